package experiment

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestToleranceSummary(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	r := &ToleranceResult{Points: []TolerancePoint{
		{Predicted: f(3), Simulated: 2.5},
		{Predicted: f(2), Simulated: 2},
		// Under the alert line while the simulator says it survives +100%: a false low.
		{Predicted: f(1.4), Simulated: 2.2},
		// Under the line and trapped by +100%: a true warning.
		{Predicted: f(1.2), Simulated: 1.1},
		// Bounds take part in the ranking but not in the ratios.
		{Predicted: f(1.1), Simulated: 1, Bound: BoundBelow},
		{Predicted: f(20), PredictedCapped: true, Simulated: 8, Bound: BoundAbove},
		// An unknown prediction is left out.
		{Simulated: 3},
	}}
	r.summarise()
	assert.Equal(t, 1, r.FalseLow)
	assert.Equal(t, 6, r.Ranked)
	assert.Equal(t, 4, r.Ratios)
	require.NotNil(t, r.MedianRatio)
	// Ratios 1.2, 1, 0.636, 1.091: the median is the mean of 1 and 1.091.
	assert.InDelta(t, (1+1.2/1.1)/2, *r.MedianRatio, 1e-9)
	require.NotNil(t, r.Spearman)
	assert.Less(t, *r.Spearman, 1.0, "the false low breaks the order")
	assert.Greater(t, *r.Spearman, 0.8)
}

func TestToleranceSpecValidate(t *testing.T) {
	require.NoError(t, DefaultToleranceSpec().Validate())
	require.NoError(t, QuickToleranceSpec().Validate())
	s := DefaultToleranceSpec()
	s.Steps, s.MaxMultiplier, s.Loads = 0, 1, []float64{-1}
	err := s.Validate()
	require.Error(t, err)
	for _, field := range []string{"steps", "max multiplier", "loads"} {
		assert.Contains(t, err.Error(), field)
	}
	assert.GreaterOrEqual(t, len(DefaultToleranceSpec().Deployments)*len(DefaultToleranceSpec().Tiers)*
		len(DefaultToleranceSpec().Loads), 24, "the issue asks for at least 24 points")
}

// TestRunTolerance runs a small slice twice with different worker counts: the same bytes come
// out, the prediction falls with the load, and the simulated tolerance brackets the threshold
// the runs show (the last multiplier that trapped is the reported one).
func TestRunTolerance(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	spec := ToleranceSpec{Deployments: []string{"1p3d"}, Tiers: []Tier{TierGPU}, Workload: "terminal-bench",
		Loads: []float64{0.5, 0.9}, Seeds: []uint64{1, 2, 3}, Steps: 3, MaxMultiplier: 8, Workers: 1}
	a, err := RunTolerance(spec, nil)
	require.NoError(t, err)
	spec.Workers = 2
	b, err := RunTolerance(spec, nil)
	require.NoError(t, err)
	ja, _ := json.Marshal(a.Points)
	jb, _ := json.Marshal(b.Points)
	assert.Equal(t, string(ja), string(jb), "results must not depend on the worker count")

	require.Len(t, a.Points, 2)
	low, high := a.Points[0], a.Points[1]
	require.NotNil(t, low.Predicted)
	require.NotNil(t, high.Predicted)
	assert.Greater(t, *low.Predicted, *high.Predicted, "a busier deployment absorbs less")
	assert.Greater(t, low.Simulated, high.Simulated)
	for _, p := range a.Points {
		require.Empty(t, p.Bound, "both loads have their threshold inside 1–8×")
		require.Len(t, p.Tries, 2+spec.Steps)
		// The reported tolerance is the smallest multiplier tried that trapped the majority, and
		// every multiplier under it that was tried did not.
		for _, tr := range p.Tries {
			trapped := 2*tr.Trapped >= len(spec.Seeds)
			if tr.Multiplier < p.Simulated {
				assert.False(t, trapped, "×%.3f under the reported %.3f trapped", tr.Multiplier, p.Simulated)
			}
			if tr.Multiplier == p.Simulated {
				assert.True(t, trapped)
			}
		}
	}
	var md bytes.Buffer
	require.NoError(t, ToleranceMarkdown(&md, a, "basin sim tolerance"))
	assert.Contains(t, md.String(), "| 1p3d | gpu | 0.50 |")
	assert.Contains(t, md.String(), "Spearman rank correlation")
}
