package remediate

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

// trappedGW is a gateway with ten live sessions s0…s9 of 150K tokens each (1.5M, past the
// budget's 1M), s0 the highest priority, all admitted before t0.
func trappedGW() Gateway {
	g := Gateway{Budget: 1_000_000, Reference: 1_000_000}
	for i := range 10 {
		g.Sessions = append(g.Sessions, LiveSession{ID: fmt.Sprintf("s%d", i), Admitted: t0.Add(-time.Hour),
			Priority: t0.Add(-time.Hour + time.Duration(i)*time.Minute), Context: 150_000})
		g.WorkingSet += 150_000
	}
	g.Live = len(g.Sessions)
	return g
}

// apply marks a hold action's sessions as the gateway would after it.
func apply(g Gateway, h *HoldAction) Gateway {
	set := map[string]bool{}
	for _, id := range h.Hold {
		set[id] = true
	}
	un := map[string]bool{}
	for _, id := range h.Resume {
		un[id] = true
	}
	g.Sessions = append([]LiveSession(nil), g.Sessions...)
	g.Held, g.HeldTokens = 0, 0
	for i, s := range g.Sessions {
		if set[s.ID] {
			s.Held = true
		}
		if un[s.ID] {
			s.Held = false
		}
		g.Sessions[i] = s
		if s.Held {
			g.Held++
			g.HeldTokens += s.Context
		}
	}
	return g
}

// trappedAt is an assessment at at of a detector trapped since DefaultHoldAfter before t0, hit
// rate 0.3.
func trappedAt(at time.Time) detector.Assessment {
	a := assess(at, detector.Trapped, 0.3)
	a.Since = t0.Add(-DefaultHoldAfter)
	return a
}

// inIncident steps p into the incident on trappedGW as the detector goes trapped, DefaultHoldAfter
// before t0: the cut, and no hold yet.
func inIncident(t *testing.T, p *Policy) {
	t.Helper()
	at := t0.Add(-DefaultHoldAfter)
	plan := p.Decide(Inputs{At: at, Assessment: trappedAt(at), Gateway: trappedGW(), GatewayOK: true})
	require.Equal(t, Incident, p.State().Mode)
	require.NotNil(t, plan.Budget)
	require.Equal(t, int64(700_000), plan.Budget.To, "the incident cut")
	require.Nil(t, plan.Hold, "the cut first: no hold before the incident has lasted HoldAfter")
}

func TestHoldsTheLowestPriorityUntilTheActiveSetFits(t *testing.T) {
	p := newPolicy(t, Options{})
	inIncident(t, p)
	g := trappedGW()
	g.Budget = 700_000
	early := t0.Add(-time.Second)
	plan := p.Decide(Inputs{At: early, Assessment: trappedAt(early), Gateway: g, GatewayOK: true})
	require.Nil(t, plan.Hold, "a second short of HoldAfter: %q", plan.Reasons)
	plan = p.Decide(Inputs{At: t0, Assessment: trappedAt(t0), Gateway: g, GatewayOK: true})
	require.NotNil(t, plan.Hold, "%q", plan.Reasons)
	// 1.5M active, B 700K: hold 150K sessions from the lowest priority until ≤ 700K: six of them.
	assert.Equal(t, []string{"s9", "s8", "s7", "s6", "s5", "s4"}, plan.Hold.Hold)
	assert.Empty(t, plan.Hold.Resume)
	assert.Equal(t, 6, plan.Hold.Held)
	assert.Equal(t, 4, plan.Hold.Active)
	assert.Equal(t, int64(600_000), plan.Hold.ActiveTokens)
	assert.Contains(t, plan.Hold.Summary(), "holding 6 sessions' next calls so the other 4 fit the cache")
	assert.Contains(t, fmt.Sprint(plan.Hold.Reasons), "active working set 1.50M → 600K, at or under B 700K")

	// The next step, with the holds applied and a newcomer admitted into the room: the newcomer,
	// admitted after the incident began, is never a candidate.
	g = apply(g, plan.Hold)
	g.Sessions = append(g.Sessions, LiveSession{ID: "new", Admitted: t0.Add(time.Second), Priority: t0, Context: 200_000})
	g.WorkingSet += 200_000
	now := t0.Add(5 * time.Second)
	plan = p.Decide(Inputs{At: now, Assessment: trappedAt(now), Gateway: g, GatewayOK: true})
	require.NotNil(t, plan.Hold, "active 800K > 700K: hold one more")
	assert.Equal(t, []string{"s3"}, plan.Hold.Hold, "the lowest-priority session live before holding began, not the newcomer")
}

func TestHoldsDoNotEngage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		state  detector.State
		hit    float64
		mutate func(*Inputs)
		opts   Options
	}{
		{name: "healthy and quiet", state: detector.Healthy, hit: 0.95},
		{name: "pressure only", state: detector.Pressure, hit: 0.3},
		{name: "hit rate on its plateau", state: detector.Trapped, hit: 0.94},
		{name: "no hit-rate reading", state: detector.Trapped, hit: 0.3, mutate: func(in *Inputs) {
			in.Assessment.HitEvidence = detector.Evidence{Why: "12 calls < 20"}
		}},
		{name: "blind", state: detector.Trapped, hit: 0.3, mutate: func(in *Inputs) {
			in.Assessment.Blind = []string{"hit_rate stale"}
		}},
		{name: "live sessions not listed", state: detector.Trapped, hit: 0.3, mutate: func(in *Inputs) { in.Gateway.Sessions = nil }},
		{name: "turned off", state: detector.Trapped, hit: 0.3, opts: Options{DisableHolds: true}},
		{name: "active set already fits", state: detector.Trapped, hit: 0.3, mutate: func(in *Inputs) {
			in.Gateway.Sessions = in.Gateway.Sessions[:4]
			in.Gateway.WorkingSet = 600_000
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, tc.opts)
			inIncident(t, p)
			a := assess(t0, tc.state, tc.hit)
			a.Since = t0.Add(-DefaultHoldAfter)
			in := Inputs{At: t0, Assessment: a, Gateway: trappedGW(), GatewayOK: true}
			if tc.mutate != nil {
				tc.mutate(&in)
			}
			plan := p.Decide(in)
			assert.Nil(t, plan.Hold, "%q", plan.Reasons)
		})
	}
}

func TestResumesHighestPriorityFirstIntoTheRoom(t *testing.T) {
	p := newPolicy(t, Options{})
	inIncident(t, p)
	g := trappedGW()
	g.Budget = 700_000
	plan := p.Decide(Inputs{At: t0, Assessment: trappedAt(t0), Gateway: g, GatewayOK: true})
	require.NotNil(t, plan.Hold)
	g = apply(g, plan.Hold)
	// Three active sessions end: 150K active, 550K of room under B 700K.
	g.Sessions = g.Sessions[3:]
	g.WorkingSet -= 450_000

	now := t0.Add(time.Minute)
	queued := g
	queued.Queued = 2
	// A policy out of its incident, B back at B_ref, sessions queued: newcomers go first.
	normal := queued
	normal.Budget = normal.Reference
	pn := newPolicy(t, Options{})
	plan = pn.Decide(Inputs{At: now, Assessment: assess(now, detector.Recovering, 0.95), Gateway: normal, GatewayOK: true})
	require.Equal(t, Normal, pn.State().Mode)
	assert.Nil(t, plan.Hold, "B back at B_ref and sessions queue for admission: newcomers go first, %q", plan.Reasons)
	// Under the incident's cut, newcomers are admitted only up to B: the band from B to B_ref is
	// the held sessions', queue or not.
	queued.Budget = g.Budget
	require.Less(t, queued.Budget, queued.Reference)
	plan = p.Decide(Inputs{At: now, Assessment: assess(now, detector.Recovering, 0.95), Gateway: queued, GatewayOK: true})
	require.NotNil(t, plan.Hold, "B under B_ref: resumes go into the band above it, %q", plan.Reasons)
	assert.Equal(t, []string{"s4"}, plan.Hold.Resume)

	plan = p.Decide(Inputs{At: now, Assessment: assess(now, detector.Trapped, 0.5), Gateway: g, GatewayOK: true})
	assert.Nil(t, plan.Hold, "hit rate still off its plateau: nothing resumed")

	plan = p.Decide(Inputs{At: now, Assessment: assess(now, detector.Recovering, 0.95), Gateway: g, GatewayOK: true})
	require.NotNil(t, plan.Hold, "%q", plan.Reasons)
	// At most 0.1 × B = 70K of context a step, but always one: the best held session, s4.
	assert.Equal(t, []string{"s4"}, plan.Hold.Resume)
	assert.Empty(t, plan.Hold.Hold)
	assert.Equal(t, 5, plan.Hold.Held)

	// The room is the margin under the knee B_ref keeps, without B_ref's cap at C: 0.9 × 1.34 ×
	// 1M = 1.206M. With no quota to speak of, 150K + 6 × 150K ≤ 1.206M: every held session.
	p2 := newPolicy(t, Options{HoldResumeFraction: 1})
	p2.st = p.st
	p2.o.HoldResumeFraction = 2
	plan = p2.Decide(Inputs{At: now, Assessment: assess(now, detector.Recovering, 0.95), Gateway: g, GatewayOK: true})
	require.NotNil(t, plan.Hold)
	assert.Equal(t, []string{"s4", "s5", "s6", "s7", "s8", "s9"}, plan.Hold.Resume)
	assert.Contains(t, fmt.Sprint(plan.Hold.Reasons), "at most 1.21M")
}

func TestHoldResumeFractionValidated(t *testing.T) {
	_, err := NewPolicy(Options{HoldResumeFraction: 1.5})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "hold_resume_fraction")
}

// A trap under lasting overload is not held: with arrivals at the peak completion rate a hold
// frees nothing (its room is refilled as fast as it is made); once arrivals fall under 0.9 × the
// peak, the same trap is.
func TestNoHoldWhileArrivalsKeepTheTrap(t *testing.T) {
	p := newPolicy(t, Options{})
	inIncident(t, p)
	g := trappedGW()
	g.Budget = 700_000
	a := trappedAt(t0)
	a.Lambda = a.PeakCompletionRate
	plan := p.Decide(Inputs{At: t0, Assessment: a, Gateway: g, GatewayOK: true})
	require.Nil(t, plan.Hold, "%q", plan.Reasons)
	assert.Contains(t, fmt.Sprint(plan.Reasons), "arrivals (λ 5.10/min, over the last hour 0.00/min) are not under 0.9 × the peak completion rate 5.10/min")
	// λ down on noise while the hour-long rate is still over the line: no hold either.
	now := t0.Add(5 * time.Second)
	a = trappedAt(now)
	a.Lambda, a.LongLambda = 0.5*a.PeakCompletionRate, 1.2*a.PeakCompletionRate
	plan = p.Decide(Inputs{At: now, Assessment: a, Gateway: g, GatewayOK: true})
	require.Nil(t, plan.Hold, "%q", plan.Reasons)
	now = now.Add(5 * time.Second)
	a = trappedAt(now)
	a.Lambda, a.LongLambda = 0.85*a.PeakCompletionRate, 0.7*a.PeakCompletionRate
	plan = p.Decide(Inputs{At: now, Assessment: a, Gateway: g, GatewayOK: true})
	require.NotNil(t, plan.Hold, "%q", plan.Reasons)
	assert.Len(t, plan.Hold.Hold, 6)
}
