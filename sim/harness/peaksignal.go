package harness

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/basin-dev/basin/sim"
)

// PeakSignal is the noisy-oracle peak predictor of the simulator's `basin` policy. The synthetic
// workloads write no task text, so the text-reading predictor of the Basin paper has nothing to
// read; instead each session carries a feature whose Spearman rank correlation with its true peak
// is a chosen parameter ρ (by default the paper's holdout Spearman for the workload), and the
// predictor maps the feature back to a peak.
//
// The feature is a Gaussian copula: with z = Φ⁻¹(F(peak)) the session's peak as a standard normal
// score (F the workload's peak distribution, estimated from sessions drawn on a stream the runs
// never use) and ε the session's own noise (sim.SessionSpec.SignalNoise),
//
//	feature = ρ'·z + √(1−ρ'²)·ε,  ρ' = 2·sin(π·ρ/6),
//
// the correlation of normal scores for which a bivariate normal's Spearman correlation is ρ. The
// prediction is the conditional median of the peak given the feature, F⁻¹(Φ(ρ'·feature)): at
// ρ = 0 every session is predicted at the workload's median peak (no information), at ρ = 1 the
// prediction is the true peak (within the training sample's range).
type PeakSignal struct {
	spearman, rhoN float64
	// peaks are the training sessions' peaks, sorted: the empirical distribution F.
	peaks []float64
}

// NewPeakSignal estimates the workload's peak distribution from n sessions of a random stream
// derived from seed that no run uses, for a feature of the given Spearman correlation.
func NewPeakSignal(w sim.Workload, spearman float64, seed uint64, n int) (*PeakSignal, error) {
	if !(spearman >= 0 && spearman <= 1) {
		return nil, fmt.Errorf("peak signal: spearman must be in [0, 1], got %v", spearman)
	}
	if n < 2 {
		return nil, fmt.Errorf("peak signal: need at least 2 training sessions, got %d", n)
	}
	if w == nil {
		return nil, errors.New("peak signal: workload missing")
	}
	rng := rand.New(rand.NewPCG(seed^0x5167_A1C0, 0x9EA4))
	p := &PeakSignal{spearman: spearman, rhoN: 2 * math.Sin(math.Pi*spearman/6), peaks: make([]float64, n)}
	for i := range p.peaks {
		p.peaks[i] = float64(w.Session(rng).PeakContext())
	}
	slices.Sort(p.peaks)
	return p, nil
}

// Spearman is the feature's rank correlation with the true peak.
func (p *PeakSignal) Spearman() float64 { return p.spearman }

// cdf is the empirical distribution's mid-rank CDF, linear between training peaks and clamped to
// [0.5/n, 1−0.5/n] so its normal score stays finite.
func (p *PeakSignal) cdf(x float64) float64 {
	n := len(p.peaks)
	lo, hi := 0.5/float64(n), 1-0.5/float64(n)
	i, _ := slices.BinarySearch(p.peaks, x) // first index with peaks[i] ≥ x
	switch {
	case i == 0:
		return lo
	case i == n:
		return hi
	}
	a, b := p.peaks[i-1], p.peaks[i]
	frac := 1.0
	if b > a {
		frac = (x - a) / (b - a)
	}
	return (float64(i-1) + frac + 0.5) / float64(n)
}

// quantile inverts cdf.
func (p *PeakSignal) quantile(u float64) float64 {
	n := len(p.peaks)
	pos := u*float64(n) - 0.5
	switch {
	case pos <= 0:
		return p.peaks[0]
	case pos >= float64(n-1):
		return p.peaks[n-1]
	}
	i := int(pos)
	return p.peaks[i] + (pos-float64(i))*(p.peaks[i+1]-p.peaks[i])
}

func normalCDF(x float64) float64   { return 0.5 * math.Erfc(-x/math.Sqrt2) }
func normalQuant(u float64) float64 { return math.Sqrt2 * math.Erfinv(2*u-1) }

// Feature is the session's noisy-oracle feature (a standard normal).
func (p *PeakSignal) Feature(s sim.SessionInfo) float64 {
	z := normalQuant(p.cdf(float64(s.TruePeak)))
	return p.rhoN*z + math.Sqrt(1-p.rhoN*p.rhoN)*s.SignalNoise
}

// PredictFeature maps a feature to the conditional median peak.
func (p *PeakSignal) PredictFeature(f float64) int64 {
	return int64(math.Round(p.quantile(normalCDF(p.rhoN * f))))
}

// Predict is the predictor the admission gate calls: it sees the session only through Feature.
func (p *PeakSignal) Predict(s sim.SessionInfo) int64 { return p.PredictFeature(p.Feature(s)) }
