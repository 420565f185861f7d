package collector

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

var inf = math.Inf(1)

// TestQuantile follows PromQL's histogram_quantile on classic buckets.
func TestQuantile(t *testing.T) {
	h := func(bounds []float64, cum ...float64) hist { return hist{bounds: bounds, cum: cum} }
	b := []float64{0.1, 0.5, 1, inf}
	for _, tc := range []struct {
		name string
		q    float64
		h    hist
		want float64
		ok   bool
	}{
		{"interpolated in the first bucket from 0", 0.5, h(b, 10, 10, 10, 10), 0.05, true},
		{"interpolated in a middle bucket", 0.75, h(b, 0, 10, 20, 20), 0.5 + 0.5*0.5, true},
		{"rank in +Inf: the last finite bound", 0.99, h(b, 0, 0, 10, 20), 1, true},
		{"exact bucket edge", 0.5, h(b, 5, 10, 10, 10), 0.1, true},
		{"no observations", 0.5, h(b, 0, 0, 0, 0), 0, false},
		{"no +Inf bucket", 0.5, h([]float64{0.1, 1}, 1, 2), 0, false},
		{"only +Inf", 0.5, h([]float64{inf}, 5), 0, false},
		{"non-monotonic deltas are forced up", 0.5, h(b, 10, 8, 10, 10), 0.05, true},
		{"negative first bound", 0.1, h([]float64{-1, 1, inf}, 5, 10, 10), -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := quantile(tc.q, tc.h)
			assert.Equal(t, tc.ok, ok)
			if tc.ok {
				assert.InDelta(t, tc.want, got, 1e-12)
			}
		})
	}
}

// TestHistAdd merges layouts, the union of bounds when they differ.
func TestHistAdd(t *testing.T) {
	var sum hist
	sum.add(hist{bounds: []float64{1, 2, inf}, cum: []float64{1, 2, 3}})
	sum.add(hist{bounds: []float64{1, 2, inf}, cum: []float64{10, 20, 30}})
	assert.Equal(t, []float64{11, 22, 33}, sum.cum)
	sum.add(hist{bounds: []float64{1.5, inf}, cum: []float64{5, 6}})
	assert.Equal(t, []float64{1, 1.5, 2, inf}, sum.bounds)
	// At 1.5 the first layout counts what it had at 1 (a lower estimate).
	assert.Equal(t, []float64{11, 16, 27, 39}, sum.cum)
}

// TestCounterWindow: pruning to the window, same-instant replacement, restarts.
func TestCounterWindow(t *testing.T) {
	var w counterWindow
	for i := range 20 {
		w.add(t0.Add(time.Duration(i)*5*time.Second), "c", [2]float64{float64(10 * i)}, 60*time.Second)
	}
	assert.Len(t, w.samples, 13, "60 s of 5 s samples, both ends included")
	r, ok := w.rate()
	assert.True(t, ok)
	assert.Equal(t, 2.0, r[0])

	assert.False(t, w.add(t0.Add(95*time.Second), "c", [2]float64{250}, time.Minute), "same instant replaces")
	assert.Len(t, w.samples, 13)
	r, _ = w.rate()
	assert.InDelta(t, (250.0-70)/60, r[0], 1e-12)

	assert.True(t, w.add(t0.Add(100*time.Second), "other", [2]float64{300}, time.Minute), "another source restarts")
	_, ok = w.rate()
	assert.False(t, ok)
	assert.True(t, w.add(t0.Add(105*time.Second), "other", [2]float64{300, -1}, time.Minute), "any member decreasing restarts")
}
