package detector

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
)

// reasonsContain reports whether any reason contains sub.
func reasonsContain(a Assessment, sub string) bool {
	for _, r := range a.Reasons {
		if strings.Contains(r, sub) {
			return true
		}
	}
	return false
}

// states lists the distinct states a run went through, in order.
func states(as []Assessment) []State {
	var out []State
	for _, a := range as {
		if len(out) == 0 || out[len(out)-1] != a.State {
			out = append(out, a.State)
		}
	}
	return out
}

// TestEvidence: each minimum on its own makes a window's hit rate not a reading.
func TestEvidence(t *testing.T) {
	o := scriptOptions().withDefaults()
	base := observation{c: testCache, hit: 0.2, hitFresh: true, window: time.Minute,
		calls: 40.0 / 60, arrival: 5.0 / 60, prompt: 0.1 * testCache / 60}
	cases := []struct {
		name   string
		edit   func(*observation)
		enough bool
		why    string
	}{
		{name: "enough", edit: func(*observation) {}, enough: true},
		{name: "no prompt tokens", edit: func(o *observation) { o.hitFresh, o.prompt = false, 0 }, why: "no prompt tokens in the window"},
		{name: "too few calls", edit: func(o *observation) { o.calls, o.arrival = 19.0/60, 1.0/60 }, why: "19 calls < 20"},
		{name: "mostly first calls", edit: func(o *observation) { o.arrival = 21.0 / 60 }, why: "21 of 40 calls may be sessions' first calls (> 50%)"},
		{name: "half first calls is enough", edit: func(o *observation) { o.arrival = 20.0 / 60 }, enough: true},
		{name: "too few tokens", edit: func(o *observation) { o.prompt = 0.04 * testCache / 60 }, why: "40K prompt tokens < 0.05 × C 1M"},
		{name: "a shorter window counts less", edit: func(o *observation) { o.window = 20 * time.Second }, why: "13 calls < 20"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obs := base
			tc.edit(&obs)
			e := o.evidence(obs)
			assert.Equal(t, tc.enough, e.Enough, e.Why)
			if tc.why != "" {
				assert.Contains(t, e.Why, tc.why)
			} else {
				assert.Empty(t, e.Why)
			}
		})
	}
}

// TestQuietDeploymentIsNotTrapped: the first-hour report. A fresh detector, no traffic, then two
// tiny sessions ("hi", three tokens out): a handful of prompt tokens, every one a first call's
// miss, read as a hit rate of 0.00. That is not a collapse, and not blindness either.
func TestQuietDeploymentIsNotTrapped(t *testing.T) {
	d := newDetector(t, Options{Calibration: nil, DisablePassive: true, KneeRatio: 1.34, PlateauHit: 0.95,
		Fluid: FluidOptions{CallsPerSession: testK}})
	as := runScript(t, d, 0, 10*time.Minute, func(off time.Duration) sample {
		if off < 2*time.Minute { // nothing yet: no prompt has ever flowed, the hit rate never computed
			return sample{wc: 0.0001, n: 0.1, prompt: -1, calls: 1e-9, arrival: 1e-9, completion: 1e-9, missing: []collector.Signal{collector.HitRate}}
		}
		// Two sessions, a call each per minute, a dozen prompt tokens a call, all misses.
		return sample{wc: 0.545, n: 2, hit: 0, calls: 2.0 / 60, prompt: 24.0 / 60, arrival: 2, completion: 1}
	})
	assert.Equal(t, []State{Healthy}, states(as), "transitions: %v", transitions(as))
	for _, a := range as {
		require.Empty(t, a.Blind, "a quiet deployment is not blind at %s", a.At.Sub(t0))
		require.False(t, a.HitEvidence.Enough)
	}
	last := as[len(as)-1]
	assert.True(t, reasonsContain(last, "hit rate not a reading over the 1m0s window: 2 calls < 20"), "%q", last.Reasons)
}

// TestFirstCallsAreNotACollapse: a burst of new sessions on a deployment with room: most calls in
// the window are first calls, whose prompts were never cached.
func TestFirstCallsAreNotACollapse(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 8*time.Minute, func(off time.Duration) sample {
		if off < 3*time.Minute {
			return sample{wc: 0.4, hit: 0.96}
		}
		// 40 sessions a minute arrive; each has made one or two calls so far.
		return sample{wc: 0.9, hit: 0.1, arrival: 40, calls: 60.0 / 60}
	})
	assert.Equal(t, []State{Healthy}, states(as), "transitions: %v", transitions(as))
	assert.True(t, reasonsContain(as[len(as)-1], "may be sessions' first calls"), "%q", as[len(as)-1].Reasons)
}

// TestRestartWithEmptyCache: an engine restart empties the cache under steady load (the
// collector sees its counters go back). Every live session's next call recomputes its context
// once: the hit rate falls to near 0 with plenty of evidence and climbs back as sessions call
// again, here over four minutes — longer than the drift hold. The working set is where it was,
// under the knee: neither trapped nor drifting. The same drop without a restart is drift.
func TestRestartWithEmptyCache(t *testing.T) {
	restart := t0.Add(5 * time.Minute)
	script := func(restarted bool) func(off time.Duration) sample {
		return func(off time.Duration) sample {
			s := sample{wc: 0.9, hit: 0.96}
			if off >= 5*time.Minute && restarted {
				s.restart = restart
			}
			switch {
			case off < 5*time.Minute:
			case off < 7*time.Minute:
				s.hit = 0.05
			case off < 9*time.Minute:
				s.hit = 0.6
			}
			return s
		}
	}
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 20*time.Minute, script(true))
	assert.Equal(t, []State{Healthy}, states(as), "transitions: %v", transitions(as))
	var cold, refill bool
	for _, a := range as {
		cold = cold || reasonsContain(a, "a cold cache (an engine restart, new sessions) refilling, not a trap")
		refill = refill || reasonsContain(a, "an engine restarted at 2026-05-01T12:05:00Z: its cache refills from empty")
	}
	assert.True(t, cold, "the collapse-level drop is named for what it is")
	assert.True(t, refill, "the restart is named while the cache refills")

	d = newDetector(t, scriptOptions())
	as = runScript(t, d, 0, 20*time.Minute, script(false))
	assert.Equal(t, []string{"6m0s healthy→drifting", "9m15s drifting→recovering", "14m15s recovering→healthy"}, transitions(as),
		"without a restart, the drop from the plateau is drift (never trapped: W/C 0.9 is far from the knee)")
}

// TestCollapseNearTheKneeIsCaught: the same collapse as a cold cache, with the working set past
// the knee, is a trap, caught after TrappedHold as before.
func TestCollapseNearTheKneeIsCaught(t *testing.T) {
	for _, tc := range []struct {
		name string
		wc   float64
		want []string
	}{
		{name: "past the knee", wc: 2.1, want: []string{"15s healthy→pressure", "30s pressure→trapped"}},
		{name: "at 0.9 × knee", wc: 1.71, want: []string{"15s healthy→pressure", "30s pressure→trapped"}},
		{name: "under 0.9 × knee: pressure only", wc: 1.6, want: []string{"15s healthy→pressure"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDetector(t, scriptOptions())
			as := runScript(t, d, 0, 3*time.Minute, func(time.Duration) sample { return sample{wc: tc.wc, hit: 0.3} })
			assert.Equal(t, tc.want, transitions(as))
		})
	}
}

// TestEstimatedWorkingSetCollapse: without a gateway the working set is the engines' KV estimate,
// which cannot exceed C; a full cache is where a trap can be.
func TestEstimatedWorkingSetCollapse(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 3*time.Minute, func(off time.Duration) sample {
		s := sample{wc: 0.95, hit: 0.3}
		return s
	})
	require.Equal(t, []State{Healthy}, states(as), "a measured W/C 0.95 is far under the knee 1.9")

	d = newDetector(t, scriptOptions())
	for off := time.Duration(0); off <= 3*time.Minute; off += step {
		snap := sample{wc: 0.95, hit: 0.3}.snapshot(t0.Add(off))
		v := snap.Signals[collector.WorkingSet]
		v.Estimated = true
		snap.Signals[collector.WorkingSet] = v
		d.Step(snap)
	}
	a, _ := d.Last()
	assert.Equal(t, Trapped, a.State, "%q", a.Reasons)
}

// TestQuietAfterTrapRecovers: traffic stops while trapped (sessions end, none arrive). The
// detector sees a quiet deployment with room in the cache, not a blind one, and leaves trapped.
func TestQuietAfterTrapRecovers(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 12*time.Minute, func(off time.Duration) sample {
		if off < 2*time.Minute {
			return sample{wc: 2.2, hit: 0.3}
		}
		return sample{wc: 0.05, n: 1, prompt: -1, calls: 1e-9, arrival: 1e-9, completion: 1e-9,
			stale: []collector.Signal{collector.HitRate}}
	})
	assert.Equal(t, []string{"15s healthy→pressure", "30s pressure→trapped", "2m15s trapped→recovering", "7m15s recovering→healthy"},
		transitions(as))
	for _, a := range as {
		require.Empty(t, a.Blind)
	}
	assert.True(t, reasonsContain(as[len(as)-1], "no hit-rate reading (quiet)") || as[len(as)-1].Transition == nil)
}

// TestHitRateMissingWhilePromptsFlow: prompts flow but the hit rate is not fresh: a broken
// source, blind.
func TestHitRateMissingWhilePromptsFlow(t *testing.T) {
	d := newDetector(t, scriptOptions())
	a := d.Step(sample{wc: 1, hit: 0.9, missing: []collector.Signal{collector.HitRate}}.snapshot(t0))
	assert.Equal(t, []string{"hit_rate missing"}, a.Blind)
}
