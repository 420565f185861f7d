package detector

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
)

const (
	testCache = 1_000_000.0 // C, tokens
	testCtx   = 25_000.0    // mean context, tokens
	step      = 5 * time.Second
)

// sample is one scripted snapshot. Zero fields take the script defaults: N from the working set at
// the mean context testCtx, 3.3 sessions/min arriving and completing, a call rate half again
// above what those completions need (the curve stays above λ, so only the knee bounds the edge).
type sample struct {
	wc, hit             float64
	n                   float64
	arrival, completion float64 // per minute
	calls               float64 // per second
	// prompt is prompt tokens per second; 0: calls × testCtx (every call re-sends a mean
	// context); negative: none (a quiet window).
	prompt         float64
	stale, missing []collector.Signal
	restart        time.Time // collector.Snapshot.CacheRestart
	cache          float64   // C; 0: testCache
}

func (s sample) snapshot(at time.Time) collector.Snapshot {
	c, w := testCache, s.wc*testCache
	if s.cache > 0 {
		c, w = s.cache, s.wc*s.cache
	} else if s.cache < 0 {
		c = s.cache // broken capacity, sane working set
	}
	if s.n == 0 {
		s.n = w / testCtx
	}
	if s.arrival == 0 {
		s.arrival = 3.3
	}
	if s.completion == 0 {
		s.completion = 3.3
	}
	if s.calls == 0 {
		s.calls = 3.3 / 60 * testK * 1.5
	}
	switch {
	case s.prompt == 0:
		s.prompt = s.calls * testCtx
	case s.prompt < 0:
		s.prompt = 0
	}
	vals := map[collector.Signal]float64{
		collector.WorkingSet: w, collector.CacheCapacity: c, collector.HitRate: s.hit, collector.PromptTokenRate: s.prompt,
		collector.LiveSessions: s.n, collector.ArrivalRate: s.arrival / 60,
		collector.CompletionRate: s.completion / 60, collector.CallRate: s.calls,
	}
	snap := collector.Snapshot{At: at, Signals: map[collector.Signal]collector.Value{}, CacheRestart: s.restart}
	for sig, v := range vals {
		snap.Signals[sig] = collector.Value{V: v, State: collector.OK, At: at, Source: "script"}
	}
	for _, sig := range s.stale {
		v := snap.Signals[sig]
		v.State, v.At = collector.Stale, at.Add(-time.Minute)
		snap.Signals[sig] = v
	}
	for _, sig := range s.missing {
		delete(snap.Signals, sig)
	}
	return snap
}

// scriptOptions keep the scripts short: a plateau warm-up of 15 s instead of 2 min, a drift hold
// of 1 min instead of 3.
func scriptOptions() Options {
	return Options{KneeRatio: 1.9, PlateauHit: 0.96, DisablePassive: true, PlateauWarmup: 15 * time.Second,
		DriftHold: time.Minute, Fluid: FluidOptions{CallsPerSession: testK}}
}

// runScript steps d every 5 s from t0 to t0+end (inclusive) with the script's samples.
func runScript(t *testing.T, d *Detector, from, end time.Duration, script func(off time.Duration) sample) []Assessment {
	t.Helper()
	var out []Assessment
	for off := from; off <= end; off += step {
		a := d.Step(script(off).snapshot(t0.Add(off)))
		require.Equal(t, t0.Add(off), a.At)
		out = append(out, a)
	}
	return out
}

// transitions renders the transitions of a run as "offset from→to".
func transitions(as []Assessment) []string {
	var out []string
	for _, a := range as {
		if tr := a.Transition; tr != nil {
			out = append(out, fmt.Sprintf("%s %s→%s", tr.At.Sub(t0), tr.From, tr.To))
		}
	}
	return out
}

func newDetector(t *testing.T, o Options) *Detector {
	t.Helper()
	d, err := New(o)
	require.NoError(t, err)
	return d
}

// alternate returns a on even steps and b on odd ones.
func alternate(off time.Duration, a, b float64) float64 {
	if (off/step)%2 == 0 {
		return a
	}
	return b
}

func TestPressureHysteresis(t *testing.T) {
	// knee 1.9: pressure from W/C 1.52, healthy again at 1.33. Values between do not move it.
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 13*time.Minute, func(off time.Duration) sample {
		switch {
		case off < time.Minute:
			return sample{wc: 1.0, hit: 0.96}
		case off < 2*time.Minute:
			return sample{wc: 1.6, hit: 0.96}
		case off < 7*time.Minute:
			return sample{wc: alternate(off, 1.35, 1.50), hit: 0.96}
		case off < 8*time.Minute:
			return sample{wc: 1.2, hit: 0.96}
		}
		return sample{wc: alternate(off, 1.35, 1.50), hit: 0.96}
	})
	assert.Equal(t, []string{"1m15s healthy→pressure", "7m15s pressure→healthy"}, transitions(as))
	tr := as[15].Transition
	require.NotNil(t, tr)
	assert.Equal(t, []string{"W/C 1.60 ≥ 0.80 × knee 1.90 = 1.52 for 15s"}, tr.Reasons)
	assert.Equal(t, tr.Reasons[0], as[15].Reasons[0], "the transition's reasons lead the assessment's")
	last := as[len(as)-1]
	assert.Equal(t, Healthy, last.State)
	assert.Equal(t, t0.Add(7*time.Minute+15*time.Second), last.Since)
	assert.InDelta(t, 1.9*testCache, last.KneeTokens, 1e-6)
	assert.Equal(t, SourceDefault, last.Knee.Source)
}

// trapAndRecovery is a spike that drifts into a trap, then load shed and a recovery: the whole
// cycle, each state held long enough for its hold.
func trapAndRecovery(off time.Duration) sample {
	switch {
	case off < 2*time.Minute:
		return sample{wc: 1.0, hit: 0.96}
	case off < 4*time.Minute: // spike: the working set grows
		return sample{wc: 1.6, hit: 0.96}
	case off < 6*time.Minute: // the hit rate leaves its plateau (0.91 = 0.96 − 0.05)
		return sample{wc: 1.7, hit: 0.88}
	case off < 10*time.Minute: // collapse
		return sample{wc: 2.1, hit: 0.41}
	case off < 12*time.Minute: // load shed: hit climbs over 0.55, W under the knee
		return sample{wc: 1.5, hit: 0.6}
	}
	return sample{wc: 1.2, hit: 0.95} // back within 0.03 of the plateau, W under 1.33
}

// TestTrapAndRecovery walks the whole cycle with each hold honoured.
func TestTrapAndRecovery(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 20*time.Minute, trapAndRecovery)
	assert.Equal(t, []string{
		"2m15s healthy→pressure",
		"5m0s pressure→drifting",    // DriftHold 60 s
		"6m30s drifting→trapped",    // TrappedHold 30 s
		"10m15s trapped→recovering", // MinHold 15 s
		"17m0s recovering→healthy",  // RecoverHold 5 min from 12m
	}, transitions(as))

	byOff := func(off time.Duration) Assessment { return as[off/step] }
	assert.Contains(t, byOff(5*time.Minute).Transition.Reasons, "hit rate 0.88 < plateau 0.96 − 0.05 for 1m0s")
	trapped := byOff(6*time.Minute + 30*time.Second)
	assert.Contains(t, trapped.Transition.Reasons, "hit rate 0.41 < collapse 0.50 at W/C 2.10 ≥ 1.71 for 30s")
	assert.Equal(t, 0.5, trapped.CollapseHit, "min(0.5, 0.6 × 0.96)")
	assert.Equal(t, []string{"hit rate 0.60 ≥ collapse 0.50 + 0.05 and W/C 1.50 < knee 1.90 for 15s"},
		byOff(10*time.Minute+15*time.Second).Transition.Reasons)
	healthy := byOff(17 * time.Minute).Transition
	assert.Equal(t, []string{"hit rate 0.95 ≥ plateau 0.96 − 0.03 for 5m0s", "W/C 1.20 ≤ 0.70 × knee 1.90 = 1.33 for 5m0s"},
		healthy.Reasons)
	assert.Equal(t, Recovering, byOff(16*time.Minute+55*time.Second).State)
}

// TestRecoveryUnderLoad: a recovery that leaves the working set in the pressure band ends in
// pressure, not in a recovering state that never ends.
func TestRecoveryUnderLoad(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 10*time.Minute, func(off time.Duration) sample {
		switch {
		case off < time.Minute:
			return sample{wc: 2.2, hit: 0.3}
		case off < 2*time.Minute:
			return sample{wc: 1.7, hit: 0.7}
		}
		return sample{wc: 1.6, hit: 0.96}
	})
	assert.Equal(t, []string{"15s healthy→pressure", "30s pressure→trapped", "1m15s trapped→recovering", "7m0s recovering→pressure"},
		transitions(as))
	assert.Contains(t, as[len(as)-1].Reasons, "W/C 1.60 (knee 1.90 default; pressure from 1.52, clears at 1.33)")
}

func TestRelapse(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 8*time.Minute, func(off time.Duration) sample {
		switch {
		case off < time.Minute:
			return sample{wc: 1.0, hit: 0.96}
		case off < 3*time.Minute:
			return sample{wc: 2.1, hit: 0.35}
		case off == 5*time.Minute: // one bad sample while recovering: not a relapse
			return sample{wc: 1.5, hit: 0.35}
		case off < 6*time.Minute:
			return sample{wc: 1.5, hit: 0.65}
		}
		return sample{wc: 1.5, hit: 0.35}
	})
	assert.Equal(t, []string{"1m15s healthy→pressure", "1m30s pressure→trapped", "3m15s trapped→recovering", "6m30s recovering→trapped"},
		transitions(as))
}

func TestDriftFromFlow(t *testing.T) {
	// Near the knee (W/C ≥ 0.9 × 1.9 = 1.71) the population grows with completions below
	// arrivals while the hit rate slips a little (0.92: under plateau − 0.025, not yet under the
	// drift line 0.91).
	script := func(hit float64) func(off time.Duration) sample {
		return func(off time.Duration) sample {
			if off < time.Minute {
				return sample{wc: 1.0, hit: 0.96}
			}
			wc := 1.72 + 0.005*float64((off-time.Minute)/step)
			return sample{wc: wc, hit: hit, arrival: 6.6, completion: 2.0, calls: 2.0 / 60 * testK}
		}
	}
	still := runScript(t, newDetector(t, scriptOptions()), 0, 6*time.Minute, script(0.96))
	assert.Equal(t, []string{"1m15s healthy→pressure"}, transitions(still),
		"with the cache still on its plateau, a growing population is pressure, not drift")
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 6*time.Minute, script(0.92))
	// The smoothed completions fall 10% under the smoothed arrivals after a minute or so, and the
	// deficit must then last two minutes.
	assert.Equal(t, []string{"1m15s healthy→pressure", "3m20s pressure→drifting"}, transitions(as))
	why := strings.Join(as[40].Transition.Reasons, "\n")
	assert.Contains(t, why, "live sessions rising")
	assert.Contains(t, why, "completions 0.0467/s < 0.90 × arrivals 0.0761/s (5m0s averages) at W/C 1.86 ≥ 0.90 × knee 1.90 = 1.71 for 2m0s")
	// Past the knee's estimated edge with the hit rate still on the plateau: drifting, not trapped —
	// an estimated edge needs the hit rate to corroborate it.
	last := as[len(as)-1]
	assert.Equal(t, Drifting, last.State)
	require.NotNil(t, last.DistanceToEdge)
	assert.Less(t, *last.DistanceToEdge, 0.0)
	require.NotNil(t, last.TimeToTrap)
	assert.Zero(t, *last.TimeToTrap)
}

func TestBlindHoldsTheState(t *testing.T) {
	tests := []struct {
		name  string
		blind sample
		want  []string
	}{
		{name: "hit rate stale", blind: sample{wc: 1.0, hit: 0.2, stale: []collector.Signal{collector.HitRate}},
			want: []string{"hit_rate stale"}},
		{name: "working set missing", blind: sample{wc: 1.0, hit: 0.2, missing: []collector.Signal{collector.WorkingSet}},
			want: []string{"working_set_tokens missing"}},
		{name: "two signals", blind: sample{wc: 1.0, hit: 0.2, missing: []collector.Signal{collector.CallRate},
			stale: []collector.Signal{collector.ArrivalRate}},
			want: []string{"call_completion_rate missing", "session_arrival_rate stale"}},
		{name: "no cache", blind: sample{wc: 1.0, hit: 0.2, cache: -1},
			want: []string{"cache_capacity_tokens invalid (-1, want > 0)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDetector(t, scriptOptions())
			as := runScript(t, d, 0, 5*time.Minute, func(off time.Duration) sample {
				switch {
				case off < 50*time.Second:
					return sample{wc: 1.6, hit: 0.96}
				case off < time.Minute: // starts clearing: 10 s of the 15 s hold before the gap
					return sample{wc: 1.2, hit: 0.96}
				case off < 3*time.Minute:
					return tc.blind // would collapse and clear the pressure, if seen
				}
				return sample{wc: 1.0, hit: 0.96}
			})
			// The hold restarts when the signals come back: 15 s after 3m, not at once (it began at
			// 50 s, before the gap).
			assert.Equal(t, []string{"15s healthy→pressure", "3m15s pressure→healthy"}, transitions(as))
			for _, a := range as[12:36] {
				assert.Equal(t, Pressure, a.State)
				assert.Equal(t, tc.want, a.Blind)
				assert.Equal(t, t0.Add(55*time.Second), a.ObservedAt)
				assert.Equal(t, 0.96, a.HitRate, "the numbers are the last complete step's")
				assert.Contains(t, a.Reasons[0], "holding pressure since")
			}
			assert.Empty(t, as[36].Blind)
		})
	}
	t.Run("blind from the start", func(t *testing.T) {
		d := newDetector(t, scriptOptions())
		a := d.Step(sample{wc: 1.0, hit: 0.9, missing: []collector.Signal{collector.HitRate}}.snapshot(t0))
		assert.Equal(t, Healthy, a.State)
		assert.Equal(t, []string{"hit_rate missing"}, a.Blind)
		assert.True(t, a.ObservedAt.IsZero())
		assert.Equal(t, 0.96, a.Plateau)
	})
}

// TestOneSampleNeverMovesTheState puts each state under one wild sample and checks nothing moves.
func TestOneSampleNeverMovesTheState(t *testing.T) {
	tests := []struct {
		name   string
		steady func(off time.Duration) sample // reaches the state within 3 minutes and keeps it
		state  State
		wild   []sample
	}{
		{name: "healthy", steady: func(time.Duration) sample { return sample{wc: 1.0, hit: 0.96} }, state: Healthy,
			wild: []sample{{wc: 3.0, hit: 0.1}, {wc: 1.8, hit: 0.96, arrival: 20, completion: 0.1}}},
		{name: "pressure", steady: func(time.Duration) sample { return sample{wc: 1.6, hit: 0.96} }, state: Pressure,
			wild: []sample{{wc: 0.2, hit: 0.96}, {wc: 2.5, hit: 0.1}}},
		{name: "drifting", steady: func(off time.Duration) sample {
			if off < 30*time.Second {
				return sample{wc: 1.6, hit: 0.96} // on the plateau first: drift is leaving it
			}
			return sample{wc: 1.6, hit: 0.88}
		}, state: Drifting,
			wild: []sample{{wc: 0.5, hit: 0.96}, {wc: 2.5, hit: 0.1}}},
		{name: "trapped", steady: func(time.Duration) sample { return sample{wc: 2.1, hit: 0.3} }, state: Trapped,
			wild: []sample{{wc: 1.0, hit: 0.96}}},
		{name: "recovering", steady: func(off time.Duration) sample {
			if off < time.Minute {
				return sample{wc: 2.1, hit: 0.3}
			}
			return sample{wc: 1.5, hit: 0.7}
		}, state: Recovering, wild: []sample{{wc: 1.0, hit: 0.96}, {wc: 2.5, hit: 0.1}}},
	}
	for _, tc := range tests {
		for i, wild := range tc.wild {
			t.Run(fmt.Sprintf("%s/%d", tc.name, i), func(t *testing.T) {
				d := newDetector(t, scriptOptions())
				before := runScript(t, d, 0, 3*time.Minute, tc.steady)
				require.Equal(t, tc.state, before[len(before)-1].State)
				n := len(transitions(before))
				as := runScript(t, d, 3*time.Minute+step, 6*time.Minute, func(off time.Duration) sample {
					if off == 4*time.Minute {
						return wild
					}
					return tc.steady(off)
				})
				assert.Empty(t, transitions(as), "had %d before", n)
				for _, a := range as {
					assert.Equal(t, tc.state, a.State)
				}
			})
		}
	}
}

// TestPastObservedEdge: with a calibrated curve the unstable equilibrium is observed; a population
// past it is trapped even while the hit rate holds.
func TestPastObservedEdge(t *testing.T) {
	cal := &Calibration{Version: 1, KneeRatio: 1.8, PlateauHit: 0.96, PeakCompletionRatePerS: 5.1 / 60,
		CallsPerSession: testK, Created: t0, Source: "test"}
	for n := 5.0; n <= 80; n += 5 {
		cal.Points = append(cal.Points, Point{WorkingSetOverCache: n * testCtx / testCache, HitRate: 0.96,
			Sessions: n, CompletionRatePerS: simCurve(n) / 60})
	}
	o := scriptOptions()
	o.Calibration = cal
	d := newDetector(t, o)
	as := runScript(t, d, 0, 10*time.Minute, func(off time.Duration) sample {
		n := 30.0
		if off >= time.Minute && off < 3*time.Minute {
			n = 52
		}
		return sample{wc: n * testCtx / testCache, hit: 0.95, n: n, calls: callRate(n), completion: simCurve(n)}
	})
	// Shed back under the edge at 3m: the hit rate never left the plateau, but a recovery still
	// lasts RecoverHold inside the recovering state.
	assert.Equal(t, []string{"1m30s healthy→trapped", "3m15s trapped→recovering", "8m15s recovering→healthy"},
		transitions(as))
	tr := as[18].Transition
	assert.Equal(t, []string{"live sessions 52.0 > unstable equilibrium 47.8 at λ 3.30/min for 30s"}, tr.Reasons)
	a := as[35] // 2m55s
	assert.Equal(t, SourceCalibration, a.Knee.Source)
	assert.False(t, a.Equilibria.Estimated)
	require.NotNil(t, a.Equilibria.Stable)
	assert.InDelta(t, 40*3.3/5.1, *a.Equilibria.Stable, 0.3)
	require.NotNil(t, a.DistanceToEdge)
	assert.InDelta(t, 40+1.8/0.23-52, *a.DistanceToEdge, 0.3)
	assert.Equal(t, testK, a.CallsPerSession)
}

// TestPassiveKneeInDetector: the knee is learnt on the way up; the collapsed branch that follows
// (the cache hysteresis: still collapsed at W/C 0.9–1.3) does not drag it down.
func TestPassiveKneeInDetector(t *testing.T) {
	o := scriptOptions()
	o.DisablePassive = false
	d := newDetector(t, o)
	ramp := 50 * time.Minute // W/C 0.3 → 1.8, 0.05 per 100 s: 20 samples a bin
	as := runScript(t, d, 0, ramp+30*time.Minute, func(off time.Duration) sample {
		if off <= ramp {
			wc := 0.3 + 1.5*float64(off)/float64(ramp)
			return sample{wc: wc, hit: cliff(1.5)(wc)}
		}
		// Still collapsed while the working set sweeps 0.9–1.3, well under the knee.
		return sample{wc: 0.9 + 0.4*float64(off-ramp)/float64(30*time.Minute), hit: 0.3}
	})
	trapped := false
	for _, a := range as {
		trapped = trapped || a.State == Trapped
	}
	require.True(t, trapped)
	last := as[len(as)-1]
	assert.Equal(t, Trapped, last.State)
	assert.Equal(t, SourcePassive, last.Knee.Source)
	assert.InDelta(t, 1.52, last.Knee.Ratio, 0.05)
	assert.InDelta(t, 0.96, last.Plateau, 0.005)
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"exit above enter", Options{PressureEnter: 0.7, PressureExit: 0.8}, "PressureExit"},
		{"enter past the knee", Options{PressureEnter: 1.2}, "PressureEnter"},
		{"negative hold", Options{TrappedHold: -time.Second}, "TrappedHold"},
		{"recover looser than drift", Options{RecoverTolerance: 0.06}, "RecoverTolerance"},
		{"knee", Options{KneeRatio: -1}, "KneeRatio"},
		{"plateau", Options{PlateauHit: 1.5}, "PlateauHit"},
		{"drift near", Options{DriftNear: 1.5}, "DriftNear"},
		{"collapse", Options{CollapseHit: 1}, "CollapseHit"},
		{"passive", Options{Passive: PassiveOptions{MinBins: 1}}, "Passive.MinBins"},
		{"fluid", Options{Fluid: FluidOptions{BinAlpha: 2}}, "Fluid.BinAlpha"},
		{"calibration", Options{Calibration: &Calibration{Version: 1}}, "Calibration: knee_ratio"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "detector options: "), err.Error())
		})
	}
	_, err := New(Options{})
	assert.NoError(t, err, "the defaults are valid")
}

func TestAssessmentJSON(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 6*time.Minute, func(off time.Duration) sample {
		if off < time.Minute {
			return sample{wc: 1.0, hit: 0.96}
		}
		return sample{wc: 1.72 + 0.002*float64(off/step), hit: 0.92, arrival: 6.6, completion: 2.0}
	})
	var a Assessment // the step that went pressure → drifting, short of the knee's edge and growing
	for _, x := range as {
		if x.Transition != nil && x.Transition.To == Drifting {
			a = x
		}
	}
	require.NotNil(t, a.TimeToTrap)
	require.NotNil(t, a.Transition)
	b, err := json.Marshal(a)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, "drifting", m["state"])
	assert.InDelta(t, a.TimeToTrap.Seconds(), m["time_to_trap_seconds"], 1e-9)
	assert.NotContains(t, m, "TimeToTrap")
	assert.Contains(t, m, "equilibria")
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(a))
	assert.Contains(t, buf.String(), "completions 0.0467/s < 0.90 × arrivals", "readable with SetEscapeHTML(false)")
	var back Assessment
	require.NoError(t, json.Unmarshal(b, &back))
	assert.InDelta(t, a.TimeToTrap.Seconds(), back.TimeToTrap.Seconds(), 1e-6)
	back.TimeToTrap = a.TimeToTrap
	assert.Equal(t, a.State, back.State)
	assert.Equal(t, a.Reasons, back.Reasons)
	assert.True(t, a.At.Equal(back.At))
}

func TestStaleSnapshotIgnored(t *testing.T) {
	d := newDetector(t, scriptOptions())
	runScript(t, d, 0, time.Minute, func(time.Duration) sample { return sample{wc: 1.6, hit: 0.96} })
	last, ok := d.Last()
	require.True(t, ok)
	a := d.Step(sample{wc: 0.5, hit: 0.96}.snapshot(t0.Add(30 * time.Second)))
	assert.Equal(t, last.At, a.At)
	assert.Equal(t, last.State, a.State)
	assert.Contains(t, a.Reasons[len(a.Reasons)-1], "not after the last step")
}

func TestNeeds(t *testing.T) {
	s := sample{wc: 1, hit: 0.9}.snapshot(t0)
	assert.Empty(t, s.Blind(Needs()), "the script provides exactly what the detector needs")
	assert.Len(t, Needs(), 7)
}

// TestColdCacheIsNotDrift: a cache warming up from empty is below its plateau without having left
// it; only a drop after reaching the plateau is drift. A collapse counts from the start.
func TestColdCacheIsNotDrift(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 3*time.Minute, func(off time.Duration) sample {
		return sample{wc: 0.3, hit: 0.8} // warming up
	})
	assert.Equal(t, Healthy, as[len(as)-1].State)
	as = runScript(t, d, 3*time.Minute+step, 5*time.Minute, func(time.Duration) sample { return sample{wc: 0.5, hit: 0.96} })
	assert.Equal(t, Healthy, as[len(as)-1].State)
	as = runScript(t, d, 5*time.Minute+step, 8*time.Minute, func(time.Duration) sample { return sample{wc: 0.5, hit: 0.85} })
	assert.Equal(t, Drifting, as[len(as)-1].State, "after the plateau, the same drop is drift")

	cold := newDetector(t, scriptOptions())
	as = runScript(t, cold, 0, 3*time.Minute, func(time.Duration) sample { return sample{wc: 2.5, hit: 0.3} })
	assert.Equal(t, Trapped, as[len(as)-1].State, "starting inside a collapse is still trapped")
}

// TestOverloadPressure: arrivals above the calibrated peak completion rate mean pressure after
// OverloadHold even with the working set far from the knee; a burst shorter than the hold does not,
// and pressure clears only once arrivals are back under the peak and W is under the exit line.
func TestOverloadPressure(t *testing.T) {
	cal := &Calibration{Version: 1, KneeRatio: 1.9, PlateauHit: 0.96, PeakCompletionRatePerS: 5.1 / 60,
		CallsPerSession: testK, Created: t0, Source: "test",
		Points: []Point{{WorkingSetOverCache: 0.5, HitRate: 0.96, Sessions: 20, CompletionRatePerS: 4.0 / 60}}}
	o := scriptOptions()
	o.Calibration = cal
	d := newDetector(t, o)
	as := runScript(t, d, 0, 8*time.Minute, func(off time.Duration) sample {
		switch {
		case off >= 30*time.Second && off < 40*time.Second: // a 10 s burst: under the hold
			return sample{wc: 0.6, hit: 0.96, arrival: 8}
		case off >= 2*time.Minute && off < 5*time.Minute: // a spike: 6.6/min > 5.1/min
			return sample{wc: 0.6, hit: 0.96, arrival: 6.6}
		}
		return sample{wc: 0.6, hit: 0.96}
	})
	assert.Equal(t, []string{"2m15s healthy→pressure", "5m15s pressure→healthy"}, transitions(as))
	tr := as[(2*time.Minute+15*time.Second)/step].Transition
	require.NotNil(t, tr)
	assert.Equal(t, []string{"arrivals 6.60/min > peak completion rate 5.10/min (calibration): no equilibrium at this rate, " +
		"the population grows towards the knee for 15s"}, tr.Reasons)
	assert.Contains(t, as[(4*time.Minute)/step].Reasons, "arrivals 6.60/min > peak completion rate 5.10/min (calibration): no equilibrium at this rate, "+
		"the population grows towards the knee for 2m0s", "pressure says what holds it")
	assert.Contains(t, as[(5*time.Minute+15*time.Second)/step].Transition.Reasons[0], "arrivals 3.30/min ≤ peak completion rate 5.10/min")
}

func TestResume(t *testing.T) {
	d := newDetector(t, scriptOptions())
	require.Error(t, d.Resume("stuck", t0))
	require.Error(t, d.Resume(Trapped, time.Time{}))
	require.NoError(t, d.Resume(Trapped, t0.Add(-time.Hour)))
	a := d.Step(sample{wc: 2.1, hit: 0.4}.snapshot(t0))
	assert.Equal(t, Trapped, a.State)
	assert.Equal(t, t0.Add(-time.Hour), a.Since)
	assert.Nil(t, a.Transition)
	require.Error(t, d.Resume(Healthy, t0), "only before the first step")
}

// TestRecalibrate: a calibration handed to a running detector is the knee of its next steps; W/C
// 1.5 is under pressure's entry with knee 1.9 (1.52) and over it with knee 1.7 (1.36).
func TestRecalibrate(t *testing.T) {
	cal := testCalibration(t)
	cal.KneeRatio = 1.9
	o := scriptOptions()
	o.Calibration = cal
	d := newDetector(t, o)
	as := runScript(t, d, 0, 2*time.Minute, func(time.Duration) sample { return sample{wc: 1.5, hit: 0.96} })
	last := as[len(as)-1]
	assert.Equal(t, Healthy, last.State)
	assert.Equal(t, 1.9, last.Knee.Ratio)

	moved := *cal
	moved.KneeRatio = 1.7
	require.NoError(t, d.Recalibrate(&moved))
	moved.KneeRatio = 9 // the detector keeps its own copy
	as = runScript(t, d, 2*time.Minute, 4*time.Minute, func(time.Duration) sample { return sample{wc: 1.5, hit: 0.96} })
	last = as[len(as)-1]
	assert.Equal(t, 1.7, last.Knee.Ratio)
	assert.Equal(t, Pressure, last.State, "the new knee puts W/C 1.5 in the pressure band")

	for name, c := range map[string]*Calibration{"nil": nil, "invalid": {KneeRatio: -1}} {
		assert.Error(t, d.Recalibrate(c), name)
	}
	learnt := newDetector(t, scriptOptions())
	assert.ErrorContains(t, learnt.Recalibrate(cal), "without a calibration")
}

// A time to the edge is a forecast within the hour λ's average moves in; further out, an idle
// deployment's +0.001 sessions/s is not a forecast of anything ("past the edge in 273h").
func TestEdgeForecast(t *testing.T) {
	for _, tc := range []struct {
		ttt  time.Duration
		want string
	}{
		{20 * time.Minute, "growing +0.030 sessions/s: past the edge in 20m0s"},
		{time.Hour, "growing +0.030 sessions/s: past the edge in 1h0m0s"},
		{273 * time.Hour, "not drifting toward the edge: 36.0 sessions below it, at +0.030 sessions/s more than 1h0m0s away"},
	} {
		assert.Equal(t, tc.want, edgeForecast(0.03, 36, tc.ttt))
	}
}

// No reason is said twice: a transition's reasons open the list, and what keeps the new state
// (the same conditions) is not repeated after them.
func TestReasonsAreNotRepeated(t *testing.T) {
	d := newDetector(t, scriptOptions())
	as := runScript(t, d, 0, 20*time.Minute, func(off time.Duration) sample {
		switch {
		case off < 2*time.Minute:
			return sample{wc: 1.0, hit: 0.96}
		case off < 4*time.Minute:
			return sample{wc: 1.6, hit: 0.96}
		case off < 6*time.Minute:
			return sample{wc: 1.7, hit: 0.88}
		case off < 10*time.Minute:
			return sample{wc: 2.1, hit: 0.41}
		case off < 12*time.Minute:
			return sample{wc: 1.5, hit: 0.6}
		}
		return sample{wc: 1.2, hit: 0.95}
	})
	transitions := 0
	for i, a := range as {
		if a.Transition != nil {
			transitions++
		}
		seen := map[string]bool{}
		for _, r := range a.Reasons {
			assert.False(t, seen[r], "step %d (%s): %q twice in %q", i, a.State, r, a.Reasons)
			seen[r] = true
		}
	}
	assert.Equal(t, 5, transitions)
}

// TestServedFractionFromTheGateway: the assessment carries the served fraction the fluid model
// smooths from the gateway's sessions in a call, and none without them.
func TestServedFractionFromTheGateway(t *testing.T) {
	d, err := New(scriptOptions())
	require.NoError(t, err)
	as := runScript(t, d, 0, time.Minute, func(time.Duration) sample { return sample{wc: 1, hit: 0.96} })
	assert.Nil(t, as[len(as)-1].ServedFraction, "no sessions in call read: unknown")
	var a Assessment
	for off := time.Minute + step; off <= 10*time.Minute; off += step {
		s := sample{wc: 1, hit: 0.96}.snapshot(t0.Add(off))
		s.Signals[collector.SessionsInCall] = collector.Value{V: 10, State: collector.OK, At: t0.Add(off)} // 10 of 40
		a = d.Step(s)
	}
	require.NotNil(t, a.ServedFraction)
	assert.InDelta(t, 0.25, *a.ServedFraction, 1e-9)
}
