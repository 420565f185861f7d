package detector

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stepEvaluation is the evaluation a step at t0 makes of a reading at W/C wc and hit rate hit
// (reading: whether the window's hit rate is one), with the script's options and knee 1.9.
func stepEvaluation(t *testing.T, wc, hit float64, reading bool, s State) evaluation {
	t.Helper()
	o := scriptOptions().withDefaults()
	require.NoError(t, o.Validate())
	knee := Knee{Ratio: 1.9, PlateauHit: 0.96}
	obs := observation{w: wc * testCache, c: testCache, hit: hit, hitFresh: true}
	return newEvaluation(o, t0, obs, knee, Outlook{}, Evidence{Enough: reading}, s)
}

func TestNewEvaluationLines(t *testing.T) {
	tests := []struct {
		name      string
		estimated bool
		state     State
		nearLine  float64
	}{
		{"measured working set", false, Healthy, DefaultDriftNear * 1.9},
		{"engines' estimate: a full cache counts", true, Drifting, DefaultDriftNear},
		{"recovering: a relapse counts anywhere", false, Recovering, 0},
		{"recovering on the estimate", true, Recovering, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := scriptOptions().withDefaults()
			obs := observation{w: testCache, c: testCache, wEstimated: tc.estimated}
			e := newEvaluation(o, t0, obs, Knee{Ratio: 1.9, PlateauHit: 0.96}, Outlook{}, Evidence{}, tc.state)
			assert.InDelta(t, tc.nearLine, e.nearLine, 1e-12)
			assert.Equal(t, 1.0, e.ratio)
			assert.Equal(t, 0.96, e.plateau)
			assert.Equal(t, 0.5, e.collapse, "min(0.5, 0.6 × 0.96)")
			assert.InDelta(t, 0.91, e.driftLine, 1e-12)
			assert.InDelta(t, 0.55, e.recoverLine, 1e-12)
		})
	}
}

func TestWarmPlateau(t *testing.T) {
	warm := scriptOptions().PlateauWarmup // 15 s
	tests := []struct {
		name      string
		hit       float64
		reading   bool
		on        bool
		since     time.Time
		wantOn    bool
		wantSince time.Time
	}{
		{"first reading on the plateau starts the count", 0.95, true, false, time.Time{}, false, t0},
		{"not yet warm", 0.95, true, false, t0.Add(-warm + time.Second), false, t0.Add(-warm + time.Second)},
		{"warm after the warm-up", 0.95, true, false, t0.Add(-warm), true, t0.Add(-warm)},
		{"under the drift line starts again", 0.90, true, false, t0.Add(-warm + time.Second), false, time.Time{}},
		{"under the drift line once warm stays warm", 0.90, true, true, t0.Add(-time.Hour), true, time.Time{}},
		{"a quiet window keeps the count", 0.10, false, false, t0.Add(-time.Second), false, t0.Add(-time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := stepEvaluation(t, 1.0, tc.hit, tc.reading, Healthy)
			on, since := e.warmPlateau(tc.on, tc.since)
			assert.Equal(t, tc.wantOn, on)
			assert.Equal(t, tc.wantSince, since)
		})
	}
}

func TestSmoothFlow(t *testing.T) {
	win := DefaultDriftFlowWindow
	w := 1 - math.Exp(-(5*time.Second).Seconds()/win.Seconds())
	tests := []struct {
		name               string
		arr, done          float64
		at                 time.Time
		wantArr, wantDone  float64
		arrival, completed float64
	}{
		{"the first reading starts them", 9, 9, time.Time{}, 2, 1, 2, 1},
		{"a step later they move by its weight", 1, 1, t0.Add(-5 * time.Second), 1 + w*(2-1), 1 + w*(0.5-1), 2, 0.5},
		{"no time passed: unchanged", 1, 1, t0, 1, 1, 2, 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := stepEvaluation(t, 1.0, 0.95, true, Healthy)
			e.obs.arrival, e.obs.completion = tc.arrival, tc.completed
			arr, done := e.smoothFlow(tc.arr, tc.done, tc.at)
			assert.InDelta(t, tc.wantArr, arr, 1e-12)
			assert.InDelta(t, tc.wantDone, done, 1e-12)
		})
	}
}

func TestTimeHolds(t *testing.T) {
	earlier := t0.Add(-time.Minute)
	var holds [numConds]time.Time
	holds[cCollapse], holds[cOnPlateau] = earlier, earlier
	var truth [numConds]bool
	truth[cCollapse], truth[cPressureEnter] = true, true
	got := timeHolds(holds, truth, t0)
	tests := []struct {
		name string
		c    cond
		want time.Time
	}{
		{"still true keeps its start", cCollapse, earlier},
		{"newly true starts now", cPressureEnter, t0},
		{"false restarts", cOnPlateau, time.Time{}},
		{"still false stays zero", cDriftHit, time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, got[tc.c])
		})
	}
}

func TestConditions(t *testing.T) {
	edge := 30.0
	tests := []struct {
		name      string
		wc, hit   float64
		reading   bool
		state     State
		onPlateau bool
		n         float64
		peak      float64
		arrival   float64
		want      []cond // in the order of their declaration
	}{
		{name: "healthy on the plateau", wc: 1.0, hit: 0.96, reading: true, onPlateau: true,
			want: []cond{cPressureExit, cDriftClear, cRecoverable, cOnPlateau}},
		{name: "pressure band", wc: 1.6, hit: 0.96, reading: true, onPlateau: true,
			want: []cond{cPressureEnter, cDriftClear, cRecoverable, cOnPlateau}},
		{name: "off the plateau once warm: drift", wc: 1.7, hit: 0.88, reading: true, onPlateau: true,
			want: []cond{cPressureEnter, cDriftHit, cRecoverable}},
		{name: "off the plateau while warming: no drift", wc: 1.7, hit: 0.88, reading: true,
			want: []cond{cPressureEnter, cDriftClear, cRecoverable}},
		{name: "collapse near the knee", wc: 2.1, hit: 0.41, reading: true, onPlateau: true,
			want: []cond{cPressureEnter, cDriftHit, cCollapse}},
		{name: "a cold cache far from the knee is no collapse", wc: 0.5, hit: 0.41, reading: true,
			want: []cond{cPressureExit}},
		{name: "recovering: a relapse counts anywhere", wc: 0.5, hit: 0.41, reading: true, state: Recovering,
			want: []cond{cPressureExit, cCollapse}},
		{name: "no reading, roomy: vouched for", wc: 1.0, hit: 0, reading: false,
			want: []cond{cPressureExit, cDriftClear, cRecoverable, cOnPlateau}},
		{name: "no reading, not roomy: neither", wc: 1.4, hit: 0, reading: false},
		{name: "overload above the peak", wc: 1.0, hit: 0.96, reading: true, peak: 0.05, arrival: 0.06,
			want: []cond{cOverload, cDriftClear, cRecoverable, cOnPlateau}},
		{name: "past an estimated edge needs a low hit", wc: 1.0, hit: 0.96, reading: true, n: 40,
			want: []cond{cPressureExit, cDriftClear, cRecoverable, cOnPlateau}},
		{name: "past an estimated edge with a low hit", wc: 1.2, hit: 0.6, reading: true, n: 40,
			want: []cond{cPressureExit, cDriftClear, cPastEdge, cRecoverable}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.state == "" {
				tc.state = Healthy
			}
			e := stepEvaluation(t, tc.wc, tc.hit, tc.reading, tc.state)
			e.obs.n, e.obs.arrival, e.peak = tc.n, tc.arrival, tc.peak
			e.out.Edge = &edge
			truth := e.conditions(tc.onPlateau)
			var got []cond
			for c, ok := range truth {
				if ok {
					got = append(got, cond(c))
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
