package collector

import (
	"math"
	"slices"
	"sort"
	"time"
)

// counterSample is one scrape's values of a group of counters read together (a hit-rate
// numerator and denominator, or a single counter in v[0]).
type counterSample struct {
	t time.Time
	v [2]float64
}

// counterWindow is one target's recent history of a counter group, restarted whenever the
// group resets (any member decreases: the engine restarted), its source changes (another metric
// is read than before, e.g. after an upgrade) or a series joins the sums.
type counterWindow struct {
	source string
	// series is how many series the window's sums add up; short is when scrapes with fewer began
	// to be refused (zero while they are not).
	series  int
	short   time.Time
	samples []counterSample
}

// add records a sample and prunes those older than window before it. It reports whether the
// window was restarted, and whether the sample was refused as incomplete: fewer series than the
// window's sums means a series went missing from the scrape (a body cut at a line end, a series
// dropped), and the sums of the rest would give a rate of the wrong tokens — a hit rate of 0 when
// the hit series is the one lost, which also looks like a reset. The caller reads no rate from
// such a scrape, so the signal holds and then goes stale. A smaller set that lasts a whole window
// is accepted as the engine's new shape (an engine restarted with fewer series that does not
// report them again).
func (w *counterWindow) add(t time.Time, source string, series int, v [2]float64, window time.Duration) (restarted, incomplete bool) {
	if n := len(w.samples); n > 0 {
		last := w.samples[n-1]
		switch {
		case source != w.source:
			restarted = true
		case series < w.series:
			if w.short.IsZero() {
				w.short = t
			}
			if t.Sub(w.short) < window {
				return false, true
			}
			restarted = true
		case series > w.series || v[0] < last.v[0] || v[1] < last.v[1]:
			restarted = true
		case !t.After(last.t):
			// Same instant: the newer reading replaces the older.
			w.samples[n-1] = counterSample{t: t, v: v}
			w.short = time.Time{}
			return false, false
		}
		if restarted {
			w.samples = w.samples[:0]
		}
	}
	w.source, w.series, w.short = source, series, time.Time{}
	w.samples = append(w.samples, counterSample{t: t, v: v})
	w.samples = pruneBefore(w.samples, t.Add(-window), func(s counterSample) time.Time { return s.t })
	return restarted, false
}

// rate returns (last − first)/Δt of each member over the window; ok is false with fewer than two
// samples since the last restart.
func (w *counterWindow) rate() (r [2]float64, ok bool) {
	n := len(w.samples)
	if n < 2 {
		return r, false
	}
	first, last := w.samples[0], w.samples[n-1]
	dt := last.t.Sub(first.t).Seconds()
	if dt <= 0 {
		return r, false
	}
	for i := range r {
		r[i] = (last.v[i] - first.v[i]) / dt
	}
	return r, true
}

func (w *counterWindow) clear() {
	w.source, w.series, w.short, w.samples = "", 0, time.Time{}, w.samples[:0]
}

// pruneBefore drops the leading elements older than from, in place.
func pruneBefore[T any](s []T, from time.Time, at func(T) time.Time) []T {
	i := 0
	for i < len(s)-1 && at(s[i]).Before(from) {
		i++
	}
	if i == 0 {
		return s
	}
	n := copy(s, s[i:])
	clear(s[n:])
	return s[:n]
}

// hist is a classic histogram: ascending upper bounds ending with +Inf, and the cumulative
// count at each.
type hist struct {
	bounds []float64
	cum    []float64
}

func (h hist) clone() hist {
	return hist{bounds: slices.Clone(h.bounds), cum: slices.Clone(h.cum)}
}

// at returns the cumulative count at bound b: that of the largest own bound ≤ b, a lower
// estimate when layouts differ.
func (h hist) at(b float64) float64 {
	i := sort.SearchFloat64s(h.bounds, b)
	if i < len(h.bounds) && h.bounds[i] == b {
		return h.cum[i]
	}
	if i == 0 {
		return 0
	}
	return h.cum[i-1]
}

// add adds o into h, bucket by bucket; when layouts differ, over the union of the bounds.
func (h *hist) add(o hist) {
	if len(o.bounds) == 0 {
		return
	}
	if len(h.bounds) == 0 {
		*h = o.clone()
		return
	}
	if slices.Equal(h.bounds, o.bounds) {
		for i := range h.cum {
			h.cum[i] += o.cum[i]
		}
		return
	}
	bounds := slices.Concat(h.bounds, o.bounds)
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	cum := make([]float64, len(bounds))
	for i, b := range bounds {
		cum[i] = h.at(b) + o.at(b)
	}
	h.bounds, h.cum = bounds, cum
}

// histSample is one scrape's histogram.
type histSample struct {
	t time.Time
	h hist
}

// histWindow is one target's recent history of a histogram, restarted when any bucket or the
// count decreases (a restart) or the bucket layout changes.
type histWindow struct {
	samples []histSample
}

func (w *histWindow) add(t time.Time, h hist, window time.Duration) (restarted bool) {
	if n := len(w.samples); n > 0 {
		last := w.samples[n-1].h
		if !slices.Equal(last.bounds, h.bounds) || decreased(last.cum, h.cum) {
			restarted = true
			w.samples = w.samples[:0]
		} else if !t.After(w.samples[n-1].t) {
			w.samples[n-1] = histSample{t: t, h: h}
			return false
		}
	}
	w.samples = append(w.samples, histSample{t: t, h: h})
	w.samples = pruneBefore(w.samples, t.Add(-window), func(s histSample) time.Time { return s.t })
	return restarted
}

// delta returns the observations of the window (last − first); ok is false with fewer than two
// samples since the last restart.
func (w *histWindow) delta() (hist, bool) {
	n := len(w.samples)
	if n < 2 {
		return hist{}, false
	}
	first, last := w.samples[0].h, w.samples[n-1].h
	d := hist{bounds: last.bounds, cum: make([]float64, len(last.cum))}
	for i := range d.cum {
		d.cum[i] = last.cum[i] - first.cum[i]
	}
	return d, true
}

func (w *histWindow) clear() { w.samples = w.samples[:0] }

func decreased(before, after []float64) bool {
	for i := range before {
		if after[i] < before[i] {
			return true
		}
	}
	return false
}

// quantile is PromQL's histogram_quantile over classic buckets: linear interpolation within
// the bucket holding the rank, the first bucket starting at 0 (when its bound is positive), and
// the upper bound of the last finite bucket when the rank falls in +Inf. ok is false without
// observations or without a finite bucket.
func quantile(q float64, h hist) (float64, bool) {
	n := len(h.bounds)
	if n < 2 || !math.IsInf(h.bounds[n-1], 1) {
		return 0, false
	}
	// Bucket counts of a delta can be non-monotonic by float error or a scrape racing an
	// observation; PromQL forces monotonicity, so does this.
	cum := make([]float64, n)
	for i, c := range h.cum {
		cum[i] = c
		if i > 0 && cum[i] < cum[i-1] {
			cum[i] = cum[i-1]
		}
	}
	total := cum[n-1]
	if !(total > 0) {
		return 0, false
	}
	rank := q * total
	b := sort.Search(n-1, func(i int) bool { return cum[i] >= rank })
	if b == n-1 {
		return h.bounds[n-2], true
	}
	if b == 0 && h.bounds[0] <= 0 {
		return h.bounds[0], true
	}
	start, end, count := 0.0, h.bounds[b], cum[b]
	if b > 0 {
		start = h.bounds[b-1]
		count -= cum[b-1]
		rank -= cum[b-1]
	}
	if count <= 0 {
		return end, true
	}
	return start + (end-start)*(rank/count), true
}
