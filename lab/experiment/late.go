package experiment

import (
	"errors"
	"fmt"
	"github.com/basin-dev/basin/sim/harness"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// Acting late: an operator installs basin, or switches its daemon from watching to acting, on a
// deployment that is already trapped. Until the acting minute the run is the detector
// evaluation's (the gateway only counts, lending is off, the engine queues in arrival order);
// from it on, basin's daemon acts — budget, shedding, lending and, unless turned off, holds —
// and goodput is counted for the sessions that arrive from then on.

// Recovery's test: the first minute from acting on that starts RecoveryWindow minutes whose
// token-weighted hit rate is at least RecoveryHitRate.
const (
	RecoveryHitRate = 0.85
	RecoveryWindow  = 5
)

// LateOptions configure one late-acting run.
type LateOptions struct {
	// ActAt is when the daemon starts acting (it watches before).
	ActAt time.Duration
	// Duration, when set, replaces the scenario's; goodput counts the sessions that arrive in
	// [ActAt, Duration).
	Duration time.Duration
	// Remediate configures the policy (DisableHolds: today's basin without the hold rule).
	Remediate remediate.Options
	// Calibration is the detector's (nil: measured on the scenario without its spikes).
	Calibration *detector.Calibration
	// HoldBound is the gateway's hold bound (zero: admission.DefaultHoldBound).
	HoldBound time.Duration
	// StartDeadline is the gateway's admission.start_deadline (zero: off).
	StartDeadline time.Duration
}

// LateResult is a late-acting run's outcome: the simulator's result for the window from the
// acting minute on, and what the hold rule did.
type LateResult struct {
	*sim.Result
	ActAtMin float64 `json:"act_at_min"`
	// RecoveredMin is the first minute from ActAtMin on that starts RecoveryWindow minutes with a
	// hit rate of at least RecoveryHitRate; null if none does before the run ends.
	RecoveredMin *float64 `json:"recovered_min"`
	// HeldSessionsMax is the most sessions the gateway held at once; HeldCallsMax the most
	// calls waiting at once; HeldCallMaxSeconds the longest a call waited (never past the
	// gateway's hold bound, HoldBoundSeconds).
	HeldSessionsMax    int     `json:"held_sessions_max"`
	HeldCallsMax       int     `json:"held_calls_max"`
	HeldCallMaxSeconds float64 `json:"held_call_max_seconds"`
	HoldBoundSeconds   float64 `json:"hold_bound_seconds"`
	// CallsHeld counts calls that waited, HoldBoundReleases those that went at the bound.
	CallsHeld         uint64 `json:"calls_held"`
	HoldBoundReleases uint64 `json:"hold_bound_releases"`
	// AdmittedCut counts window sessions that were admitted and then ended before finishing
	// (killed): the hold rule never cuts, so this stays 0.
	AdmittedCut int `json:"admitted_cut"`
	// TooLate counts sessions the gateway refused because their first call could not start
	// within its start deadline (admission.Options.StartDeadline; 0 when it is off).
	TooLate uint64 `json:"too_late"`
}

// RunLate runs sc (its seed) with the daemon acting from o.ActAt, and fills the result's
// no-spike goodput from the same run without spikes.
func RunLate(sc *scenario.Scenario, o LateOptions) (*LateResult, error) {
	cal := o.Calibration
	if cal == nil {
		var err error
		if cal, err = harness.Calibrate(sc.WithoutSpikes(), harness.Epoch); err != nil {
			return nil, fmt.Errorf("calibrate %s: %w", sc.Name, err)
		}
	}
	res, err := runLate(sc, cal, o)
	if err != nil {
		return nil, err
	}
	if sc.HasSpikes() {
		twin, err := runLate(sc.WithoutSpikes(), cal, o)
		if err != nil {
			return nil, fmt.Errorf("%s without spikes: %w", sc.Name, err)
		}
		noSpike := twin.GoodputPerHour
		res.NoSpikeGoodputPerHour = &noSpike
		if noSpike > 0 {
			v := res.GoodputPerHour / noSpike
			res.GoodputRatio = &v
		}
	}
	return res, nil
}

func runLate(sc *scenario.Scenario, cal *detector.Calibration, lo LateOptions) (*LateResult, error) {
	c := *sc
	if lo.Duration > 0 {
		c.Duration = scenario.Duration(lo.Duration)
	}
	end := time.Duration(c.Duration)
	if lo.ActAt < 0 || lo.ActAt >= end {
		return nil, fmt.Errorf("act at %v: must be in [0, %v)", lo.ActAt, end)
	}
	c.Measure = scenario.Window{From: scenario.Duration(lo.ActAt), To: c.Duration}
	o, err := c.Options("")
	if err != nil {
		return nil, err
	}
	if o.Gate != nil {
		return nil, fmt.Errorf("scenario %s: its engine baseline already has a gate", sc.Name)
	}
	core, err := admission.New(admission.Options{CountOnly: true, HoldBound: lo.HoldBound, StartDeadline: lo.StartDeadline})
	if err != nil {
		return nil, err
	}
	g := harness.NewGate(core, func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) })
	o.Gate = g
	o.Deployment.Lending.MaxFraction = max(o.Deployment.Lending.MaxFraction, 0.5)
	if _, err := harness.AttachRemediationFrom(&o, g, detector.Options{Calibration: cal}, lo.Remediate, lo.ActAt, nil); err != nil {
		return nil, err
	}
	bound := lo.HoldBound
	if bound == 0 {
		bound = admission.DefaultHoldBound
	}
	out := &LateResult{ActAtMin: lo.ActAt.Minutes(), HoldBoundSeconds: bound.Seconds()}
	// Watch the core's hold list at every observation step, after the loop acted.
	watch := o.Controller
	o.Controller = &sim.Controller{Every: watch.Every, Tick: func(t time.Duration, ctl sim.Control) {
		watch.Tick(t, ctl)
		s := core.Snapshot(harness.Epoch.Add(t), false)
		out.HeldSessionsMax = max(out.HeldSessionsMax, s.Held)
		out.HeldCallsMax = max(out.HeldCallsMax, s.HeldCalls)
		out.HeldCallMaxSeconds = max(out.HeldCallMaxSeconds, s.OldestHeldCallSeconds)
	}}
	s, err := sim.New(o)
	if err != nil {
		return nil, err
	}
	out.Result = s.Run()
	out.Result.Scenario = sc.Name
	out.RecoveredMin = recoveredFrom(out.Timeline, lo.ActAt)
	cnt := core.Snapshot(harness.Epoch.Add(end), false).Counters
	out.CallsHeld, out.HoldBoundReleases, out.TooLate = cnt.CallsHeld, cnt.HoldBoundReleases, cnt.TooLate
	out.AdmittedCut = out.Sessions.Killed
	return out, nil
}

// recoveredFrom is the first minute at or after from that starts RecoveryWindow minutes with a
// token-weighted hit rate of at least RecoveryHitRate, or nil.
func recoveredFrom(tl []sim.Minute, from time.Duration) *float64 {
	first := int(math.Ceil(from.Minutes()))
	for i := first; i+RecoveryWindow <= len(tl); i++ {
		var hit, prompt float64
		for _, m := range tl[i : i+RecoveryWindow] {
			hit += m.HitTokens
			prompt += m.PromptTokens
		}
		if prompt > 0 && hit/prompt >= RecoveryHitRate {
			v := float64(i)
			return &v
		}
	}
	return nil
}

// LateScenarios are the scenarios `basin sim late` measures by default: the Basin paper's two
// deployments with arrivals doubled for ten minutes, the runs whose collapse the detector
// evaluation measures.
var LateScenarios = []string{"paper-1p1d-h100-spike", "paper-1p3d-h200-spike"}

// LateTableOptions configure MeasureLate.
type LateTableOptions struct {
	Scenarios []string
	ActAt     []float64 // minutes
	Seeds     []uint64
	Duration  time.Duration
	// AlsoBounds adds, per scenario and acting minute, a row with holds at each of these hold
	// bounds (the default's row is always there): how the bound sets what holds can rescue.
	AlsoBounds []time.Duration
	// StartDeadline, when set, adds a row with holds (the default bound) and the gateway refusing
	// early the first calls that cannot start within it.
	StartDeadline time.Duration
}

// LateRow aggregates one scenario, acting minute and hold setting over the seeds.
type LateRow struct {
	Scenario string  `json:"scenario"`
	ActAtMin float64 `json:"act_at_min"`
	Holds    bool    `json:"holds"`
	// HoldBoundSeconds is the gateway's hold bound in the runs with holds (0 without);
	// StartDeadlineSeconds its start deadline (0: off).
	HoldBoundSeconds     float64 `json:"hold_bound_seconds,omitempty"`
	StartDeadlineSeconds float64 `json:"start_deadline_seconds,omitempty"`
	// LoadRatio is the base arrival rate over the deployment's calibrated peak completion rate.
	LoadRatio float64 `json:"load_ratio"`
	Runs      int     `json:"runs"`
	// Recovered counts runs recovered before the end, Within15 those recovered within 15
	// minutes of acting; RecoverMedian and RecoverMax are minutes from acting to recovery over
	// the runs, a run never recovered counting as the rest of the run (so the median is an upper
	// bound once half never recover: Never says how many).
	Recovered, Within15, Never int
	RecoverMedian, RecoverMax  *float64
	// RecoverMinMin is the fastest recovery.
	RecoverMinMin *float64
	// RatioMedian and RatioMin are post-acting goodput over the no-spike twin's.
	RatioMedian, RatioMin *float64
	// FirstWaitP50Median is the median over seeds of the post-acting first-call wait p50.
	FirstWaitP50Median *float64
	// HeldMax is the most sessions held at once in any run: 0 when holds never engaged.
	HeldMax int
	// BoundReleases and CallsHeld are summed over the runs; HeldCallMaxSeconds is the longest
	// hold of any call.
	BoundReleases, CallsHeld uint64
	HeldCallMaxSeconds       float64
	// AdmittedCut sums admitted sessions ended before finishing (never by basin: 0); TooLate
	// the sessions refused for their start deadline.
	AdmittedCut int
	TooLate     uint64
	Results     []*LateResult `json:"-"`
}

// LateTable is MeasureLate's result.
type LateTable struct {
	Options LateTableOptions
	Rows    []LateRow
}

// MeasureLate runs every scenario × acting minute × seed with and without holds, two runs at a
// time; each run is deterministic, so the table does not depend on the scheduling.
func MeasureLate(o LateTableOptions, progress func(done, total int)) (*LateTable, error) {
	type job struct {
		row  int
		seed uint64
	}
	t := &LateTable{Options: o}
	var jobs []job
	cals := map[string]*detector.Calibration{}
	for _, name := range o.Scenarios {
		sc, err := scenario.Load(name)
		if err != nil {
			return nil, err
		}
		cal, err := harness.Calibrate(sc.WithoutSpikes(), harness.Epoch)
		if err != nil {
			return nil, fmt.Errorf("calibrate %s: %w", name, err)
		}
		cals[name] = cal
		load := 0.0
		if cal.PeakCompletionRatePerS > 0 {
			load = sc.Arrivals.RatePerMin / 60 / cal.PeakCompletionRatePerS
		}
		for _, act := range o.ActAt {
			rows := []LateRow{{Holds: false}, {Holds: true, HoldBoundSeconds: admission.DefaultHoldBound.Seconds()}}
			if o.StartDeadline > 0 {
				rows = append(rows, LateRow{Holds: true, HoldBoundSeconds: admission.DefaultHoldBound.Seconds(),
					StartDeadlineSeconds: o.StartDeadline.Seconds()})
			}
			for _, b := range o.AlsoBounds {
				rows = append(rows, LateRow{Holds: true, HoldBoundSeconds: b.Seconds()})
			}
			for _, r := range rows {
				r.Scenario, r.ActAtMin, r.LoadRatio = name, act, load
				t.Rows = append(t.Rows, r)
				for _, seed := range o.Seeds {
					jobs = append(jobs, job{row: len(t.Rows) - 1, seed: seed})
				}
			}
		}
	}
	results := make([]*LateResult, len(jobs))
	err := parallel(len(jobs), 2, func(i int) error {
		j := jobs[i]
		row := t.Rows[j.row]
		sc, err := scenario.Load(row.Scenario)
		if err != nil {
			return err
		}
		sc.Seed = j.seed
		res, err := RunLate(sc, LateOptions{ActAt: time.Duration(row.ActAtMin * float64(time.Minute)), Duration: o.Duration,
			Calibration: cals[row.Scenario], Remediate: remediate.Options{DisableHolds: !row.Holds},
			HoldBound:     time.Duration(row.HoldBoundSeconds * float64(time.Second)),
			StartDeadline: time.Duration(row.StartDeadlineSeconds * float64(time.Second))})
		if err != nil {
			return fmt.Errorf("%s seed %d act at %g: %w", row.Scenario, j.seed, row.ActAtMin, err)
		}
		results[i] = res
		return nil
	}, progress)
	if err != nil {
		return nil, err
	}
	for i, j := range jobs {
		t.Rows[j.row].Results = append(t.Rows[j.row].Results, results[i])
	}
	for i := range t.Rows {
		t.Rows[i].aggregate(o.Duration)
	}
	return t, nil
}

func (r *LateRow) aggregate(duration time.Duration) {
	var rec, ratio, wait []float64
	for _, res := range r.Results {
		r.Runs++
		left := duration.Minutes() - res.ActAtMin
		if res.RecoveredMin != nil {
			r.Recovered++
			m := *res.RecoveredMin - res.ActAtMin
			if m <= 15 {
				r.Within15++
			}
			rec = append(rec, m)
		} else {
			r.Never++
			rec = append(rec, left)
		}
		if res.GoodputRatio != nil {
			ratio = append(ratio, *res.GoodputRatio)
		}
		if res.FirstCallWaitP50 != nil {
			wait = append(wait, *res.FirstCallWaitP50)
		}
		r.HeldMax = max(r.HeldMax, res.HeldSessionsMax)
		r.BoundReleases += res.HoldBoundReleases
		r.CallsHeld += res.CallsHeld
		r.HeldCallMaxSeconds = max(r.HeldCallMaxSeconds, res.HeldCallMaxSeconds)
		r.AdmittedCut += res.AdmittedCut
		r.TooLate += res.TooLate
	}
	if len(rec) > 0 {
		r.RecoverMedian, r.RecoverMax, r.RecoverMinMin = ptrOf(median(rec)), ptrOf(slices.Max(rec)), ptrOf(slices.Min(rec))
	}
	if len(ratio) > 0 {
		r.RatioMedian, r.RatioMin = ptrOf(median(ratio)), ptrOf(slices.Min(ratio))
	}
	if len(wait) > 0 {
		r.FirstWaitP50Median = ptrOf(median(wait))
	}
}

func ptrOf(v float64) *float64 { return &v }

// parallel runs n jobs, k at a time, reporting progress after each.
func parallel(n, k int, job func(i int) error, progress func(done, total int)) error {
	errs := make([]error, n)
	sem := make(chan struct{}, k)
	var mu sync.Mutex
	done := 0
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = job(i)
			mu.Lock()
			done++
			if progress != nil {
				progress(done, n)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
