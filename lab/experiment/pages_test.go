package experiment

import (
	"bytes"
	"github.com/basin-dev/basin/sim/harness"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

func TestPageMin(t *testing.T) {
	at := func(min float64) time.Time { return harness.Epoch.Add(time.Duration(min * float64(time.Minute))) }
	tr := func(from, to detector.State, min float64) detector.Transition {
		return detector.Transition{From: from, To: to, At: at(min)}
	}
	const (
		H, P, D, T = detector.Healthy, detector.Pressure, detector.Drifting, detector.Trapped
	)
	cases := []struct {
		name string
		trs  []detector.Transition
		want *float64
	}{
		{"pressure never pages", []detector.Transition{tr(H, P, 10), tr(P, H, 40)}, nil},
		{"drifting for 4.5 min does not page", []detector.Transition{tr(H, P, 10), tr(P, D, 11), tr(D, P, 15.5)}, nil},
		{"drifting for five minutes pages", []detector.Transition{tr(H, P, 10), tr(P, D, 11), tr(D, P, 16.5)}, ptr(16)},
		{"drifting then trapped: trapped's own wait", []detector.Transition{tr(H, D, 10), tr(D, T, 14), tr(T, P, 14.5)}, nil},
		{"trapped to the end pages", []detector.Transition{tr(H, D, 10), tr(D, T, 10.5)}, ptr(11.5)},
		{"entered 30 s before the end does not", []detector.Transition{tr(H, D, 89.5)}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := DetectionRun{DurationMin: 90, Obs: &harness.Observation{Transitions: tc.trs}}
			got := r.PageMin()
			if tc.want == nil {
				assert.Nil(t, got)
				assert.False(t, r.FalsePage())
				return
			}
			require.NotNil(t, got)
			assert.InDelta(t, *tc.want, *got, 1e-9)
			assert.True(t, r.FalsePage(), "paged without a collapse")
			r.Collapsed = true
			assert.False(t, r.FalsePage(), "a page in a collapsed run is a true page")
		})
	}
}

func ptr(v float64) *float64 { return &v }

func TestPagesMarkdown(t *testing.T) {
	at := func(min float64) time.Time { return harness.Epoch.Add(time.Duration(min * float64(time.Minute))) }
	paged := &harness.Observation{Transitions: []detector.Transition{{From: detector.Healthy, To: detector.Drifting, At: at(20)},
		{From: detector.Drifting, To: detector.Healthy, At: at(26)}}, FirstDriftingMin: ptr(20)}
	brief := &harness.Observation{Transitions: []detector.Transition{{From: detector.Healthy, To: detector.Drifting, At: at(20)},
		{From: detector.Drifting, To: detector.Healthy, At: at(24)}}, UtilisationFirstMin: ptr(21),
		FirstDriftingMin: ptr(20)}
	// Pressure held 2 min notifies (BasinCacheKneeApproaching's for:), held 1.9 min does not, and
	// a spell that lasts to the end of the run counts when the end is 2 min away.
	pressed := &harness.Observation{Transitions: []detector.Transition{{From: detector.Healthy, To: detector.Pressure, At: at(10)},
		{From: detector.Pressure, To: detector.Healthy, At: at(12)}, {From: detector.Healthy, To: detector.Pressure, At: at(30)},
		{From: detector.Pressure, To: detector.Healthy, At: at(31.9)}, {From: detector.Healthy, To: detector.Pressure, At: at(88)}}}
	runs := []DetectionRun{
		{Scenario: "a", Seed: 1, DurationMin: 90, Obs: pressed},
		{Scenario: "a", Seed: 2, DurationMin: 90, Obs: brief},
		{Scenario: "a-spike33", Seed: 1, DurationMin: 90, Obs: paged},
		{Scenario: "a-spike", Seed: 1, DurationMin: 90, Obs: paged, Collapsed: true},
	}
	var b bytes.Buffer
	require.NoError(t, PagesMarkdown(&b, runs))
	out := b.String()
	// a: the brief drift is a drifting state but no page; its utilisation alert is a false page.
	// Its two pressure spells over 3 hours are 0.7 an hour.
	assert.Contains(t, out, "| a | 2 | 2 | 0 | 1 | 1 | 2 (0.7) | 0 of 0 |")
	assert.Contains(t, out, "| a-spike33 | 1 | 1 | 1 | 0 | 1 | 0 (0.0) | 0 of 0 |")
	assert.Contains(t, out, "| a-spike | 1 | 0 | 0 | 0 | 0 | — | 1 of 1 |", "no run that did not collapse: no hours to count")
	assert.Contains(t, out, "did not collapse: 2, 0.4 an hour")
	assert.Contains(t, out, "healthy presets: a 0 in 2")
	assert.Contains(t, out, "together 1 in 3 (target ≤ 1; utilisation alerts: 1)")
}
