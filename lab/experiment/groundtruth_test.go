package experiment

import (
	"encoding/json"
	"github.com/basin-dev/basin/sim/harness"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
)

func TestGroundTruthFindsTheBindingLimit(t *testing.T) {
	w, err := sim.SyntheticWorkload("terminal-bench")
	require.NoError(t, err)
	cases := []struct {
		name    string
		kv      int
		binding string
	}{
		{"small decode memory fills first", 200_000, DecodeFirst},
		{"ample decode memory: the cache collapses first", 800_000, CacheFirst},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dep, err := sim.DeploymentPreset("paper-1p1d-h100")
			require.NoError(t, err)
			dep.Decode.KVTokens = tc.kv
			// A 650K prefill cache (the preset's before the decode step was derived from bandwidth):
			// with the faster step the preset's 560K cache collapses at about the population where
			// 200K of decode memory fills, which would blur the first case.
			dep.Prefill.CacheTokens = 650_000
			gt, err := MeasureGroundTruth(dep, w, 1, 2, 120)
			require.NoError(t, err)
			assert.Equal(t, tc.binding, gt.Binding)
			assert.Greater(t, gt.Plateau, 0.9)
			b, err := json.Marshal(gt)
			require.NoError(t, err, "an unreached limit is written as null, not +Inf")
			assert.Contains(t, string(b), "null")
		})
	}
}

func TestRiskGridAndShape(t *testing.T) {
	grid, err := RiskGrid()
	require.NoError(t, err)
	assert.Len(t, grid, 36)
	names := map[string]bool{}
	for _, g := range grid {
		names[g.Name] = true
	}
	assert.Len(t, names, 36, "every deployment is distinct")

	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	require.NoError(t, err)
	short, long := grid[0].Workload, grid[2].Workload // tool medians 3 s and 12 s
	a, b := harness.Shape(dep, short, 1, 500), harness.Shape(dep, long, 1, 500)
	assert.Greater(t, a.ServedFraction, b.ServedFraction, "longer tools: fewer sessions in a call")
	assert.InDelta(t, a.MeanContext, b.MeanContext, 0.05*a.MeanContext, "tool time does not change contexts")
	assert.InDelta(t, 30, a.CallsPerSess, 1.5)
}
