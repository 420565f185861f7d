package remediate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

// The hold rule's steps (hold.go), each on its own; hold_test.go runs the rule through Decide.

func TestTrapOutlivedArrivals(t *testing.T) {
	const peak = 6.0 / 60
	for _, tc := range []struct {
		name               string
		lambda, longLambda float64
		peak               float64
		want               bool
	}{
		{"both rates under 0.9 × the peak", 0.5 * peak, 0.8 * peak, peak, true},
		{"at 0.9 × the peak: under the line", 0.9 * peak, 0.9 * peak, peak, true},
		{"λ at the peak", peak, 0.5 * peak, peak, false},
		{"λ down on noise, the hour-long rate still over the line", 0.5 * peak, 1.2 * peak, peak, false},
		{"no peak completion rate known", 0, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := detector.Assessment{Lambda: tc.lambda, LongLambda: tc.longLambda, PeakCompletionRate: tc.peak}
			assert.Equal(t, tc.want, trapOutlivedArrivals(a))
		})
	}
}

func TestHoldMore(t *testing.T) {
	for _, tc := range []struct {
		name       string
		gateway    func() Gateway
		budget     int64
		want       []string
		wantHeld   int
		wantActive int64
		wantWhy    string
	}{
		{name: "lowest priority first until the active set fits", gateway: trappedGW, budget: 700_000,
			want: []string{"s9", "s8", "s7", "s6", "s5", "s4"}, wantHeld: 6, wantActive: 600_000,
			wantWhy: "detector trapped, hit rate 0.30 off its plateau 0.95: holding 6 sessions' next calls so the other 4 fit the cache (hold 6 more): active working set 1.50M → 600K, at or under B 700K"},
		{name: "sessions held already are not held again, and count", gateway: func() Gateway {
			return apply(trappedGW(), &HoldAction{Hold: []string{"s9", "s8"}})
		}, budget: 700_000, want: []string{"s7", "s6", "s5", "s4"}, wantHeld: 6, wantActive: 600_000},
		{name: "sessions admitted since the incident began are never held", gateway: func() Gateway {
			g := trappedGW()
			for i := 5; i < 10; i++ {
				g.Sessions[i].Admitted = t0.Add(time.Minute)
			}
			return g
		}, budget: 700_000, want: []string{"s4", "s3", "s2", "s1", "s0"}, wantHeld: 5, wantActive: 750_000},
		{name: "nobody to hold: no action", gateway: func() Gateway {
			g := trappedGW()
			for i := range g.Sessions {
				g.Sessions[i].Admitted = t0.Add(time.Minute)
			}
			return g
		}, budget: 700_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			p.st.Mode, p.st.ModeSince = Incident, t0
			g := tc.gateway()
			h, why := p.holdMore(Inputs{At: t0, Assessment: trappedAt(t0), Gateway: g, GatewayOK: true}, g.WorkingSet-g.HeldTokens, tc.budget)
			if tc.want == nil {
				assert.Nil(t, h)
				assert.Empty(t, why)
				return
			}
			require.NotNil(t, h)
			assert.Equal(t, tc.want, h.Hold)
			assert.Empty(t, h.Resume)
			assert.Equal(t, tc.wantHeld, h.Held)
			assert.Equal(t, len(g.Sessions)-tc.wantHeld, h.Active)
			assert.Equal(t, tc.wantActive, h.ActiveTokens)
			assert.Equal(t, g.WorkingSet-tc.wantActive, h.HeldTokens)
			assert.Equal(t, h.Summary(), h.Text, "the summary is kept for readers that are not Go")
			if tc.wantWhy != "" {
				assert.Equal(t, tc.wantWhy, why)
			}
		})
	}
}

func TestResumeSome(t *testing.T) {
	// heldFrom is trappedGW with s<from>…s9 held.
	heldFrom := func(from int) Gateway {
		h := &HoldAction{}
		for i := from; i < 10; i++ {
			h.Hold = append(h.Hold, trappedGW().Sessions[i].ID)
		}
		return apply(trappedGW(), h)
	}
	for _, tc := range []struct {
		name     string
		opts     Options
		g        Gateway
		budget   int64
		evidence bool
		want     []string
		wantWhy  string
	}{
		{name: "the highest priority first, one past the quota", g: heldFrom(5), budget: 1_000_000, evidence: true,
			want:    []string{"s5"},
			wantWhy: "hit rate on its plateau, nobody queued: resuming 1 held session; 4 still held, highest priority first (150K of context back, active working set 900K, at most 1.21M)"},
		{name: "up to the quota", opts: Options{HoldResumeFraction: 0.5}, g: heldFrom(5), budget: 1_000_000, evidence: true,
			want: []string{"s5", "s6", "s7"}},
		{name: "up to the room (0.9 × knee·C)", opts: Options{HoldResumeFraction: 1}, g: heldFrom(2), budget: 1_000_000, evidence: true,
			want: []string{"s2", "s3", "s4", "s5", "s6", "s7"}},
		{name: "no room: no action", g: heldFrom(9), budget: 1_000_000, evidence: true},
		{name: "newcomers queued under the incident's cut: the band above B is the held sessions'",
			g: func() Gateway { g := heldFrom(5); g.Queued = 2; return g }(), budget: 700_000, evidence: true,
			want:    []string{"s5"},
			wantWhy: "hit rate on its plateau, newcomers admitted up to B 700K: resuming 1 held session; 4 still held, highest priority first (150K of context back, active working set 900K, at most 1.21M)"},
		{name: "no reading says it", g: heldFrom(5), budget: 1_000_000,
			want:    []string{"s5"},
			wantWhy: "no hit-rate reading off the plateau, nobody queued: resuming 1 held session; 4 still held, highest priority first (150K of context back, active working set 900K, at most 1.21M)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, tc.opts)
			a := assess(t0, detector.Recovering, 0.95)
			a.HitEvidence.Enough = tc.evidence
			h, why := p.resumeSome(Inputs{At: t0, Assessment: a, Gateway: tc.g, GatewayOK: true}, tc.g.WorkingSet-tc.g.HeldTokens, tc.budget)
			if tc.want == nil {
				assert.Nil(t, h)
				return
			}
			require.NotNil(t, h)
			assert.Equal(t, tc.want, h.Resume)
			assert.Empty(t, h.Hold)
			assert.Equal(t, tc.g.Held-len(tc.want), h.Held)
			assert.Equal(t, tc.g.WorkingSet-tc.g.HeldTokens+int64(len(tc.want))*150_000, h.ActiveTokens)
			if tc.wantWhy != "" {
				assert.Equal(t, tc.wantWhy, why)
			}
		})
	}
}

// TestHoldCarriesItsOwnReason: the executor records and sends a hold with its own reason, not with
// the budget change's decided before it in the same plan.
func TestHoldCarriesItsOwnReason(t *testing.T) {
	p := newPolicy(t, Options{})
	p.st.Mode, p.st.ModeSince = Incident, t0
	plan := Plan{Reasons: []string{"the budget's reason"}}
	p.holds(Inputs{At: t0, Assessment: trappedAt(t0), Gateway: trappedGW(), GatewayOK: true}, &plan, 700_000, false)
	require.NotNil(t, plan.Hold)
	require.Len(t, plan.Reasons, 2)
	assert.Equal(t, plan.Reasons[1:], plan.Hold.Reasons)
}
