package predictor_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/basin-dev/basin/gateway/predictor"
)

func TestSpearman(t *testing.T) {
	tests := []struct {
		name string
		a, b []float64
		want float64 // NaN where undefined
	}{
		{"identical", []float64{1, 2, 3, 4, 5}, []float64{1, 2, 3, 4, 5}, 1},
		{"monotone transform is identical in rank", []float64{1, 2, 3, 4}, []float64{10, 100, 1000, 1e6}, 1},
		{"perfect inverse", []float64{1, 2, 3, 4, 5}, []float64{50, 40, 30, 20, 10}, -1},
		// Ranks of b: 1.5, 1.5, 3, 4; Pearson with 1..4 = 4.5 / sqrt(5 * 4.5).
		{"tie in one input", []float64{1, 2, 3, 4}, []float64{7, 7, 8, 9}, 4.5 / math.Sqrt(5*4.5)},
		// Ranks a: 1.5, 1.5, 3.5, 3.5; b: 1, 2, 3, 4: 4 / sqrt(4 * 5).
		{"ties in pairs", []float64{5, 5, 9, 9}, []float64{1, 2, 3, 4}, 4 / math.Sqrt(4*5)},
		{"ties on both sides agreeing", []float64{1, 1, 2, 2}, []float64{3, 3, 4, 4}, 1},
		// a ranks 1..5; b ranks 2, 1, 4, 3, 5: 1 - 6*4/(5*24) = 0.8.
		{"swapped pairs", []float64{1, 2, 3, 4, 5}, []float64{2, 1, 4, 3, 5}, 0.8},
		{"constant input", []float64{1, 2, 3}, []float64{4, 4, 4}, math.NaN()},
		{"both constant", []float64{2, 2}, []float64{4, 4}, math.NaN()},
		{"one item", []float64{1}, []float64{2}, math.NaN()},
		{"empty", nil, nil, math.NaN()},
		{"lengths differ", []float64{1, 2, 3}, []float64{1, 2}, math.NaN()},
		{"NaN value", []float64{1, math.NaN(), 3}, []float64{1, 2, 3}, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := predictor.Spearman(tt.a, tt.b)
			if math.IsNaN(tt.want) {
				assert.True(t, math.IsNaN(got), "want NaN, got %v", got)
				return
			}
			assert.InDelta(t, tt.want, got, 1e-12)
			assert.InDelta(t, tt.want, predictor.Spearman(tt.b, tt.a), 1e-12, "symmetric")
		})
	}
}
