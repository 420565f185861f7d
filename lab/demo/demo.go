// Package demo is `basin demo`: basin end to end on loopback, in minutes, with nothing but Go.
//
// It runs three copies of one deployment side by side, each a simulated PD deployment served over
// HTTP exactly as `basin sim serve` serves it, with a basin gateway in front:
//
//   - "no spike": the scenario's traffic without its spike, the reference for goodput;
//   - "dry run": the spike, with the daemon watching (dry_run: true) — what the deployment does
//     without basin, and what basin would have done;
//   - "acting": the spike, with the daemon acting on the gateway's session budget and on KV
//     lending, through the lender's http backend and the simulated deployment's switch.
//
// The three run at once so the comparison is measured on one machine in one stretch of time
// (these machines are noisy), and so the demo takes one scenario's length of wall time, not
// three. Every part is the production code: sim/serve, gateway, daemon (with a config
// file loaded the way `basin daemon --config` loads it) and the load generator, talking HTTP over
// 127.0.0.1. The gateways and daemons run on the deployment's clock, internal/scaledclock at the
// demo's speed, which the demo injects: their holds, waits and rates are the deployment's. They run in this process rather than as child processes so that nothing can be
// left behind when the demo stops, however it stops.
//
// The gateways start with a session budget out of reach: on their own they only count, as an
// engine router would. Only the acting daemon changes that (and switches lending).
//
// Playing at 90× needs the CPU to keep up: on a busy machine every wake-up comes late, sessions
// live longer than the deployment would make them, and the runs collapse from the machine's lag,
// not the traffic (see MaxMeanLag and MaxLag). Every run's load generator waits are timed; a run
// that falls behind says so while it runs (EventLag), and Write then marks the table and Verdict
// gives no verdict from the live runs, as it does when the no-spike reference itself did not stay
// healthy. The story does not end there: the three runs are then played again in virtual time by
// the simulator, with basin's own policy code wired in (see playVirtual), in seconds, and the
// verdict comes from them — every demo ends with one, whatever the machine.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/loadgen"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/harness"
	"github.com/basin-dev/basin/sim/scenario"
)

// Defaults.
const (
	// DefaultScenario is the Basin paper's trap: its 1P1D H100 deployment, +100% for ten minutes.
	DefaultScenario = "paper-1p1d-h100-spike"
	// DefaultSpeed plays its 90 minutes in one minute of wall time. The simulated deployment, the
	// three gateways, two daemons and load generators keep up with it on two busy cores.
	DefaultSpeed = 90
	// DefaultInterval is the daemons' loop period in the deployment's time; at 90× it is 333 ms of
	// wall time, which keeps every scrape of a busy simulator inside its timeout (one interval).
	DefaultInterval = 30 * time.Second
	// DefaultQueueWait is how long a gateway holds a queued first call, in the deployment's time
	// (converted to wall time at the demo's speed: the hold is a real timer). Longer than the
	// gateway's default (30 s): a session held in the queue waits about as long as it would at 1×,
	// where each retry cycle of a short hold adds the machine's lag at every hop.
	DefaultQueueWait = 10 * time.Minute
)

// Run names.
const (
	NoSpike = "no spike"
	DryRun  = "dry run"
	Acting  = "acting"
)

// Runs are the runs a demo plays, in the order it reports them; the command's help names each.
var Runs = []string{NoSpike, DryRun, Acting}

// Options configure a demo. Scenario and Dir are required.
type Options struct {
	// Scenario is the spike scenario; its spike-free twin is the reference run.
	Scenario *scenario.Scenario
	// Speed is virtual seconds per wall second (DefaultSpeed when zero).
	Speed float64
	// Interval is the daemons' loop period in virtual time (DefaultInterval when zero).
	Interval time.Duration
	// QueueWait is the gateways' max_queue_wait in virtual time (DefaultQueueWait when zero).
	QueueWait time.Duration
	// Dir receives the configuration files, the calibration and the daemons' data directories;
	// it must exist. The caller decides whether to keep it.
	Dir string
	// Listen is the host the servers listen on (127.0.0.1 when empty), on ports the system picks.
	Listen string
	// OnEvent, when set, hears every event as it is seen: the runs' status pages when they are
	// up, the daemons' detector transitions and actions. Calls are serialised.
	OnEvent func(Event)
	// Progress, when set, is called with the fraction of the scenario played, in [0, 1].
	Progress func(float64)
	// Logger receives the components' warnings and errors (discarded when nil).
	Logger *slog.Logger

	// sleep is the load generators' wall-clock wait (a timer when nil): tests make a run fall
	// behind on purpose with one that oversleeps.
	sleep func(ctx context.Context, d time.Duration) error
}

// EventKind says what an Event reports.
type EventKind string

// Event kinds.
const (
	// EventStarted: a run's servers are up; Text is its status page URL (empty without a daemon).
	EventStarted EventKind = "started"
	// EventState: the run's detector changed state; Text is "from → to" and the reasons.
	EventState EventKind = "state"
	// EventAction: the run's daemon decided an action (taken, or only recorded in a dry run).
	EventAction EventKind = "action"
	// EventLag: the run fell behind the wall clock for good (its waits' mean lateness over the last
	// LagWindow passed MaxLag); Text says by how much. Said once per run. A run whose mean over
	// the whole run passes MaxMeanLag is only known at the end: Write says so then.
	EventLag EventKind = "lag"
	// EventVirtual: the live runs finished without a verdict because of the machine (a run did
	// not keep time, or the reference did not stay healthy); the three runs are being played in
	// virtual time for one. Run is empty.
	EventVirtual EventKind = "virtual"
)

// Event is something a run's daemon did, at a time in the deployment's clock since the load began.
type Event struct {
	Run  string        `json:"run"`
	Kind EventKind     `json:"kind"`
	At   time.Duration `json:"at"`
	Text string        `json:"text"`
}

// RunResult is one run's outcome.
type RunResult struct {
	Name string
	// Report is the load generator's report: goodput, hit rate, first-call wait.
	Report *loadgen.Report
	// StatusURL is the daemon's status page (empty for the reference run).
	StatusURL string
	// States and Actions count the detector transitions and the actions the run's daemon took
	// (or, in a dry run, would have taken).
	States, Actions int
	// FinalState is the detector's state at the end ("" without a daemon).
	FinalState string
	// Budget is the gateway's session budget at the end (-1 if the gateway could not say);
	// CountOnly, that the gateway still only counted (no budget was ever set).
	Budget    int64
	CountOnly bool
	// Timing is how well the run kept the deployment's time; a run that did not (see
	// Timing.Kept) measured the machine, not the deployment, and Verdict leaves it out.
	Timing Timing
}

// Result is the demo's outcome: the three runs in the order NoSpike, DryRun, Acting.
type Result struct {
	Scenario string
	Speed    float64
	Runs     []RunResult
	// Elapsed is the wall time the runs took, start-up and shutdown included.
	Elapsed time.Duration
	// Interrupted is set when the caller cancelled the run before the scenario's end: the
	// numbers are partial. (The load generators' reports are always marked interrupted, since
	// the demo cuts the sessions still live at the scenario's end.)
	Interrupted bool
	// Virtual holds the three runs played again in virtual time, when the live ones finished but
	// gave no verdict because of the machine (see playVirtual): the verdict then comes from them.
	Virtual []VirtualRun
}

// withDefaults fills zero fields.
func (o Options) withDefaults() Options {
	if o.Speed == 0 {
		o.Speed = DefaultSpeed
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.QueueWait == 0 {
		o.QueueWait = DefaultQueueWait
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.sleep == nil {
		o.sleep = loadgen.Sleep
	}
	return o
}

// Validate reports every option Run refuses, naming each; zero fields stand for their defaults.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	switch {
	case o.Scenario == nil:
		errs = append(errs, errors.New("scenario: required"))
	case !o.Scenario.HasSpikes():
		errs = append(errs, fmt.Errorf("scenario: %s has no spike to compare with its spike-free twin", o.Scenario.Name))
	}
	if !(o.Speed > 0 && o.Speed <= scaledclock.MaxSpeed) || math.IsInf(o.Speed, 0) {
		errs = append(errs, fmt.Errorf("speed: must be a finite number > 0 and at most %d, got %v", scaledclock.MaxSpeed, o.Speed))
	}
	if o.Interval < 0 {
		errs = append(errs, fmt.Errorf("interval: must be > 0, got %v", o.Interval))
	}
	if o.QueueWait < 0 {
		errs = append(errs, fmt.Errorf("queue_wait: must be > 0, got %v", o.QueueWait))
	}
	if o.Dir == "" {
		errs = append(errs, errors.New("dir: required"))
	} else if fi, err := os.Stat(o.Dir); err != nil || !fi.IsDir() {
		errs = append(errs, fmt.Errorf("dir: %s is not a directory", o.Dir))
	}
	return errors.Join(errs...)
}

// Run plays the scenario's duration on the three runs and returns their outcomes. Cancelling ctx
// stops the load early; the result then holds what was measured so far and the error says so.
// Every server and goroutine it started has stopped when it returns.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("demo options: %w", err)
	}
	o = o.withDefaults()
	began := time.Now()
	sc := o.Scenario
	cal, err := harness.Calibrate(sc.WithoutSpikes(), time.Now().UTC())
	if err != nil {
		return nil, fmt.Errorf("calibrating %s: %w", sc.Deployment.Preset, err)
	}
	calPath := filepath.Join(o.Dir, "calibration.json")
	if err := cal.Save(calPath); err != nil {
		return nil, err
	}

	// The deployment's clock: every gateway and daemon keeps its time (the simulated deployments
	// compute theirs from the wall clock at the same speed).
	clock, err := scaledclock.New(o.Speed, nil)
	if err != nil {
		return nil, fmt.Errorf("demo options: %w", err)
	}
	emit := o.emitter()
	specs := []struct {
		name   string
		load   *scenario.Scenario
		daemon bool
		dryRun bool
	}{
		{NoSpike, sc.WithoutSpikes(), false, false},
		{DryRun, sc, true, true},
		{Acting, sc, true, false},
	}
	stacks := make([]*stack, 0, len(specs))
	stopAll := func() error {
		var errs []error
		for _, s := range stacks {
			errs = append(errs, s.stop())
		}
		return errors.Join(errs...)
	}
	for _, sp := range specs {
		s, err := startStack(o, stackSpec{name: sp.name, daemon: sp.daemon, dryRun: sp.dryRun, calibration: calPath, clock: clock})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("starting the %s run: %w", sp.name, err), stopAll())
		}
		stacks = append(stacks, s)
		s.load = sp.load
		emit(Event{Run: sp.name, Kind: EventStarted, Text: s.statusURL})
	}

	// The load: the scenario's duration of traffic, then the runs are cut off (sessions still
	// live count as unfinished: that is what a trapped deployment leaves behind).
	wall := time.Duration(float64(sc.Duration) / o.Speed)
	loadCtx, stopLoad := context.WithTimeout(ctx, wall)
	defer stopLoad()
	loadStart := time.Now()
	virtual := func(t time.Time) time.Duration { return time.Duration(float64(t.Sub(loadStart)) * o.Speed) }
	reports := make([]*loadgen.Report, len(stacks))
	loadErrs := make([]error, len(stacks))
	meters := make([]*lagMeter, len(stacks))
	var wg sync.WaitGroup
	watchCtx, stopWatch := context.WithCancel(context.Background())
	for i, s := range stacks {
		meters[i] = newLagMeter(o.Speed, time.Now, o.sleep)
		meters[i].begin(loadStart)
		wg.Go(func() {
			reports[i], loadErrs[i] = loadgen.Run(loadCtx, loadgen.Options{
				Target: s.apiURL, Scenario: s.load, Speed: o.Speed, RunID: runID(s.name), NoStream: true,
				Unloaded: func(ss sim.SessionSpec) time.Duration { return sc.Deployment.Deployment.UnloadedTime(ss) },
				Logger:   o.Logger.With("run", s.name, "component", "loadgen"),
				Sleep:    meters[i].Sleep,
			})
		})
	}
	var watchers sync.WaitGroup
	for _, s := range stacks {
		if s.d != nil {
			watchers.Go(func() { s.watch(watchCtx, virtual, emit) })
		}
	}
	watchers.Go(func() { watchLag(watchCtx, stacks, meters, virtual, emit) })
	if o.Progress != nil {
		watchers.Go(func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-watchCtx.Done():
					return
				case now := <-t.C:
					o.Progress(min(1, float64(now.Sub(loadStart))/float64(wall)))
				}
			}
		})
	}
	wg.Wait()
	if o.Progress != nil && ctx.Err() == nil {
		o.Progress(1)
	}
	// One last look at each daemon before stopping them, so the final state is the end's.
	for _, s := range stacks {
		if s.d != nil {
			s.poll(context.Background(), virtual, emit)
		}
	}
	stopWatch()
	watchers.Wait()

	res := &Result{Scenario: sc.Name, Speed: o.Speed}
	var errs []error
	for i, s := range stacks {
		if loadErrs[i] != nil {
			errs = append(errs, fmt.Errorf("the %s run's load: %w", s.name, loadErrs[i]))
		}
		r := RunResult{Name: s.name, Report: reports[i], StatusURL: s.statusURL, Budget: -1}
		if st, err := s.g.State(context.Background()); err == nil {
			r.Budget, r.CountOnly = st.Budget, st.CountOnly
		}
		s.mu.Lock()
		r.States, r.Actions, r.FinalState = s.mu.states, s.mu.actions, s.mu.state
		s.mu.Unlock()
		r.Timing = meters[i].timing()
		res.Runs = append(res.Runs, r)
	}
	errs = append(errs, stopAll())
	if ctx.Err() != nil {
		res.Interrupted = true
		errs = append(errs, fmt.Errorf("interrupted after %v of %v: the results are partial: %w",
			virtual(time.Now()).Round(time.Second), time.Duration(sc.Duration), ctx.Err()))
	}
	if needsVirtual(res) && ctx.Err() == nil {
		emit(Event{Kind: EventVirtual, At: virtual(time.Now()),
			Text: "the live runs give no verdict on this machine; playing them in virtual time"})
		if o.Progress != nil {
			o.Progress(0)
		}
		if res.Virtual, err = playVirtual(sc, o.Progress); err != nil {
			errs = append(errs, err)
		}
	}
	res.Elapsed = time.Since(began)
	return res, errors.Join(errs...)
}

// watchLag says, once per run, when a run's load generator has fallen behind the wall clock for
// good (lagMeter.behind): while it runs, so that whoever watches knows before the table why the
// numbers will not count.
func watchLag(ctx context.Context, stacks []*stack, meters []*lagMeter, virtual func(time.Time) time.Duration, emit func(Event)) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	said := make([]bool, len(stacks))
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for i, s := range stacks {
				if said[i] {
					continue
				}
				how, behind := meters[i].behind(now)
				if !behind {
					continue
				}
				said[i] = true
				emit(Event{Run: s.name, Kind: EventLag, At: virtual(now), Text: "falling behind the wall clock: " + how +
					"; this run will not count for a verdict"})
			}
		}
	}
}

// emitter serialises OnEvent.
func (o Options) emitter() func(Event) {
	var mu sync.Mutex
	return func(e Event) {
		if o.OnEvent == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		o.OnEvent(e)
	}
}

func runID(name string) string {
	switch name {
	case NoSpike:
		return "nospike"
	case DryRun:
		return "dryrun"
	}
	return name
}

// token is a fresh random bearer token for a run's admin APIs.
func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// listen opens a loopback listener on a port the system picks.
func listen(host string) (net.Listener, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	return ln, nil
}

// serveHTTP serves h on ln until stop is called; stop waits for the server to end.
func serveHTTP(ln net.Listener, h http.Handler) (stop func()) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // http.ErrServerClosed after Shutdown
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		<-done
	}
}

// newRegistry is a private registry per component, as each would have in its own process.
func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }
