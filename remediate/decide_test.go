package remediate

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

// The steps Decide runs before the budget rules, each on its own (budget_test.go has the rules).

func TestTrackArrivals(t *testing.T) {
	window := DefaultShedWindow
	for _, tc := range []struct {
		name     string
		st       PolicyState // the average before
		in       Inputs
		wantEWMA float64
		wantAt   time.Time
	}{
		{"the first reading starts the average", PolicyState{},
			Inputs{At: t0, ArrivalRate: 0.2, ArrivalOK: true}, 0.2, t0},
		{"one window later the average has moved 63% of the way", PolicyState{ArrivalEWMA: 1, ArrivalAt: t0},
			Inputs{At: t0.Add(window), ArrivalRate: 2, ArrivalOK: true}, 1 + (1 - math.Exp(-1)), t0.Add(window)},
		{"a burst over one step moves it little", PolicyState{ArrivalEWMA: 1, ArrivalAt: t0},
			Inputs{At: t0.Add(5 * time.Second), ArrivalRate: 11, ArrivalOK: true}, 1 + 10*(1-math.Exp(-5.0/window.Seconds())), t0.Add(5 * time.Second)},
		{"a second reading at the same instant changes nothing", PolicyState{ArrivalEWMA: 1, ArrivalAt: t0},
			Inputs{At: t0, ArrivalRate: 3, ArrivalOK: true}, 1, t0},
		{"a stale rate is left out, not read as no arrivals", PolicyState{ArrivalEWMA: 1, ArrivalAt: t0},
			Inputs{At: t0.Add(time.Hour), ArrivalRate: 0, ArrivalOK: false}, 1, t0},
		{"a negative rate is left out", PolicyState{ArrivalEWMA: 1, ArrivalAt: t0},
			Inputs{At: t0.Add(time.Hour), ArrivalRate: -1, ArrivalOK: true}, 1, t0},
		{"an infinite rate is left out", PolicyState{ArrivalEWMA: 1, ArrivalAt: t0},
			Inputs{At: t0.Add(time.Hour), ArrivalRate: math.Inf(1), ArrivalOK: true}, 1, t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			p.st = tc.st
			p.trackArrivals(tc.in)
			assert.InDelta(t, tc.wantEWMA, p.st.ArrivalEWMA, 1e-12)
			assert.Equal(t, tc.wantAt, p.st.ArrivalAt)
		})
	}
}

func TestReferenceInUse(t *testing.T) {
	// capacity is an assessment of a cache of c tokens at the test knee (B_ref = C while 0.9 ×
	// 1.34 > 1).
	capacity := func(c float64) detector.Assessment {
		a := assess(t0, detector.Healthy, 0.95)
		a.KneeTokens = a.Knee.Ratio * c
		return a
	}
	for _, tc := range []struct {
		name    string
		inUse   int64 // the B_ref last sent
		a       detector.Assessment
		want    int64
		comment string
	}{
		{name: "no knee yet: none", a: detector.Assessment{ObservedAt: t0}, want: 0},
		{name: "the first: from the capacity", a: capacity(1_000_000), want: 1_000_000},
		{name: "a fall of less than a step: the one in use stays", inUse: 1_000_000, a: capacity(970_000), want: 1_000_000},
		{name: "a rise of less than a step: the one in use stays", inUse: 1_000_000, a: capacity(1_040_000), want: 1_000_000},
		{name: "a fall of more than a step: the new one", inUse: 1_000_000, a: capacity(900_000), want: 900_000},
		{name: "a rise of more than a step: the new one", inUse: 1_000_000, a: capacity(1_200_000), want: 1_200_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			p.st.Reference = tc.inUse
			assert.Equal(t, tc.want, p.referenceInUse(tc.a, t0))
		})
	}
}

func TestUndecided(t *testing.T) {
	p := newPolicy(t, Options{})
	p.st.Mode, p.st.Seq = Restoring, 7
	plan := p.undecided(Plan{At: t0, Reasons: []string{"first"}}, "why not")
	assert.Equal(t, Restoring, plan.Mode, "the mode is kept")
	assert.Equal(t, []string{"first", "why not"}, plan.Reasons)
	assert.True(t, plan.Empty())
	assert.Zero(t, plan.Seq, "a plan that changes nothing takes no number")
	assert.Equal(t, uint64(7), p.st.Seq)
}

func TestStartTarget(t *testing.T) {
	const ref = 1_000_000
	for _, tc := range []struct {
		name         string
		target       int64 // the policy's before
		in           Inputs
		wantTakeover bool
		wantOK       bool
		wantTarget   int64
		wantReason   string // the prefix of the one reason added; "" for none
	}{
		{name: "a target already: kept", target: 800_000, in: Inputs{GatewayOK: true, Gateway: gw(600_000, 0)},
			wantOK: true, wantTarget: 800_000},
		{name: "from the gateway's budget", in: Inputs{GatewayOK: true, Gateway: gw(600_000, 0)},
			wantOK: true, wantTarget: 600_000},
		{name: "a gateway that only counts: taken over from the top of the range",
			in:           Inputs{GatewayOK: true, Gateway: Gateway{CountOnly: true}},
			wantTakeover: true, wantOK: true, wantTarget: 1_100_000,
			wantReason: "the gateway only counts (admission.count_only): basin takes admission over from 1.10 × B_ref 1.00M"},
		{name: "a dry run without the gateway: from B_ref", in: Inputs{DryRun: true},
			wantOK: true, wantTarget: ref, wantReason: "dry run without the gateway's budget: deciding from B_ref 1.00M"},
		{name: "acting without the gateway's budget: nothing to start from", in: Inputs{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			p.st.Target = tc.target
			var plan Plan
			takeover, ok := p.startTarget(tc.in, ref, &plan)
			assert.Equal(t, tc.wantTakeover, takeover, "takeover")
			assert.Equal(t, tc.wantOK, ok, "ok")
			assert.Equal(t, tc.wantTarget, p.st.Target)
			if tc.wantReason == "" {
				assert.Empty(t, plan.Reasons)
			} else {
				assert.Equal(t, []string{tc.wantReason}, plan.Reasons)
			}
		})
	}
}

func TestViewOf(t *testing.T) {
	fresh := func(st detector.State, hit float64) Inputs {
		return Inputs{At: t0, Assessment: assess(t0, st, hit), GatewayOK: true, Gateway: gw(1_000_000, 0)}
	}
	with := func(in Inputs, f func(*Inputs)) Inputs { f(&in); return in }
	for _, tc := range []struct {
		name string
		in   Inputs
		want view // the flags only
	}{
		{"healthy on the plateau", fresh(detector.Healthy, 0.95), view{onPlateau: true}},
		{"within the tolerance is on the plateau", fresh(detector.Healthy, 0.92), view{onPlateau: true}},
		{"between the lines: neither", fresh(detector.Healthy, 0.91), view{}},
		{"more than LeaveDrop under: left", fresh(detector.Healthy, 0.89), view{left: true}},
		{"too little evidence: neither, whatever the rate",
			with(fresh(detector.Healthy, 0.1), func(in *Inputs) { in.Assessment.HitEvidence.Enough = false }), view{}},
		{"trapped on a fresh reading: an incident", fresh(detector.Trapped, 0.5), view{left: true, incident: true}},
		{"drifting on a fresh reading: an incident", fresh(detector.Drifting, 0.89), view{left: true, incident: true}},
		{"recovering: no incident", fresh(detector.Recovering, 0.95), view{onPlateau: true}},
		{"trapped but a signal stale: unseen, and blind",
			with(fresh(detector.Trapped, 0.5), func(in *Inputs) { in.Assessment.Blind = []string{"hit_rate"} }),
			view{blind: true, left: true, unseenTrouble: true}},
		{"trapped before any observation: unseen, and blind",
			with(fresh(detector.Trapped, 0.5), func(in *Inputs) { in.Assessment.ObservedAt = time.Time{} }),
			view{blind: true, left: true, unseenTrouble: true}},
		{"unseen trouble with an alert firing: an incident",
			with(fresh(detector.Trapped, 0.5), func(in *Inputs) { in.Assessment.Blind, in.Alerts = []string{"hit_rate"}, []string{"BasinTrapped"} }),
			view{blind: true, left: true, unseenTrouble: true, incident: true}},
		{"an alert on a healthy detector: an incident",
			with(fresh(detector.Healthy, 0.95), func(in *Inputs) { in.Alerts = []string{"BasinTrapped"} }),
			view{onPlateau: true, incident: true}},
		{"the gateway unread: blind, but trouble seen is still an incident",
			with(fresh(detector.Trapped, 0.5), func(in *Inputs) { in.GatewayOK = false }),
			view{blind: true, left: true, incident: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			v := p.viewOf(tc.in, 1_000_000, 900_000)
			assert.Equal(t, int64(1_000_000), v.ref)
			assert.Equal(t, int64(900_000), v.cur)
			assert.Equal(t, tc.in.At, v.At, "the inputs are carried")
			got := view{blind: v.blind, onPlateau: v.onPlateau, left: v.left, unseenTrouble: v.unseenTrouble, incident: v.incident}
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestShedCarriesItsOwnReason: the executor records and sends a shed with its own reason, not
// with the budget change's decided before it in the same plan.
func TestShedCarriesItsOwnReason(t *testing.T) {
	p := newPolicy(t, Options{})
	p.st.ArrivalEWMA, p.st.ArrivalAt = 6.0/60, t0
	plan := Plan{Reasons: []string{"the budget's reason"}}
	in := Inputs{At: t0, Assessment: assess(t0, detector.Healthy, 0.95), ArrivalOK: true, GatewayOK: true,
		Gateway: Gateway{Queued: 2, HeadWait: 16 * time.Minute, ShedCandidates: []string{"low", "high"}}}
	p.shed(in, &plan)
	require.NotNil(t, plan.Shed)
	assert.Equal(t, []string{"low"}, plan.Shed.IDs)
	require.Len(t, plan.Reasons, 2)
	assert.Equal(t, plan.Reasons[1:], plan.Shed.Reasons)
	assert.True(t, strings.HasPrefix(plan.Shed.Reasons[0], "long-run arrivals 6.00/min > peak completion rate 5.10/min"), plan.Shed.Reasons[0])
	assert.Equal(t, t0, p.st.LastShed)
}
