package detector

import (
	"errors"
	"fmt"
)

// Passive learning defaults.
const (
	// DefaultPassiveBinWidth is the width of a W/C bin (basin's design value, 0.05: admission's
	// budget is 0.9 × knee, and a bin is under 3% of it at the paper's knee of 1.9).
	DefaultPassiveBinWidth = 0.05
	// DefaultPassiveMinBins is how many bins must have enough samples before a knee is fitted:
	// chosen because six bins span 0.3 in W/C, enough for a plateau third of two bins and a drop
	// confirmed by a second point.
	DefaultPassiveMinBins = 6
	// DefaultPassiveMinSamples is how many samples make a bin count: chosen because at a 5 s step
	// it is 100 s of data, longer than the collector's hit-rate window, so one bin is not one burst.
	DefaultPassiveMinSamples = 20
	// DefaultPassiveAlpha is the floor of a sample's weight in its bin: a bin is the plain mean of
	// its first 1/alpha samples, then an EWMA remembering about 50 samples (about 4 minutes at a
	// 5 s step), so a deployment whose workload changes relearns in minutes. Chosen, not measured.
	DefaultPassiveAlpha = 0.02
	// maxPassiveRatio bounds the bins: past 20× the cache the curve has long collapsed.
	maxPassiveRatio = 20
)

// PassiveOptions configure the passive knee learner. Zero fields take the defaults.
type PassiveOptions struct {
	BinWidth   float64 // DefaultPassiveBinWidth
	MinBins    int     // DefaultPassiveMinBins
	MinSamples int     // DefaultPassiveMinSamples
	Alpha      float64 // DefaultPassiveAlpha
	// Tolerance is the plateau tolerance of the fit (DefaultPlateauTolerance).
	Tolerance float64
}

func (o PassiveOptions) withDefaults() PassiveOptions {
	if o.BinWidth == 0 {
		o.BinWidth = DefaultPassiveBinWidth
	}
	if o.MinBins == 0 {
		o.MinBins = DefaultPassiveMinBins
	}
	if o.MinSamples == 0 {
		o.MinSamples = DefaultPassiveMinSamples
	}
	if o.Alpha == 0 {
		o.Alpha = DefaultPassiveAlpha
	}
	if o.Tolerance == 0 {
		o.Tolerance = DefaultPlateauTolerance
	}
	return o
}

// Validate reports the first option NewPassive refuses, naming it; zero fields stand for their
// defaults.
func (o PassiveOptions) Validate() error {
	o = o.withDefaults()
	switch {
	case !(o.BinWidth > 0 && o.BinWidth <= 1):
		return fmt.Errorf("Passive.BinWidth: %v outside (0, 1]", o.BinWidth)
	case o.MinBins < MinFitPoints:
		return fmt.Errorf("Passive.MinBins: %d, need at least %d to fit a knee", o.MinBins, MinFitPoints)
	case o.MinSamples < 1:
		return fmt.Errorf("Passive.MinSamples: %d, must be positive", o.MinSamples)
	case !(o.Alpha > 0 && o.Alpha <= 1):
		return fmt.Errorf("Passive.Alpha: %v outside (0, 1]", o.Alpha)
	case !(o.Tolerance > 0 && o.Tolerance < 1):
		return fmt.Errorf("Passive.Tolerance: %v outside (0, 1)", o.Tolerance)
	}
	return nil
}

// Passive learns the knee from the running deployment: it keeps the hit rate observed in each
// W/C bin and fits the knee the way FitKnee does once enough bins have enough samples. It only
// sees what the deployment went through: until the working set has been past the knee it can
// only say the plateau holds at least that far.
type Passive struct {
	o    PassiveOptions
	bins []passiveBin
}

type passiveBin struct {
	ratio, hit float64 // means of the bin's samples
	n          int
}

// NewPassive returns an empty learner.
func NewPassive(o PassiveOptions) (*Passive, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("passive knee: %w", err)
	}
	o = o.withDefaults()
	return &Passive{o: o}, nil
}

// Observe adds one (W/C, hit rate) sample. Samples outside [0, 20] × [0, 1] are ignored.
func (p *Passive) Observe(ratio, hit float64) {
	if !(ratio >= 0 && ratio < maxPassiveRatio && hit >= 0 && hit <= 1) {
		return
	}
	i := int(ratio/p.o.BinWidth + 1e-9) // 2.3/0.05 is 45.99…: edges belong to the bin above
	if i >= len(p.bins) {
		p.bins = append(p.bins, make([]passiveBin, i+1-len(p.bins))...)
	}
	b := &p.bins[i]
	b.n++
	a := max(1/float64(b.n), p.o.Alpha)
	b.ratio += a * (ratio - b.ratio)
	b.hit += a * (hit - b.hit)
}

// Points returns one point per bin with at least MinSamples samples, in W/C order.
func (p *Passive) Points() []Point {
	var pts []Point
	for _, b := range p.bins {
		if b.n >= p.o.MinSamples {
			pts = append(pts, Point{WorkingSetOverCache: b.ratio, HitRate: b.hit})
		}
	}
	return pts
}

// Knee returns the learnt knee, falling back on def for what is not learnt yet:
//   - with at least MinBins bins, the fitted knee (Source "passive");
//   - when the fit finds no drop, the plateau is learnt and the knee is the larger of def.Ratio and
//     the largest W/C seen (a lower bound, BeyondRange), Source "passive" only if it is the latter;
//   - with fewer bins, the plateau is the median of the bins at or below plateauBelow (the W/C
//     under which the hit rate is on its plateau by any knee's measure) and the knee is def's.
func (p *Passive) Knee(def Knee, plateauBelow float64) Knee {
	pts := p.Points()
	if len(pts) >= p.o.MinBins {
		k, err := FitKneeTolerance(pts, p.o.Tolerance)
		switch {
		case err == nil:
			k.Source, k.PlateauSource = SourcePassive, SourcePassive
			return k
		case errors.Is(err, ErrNoDrop):
			out := def
			out.PlateauHit, out.PlateauSource = k.PlateauHit, SourcePassive
			if k.Ratio > def.Ratio {
				out.Ratio, out.Source, out.BeyondRange = k.Ratio, SourcePassive, true
			}
			return out
		}
	}
	var hits []float64
	for _, pt := range pts {
		if pt.WorkingSetOverCache <= plateauBelow {
			hits = append(hits, pt.HitRate)
		}
	}
	if len(hits) > 0 {
		def.PlateauHit, def.PlateauSource = median(hits), SourcePassive
	}
	return def
}
