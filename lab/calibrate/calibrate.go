// Package calibrate measures a live deployment's knee: it drives agent sessions at a rising
// arrival rate through the load generator against an endpoint (the gateway, an engine router,
// `basin sim serve`), scrapes the engines' and the gateway's metrics with basin's collector, and
// fits the knee on the (working set ÷ cache, hit rate) points, one per step. The simulated path
// (`basin calibrate --scenario`) holds N sessions in closed loop instead; both write the same
// calibration file.
package calibrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/atomicfile"
	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/loadgen"
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
	// Progress, when set, is told how the run is going: at each step's start and end, and about
	// every ProgressEvery within a step.
	Progress func(Progress)
	Logger   *slog.Logger
	// Source names the calibration's provenance.
	Source string
}

// ProgressEvery is how often Progress hears from a step under way: steps last minutes.
const ProgressEvery = time.Second

// Progress is how a live calibration is going.
type Progress struct {
	// Step is the step under way, 1-based, of Steps; Multiplier its arrival-rate multiplier and
	// RatePerMin its arrival rate, sessions per minute of the endpoint's time.
	Step, Steps int
	Multiplier  float64
	RatePerMin  float64
	// Done is the fraction of the whole run done, Elapsed its wall time so far.
	Done    float64
	Elapsed time.Duration
	// Points are the steps measured so far.
	Points []detector.Point
}

// DefaultMultipliers step the arrival rate from half the scenario's base rate to three times it.
var DefaultMultipliers = []float64{0.5, 1, 1.5, 2, 2.5, 3}

// Result is the calibration and the points it was fit on. When Run fails after measuring some steps
// (interrupted, a step without fresh signals, no knee in the points), Result still holds the points
// and Calibration is nil: Partial makes them a file worth keeping.
type Result struct {
	Calibration *detector.Calibration
	Points      []detector.Point
	// Multipliers and Step are the run's plan, for the partial file.
	Multipliers []float64
	Step        time.Duration
	Source      string
	// CallsPerSession is K of the scenario's workload (the endpoint's metrics do not say).
	CallsPerSession float64
	// Admission is what the gateway's metrics said of its admission at the end of each measured
	// step, one per point; nil where the gateway was not scraped.
	Admission []*Admission
	// SessionEnds is how the sessions the run cut short, or that did not complete, were ended at
	// the endpoint (every one is, so that none holds a budget after the run).
	SessionEnds loadgen.SessionEnds
}

// Admission is the gateway's admission at the end of a step, as its metrics said.
type Admission struct {
	// BudgetTokens is its budget B; 0 while it only counts (admission.count_only).
	BudgetTokens float64 `json:"budget_tokens"`
	// ReservedTokens is the live sessions' demand on it, QueuedSessions the first calls waiting.
	ReservedTokens float64 `json:"reserved_tokens"`
	QueuedSessions float64 `json:"queued_sessions"`
	// CacheTokens is the cache capacity C the step's point was divided by.
	CacheTokens float64 `json:"cache_tokens"`
}

// capped says whether the budget held the step's working set back: a budget is set, and sessions
// waited for it or what was admitted filled it.
func (a *Admission) capped() bool {
	return a != nil && a.BudgetTokens > 0 && (a.QueuedSessions >= 1 || a.ReservedTokens >= capFill*a.BudgetTokens)
}

// capFill is the share of the budget reserved from which a step counts as held at the budget even
// with no session queued at the instant it ended.
const capFill = 0.95

// Run drives the steps and fits the knee. It stops by itself after the last step, or when ctx is
// done: then the error wraps ctx's, and the Result holds the points of the steps completed.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	wallStep := time.Duration(float64(o.Step) / o.Speed)
	// Scrape several times per step and keep the rates' window inside one step.
	interval := min(collector.DefaultInterval, wallStep/6) // wall time
	// The metrics are read on the endpoint's clock (a simulated deployment announces its speed,
	// and the collector refuses one that differs from its clock's): rates come per second of the
	// endpoint's time. A scrape's timeout stays wall time: the network does not run faster.
	clock, err := scaledclock.New(o.Speed, nil)
	if err != nil {
		return nil, fmt.Errorf("speed: %w", err)
	}
	span := func(wall time.Duration) time.Duration { return time.Duration(float64(wall) * o.Speed) }
	// A reading from anywhere in the step will do, so a signal is stale only after a whole step
	// without a successful scrape (a loaded endpoint answers slowly).
	col, err := collector.New(collector.Options{Targets: o.Targets, TargetFile: o.TargetFile, Interval: span(interval),
		Timeout: min(interval, span(interval)), Window: span(max(2*interval, wallStep/2)), StaleAfter: int(wallStep / interval),
		Now: clock.Now, WallDuration: clock.WallDuration, Logger: o.Logger})
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

	k, err := callsPerSession(o.Scenario)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	colDone := make(chan error, 1)
	go func() { colDone <- col.Run(ctx) }()
	genDone := make(chan error, 1)
	var ends loadgen.SessionEnds // written before genDone is
	go func() {
		rep, err := loadgen.Run(ctx, loadgen.Options{Target: o.Target, Scenario: &sc, Speed: o.Speed, Logger: o.Logger})
		if rep != nil {
			ends = rep.SessionEnds
		}
		genDone <- err
	}()
	src := o.Source
	if src == "" {
		src = "basin calibrate --target " + o.Target
	}
	res := &Result{Multipliers: o.Multipliers, Step: o.Step, Source: src, CallsPerSession: k}
	// Nothing of the run outlives Run: the collector and the generator's calls are stopped, and
	// the generator ends at the endpoint every session it cut short before it returns.
	defer func() {
		cancel()
		<-colDone
		if genDone != nil {
			<-genDone
		}
		res.SessionEnds = ends
		if ends.Failed > 0 {
			o.Logger.Warn("sessions of the step load not ended: they hold the gateway's budget until its idle timeout",
				"count", ends.Failed, "of", ends.Asked, "ids", ends.FailedIDs, "err", ends.LastError)
		}
	}()
	start := time.Now()
	tick := time.NewTicker(ProgressEvery)
	defer tick.Stop()
	report := func(i int) {
		if o.Progress == nil {
			return
		}
		n := len(o.Multipliers)
		m, el := o.Multipliers[min(i, n-1)], time.Since(start)
		o.Progress(Progress{Step: min(i+1, n), Steps: n, Multiplier: m, RatePerMin: o.Scenario.Arrivals.RatePerMin * m,
			Done: min(1, float64(el)/float64(wallStep*time.Duration(n))), Elapsed: el, Points: slices.Clone(res.Points)})
	}
	for i := range o.Multipliers {
		report(i)
		end := start.Add(time.Duration(i+1) * wallStep)
		stepEnd := time.NewTimer(time.Until(end))
	wait:
		for {
			select {
			case <-ctx.Done():
				stepEnd.Stop()
				return res, fmt.Errorf("interrupted in step %d of %d, after %d measured: %w", i+1,
					len(o.Multipliers), len(res.Points), ctx.Err())
			case err := <-genDone: // nil once the generator has ended: the step runs out on the clock
				if err != nil {
					stepEnd.Stop()
					return res, fmt.Errorf("load generator: %w", err)
				}
				genDone = nil
			case <-tick.C:
				report(i)
			case <-stepEnd.C:
				break wait
			}
		}
		snap := col.Snapshot()
		p, err := point(snap)
		if err != nil {
			return res, fmt.Errorf("step %d (×%g): %w", i+1, o.Multipliers[i], err)
		}
		res.Points = append(res.Points, p)
		res.Admission = append(res.Admission, admission(snap))
	}
	report(len(o.Multipliers))
	res.Calibration, err = detector.NewCalibration(res.Points, k, time.Now().UTC(), src)
	return res, res.explain(err)
}

// explain adds to a fit's error what the run knows of its cause: a knee beyond the measured range
// under a gateway whose budget held the steps back is the budget's doing (budgetCap).
func (r *Result) explain(err error) error {
	if !errors.Is(err, detector.ErrNoDrop) {
		return err
	}
	if why := r.budgetCap(); why != "" {
		return fmt.Errorf("%w: %s", err, why)
	}
	return err
}

// budgetCap explains a knee beyond the measured range by the gateway's budget, when it held the
// steps back: the working set cannot pass what the budget admits, so more arrivals only queued
// at the gateway and the engines never saw the load that would have shown the knee. Empty when
// no step was held at the budget.
func (r *Result) budgetCap() string {
	first := -1
	for i, a := range r.Admission {
		if a.capped() {
			first = i
			break
		}
	}
	if first < 0 {
		return ""
	}
	last := len(r.Admission) - 1
	for !r.Admission[last].capped() {
		last--
	}
	a := r.Admission[last]
	maxWC := 0.0
	for _, p := range r.Points[first:] {
		maxWC = max(maxWC, p.WorkingSetOverCache)
	}
	capped := 0
	for _, a := range r.Admission {
		if a.capped() {
			capped++
		}
	}
	return fmt.Sprintf("the gateway's admission budget capped the working set: %d of %d steps were held at it "+
		"(from step %d on W/C reached at most %.2f; at step %d the budget was %.0f tokens, %.2f× the cache of %.0f, "+
		"with %.0f tokens reserved and %.0f sessions queued), so the engines never saw the load that shows the knee; "+
		"calibrate with the gateway counting only (admission.count_only: true) or with a budget out of reach, "+
		"and the daemon stopped or paused",
		capped, len(r.Admission), first+1, maxWC, last+1, a.BudgetTokens, a.BudgetTokens/a.CacheTokens, a.CacheTokens,
		a.ReservedTokens, a.QueuedSessions)
}

// admission reads the gateway's admission from a step's snapshot; nil without a fresh budget (no
// gateway scraped).
func admission(s collector.Snapshot) *Admission {
	b, ok := s.Get(collector.Budget)
	if !ok {
		return nil
	}
	c, _ := s.Get(collector.CacheCapacity)
	a := &Admission{BudgetTokens: b, CacheTokens: c}
	a.ReservedTokens, _ = s.Get(collector.Reserved)
	a.QueuedSessions, _ = s.Get(collector.QueuedSessions)
	return a
}

// Partial is what a live calibration measured before it stopped short of a calibration: the points
// of the steps it completed and why it stopped. It is not a calibration file (the daemon does not
// read it); it is kept so that hours of step load are not lost: the points show how far the
// deployment got toward its knee, and Calibration holds a fit when they already reach it.
type Partial struct {
	// Partial is always true: it marks the file for what it is.
	Partial     bool             `json:"partial"`
	Reason      string           `json:"reason"`
	Source      string           `json:"source"`
	Created     time.Time        `json:"created"`
	Multipliers []float64        `json:"multipliers"`
	StepSeconds float64          `json:"step_seconds"`
	StepsDone   int              `json:"steps_done"`
	Points      []detector.Point `json:"points"`
	// Calibration is the fit of the points when they reach the knee, else absent.
	Calibration *detector.Calibration `json:"calibration,omitempty"`
}

// SavePartial writes what r measured, and why the run stopped, to path (atomically). It is an
// error to save a result without points: there is nothing to keep.
func (r *Result) SavePartial(path string, reason error, now time.Time) error {
	if r == nil || len(r.Points) == 0 {
		return errors.New("save partial calibration: no step was measured")
	}
	p := Partial{Partial: true, Source: r.Source, Created: now.UTC(), Multipliers: r.Multipliers,
		StepSeconds: r.Step.Seconds(), StepsDone: len(r.Points), Points: r.Points}
	if reason != nil {
		p.Reason = reason.Error()
	}
	if c, err := detector.NewCalibration(r.Points, r.CallsPerSession, now.UTC(), r.Source+" (partial)"); err == nil {
		p.Calibration = c
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("save partial calibration: %w", err)
	}
	if err := atomicfile.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("save partial calibration %s: %w", path, err)
	}
	return nil
}

// PartialPath is where the partial file of a calibration meant for out goes: beside it, with
// .partial.json for .json (calibration.partial.json for calibration.json).
func PartialPath(out string) string {
	return strings.TrimSuffix(out, ".json") + ".partial.json"
}

// SaveCalibration writes c to out (atomically) and then removes the partial file beside it
// (PartialPath), left by an earlier run that stopped short: once the calibration is written, the
// partial file is an older, incomplete measurement of the same thing, and it would be read for
// the current one. A partial file is kept only while no calibration has replaced it.
func SaveCalibration(c *detector.Calibration, out string) error {
	if err := c.Save(out); err != nil {
		return err
	}
	partial := PartialPath(out)
	if err := os.Remove(partial); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the earlier partial calibration %s: %w", partial, err)
	}
	return nil
}

// point reads one step's measurement; a signal that is not fresh is an error, never a zero. Rates
// are per second of the endpoint's time (the collector runs on its clock).
func point(s collector.Snapshot) (detector.Point, error) {
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
		p.CompletionRatePerS = r
	}
	return p, nil
}

// withDefaults fills zero fields.
func (o Options) withDefaults() Options {
	if len(o.Multipliers) == 0 {
		o.Multipliers = DefaultMultipliers
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Validate reports every option Run refuses, naming each; zero fields stand for their defaults.
func (o Options) Validate() error {
	o = o.withDefaults()
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
