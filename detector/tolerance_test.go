package detector

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// referenceTolerance is the spike ratio that just reaches edge from n, found on simCurve itself
// (not the learnt bins) with a fine Euler step: an independent reading of the same fluid model.
func referenceTolerance(n, lambdaPerMin, edge float64) float64 {
	lambda := lambdaPerMin / 60
	end := func(m float64) float64 {
		x := n
		for range 6000 { // 0.1-s steps over ten minutes
			x = max(0, x+(m*lambda-simCurve(x)/60)*0.1)
		}
		return x
	}
	lo, hi := 1.0, MaxSpikeRatio
	for range 50 {
		mid := (lo + hi) / 2
		if end(mid) < edge {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

func TestSpikeTolerance(t *testing.T) {
	const lambda = 3.3 // sessions/min: stable N ≈ 25.9, unstable N = 40 + 1.8/0.23 ≈ 47.8
	edge := 40 + 1.8/0.23
	c := learnt(t, 80, lambda)
	k, ok := c.f.K()
	require.True(t, ok)
	prev := MaxSpikeRatio + 1
	for _, n := range []float64{10, 26, 35, 42, 46} {
		t.Run(fmt.Sprintf("N=%v", n), func(t *testing.T) {
			tol, ok := c.f.SpikeTolerance(n, lambda/60, k, edge)
			require.True(t, ok)
			want := referenceTolerance(n, lambda, edge)
			assert.InEpsilon(t, want, tol.Ratio, 0.03, "ratio against a fine-step integration of the true curve")
			assert.InDelta(t, (tol.Ratio-1)*lambda*10, tol.Sessions, 1e-6, "sessions = (ratio − 1) × λ × 10 min")
			assert.Less(t, tol.Ratio, prev, "the nearer the edge, the smaller the spike it absorbs")
			prev = tol.Ratio
		})
	}

	t.Run("at or past the edge it absorbs nothing", func(t *testing.T) {
		tol, ok := c.f.SpikeTolerance(edge+1, lambda/60, k, edge)
		require.True(t, ok)
		assert.Equal(t, SpikeTolerance{Ratio: 1}, tol)
	})
	t.Run("growing past the edge without a spike absorbs nothing", func(t *testing.T) {
		// λ above the curve's peak (5.1/min): N grows whatever it is.
		tol, ok := c.f.SpikeTolerance(30, 6.0/60, k, edge)
		require.True(t, ok)
		assert.Equal(t, 1.0, tol.Ratio)
	})
	t.Run("an edge out of reach is a lower bound", func(t *testing.T) {
		tol, ok := c.f.SpikeTolerance(1, 0.05/60, k, 70)
		require.True(t, ok)
		assert.True(t, tol.Capped)
		assert.Equal(t, MaxSpikeRatio, tol.Ratio)
	})
	t.Run("unknown without arrivals, K, an edge or a curve", func(t *testing.T) {
		empty, err := NewFluid(FluidOptions{})
		require.NoError(t, err)
		for name, call := range map[string]func() (SpikeTolerance, bool){
			"no arrivals": func() (SpikeTolerance, bool) { return c.f.SpikeTolerance(26, 0, k, edge) },
			"no K":        func() (SpikeTolerance, bool) { return c.f.SpikeTolerance(26, lambda/60, 0, edge) },
			"no edge":     func() (SpikeTolerance, bool) { return c.f.SpikeTolerance(26, lambda/60, k, 0) },
			"no curve":    func() (SpikeTolerance, bool) { return empty.SpikeTolerance(26, lambda/60, k, edge) },
		} {
			_, ok := call()
			assert.False(t, ok, name)
		}
	})
}

// TestOutlookCarriesSpikeTolerance: the outlook (and so the assessment) reports the tolerance at
// the current population against the edge it reports.
func TestOutlookCarriesSpikeTolerance(t *testing.T) {
	c := learnt(t, 80, 3.3)
	out := c.f.Outlook(26, 1.9, 70*25_000/1.9)
	require.NotNil(t, out.SpikeTolerance)
	require.NotNil(t, out.Edge)
	want, ok := c.f.SpikeTolerance(26, out.Lambda, out.K, *out.Edge)
	require.True(t, ok)
	assert.Equal(t, want, *out.SpikeTolerance)
	assert.Greater(t, out.SpikeTolerance.Ratio, 1.0)
}

// TestSpikeToleranceUnknownShortOfTheEdge: a deployment seen only around where it runs (its
// completions matching its arrivals) has shown nothing of how it completes the sessions a spike
// adds, and must not be read as absorbing nothing.
func TestSpikeToleranceUnknownShortOfTheEdge(t *testing.T) {
	for _, seen := range []int{26, 40} {
		c := learnt(t, seen, 3.3)
		k, _ := c.f.K()
		for _, n := range []float64{20, 26} {
			_, ok := c.f.SpikeTolerance(n, 3.3/60, k, 47.8)
			assert.False(t, ok, "curve seen up to N=%d, from N=%v", seen, n)
		}
	}
	c := learnt(t, 52, 3.3)
	k, _ := c.f.K()
	_, ok := c.f.SpikeTolerance(26, 3.3/60, k, 47.8)
	assert.True(t, ok, "seen up to the edge")
}

func TestCalibratedOutlook(t *testing.T) {
	cal := &Calibration{CallsPerSession: testK, KneeRatio: 1.9}
	for n := 2.0; n <= 80; n += 2 {
		cal.Points = append(cal.Points, Point{Sessions: n, CompletionRatePerS: simCurve(n) / 60})
	}
	out, err := CalibratedOutlook(cal, -1, 3.3/60, 25_000, 70*25_000/1.9)
	require.NoError(t, err)
	require.NotNil(t, out.Equilibria.Stable)
	assert.InDelta(t, 3.3*40/5.1, *out.Equilibria.Stable, 0.5, "settles at the stable point")
	require.NotNil(t, out.SpikeTolerance)
	want := referenceTolerance(*out.Equilibria.Stable, 3.3, 40+1.8/0.23)
	assert.InEpsilon(t, want, out.SpikeTolerance.Ratio, 0.03)

	for name, tc := range map[string]struct {
		cal          *Calibration
		lambda, ctx  float64
		wantContains string
	}{
		"no points":       {&Calibration{CallsPerSession: testK}, 3.3 / 60, 25_000, "no points"},
		"no K":            {&Calibration{Points: cal.Points}, 3.3 / 60, 25_000, "calls_per_session"},
		"no arrivals":     {cal, 0, 25_000, "arrival rate"},
		"no mean context": {cal, 3.3 / 60, 0, "mean context"},
		"above the peak":  {cal, 6.0 / 60, 25_000, "no stable equilibrium"},
	} {
		_, err := CalibratedOutlook(tc.cal, -1, tc.lambda, tc.ctx, 70*25_000/1.9)
		assert.ErrorContains(t, err, tc.wantContains, name)
	}
}
