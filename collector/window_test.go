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

// TestCounterWindow: pruning to the window, same-instant replacement, restarts, incomplete sums.
func TestCounterWindow(t *testing.T) {
	var w counterWindow
	add := func(sec int, source string, series int, v ...float64) (bool, bool) {
		return w.add(t0.Add(time.Duration(sec)*time.Second), source, series, [2]float64(append(v, 0)[:2]), time.Minute)
	}
	for i := range 20 {
		add(5*i, "c", 1, float64(10*i))
	}
	assert.Len(t, w.samples, 13, "60 s of 5 s samples, both ends included")
	r, ok := w.rate()
	assert.True(t, ok)
	assert.Equal(t, 2.0, r[0])

	restarted, _ := add(95, "c", 1, 250)
	assert.False(t, restarted, "same instant replaces")
	assert.Len(t, w.samples, 13)
	r, _ = w.rate()
	assert.InDelta(t, (250.0-70)/60, r[0], 1e-12)

	restarted, _ = add(100, "other", 2, 300, 400)
	assert.True(t, restarted, "another source restarts")
	_, ok = w.rate()
	assert.False(t, ok)
	add(105, "other", 2, 310, 420)

	restarted, incomplete := add(110, "other", 1, 320, 425)
	assert.False(t, restarted)
	assert.True(t, incomplete, "a series lost without a reset: refused")
	assert.Len(t, w.samples, 2, "the window waits for the full set")
	_, incomplete = add(115, "other", 2, 330, 440)
	assert.False(t, incomplete, "the full set again")
	r, ok = w.rate()
	assert.True(t, ok)
	assert.InDelta(t, 2.0, r[0], 1e-12, "(330 − 310) / 10 s: the refused scrape left no trace")

	restarted, _ = add(120, "other", 3, 340, 450)
	assert.True(t, restarted, "a series joining the sums restarts")
	_, incomplete = add(125, "other", 2, 10, 20)
	assert.True(t, incomplete, "fewer series that look like a reset (a lost hit series does): refused")
	_, incomplete = add(180, "other", 2, 20, 40)
	assert.True(t, incomplete, "still within a window of the first refusal")
	restarted, incomplete = add(185, "other", 2, 30, 60)
	assert.True(t, restarted, "a smaller set that lasted a whole window is the engine's new shape")
	assert.False(t, incomplete)
	restarted, _ = add(190, "other", 2, 300, -1)
	assert.True(t, restarted, "any member decreasing restarts")
}
