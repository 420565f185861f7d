package predictor_test

import (
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/predictor"
)

func TestFallbackPredictPeak(t *testing.T) {
	seq := func(lo, hi int64) []int64 {
		var s []int64
		for v := lo; v <= hi; v++ {
			s = append(s, v*1000)
		}
		return s
	}
	tests := []struct {
		name        string
		o           predictor.FallbackOptions
		observe     []int64
		firstPrompt int
		want        int64
		observed    int
	}{
		{name: "nothing observed: 4× the first prompt", firstPrompt: 25600, want: 102400},
		{name: "nothing observed, own multiplier", o: predictor.FallbackOptions{Multiplier: 2.5}, firstPrompt: 1000, want: 2500},
		{name: "nothing observed, capped", firstPrompt: 5_000_000, want: predictor.MaxPeak},
		{name: "nothing observed, no first prompt", firstPrompt: 0, want: 0},
		{name: "0.9 quantile of 1K..100K", observe: seq(1, 100), firstPrompt: 1000, want: 90_000, observed: 100},
		{name: "order of observation does not matter", observe: reversed(seq(1, 100)), firstPrompt: 1000, want: 90_000, observed: 100},
		{name: "never below the first prompt", observe: seq(1, 100), firstPrompt: 95_000, want: 95_000, observed: 100},
		{name: "median", o: predictor.FallbackOptions{Quantile: 0.5}, observe: seq(1, 100), want: 50_000, observed: 100},
		{name: "quantile 1 is the largest", o: predictor.FallbackOptions{Quantile: 1}, observe: seq(1, 100), want: 100_000, observed: 100},
		{name: "exact rank despite rounding (0.7×10)", o: predictor.FallbackOptions{Quantile: 0.7}, observe: seq(1, 10), want: 7000, observed: 10},
		{name: "nearest rank rounds up", o: predictor.FallbackOptions{Quantile: 0.75}, observe: seq(1, 10), want: 8000, observed: 10},
		{name: "one observation", observe: []int64{7000}, firstPrompt: 10, want: 7000, observed: 1},
		{name: "window keeps the latest", o: predictor.FallbackOptions{Window: 10, Quantile: 0.1}, observe: seq(1, 100), want: 91_000, observed: 10},
		{
			name:    "window evicts the oldest, not the smallest",
			o:       predictor.FallbackOptions{Window: 3, Quantile: 0.3},
			observe: []int64{5000, 1000, 9000, 2000}, // keeps 1000, 9000, 2000
			want:    1000, observed: 3,
		},
		{
			name:    "evicting a duplicate keeps the other",
			o:       predictor.FallbackOptions{Window: 3, Quantile: 1},
			observe: []int64{9000, 9000, 1000, 2000}, // keeps 9000, 1000, 2000
			want:    9000, observed: 3,
		},
		{name: "non-positive peaks are ignored", observe: []int64{0, -5}, firstPrompt: 100, want: 400, observed: 0},
		// A handful of peaks are the short sessions that ended first: they may raise the
		// know-nothing guess, never lower it, until MinObserved are kept.
		{name: "few peaks never lower the guess", observe: seq(1, 5), firstPrompt: 10_000, want: 40_000, observed: 5},
		{name: "few peaks may raise it", observe: []int64{70_000}, firstPrompt: 10_000, want: 70_000, observed: 1},
		{name: "MinObserved peaks: the quantile", observe: seq(1, 20), firstPrompt: 10_000, want: 18_000, observed: 20},
		{name: "own MinObserved", o: predictor.FallbackOptions{MinObserved: 1}, observe: []int64{7000}, firstPrompt: 5000, want: 7000, observed: 1},
		{name: "MinObserved is capped at a smaller window", o: predictor.FallbackOptions{Window: 3}, observe: seq(1, 3), firstPrompt: 2000, want: 3000, observed: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := predictor.NewFallback(tt.o)
			require.NoError(t, err)
			for _, p := range tt.observe {
				f.Observe(p)
			}
			assert.Equal(t, tt.want, f.PredictPeak("refactor everything", 100, tt.firstPrompt))
			assert.Equal(t, tt.observed, f.Observed())
		})
	}
}

func reversed(s []int64) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

func TestFallbackZeroValueUsesDefaults(t *testing.T) {
	var f predictor.Fallback
	assert.Equal(t, int64(4000), f.PredictPeak("", 0, 1000))
	for v := int64(1); v <= 2000; v++ {
		f.Observe(v)
	}
	assert.Equal(t, predictor.DefaultWindow, f.Observed())
	// The window holds 1001..2000; the 900th smallest is 1900.
	assert.Equal(t, int64(1900), f.PredictPeak("", 0, 1))
}

func TestNewFallbackRejects(t *testing.T) {
	tests := []struct {
		name  string
		o     predictor.FallbackOptions
		field string
	}{
		{"negative window", predictor.FallbackOptions{Window: -1}, "FallbackOptions.Window"},
		{"huge window", predictor.FallbackOptions{Window: 1 << 30}, "FallbackOptions.Window"},
		{"quantile above 1", predictor.FallbackOptions{Quantile: 1.5}, "FallbackOptions.Quantile"},
		{"negative quantile", predictor.FallbackOptions{Quantile: -0.1}, "FallbackOptions.Quantile"},
		{"NaN quantile", predictor.FallbackOptions{Quantile: math.NaN()}, "FallbackOptions.Quantile"},
		{"shrinking multiplier", predictor.FallbackOptions{Multiplier: 0.5}, "FallbackOptions.Multiplier"},
		{"infinite multiplier", predictor.FallbackOptions{Multiplier: math.Inf(1)}, "FallbackOptions.Multiplier"},
		{"MinObserved past the window", predictor.FallbackOptions{Window: 10, MinObserved: 11}, "FallbackOptions.MinObserved"},
		{"negative MinObserved", predictor.FallbackOptions{MinObserved: -1}, "FallbackOptions.MinObserved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := predictor.NewFallback(tt.o)
			require.Error(t, err)
			assert.Nil(t, f)
			var fe *predictor.FieldError
			require.True(t, errors.As(err, &fe), "error %q is not a *FieldError", err)
			assert.Equal(t, tt.field, fe.Field)
		})
	}
}

// TestFallbackConcurrent observes and predicts from many goroutines; run with -race. The window
// ends up holding exactly the 1000 observed peaks whatever the interleaving, so the final
// quantile is known.
func TestFallbackConcurrent(t *testing.T) {
	f, err := predictor.NewFallback(predictor.FallbackOptions{})
	require.NoError(t, err)
	const workers, each = 8, 125
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				f.Observe(int64(w*each + i + 1))
				p := f.PredictPeak("", 0, 1)
				if p < 1 || p > workers*each {
					t.Errorf("prediction %d outside the observed peaks", p)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, workers*each, f.Observed())
	assert.Equal(t, int64(900), f.PredictPeak("", 0, 1))
}

// TestModelConcurrent predicts from one model in many goroutines; run with -race.
func TestModelConcurrent(t *testing.T) {
	m, _ := trained(t)
	text := task(50, 3, "refactor")
	want := m.PredictPeak(text, len(text), 20000)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if got := m.PredictPeak(text, len(text), 20000); got != want {
					t.Errorf("got %d, want %d", got, want)
				}
			}
		})
	}
	wg.Wait()
}
