package harness

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/predictor"
	"github.com/basin-dev/basin/sim"
)

// The feature's measured rank correlation with the true peak, over sessions the predictor was not
// fitted on, is the parameter: the matrix's "default", "0" and "1.0" rows mean what they say.
func TestPeakSignalSpearmanIsTheParameter(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	for _, kind := range []string{"terminal-bench", "swebench-pro"} {
		w, err := sim.SyntheticWorkload(kind)
		require.NoError(t, err)
		for _, rho := range []float64{0, 0.3, w.PeakSpearman, 0.9, 1} {
			sig, err := NewPeakSignal(w, rho, 7, PeakSignalSessions)
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(99, 1))
			const n = 20000
			feat, peak := make([]float64, n), make([]float64, n)
			for i := range n {
				s := w.Session(rng)
				info := sim.SessionInfo{TruePeak: s.PeakContext(), SignalNoise: s.SignalNoise()}
				feat[i], peak[i] = sig.Feature(info), float64(info.TruePeak)
			}
			got := predictor.Spearman(feat, peak)
			assert.InDelta(t, rho, got, 0.03, "%s: feature's Spearman with the true peak at ρ = %.2f", kind, rho)
		}
	}
}

func TestPeakSignalPredictions(t *testing.T) {
	w, err := sim.SyntheticWorkload("terminal-bench")
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 3))
	var infos []sim.SessionInfo
	for range 500 {
		s := w.Session(rng)
		infos = append(infos, sim.SessionInfo{TruePeak: s.PeakContext(), SignalNoise: s.SignalNoise()})
	}
	t.Run("blind predicts the median for everyone", func(t *testing.T) {
		sig, err := NewPeakSignal(w, 0, 1, PeakSignalSessions)
		require.NoError(t, err)
		first := sig.Predict(infos[0])
		for _, in := range infos {
			assert.Equal(t, first, sig.Predict(in))
		}
		assert.InDelta(t, sig.quantile(0.5), float64(first), 1)
	})
	t.Run("rho 1 predicts the true peak inside the training range", func(t *testing.T) {
		sig, err := NewPeakSignal(w, 1, 1, PeakSignalSessions)
		require.NoError(t, err)
		for _, in := range infos {
			if p := float64(in.TruePeak); p > sig.peaks[0] && p < sig.peaks[len(sig.peaks)-1] {
				assert.InDelta(t, in.TruePeak, sig.Predict(in), 1)
			}
		}
	})
	t.Run("predictions are monotone in the feature", func(t *testing.T) {
		sig, err := NewPeakSignal(w, 0.64, 1, PeakSignalSessions)
		require.NoError(t, err)
		prev := int64(0)
		for f := -3.0; f <= 3; f += 0.25 {
			p := sig.PredictFeature(f)
			assert.GreaterOrEqual(t, p, prev)
			prev = p
		}
	})
	t.Run("noise is fixed per session and independent of the stream", func(t *testing.T) {
		a := w.Session(rand.New(rand.NewPCG(5, 5)))
		b := w.Session(rand.New(rand.NewPCG(5, 5)))
		assert.Equal(t, a.SignalNoise(), b.SignalNoise())
		assert.NotEqual(t, a.SignalNoise(), w.Session(rand.New(rand.NewPCG(6, 6))).SignalNoise())
	})
	for _, bad := range []float64{-0.1, 1.1} {
		_, err := NewPeakSignal(w, bad, 1, 100)
		assert.ErrorContains(t, err, "spearman")
	}
}
