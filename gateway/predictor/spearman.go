package predictor

import (
	"cmp"
	"math"
	"slices"
)

// Spearman is the Spearman rank correlation of a and b: the Pearson correlation of their ranks,
// tied values sharing the average of the ranks they span. It is 1 when b orders the items exactly
// as a does and -1 when exactly the reverse.
//
// It is NaN when the correlation is undefined: the lengths differ, there are fewer than two
// items, a value is NaN, or either input is constant (all ranks tie, so there is no order to
// agree with). NaN rather than 0 so that "no order to compare" is not mistaken for "no
// relation", and so that it does not pass as a quality score.
func Spearman(a, b []float64) float64 {
	if len(a) != len(b) || len(a) < 2 {
		return math.NaN()
	}
	for i := range a {
		if math.IsNaN(a[i]) || math.IsNaN(b[i]) {
			return math.NaN()
		}
	}
	ra, rb := ranks(a), ranks(b)
	n := float64(len(a))
	// Both rank vectors have mean (n+1)/2 whatever the ties.
	mean := (n + 1) / 2
	var sab, saa, sbb float64
	for i := range ra {
		da, db := ra[i]-mean, rb[i]-mean
		sab += da * db
		saa += da * da
		sbb += db * db
	}
	if saa == 0 || sbb == 0 {
		return math.NaN()
	}
	// Rounding can carry a perfect correlation a hair past ±1.
	return max(-1, min(1, sab/math.Sqrt(saa*sbb)))
}

// ranks gives the 1-based rank of each value of x, ties getting the average of their ranks.
func ranks(x []float64) []float64 {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(i, j int) int { return cmp.Compare(x[i], x[j]) })
	r := make([]float64, len(x))
	for lo := 0; lo < len(idx); {
		hi := lo + 1
		for hi < len(idx) && x[idx[hi]] == x[idx[lo]] {
			hi++
		}
		// Positions lo..hi-1 hold ranks lo+1..hi; their average is (lo+1+hi)/2.
		avg := float64(lo+1+hi) / 2
		for _, i := range idx[lo:hi] {
			r[i] = avg
		}
		lo = hi
	}
	return r
}
