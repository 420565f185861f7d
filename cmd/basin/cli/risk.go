package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/lab/calibrate"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/harness"
	"github.com/basin-dev/basin/sim/scenario"
)

// runRisk says which limit a deployment and workload reach first: the cache knee (the trap) or
// decode memory, with the numbers behind it.
func runRisk(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	scName := fs.String("scenario", "", "scenario file or preset describing the deployment and the workload")
	fs.StringVar(scName, "config", "", "the same as --scenario: a scenario file is the deployment's description")
	calib := fs.String("calibration", "", "calibration.json from basin calibrate (its knee replaces the default 1.9)")
	asJSON := fs.Bool("json", false, "print JSON")
	metrics := fs.String("metrics", "", "live: comma-separated role=URL metrics endpoints (engines and the gateway) instead of a scenario")
	window := fs.Duration("window", time.Minute, "live: how long to watch the metrics")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	knee := 0.0
	var cal *detector.Calibration
	if *calib != "" {
		c, err := detector.LoadCalibration(*calib)
		if err != nil {
			return err
		}
		knee, cal = c.KneeRatio, c
	}
	if *metrics != "" {
		if *scName != "" {
			return fmt.Errorf("%w: --metrics or --scenario, not both", errUsage)
		}
		targets, err := parseMetricTargets(*metrics)
		if err != nil {
			return fmt.Errorf("%w: --metrics: %v", errUsage, err)
		}
		if err := checkTargets(ctx, targets); err != nil {
			return err
		}
		rep, err := liveRisk(ctx, targets, *window, knee, cal)
		if rep != nil {
			var werr error
			if *asJSON {
				werr = writeJSON(env.Stdout, rep)
			} else {
				werr = printLiveRisk(env.Stdout, rep)
			}
			if err == nil {
				err = werr
			}
		}
		return err
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	o, err := basinWiring(sc).Options(sc, "")
	if err != nil {
		return err
	}
	sh := harness.Shape(o.Deployment, o.Streams[0].Workload, sc.Seed, 2000)
	rep, err := harness.RiskOf(o.Deployment, sh, knee)
	if err != nil {
		return err
	}
	tol := scenarioTolerance(sc, o.Deployment, sh, cal)
	if *asJSON {
		return writeJSON(env.Stdout, struct {
			Scenario string                `json:"scenario"`
			Shape    harness.WorkloadShape `json:"workload"`
			detector.RiskReport
			SpikeTolerance toleranceReport `json:"spike_tolerance"`
		}{sc.Name, sh, rep, tol})
	}
	if err := printRisk(env.Stdout, sc.Name, &sh, rep); err != nil {
		return err
	}
	return printTolerance(env.Stdout, tol)
}

// toleranceReport is the spike tolerance `basin risk` prints: the largest ten-minute arrival spike
// the deployment absorbs at population N and arrival rate λ, or why it is unknown.
type toleranceReport struct {
	*detector.SpikeTolerance
	Sessions         float64 `json:"live_sessions"`
	ArrivalsPerMin   float64 `json:"arrivals_per_min"`
	CurveFrom        string  `json:"curve_from,omitempty"`
	Unknown          string  `json:"unknown,omitempty"`
	StableEquilibria bool    `json:"at_stable_equilibrium,omitempty"`
}

// take fills the tolerance from an outlook, or says why it is unknown.
func (r *toleranceReport) take(out detector.Outlook, err error) {
	switch {
	case err != nil:
		r.Unknown = err.Error()
	case out.SpikeTolerance == nil:
		r.Unknown = "the completion curve is not known up to the edge"
	default:
		r.SpikeTolerance = out.SpikeTolerance
	}
}

// scenarioTolerance is the spike tolerance of a scenario's deployment settled at its base arrival
// rate, from the given calibration or, without one, the scenario's own measured curve.
func scenarioTolerance(sc *scenario.Scenario, dep sim.Deployment, sh harness.WorkloadShape, cal *detector.Calibration) toleranceReport {
	r := toleranceReport{ArrivalsPerMin: sc.Arrivals.RatePerMin, CurveFrom: "--calibration", StableEquilibria: true}
	if cal == nil {
		c, err := harness.Calibrate(sc.WithoutSpikes(), time.Now().UTC())
		if err != nil {
			r.Unknown = "measuring the scenario's completion curve: " + err.Error()
			return r
		}
		cal, r.CurveFrom = c, "the scenario, measured (basin calibrate --scenario)"
	}
	cache := float64(dep.Prefill.Instances * (dep.Prefill.CacheTokens + dep.Prefill.HostCacheTokens))
	out, err := detector.CalibratedOutlook(cal, -1, sc.Arrivals.RatePerMin/60, sh.MeanContext, cache)
	if out.Equilibria.Stable != nil {
		r.Sessions = *out.Equilibria.Stable
	}
	r.take(out, err)
	return r
}

// printTolerance adds the spike tolerance to a risk printout.
func printTolerance(w io.Writer, r toleranceReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	at := fmt.Sprintf("at N %.1f, λ %.2f sessions/min", r.Sessions, r.ArrivalsPerMin)
	if r.StableEquilibria {
		at = fmt.Sprintf("settled at N %.1f (the stable point of λ %.2f sessions/min)", r.Sessions, r.ArrivalsPerMin)
	}
	switch t := r.SpikeTolerance; {
	case r.Unknown != "":
		fmt.Fprintf(tw, "spike tolerance\tunknown: %s\n", r.Unknown)
	case t.Ratio <= 1:
		fmt.Fprintf(tw, "spike tolerance\tnone: %s, any more arrivals leave it trapped\n", at)
	default:
		least := ""
		if t.Capped {
			least = "at least "
		}
		fmt.Fprintf(tw, "spike tolerance\t%s+%.0f%% arrivals for 10 min (%.0f extra sessions), %s\n", least,
			100*(t.Ratio-1), t.Sessions, at)
	}
	if r.CurveFrom != "" && r.Unknown == "" {
		fmt.Fprintf(tw, "\tcompletion curve from %s\n", r.CurveFrom)
	}
	return tw.Flush()
}

func printRisk(w io.Writer, source string, sh *harness.WorkloadShape, rep detector.RiskReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "source\t%s\n", source)
	if sh != nil {
		fmt.Fprintf(tw, "workload\tmean context %.0f tokens, %.1f calls per session, call %.1f s, tool %.1f s: %.0f%% of live sessions served\n",
			sh.MeanContext, sh.CallsPerSess, sh.MeanCall, sh.MeanTool, 100*sh.ServedFraction)
	}
	fmt.Fprintf(tw, "cache limit\t%.0f sessions\n", rep.CacheLimitSessions)
	fmt.Fprintf(tw, "decode limit\t%.0f sessions\n", rep.DecodeLimitSessions)
	fmt.Fprintf(tw, "binds first\t%s\n", rep.Binding)
	for _, r := range rep.Reasons {
		fmt.Fprintf(tw, "\t%s\n", r)
	}
	return tw.Flush()
}

// runCalibrate measures a deployment's knee by step load. With --scenario only, the simulated
// deployment holds a rising number of sessions in closed loop; with --target, agent sessions are
// sent at rising arrival rates to a live endpoint while its metrics are scraped. Either way the
// (working set ÷ cache, hit rate) points give the knee.
func runCalibrate(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	scName := fs.String("scenario", "", "scenario file or preset: the deployment to step-load in the simulator, or the workload to send to --target")
	out := fs.String("o", "calibration.json", "where to write the calibration")
	maxN := fs.Int("max-sessions", 0, "simulated: largest population to try (default: from the cache size)")
	target := fs.String("target", "", "live: the OpenAI-compatible endpoint to send sessions to (the gateway)")
	metrics := fs.String("metrics", "", "live: comma-separated role=URL metrics endpoints (roles prefill, decode, unified, gateway)")
	targetFile := fs.String("targets-file", "", "live: the metrics endpoints as a Prometheus file_sd file")
	step := fs.Duration("step", 5*time.Minute, "live: how long each arrival rate is held (endpoint time)")
	speed := fs.Float64("speed", 0, "live: the endpoint's virtual seconds per wall second (default: what the engines announce in basin_sim_speed, 1 for real engines; must agree with it)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	if *target != "" {
		targets, err := parseMetricTargets(*metrics)
		if err != nil {
			return fmt.Errorf("%w: --metrics: %v", errUsage, err)
		}
		if err := checkTargets(ctx, targets); err != nil {
			return err
		}
		s, err := calibrationSpeed(ctx, targets, *speed)
		if err != nil {
			return err
		}
		b := bar(env, false, "step load on "+*target)
		res, err := calibrate.Run(ctx, calibrate.Options{Target: *target, Targets: targets, TargetFile: *targetFile,
			Scenario: sc, Step: *step, Speed: s, Progress: func(p calibrate.Progress) {
				b.SetNote(p.Done, calibrationNote(p))
			},
			// Sessions it could not end at the gateway are named on stderr.
			Logger: slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		b.Done()
		if err != nil {
			return keepPartial(env, *out, res, err)
		}
		if err := calibrate.SaveCalibration(res.Calibration, *out); err != nil {
			return err
		}
		printCalibration(env.Stdout, res.Calibration, *out)
		return nil
	}
	var co scenario.CurveOptions
	if *maxN > 0 {
		step := max(1, *maxN/30)
		for n := step; n <= *maxN; n += step {
			co.Ns = append(co.Ns, n)
		}
	}
	b := bar(env, false, "step load on "+sc.Name)
	c, err := basinWiring(sc).MeasureCurve(sc, "", co, b.Set)
	b.Done()
	if err != nil {
		return err
	}
	pts := make([]detector.Point, len(c.Points))
	for i, p := range c.Points {
		pts[i] = detector.Point{WorkingSetOverCache: p.WorkingSetOverCache, HitRate: p.HitRate, Sessions: float64(p.N),
			CompletionRatePerS: p.SessionsPerMin / 60}
	}
	cal, err := detector.NewCalibration(pts, c.K, time.Now().UTC(), "basin calibrate --scenario "+sc.Name)
	if err != nil {
		return err
	}
	if err := calibrate.SaveCalibration(cal, *out); err != nil {
		return err
	}
	printCalibration(env.Stdout, cal, *out)
	return nil
}

// calibrationSpeed is the speed a live calibration runs at: the one the engines announce
// (basin_sim_speed; 1 for real engines), which --speed, when given, must agree with — a step load
// at the wrong speed measures nothing, and found out only after its first step.
func calibrationSpeed(ctx context.Context, targets []collector.Target, flag float64) (float64, error) {
	if flag < 0 || math.IsNaN(flag) || math.IsInf(flag, 0) {
		return 0, fmt.Errorf("%w: --speed %v: must be a finite number > 0", errUsage, flag)
	}
	col, err := collector.New(collector.Options{Targets: targets, Timeout: targetCheckTimeout, Interval: targetCheckTimeout})
	if err != nil {
		return 0, err
	}
	probe, err := col.ProbeSpeed(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the deployment's speed: %w", err)
	}
	switch {
	case flag == 0:
		return probe.Speed, nil
	case len(probe.Announced) > 0 && flag != probe.Speed:
		return 0, fmt.Errorf("%w: --speed %v, but the engines announce %s %v: leave --speed out", errUsage, flag,
			collector.SpeedMetric, probe.Speed)
	}
	return flag, nil
}

// calibrationNote says where a live calibration is: the step, its rate, the time so far and the
// last point measured.
func calibrationNote(p calibrate.Progress) string {
	s := fmt.Sprintf("step %d/%d ×%g (%.2f sessions/min), %v", p.Step, p.Steps, p.Multiplier, p.RatePerMin,
		p.Elapsed.Round(time.Second))
	if n := len(p.Points); n > 0 {
		last := p.Points[n-1]
		s += fmt.Sprintf("; %d measured, last W/C %.2f hit rate %.3f", n, last.WorkingSetOverCache, last.HitRate)
	}
	return s
}

// keepPartial saves what a live calibration measured before it failed or was interrupted, next to
// where the calibration would have gone (calibration.partial.json for calibration.json), and says
// where on stderr. It returns the run's error: a partial file is not a calibration.
func keepPartial(env Env, out string, res *calibrate.Result, runErr error) error {
	if res == nil || len(res.Points) == 0 {
		fmt.Fprintln(env.Stderr, "basin calibrate: no step was measured; nothing saved")
		return runErr
	}
	path := calibrate.PartialPath(out)
	if err := res.SavePartial(path, runErr, time.Now()); err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprintf(env.Stderr, "basin calibrate: the %d of %d steps measured are saved in %s (marked partial: not a calibration)\n",
		len(res.Points), len(res.Multipliers), path)
	return runErr
}

func printCalibration(w io.Writer, c *detector.Calibration, path string) {
	fmt.Fprintf(w, "knee at W/C %.2f (hit rate plateau %.3f); peak completion %.2f sessions/min; K = %.1f calls per session\n",
		c.KneeRatio, c.PlateauHit, 60*c.PeakCompletionRatePerS, c.CallsPerSession)
	fmt.Fprintf(w, "written to %s\n", path)
}

// parseMetricTargets reads "prefill=http://h:p/metrics,decode=…" into collector targets named
// role-index.
func parseMetricTargets(s string) ([]collector.Target, error) {
	var out []collector.Target
	seen := map[string]int{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		role, url, ok := strings.Cut(f, "=")
		if !ok || url == "" {
			return nil, fmt.Errorf("%q: want role=URL", f)
		}
		r := collector.Role(role)
		switch r {
		case collector.RolePrefill, collector.RoleDecode, collector.RoleUnified, collector.RoleGateway:
		default:
			return nil, fmt.Errorf("%q: role %q, want prefill, decode, unified or gateway", f, role)
		}
		out = append(out, collector.Target{Name: fmt.Sprintf("%s-%d", role, seen[role]), URL: url, Role: r})
		seen[role]++
	}
	return out, nil
}

// checkTargets asks every metrics endpoint once, at the same time, before any window is waited
// out: an endpoint that cannot be reached or does not answer 200 is an error naming the target and
// its URL, at once.
func checkTargets(ctx context.Context, targets []collector.Target) error {
	ctx, cancel := context.WithTimeout(ctx, targetCheckTimeout)
	defer cancel()
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() { errs[i] = checkTarget(ctx, t) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// targetCheckTimeout bounds the up-front check of a metrics endpoint; a scrape of a healthy
// engine takes milliseconds.
const targetCheckTimeout = 5 * time.Second

func checkTarget(ctx context.Context, t collector.Target) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return fmt.Errorf("metrics target %s (%s): %w", t.Name, t.URL, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			cause := op.Err
			var sys *os.SyscallError
			if errors.As(cause, &sys) {
				cause = sys.Err // "connection refused", not "connect: connection refused"
			}
			return fmt.Errorf("metrics target %s (%s): cannot connect: %w", t.Name, t.URL, cause)
		}
		return fmt.Errorf("metrics target %s (%s): %w", t.Name, t.URL, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metrics target %s (%s): answered %s", t.Name, t.URL, resp.Status)
	}
	return nil
}

// liveRiskReport is what `basin risk --metrics` can say. The engines alone give the cache side —
// its capacity and the working set at the knee — and decode's capacity; the limits in sessions and
// which binds first need the mean context (working set ÷ live sessions) and the served fraction,
// which come from the gateway. What could not be computed is listed in Unknown with the reason,
// never printed as a zero.
type liveRiskReport struct {
	Targets []string `json:"targets"`
	// Speed is the deployment's simulated seconds per wall second (collector.SpeedMetric; 1 for
	// real engines): rates are per second of its time.
	Speed                float64  `json:"deployment_speed"`
	CacheCapacityTokens  float64  `json:"cache_capacity_tokens"`
	KneeRatio            float64  `json:"knee_ratio"`
	KneeFrom             string   `json:"knee_from"`
	KneeWorkingSetTokens float64  `json:"knee_working_set_tokens"`
	DecodeCapacityTokens *float64 `json:"decode_capacity_tokens,omitempty"`
	*detector.RiskReport
	SpikeTolerance *toleranceReport `json:"spike_tolerance,omitempty"`
	Unknown        []string         `json:"unknown,omitempty"`
}

// liveRisk watches live metrics. With a gateway target it watches the whole window: the served
// fraction is averaged over it (one instant is noisy), the rest read from the final snapshot.
// Without one it stops as soon as the engines' capacities are read, and says what needs the
// gateway. A non-nil report comes with an error when the binding limit could not be decided.
func liveRisk(ctx context.Context, targets []collector.Target, window time.Duration, knee float64, cal *detector.Calibration) (*liveRiskReport, error) {
	// A simulated deployment served S times faster than real time announces S: the metrics are
	// read on a clock at that speed, so that λ and every rate are per second of the deployment's
	// time. --window is how long the operator waits, wall time; the collector's rate window is the
	// deployment's time that passes meanwhile. A scrape's timeout stays wall time.
	probeCol, err := collector.New(collector.Options{Targets: targets, Timeout: targetCheckTimeout, Interval: targetCheckTimeout})
	if err != nil {
		return nil, err
	}
	probe, err := probeCol.ProbeSpeed(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the deployment's speed: %w", err)
	}
	clock, err := scaledclock.New(probe.Speed, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", collector.SpeedMetric, err)
	}
	span := func(wall time.Duration) time.Duration { return time.Duration(float64(wall) * probe.Speed) }
	interval := min(collector.DefaultInterval, max(window/6, 100*time.Millisecond)) // wall time
	col, err := collector.New(collector.Options{Targets: targets, Interval: span(interval), Timeout: min(interval, span(interval)),
		Window: span(max(2*interval, window)), Now: clock.Now, WallDuration: clock.WallDuration})
	if err != nil {
		return nil, err
	}
	gateway := false
	rep := &liveRiskReport{KneeRatio: knee, KneeFrom: "calibration", Speed: probe.Speed}
	for _, t := range targets {
		gateway = gateway || t.Role == collector.RoleGateway
		rep.Targets = append(rep.Targets, t.Name+"="+t.URL)
	}
	if knee == 0 {
		rep.KneeRatio, rep.KneeFrom = detector.DefaultKneeRatio, "the Basin paper's, without --calibration"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- col.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var sum float64
	var n int
	poll := time.NewTicker(min(interval, 100*time.Millisecond))
	defer poll.Stop()
	next := time.Now().Add(interval)
	end := time.After(window)
wait:
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-end:
			break wait
		case now := <-poll.C:
			snap := col.Snapshot()
			if !gateway {
				if _, ok := snap.Get(collector.CacheCapacity); ok {
					break wait
				}
				continue
			}
			if now.Before(next) {
				continue
			}
			next = now.Add(interval)
			if f, err := detector.ServedFractionOf(snap); err == nil {
				sum += f
				n++
			}
		}
	}
	snap := col.Snapshot()
	c, ok := snap.Get(collector.CacheCapacity)
	if !ok {
		return nil, fmt.Errorf("no cache capacity in %v: %s %s (the prefill or unified engines' metrics give it)",
			window, collector.CacheCapacity, snap.State(collector.CacheCapacity))
	}
	rep.CacheCapacityTokens, rep.KneeWorkingSetTokens = c, rep.KneeRatio*c
	if d, ok := snap.Get(collector.DecodeCapacity); ok {
		rep.DecodeCapacityTokens = &d
	} else {
		rep.Unknown = append(rep.Unknown, fmt.Sprintf("decode capacity: %s %s (the decode engines' metrics give it)",
			collector.DecodeCapacity, snap.State(collector.DecodeCapacity)))
	}
	if !gateway {
		rep.Unknown = append(rep.Unknown, "cache and decode limits in sessions, and which binds first: they need the mean "+
			"context (working set ÷ live sessions) and the served fraction (sessions in a call ÷ live sessions), "+
			"which come from the gateway; add gateway=URL (its /metrics) to --metrics")
		return rep, errors.New("which limit binds first is unknown without a gateway target")
	}
	if n == 0 {
		_, err := detector.ServedFractionOf(snap)
		rep.Unknown = append(rep.Unknown, fmt.Sprintf("served fraction: none read in %v: %v", window, err))
		return rep, fmt.Errorf("which limit binds first is unknown: no served fraction in %v: %w", window, err)
	}
	in, err := detector.RiskInputsFrom(snap, sum/float64(n), knee)
	if err != nil {
		rep.Unknown = append(rep.Unknown, err.Error())
		return rep, err
	}
	r, err := detector.Risk(in)
	if err != nil {
		rep.Unknown = append(rep.Unknown, err.Error())
		return rep, err
	}
	rep.RiskReport = &r
	rep.SpikeTolerance = liveTolerance(snap, cal, c)
	return rep, nil
}

// liveTolerance is the spike tolerance at the population and arrival rate the metrics show, on the
// calibration's completion curve (a minute of metrics does not show the curve up to the edge).
func liveTolerance(snap collector.Snapshot, cal *detector.Calibration, cache float64) *toleranceReport {
	r := &toleranceReport{CurveFrom: "--calibration"}
	n, okN := snap.Get(collector.LiveSessions)
	lambda, okL := snap.Get(collector.ArrivalRate)
	w, okW := snap.Get(collector.WorkingSet)
	r.Sessions, r.ArrivalsPerMin = n, 60*lambda
	switch {
	case cal == nil:
		r.Unknown = "needs --calibration: the completion curve up to the edge comes from basin calibrate"
		return r
	case !okN || !okL || !okW || n <= 0:
		r.Unknown = "no live sessions, arrival rate or working set in the gateway's metrics"
		return r
	}
	out, err := detector.CalibratedOutlook(cal, n, lambda, w/n, cache)
	r.take(out, err)
	return r
}

// printLiveRisk writes what the live metrics gave, and what they could not.
func printLiveRisk(w io.Writer, rep *liveRiskReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "source	live metrics: %s\n", strings.Join(rep.Targets, ", "))
	if rep.Speed != 1 {
		fmt.Fprintf(tw, "speed	%g simulated seconds per wall second (%s): rates per simulated second\n", rep.Speed, collector.SpeedMetric)
	}
	fmt.Fprintf(tw, "cache capacity	%s tokens\n", remediate.FormatTokens(int64(rep.CacheCapacityTokens)))
	fmt.Fprintf(tw, "knee	W/C %.2f (%s): working set %s tokens\n", rep.KneeRatio, rep.KneeFrom,
		remediate.FormatTokens(int64(rep.KneeWorkingSetTokens)))
	if rep.DecodeCapacityTokens != nil {
		fmt.Fprintf(tw, "decode capacity	%s tokens\n", remediate.FormatTokens(int64(*rep.DecodeCapacityTokens)))
	}
	if r := rep.RiskReport; r != nil {
		fmt.Fprintf(tw, "cache limit	%.0f sessions\n", r.CacheLimitSessions)
		fmt.Fprintf(tw, "decode limit	%.0f sessions\n", r.DecodeLimitSessions)
		fmt.Fprintf(tw, "binds first	%s\n", r.Binding)
		for _, s := range r.Reasons {
			fmt.Fprintf(tw, "\t%s\n", s)
		}
	}
	for _, u := range rep.Unknown {
		fmt.Fprintf(tw, "unknown	%s\n", u)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.SpikeTolerance != nil {
		return printTolerance(w, *rep.SpikeTolerance)
	}
	return nil
}
