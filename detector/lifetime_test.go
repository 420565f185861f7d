package detector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLifetime: Little's law on the healthy bins of the curve, N ÷ (X(N) ÷ K), their lower
// quartile; bins past 0.8 of the knee population (where calls queue for cache) do not count.
func TestLifetime(t *testing.T) {
	type bin struct{ n, x float64 }
	for _, tc := range []struct {
		name  string
		k     float64 // 0: K unknown
		bins  []bin
		knee  float64
		want  time.Duration
		known bool
	}{
		{"one bin: N·K/X", 10, []bin{{20, 1}}, 100, 200 * time.Second, true},
		// 100, 200, 300 s: the quartile sits halfway between the first two.
		{"lower quartile of three", 10, []bin{{10, 1}, {20, 1}, {30, 1}}, 100, 150 * time.Second, true},
		// 200, 200, 200, 800 s: a bin slowed by congestion does not move it.
		{"a congested bin does not count", 10, []bin{{20, 1}, {30, 1.5}, {40, 2}, {50, 0.625}}, 100, 200 * time.Second, true},
		// The 60-session bin is past 0.8 × 50: its long lifetime is the trap's, not the workload's.
		{"bins past 0.8 of the knee left out", 10, []bin{{20, 1}, {30, 1.5}, {60, 0.1}}, 50, 200 * time.Second, true},
		// 200, 200, 6000 s: the quartile is halfway between the first two.
		{"unknown knee: every bin counts", 10, []bin{{20, 1}, {30, 1.5}, {60, 0.1}}, 0, 200 * time.Second, true},
		{"no healthy bin", 10, []bin{{60, 1}}, 50, 0, false},
		{"K unknown", 0, []bin{{20, 1}}, 100, 0, false},
		{"empty curve", 10, nil, 100, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NewFluid(FluidOptions{CallsPerSession: tc.k})
			require.NoError(t, err)
			for _, b := range tc.bins {
				for range DefaultFluidMinBinSamples {
					f.addToBin(b.n, b.x)
				}
			}
			got, ok := f.Lifetime(tc.knee)
			assert.Equal(t, tc.known, ok)
			assert.InDelta(t, tc.want.Seconds(), got.Seconds(), 1e-6)
		})
	}
}

// TestLifetimeNeedsEnoughSamples: a bin seen fewer than MinBinSamples times is not part of the curve.
func TestLifetimeNeedsEnoughSamples(t *testing.T) {
	f, err := NewFluid(FluidOptions{CallsPerSession: 10})
	require.NoError(t, err)
	for range DefaultFluidMinBinSamples - 1 {
		f.addToBin(20, 1)
	}
	_, ok := f.Lifetime(100)
	assert.False(t, ok)
	f.addToBin(20, 1)
	got, ok := f.Lifetime(100)
	require.True(t, ok)
	assert.InDelta(t, 200, got.Seconds(), 1e-6)
}
