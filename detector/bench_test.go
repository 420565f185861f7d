package detector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkStep is one Step on a deployment of 10,000 live sessions whose detector has learnt a
// completion curve over every N bin from 1 to 10,000 and a passive knee over W/C 0.1–2.5.
func BenchmarkStep(b *testing.B) {
	o := scriptOptions()
	o.DisablePassive = false
	d, err := New(o)
	require.NoError(b, err)
	const cache = 250_000_000.0 // 10,000 sessions of 25K tokens at W/C 1.0
	at := t0
	warm := func(n, wc, hit float64) {
		at = at.Add(step)
		d.Step(sample{wc: wc, hit: hit, n: n, calls: callRate(n / 250), cache: cache}.snapshot(at))
	}
	for range 6 {
		for n := 1.0; n <= 10_000; n *= 1.02 {
			warm(n, 0.5, 0.96)
		}
	}
	d.mu.Lock()
	for range 25 {
		for wc := 0.1; wc <= 2.5; wc += 0.05 {
			d.mu.passive.Observe(wc+0.01, cliff(1.7)(wc))
		}
	}
	bins, pbins := len(d.mu.fluid.Curve()), len(d.mu.passive.Points())
	d.mu.Unlock()
	require.Greater(b, bins, 140, "every N bin from 1 to 10,000")
	require.Greater(b, pbins, 40)
	s := sample{wc: 1.0, hit: 0.96, n: 10_000, calls: callRate(40), cache: cache}.snapshot(at)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s.At = at.Add(time.Duration(i+1) * step)
		d.Step(s)
	}
}
