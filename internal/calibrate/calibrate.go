// Package calibrate measures a live deployment's knee: it drives agent sessions at a rising
// arrival rate through the load generator against an endpoint (the gateway, an engine router,
// `basin sim serve`), scrapes the engines' and the gateway's metrics with basin's collector, and
// fits the knee on the (working set ÷ cache, hit rate) points, one per step. The simulated path
// (`basin calibrate --scenario`) holds N sessions in closed loop instead; both write the same
// calibration file.
package calibrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim/loadgen"
	"github.com/basin-dev/basin/sim/scenario"
)

// Options configure a live calibration.
type Options struct {
	// Target is the OpenAI-compatible endpoint the sessions are sent to.
	Target string
	// Targets and TargetFile are the metrics endpoints (engines and, ideally, the gateway: without
	// it the working set is estimated from the engines).
	Targets    []collector.Target
	TargetFile string
	// Scenario supplies the workload and the base arrival rate the steps multiply.
	Scenario *scenario.Scenario
	// Multipliers are the arrival-rate steps, × the scenario's base rate (default 0.5 … 3).
	Multipliers []float64
	// Step is how long each rate is held, in the endpoint's time (virtual for sim serve).
	Step time.Duration
	// Speed is virtual seconds per wall second: 1 against real engines.
	Speed float64
	// Progress receives the fraction done.
	Progress func(float64)
	Logger   *slog.Logger
	// Source names the calibration's provenance.
	Source string
}

// DefaultMultipliers step the arrival rate from half the scenario's base rate to three times it.
var DefaultMultipliers = []float64{0.5, 1, 1.5, 2, 2.5, 3}

// Result is the calibration and the points it was fit on.
type Result struct {
	Calibration *detector.Calibration
	Points      []detector.Point
}

// Run drives the steps and fits the knee. It stops by itself after the last step (or when ctx is
// done, with an error).
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if len(o.Multipliers) == 0 {
		o.Multipliers = DefaultMultipliers
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	wallStep := time.Duration(float64(o.Step) / o.Speed)
	// Scrape several times per step and keep the rates' window inside one step.
	interval := min(collector.DefaultInterval, wallStep/6)
	// A reading from anywhere in the step will do, so a signal is stale only after a whole step
	// without a successful scrape (a loaded endpoint answers slowly).
	col, err := collector.New(collector.Options{Targets: o.Targets, TargetFile: o.TargetFile, Interval: interval,
		Timeout: interval, Window: max(2*interval, wallStep/2), StaleAfter: int(wallStep / interval),
		Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	sc := *o.Scenario
	sc.Arrivals.Spikes = nil
	sc.Arrivals.Extra = nil
	for i, m := range o.Multipliers {
		from := scenario.Duration(time.Duration(i) * o.Step)
		sc.Arrivals.Spikes = append(sc.Arrivals.Spikes, scenario.Spike{From: from,
			To: from + scenario.Duration(o.Step), Multiplier: m})
	}
	sc.Duration = scenario.Duration(time.Duration(len(o.Multipliers)) * o.Step)
	sc.Measure = scenario.Window{To: sc.Duration}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	colDone := make(chan error, 1)
	go func() { colDone <- col.Run(ctx) }()
	genDone := make(chan error, 1)
	go func() {
		_, err := loadgen.Run(ctx, loadgen.Options{Target: o.Target, Scenario: &sc, Speed: o.Speed, Logger: o.Logger})
		genDone <- err
	}()
	start := time.Now()
	var pts []detector.Point
	for i := range o.Multipliers {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-genDone:
			if err != nil {
				return nil, fmt.Errorf("load generator: %w", err)
			}
			genDone = nil
		case <-time.After(time.Until(start.Add(time.Duration(i+1) * wallStep))):
		}
		if genDone == nil { // the generator ended early: wait out the step on the clock
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * wallStep)))
		}
		p, err := point(col.Snapshot(), o.Speed)
		if err != nil {
			return nil, fmt.Errorf("step %d (×%g): %w", i+1, o.Multipliers[i], err)
		}
		pts = append(pts, p)
		if o.Progress != nil {
			o.Progress(float64(i+1) / float64(len(o.Multipliers)))
		}
	}
	cancel()
	<-colDone
	src := o.Source
	if src == "" {
		src = "basin calibrate --target " + o.Target
	}
	k, err := callsPerSession(o.Scenario)
	if err != nil {
		return nil, err
	}
	cal, err := detector.NewCalibration(pts, k, time.Now().UTC(), src)
	if err != nil {
		return &Result{Points: pts}, err
	}
	return &Result{Calibration: cal, Points: pts}, nil
}

// point reads one step's measurement; a signal that is not fresh is an error, never a zero. Rates
// are scraped per wall second and converted to the endpoint's time (÷ speed).
func point(s collector.Snapshot, speed float64) (detector.Point, error) {
	need := []collector.Signal{collector.WorkingSet, collector.CacheCapacity, collector.HitRate}
	if blind := s.Blind(need); len(blind) > 0 {
		return detector.Point{}, fmt.Errorf("signals not fresh: %v", blind)
	}
	w, _ := s.Get(collector.WorkingSet)
	c, _ := s.Get(collector.CacheCapacity)
	hit, _ := s.Get(collector.HitRate)
	p := detector.Point{WorkingSetOverCache: w / c, HitRate: hit}
	if n, ok := s.Get(collector.LiveSessions); ok {
		p.Sessions = n
	}
	if r, ok := s.Get(collector.CompletionRate); ok {
		p.CompletionRatePerS = r / speed
	}
	return p, nil
}

func (o Options) validate() error {
	var errs []error
	if o.Target == "" {
		errs = append(errs, errors.New("target: missing"))
	}
	if len(o.Targets) == 0 && o.TargetFile == "" {
		errs = append(errs, errors.New("metrics targets: none (give the engines' and the gateway's /metrics)"))
	}
	if o.Scenario == nil {
		errs = append(errs, errors.New("scenario: missing (it supplies the workload and the base rate)"))
	}
	if o.Step <= 0 {
		errs = append(errs, fmt.Errorf("step: must be > 0, got %v", o.Step))
	}
	if !(o.Speed > 0) {
		errs = append(errs, fmt.Errorf("speed: must be > 0, got %v", o.Speed))
	}
	for i, m := range o.Multipliers {
		if !(m > 0) {
			errs = append(errs, fmt.Errorf("multipliers[%d]: must be > 0, got %v", i, m))
		}
	}
	return errors.Join(errs...)
}

// callsPerSession is the mean number of calls of the scenario's workload, from sessions drawn off
// its generator (the endpoint's metrics do not say).
func callsPerSession(sc *scenario.Scenario) (float64, error) {
	o, err := sc.Options("")
	if err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(sc.Seed, 0xCA11))
	const n = 1000
	var calls int
	for range n {
		calls += len(o.Streams[0].Workload.Session(rng).Calls)
	}
	return float64(calls) / n, nil
}
