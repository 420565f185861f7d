package experiment

import (
	"errors"
	"fmt"
	"github.com/basin-dev/basin/sim/harness"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/predictor"
	"github.com/basin-dev/basin/sim"
)

// The spike tolerance the detector exports is a prediction of the fluid model; this file checks it
// against the simulator. For each (deployment, tier, base load) point, the predicted tolerance is
// what `basin risk` prints for a scenario — the fluid model on the deployment's measured curve, at
// the stable point of the base arrival rate — and the simulated tolerance is the smallest
// ten-minute spike multiplier that traps at least half of the seeds, found by bisection.

// ToleranceSpec is the validation grid and the search's budget.
type ToleranceSpec struct {
	Deployments []string
	Tiers       []Tier
	// Workload is the synthetic workload of every point.
	Workload string
	// Loads are base arrival rates as fractions of each group's calibrated peak completion rate.
	Loads []float64
	// Seeds run at every multiplier tried; the spike traps when at least half of them collapse.
	Seeds []uint64
	// Steps is how many bisection steps narrow the simulated tolerance between 1 and MaxMultiplier
	// (in log space: six steps put it within 3% on a 1–8 range).
	Steps int
	// MaxMultiplier is the largest spike tried: a point that survives it is reported as "above".
	MaxMultiplier float64
	// Workers is how many points are searched at once (results do not depend on it).
	Workers int
}

// DefaultToleranceSpec is the grid: 1P1D and 1P3D, GPU-only and host tier, six base loads
// from half the calibrated peak to just under it — 24 points — five seeds per multiplier.
func DefaultToleranceSpec() ToleranceSpec {
	return ToleranceSpec{
		Deployments:   []string{"1p1d", "1p3d"},
		Tiers:         []Tier{TierGPU, TierHost},
		Workload:      "terminal-bench",
		Loads:         []float64{0.4, 0.5, 0.6, 0.7, 0.8, 0.9},
		Seeds:         []uint64{1, 2, 3, 4, 5},
		Steps:         6,
		MaxMultiplier: 8,
		Workers:       2,
	}
}

// QuickToleranceSpec is a slice of the grid that runs in a minute or so: one deployment and tier,
// three loads, three seeds, four steps.
func QuickToleranceSpec() ToleranceSpec {
	s := DefaultToleranceSpec()
	s.Deployments, s.Tiers, s.Loads, s.Seeds, s.Steps = []string{"1p3d"}, []Tier{TierGPU}, []float64{0.5, 0.7, 0.9},
		[]uint64{1, 2, 3}, 4
	return s
}

// Validate checks the spec up front, naming the field.
func (s ToleranceSpec) Validate() error {
	m := MatrixSpec{Loads: s.Loads, Spikes: []float64{0}, Tiers: s.Tiers, Deployments: s.Deployments,
		Workloads: []string{s.Workload}, Seeds: s.Seeds, Policies: []string{EnginePolicy}, Workers: s.Workers}
	errs := []error{m.Validate()}
	if s.Steps < 1 || s.Steps > 20 {
		errs = append(errs, fmt.Errorf("steps: %d, want 1–20", s.Steps))
	}
	if !(s.MaxMultiplier > 1 && s.MaxMultiplier <= 1+20) {
		errs = append(errs, fmt.Errorf("max multiplier: %v, want in (1, 21]", s.MaxMultiplier))
	}
	return errors.Join(errs...)
}

// ToleranceTry is one multiplier the bisection ran: how many seeds collapsed of those run (the
// seeds stop once the majority is decided).
type ToleranceTry struct {
	Multiplier float64 `json:"multiplier"`
	Trapped    int     `json:"trapped"`
	Runs       int     `json:"runs"`
}

// Simulated tolerance bounds: the search range does not contain the threshold.
const (
	// BoundBelow: the deployment is trapped without a spike (or by the smallest one tried).
	BoundBelow = "below"
	// BoundAbove: the largest spike tried does not trap it.
	BoundAbove = "above"
)

// TolerancePoint is one (deployment, tier, load) point of the validation.
type TolerancePoint struct {
	MatrixGroup
	Load           float64 `json:"load"`
	ArrivalsPerMin float64 `json:"arrivals_per_min"`
	// StableN is the fluid model's stable population at the base rate, where the prediction is made.
	StableN *float64 `json:"stable_n,omitempty"`
	// Predicted is the fluid model's spike tolerance (a multiplier of λ); nil when it cannot say,
	// with the reason in Unknown.
	Predicted       *float64 `json:"predicted,omitempty"`
	PredictedCapped bool     `json:"predicted_capped,omitempty"`
	Unknown         string   `json:"unknown,omitempty"`
	// Simulated is the smallest multiplier that traps at least half the seeds, as bracketed by the
	// bisection (the upper end of the final bracket); Bound says when it lies outside the range.
	Simulated float64        `json:"simulated"`
	Bound     string         `json:"bound,omitempty"`
	Tries     []ToleranceTry `json:"tries"`
}

// Ratio is predicted ÷ simulated, when both are numbers (not bounds).
func (p TolerancePoint) Ratio() *float64 {
	if p.Predicted == nil || p.PredictedCapped || p.Bound != "" {
		return nil
	}
	v := *p.Predicted / p.Simulated
	return &v
}

// ToleranceResult is the validation: the points and the summary the targets are about.
type ToleranceResult struct {
	Spec   ToleranceSpec    `json:"spec"`
	Points []TolerancePoint `json:"points"`
	// Spearman is the rank correlation of predicted and simulated over the points where both are
	// known; a bound ranks at its end of the range (capped predictions at MaxSpikeRatio, "above" at
	// the largest multiplier tried), which keeps the order it stands for.
	Spearman *float64 `json:"spearman,omitempty"`
	Ranked   int      `json:"ranked"`
	// MedianRatio is the median of predicted ÷ simulated over the points where both are numbers.
	MedianRatio *float64 `json:"median_ratio,omitempty"`
	Ratios      int      `json:"ratios"`
	// FalseLow counts points whose prediction is under the alert margin (1 + AlertMargin) while the
	// simulator says the deployment survives +100% (its simulated tolerance is above 2×).
	FalseLow int `json:"false_low"`
}

// AlertMargin is the spike tolerance alert's default margin (BasinSpikeToleranceLow fires while
// the tolerance stays under 1 + margin).
const AlertMargin = 0.5

// RunTolerance calibrates each group once, predicts every point's tolerance, and bisects for the
// simulated one on a worker pool over points. Within a point the runs go in a fixed order, so the
// result is the same for any number of workers.
func RunTolerance(spec ToleranceSpec, progress func(done, total int)) (*ToleranceResult, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("tolerance: %w", err)
	}
	m := MatrixSpec{Loads: spec.Loads, Spikes: []float64{0}, Tiers: spec.Tiers, Deployments: spec.Deployments,
		Workloads: []string{spec.Workload}}
	cals, err := m.calibrate()
	if err != nil {
		return nil, err
	}
	rows := m.expand(cals)
	out := &ToleranceResult{Spec: spec, Points: make([]TolerancePoint, len(rows))}
	errs := make([]error, len(rows))
	jobs := make(chan int)
	var mu sync.Mutex
	done := 0
	var wg sync.WaitGroup
	for range spec.Workers {
		wg.Go(func() {
			for i := range jobs {
				row := rows[i]
				p, err := tolerancePoint(spec, row, cals[row.MatrixGroup.String()])
				if err != nil {
					errs[i] = fmt.Errorf("%s load %.2f: %w", row.MatrixGroup, row.Load, err)
				}
				out.Points[i] = p
				mu.Lock()
				done++
				if progress != nil {
					progress(done, len(rows))
				}
				mu.Unlock()
			}
		})
	}
	for i := range rows {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out.summarise()
	return out, nil
}

// tolerancePoint predicts and measures one point.
func tolerancePoint(spec ToleranceSpec, row MatrixRow, cal *detector.Calibration) (TolerancePoint, error) {
	p := TolerancePoint{MatrixGroup: row.MatrixGroup, Load: row.Load, ArrivalsPerMin: row.ArrivalsPerMin}
	sc, err := matrixScenario(row.MatrixGroup, row.ArrivalsPerMin, 0, 0)
	if err != nil {
		return p, err
	}
	policy := engineName(row.Tier, EnginePolicy)
	o, err := sc.Options(policy)
	if err != nil {
		return p, err
	}
	dep := o.Deployment
	sh := harness.Shape(dep, o.Streams[0].Workload, sc.Seed, 2000)
	cache := float64(dep.Prefill.Instances * (dep.Prefill.CacheTokens + dep.Prefill.HostCacheTokens))
	out, err := detector.CalibratedOutlook(cal, -1, row.ArrivalsPerMin/60, sh.MeanContext, cache)
	p.StableN = out.Equilibria.Stable
	switch {
	case err != nil:
		p.Unknown = err.Error()
	case out.SpikeTolerance == nil:
		p.Unknown = "the completion curve is not known up to the edge"
	default:
		r := out.SpikeTolerance.Ratio
		p.Predicted, p.PredictedCapped = &r, out.SpikeTolerance.Capped
	}

	traps := func(mult float64) (bool, error) {
		t := ToleranceTry{Multiplier: mult}
		need := len(spec.Seeds)/2 + len(spec.Seeds)%2 // at least half
		for _, seed := range spec.Seeds {
			c, err := spikeCollapses(row, policy, mult, seed)
			if err != nil {
				return false, err
			}
			t.Runs++
			if c {
				t.Trapped++
			}
			if t.Trapped >= need || t.Runs-t.Trapped > len(spec.Seeds)-need {
				break // the majority is decided
			}
		}
		p.Tries = append(p.Tries, t)
		return 2*t.Trapped >= len(spec.Seeds), nil
	}
	lo, hi := 1.0, spec.MaxMultiplier
	trapped, err := traps(hi)
	if err != nil {
		return p, err
	}
	if !trapped {
		p.Simulated, p.Bound = hi, BoundAbove
		return p, nil
	}
	if trapped, err = traps(lo); err != nil {
		return p, err
	} else if trapped {
		p.Simulated, p.Bound = lo, BoundBelow
		return p, nil
	}
	for range spec.Steps {
		mid := math.Sqrt(lo * hi)
		trapped, err := traps(mid)
		if err != nil {
			return p, err
		}
		if trapped {
			hi = mid
		} else {
			lo = mid
		}
	}
	p.Simulated = hi
	return p, nil
}

// spikeCollapses runs a point's scenario with a ten-minute spike of the given multiplier on the
// row's engine baseline, without basin, and says whether it collapsed.
func spikeCollapses(row MatrixRow, policy string, mult float64, seed uint64) (bool, error) {
	sc, err := matrixScenario(row.MatrixGroup, row.ArrivalsPerMin, mult-1, 0)
	if err != nil {
		return false, err
	}
	sc.Seed = seed
	o, err := sc.Options(policy)
	if err != nil {
		return false, err
	}
	s, err := sim.New(o)
	if err != nil {
		return false, err
	}
	return Collapsed(s.Run().Timeline), nil
}

// Collapsed is the simulator's ground truth of a trapped run, as the detector evaluation counts
// it: the hit rate stayed under 0.5 for five consecutive minutes.
func Collapsed(tl []sim.Minute) bool {
	low := 0
	for _, m := range tl {
		if m.HitRate < 0.5 {
			if low++; low >= 5 {
				return true
			}
		} else {
			low = 0
		}
	}
	return false
}

// summarise fills the rank correlation, the median ratio and the false-low count.
func (r *ToleranceResult) summarise() {
	var pred, simd, ratios []float64
	r.FalseLow = 0
	for _, p := range r.Points {
		if p.Predicted == nil {
			continue
		}
		pred = append(pred, *p.Predicted)
		simd = append(simd, p.Simulated)
		if v := p.Ratio(); v != nil {
			ratios = append(ratios, *v)
		}
		if *p.Predicted < 1+AlertMargin && p.Simulated > 2 {
			r.FalseLow++
		}
	}
	r.Ranked, r.Ratios = len(pred), len(ratios)
	// predictor.Spearman is NaN where the correlation is undefined; two points rank nothing.
	if rho := predictor.Spearman(pred, simd); len(pred) >= 3 && !math.IsNaN(rho) {
		r.Spearman = &rho
	}
	if len(ratios) > 0 {
		m := median(ratios)
		r.MedianRatio = &m
	}
}

// median of a non-empty slice (the mean of the middle two for an even count).
func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ToleranceMarkdown writes the validation as the docs/results.md section.
func ToleranceMarkdown(w io.Writer, r *ToleranceResult, command string) error {
	var b strings.Builder
	s := r.Spec
	fmt.Fprintf(&b, "## Spike tolerance: predicted against simulated\n\n")
	fmt.Fprintf(&b, "Generated by `%s`. Each point is a deployment and engine tier (the tier's engine baseline, "+
		"no basin) at a base arrival rate given as a fraction of its calibrated peak completion rate, %s workload. "+
		"*Predicted* is the detector's spike tolerance as `basin risk` prints it for a scenario: the fluid model on "+
		"the deployment's measured completion curve, at the stable point of the base rate — the largest "+
		"multiplier of λ, held ten minutes, after which the population still comes back. *Simulated* is the "+
		"smallest ten-minute spike multiplier (minutes 15–25 of a 90-minute run) that collapses at least half of "+
		"%d seeds (hit rate under 0.5 for five minutes, as the detector evaluation counts a collapse), bracketed by "+
		"%d bisection steps in log space between 1× and %g× after both ends are tried; the upper end of the final "+
		"bracket is shown. A prediction under the alert line (%.1f×) for a deployment that survives +100%% counts "+
		"as a false low.\n\n",
		command, s.Workload, len(s.Seeds), s.Steps, s.MaxMultiplier, 1+AlertMargin)
	b.WriteString("| deployment | tier | load | λ /min | stable N | predicted | simulated | predicted ÷ simulated | runs |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range r.Points {
		pred := "unknown"
		if p.Predicted != nil {
			pred = fmt.Sprintf("%.2f×", *p.Predicted)
			if p.PredictedCapped {
				pred = "≥ " + pred
			}
		}
		simd := fmt.Sprintf("%.2f×", p.Simulated)
		switch p.Bound {
		case BoundAbove:
			simd = "> " + simd
		case BoundBelow:
			simd = "≤ " + simd
		}
		ratio := "—"
		if v := p.Ratio(); v != nil {
			ratio = fmt.Sprintf("%.2f", *v)
		}
		n := "—"
		if p.StableN != nil {
			n = fmt.Sprintf("%.1f", *p.StableN)
		}
		runs := 0
		for _, t := range p.Tries {
			runs += t.Runs
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %s | %s | %s | %s | %d |\n", p.Deployment, p.Tier, p.Load,
			p.ArrivalsPerMin, n, pred, simd, ratio, runs)
	}
	f := func(v *float64) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf("%.2f", *v)
	}
	fmt.Fprintf(&b, "\nSpearman rank correlation %s over %d points (target ≥ 0.8); median predicted ÷ simulated %s over "+
		"%d points (target 0.75–1.33); false lows %d (target 0).\n", f(r.Spearman), r.Ranked, f(r.MedianRatio),
		r.Ratios, r.FalseLow)
	_, err := io.WriteString(w, b.String())
	return err
}
