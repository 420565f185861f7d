package experiment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim/scenario"
)

// The paper-eval-* presets reproduce the Basin paper's experimental conditions from how its
// baselines behaved: the engine baseline (SGLang default, or HiCache with a host tier) is healthy
// without the spike and stuck after it, and Continuum does not get stuck but runs under its
// pre-spike hit rate while new sessions wait minutes. When the engine model moves and this fails,
// re-derive the rates from the matrix rows the presets name.
func TestEvalPresetsReproduceTheBaselines(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	for _, tc := range []struct {
		name, engine string
		// dip is the least drop of continuum's hit rate after the spike: the paper saw 10–15
		// points. With a host tier on 1P3D the model gives ≈ 3 points or a stuck continuum (from
		// 14.0/min, the preset runs 13.5): the host-tier gap of docs/fidelity.md (e).
		dip float64
	}{
		{"paper-eval-1p3d-h200", "none", 0.04},
		{"paper-eval-1p3d-h200-host", "hicache", 0.02},
		{"paper-eval-1p1d-h100", "none", 0.04},
		{"paper-eval-1p1d-h100-host", "hicache", 0.04},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := scenario.Load(tc.name)
			require.NoError(t, err)
			calm := sc.WithoutSpikes()
			engine, err := scenario.Run(sc, tc.engine, nil)
			require.NoError(t, err)
			engineCalm, err := scenario.Run(calm, tc.engine, nil)
			require.NoError(t, err)
			cont, err := scenario.Run(sc, "continuum", nil)
			require.NoError(t, err)
			contCalm, err := scenario.Run(calm, "continuum", nil)
			require.NoError(t, err)
			t.Logf("%s: hit %.3f → %.3f, goodput %.0f → %.0f; continuum hit %.3f → %.3f, goodput %.0f → %.0f, first-call wait p90 %.0f s",
				tc.engine, *engineCalm.HitRateMeanWindow, *engine.HitRateMeanWindow, engineCalm.GoodputPerHour, engine.GoodputPerHour,
				*contCalm.HitRateMeanWindow, *cont.HitRateMeanWindow, contCalm.GoodputPerHour, cont.GoodputPerHour, *cont.FirstCallWaitP90)
			assert.Greater(t, *engineCalm.HitRateMeanWindow, 0.9, "healthy without the spike")
			assert.Less(t, *engine.HitRateMeanWindow, 0.45, "stuck after it (the paper: hit ≈ 0.27–0.33)")
			assert.Less(t, engine.GoodputPerHour, 0.2*engineCalm.GoodputPerHour)
			assert.Greater(t, *cont.HitRateMeanWindow, 0.6, "continuum is not stuck")
			assert.Greater(t, cont.GoodputPerHour, 0.6*contCalm.GoodputPerHour)
			assert.Greater(t, *contCalm.HitRateMeanWindow-*cont.HitRateMeanWindow, tc.dip, "but runs under its pre-spike hit rate")
			assert.Greater(t, *cont.FirstCallWaitP90, 60.0, "and new sessions wait minutes")
		})
	}
}
