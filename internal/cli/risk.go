package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/calibrate"
	"github.com/basin-dev/basin/internal/harness"
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
	if *calib != "" {
		c, err := detector.LoadCalibration(*calib)
		if err != nil {
			return err
		}
		knee = c.KneeRatio
	}
	if *metrics != "" {
		if *scName != "" {
			return fmt.Errorf("%w: --metrics or --scenario, not both", errUsage)
		}
		targets, err := parseMetricTargets(*metrics)
		if err != nil {
			return fmt.Errorf("%w: --metrics: %v", errUsage, err)
		}
		rep, err := liveRisk(ctx, targets, *window, knee)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(env.Stdout, rep)
		}
		return printRisk(env.Stdout, "live metrics", nil, rep)
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	o, err := sc.Options("")
	if err != nil {
		return err
	}
	sh := harness.Shape(o.Deployment, o.Streams[0].Workload, sc.Seed, 2000)
	rep, err := harness.RiskOf(o.Deployment, sh, knee)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.Stdout, struct {
			Scenario string                `json:"scenario"`
			Shape    harness.WorkloadShape `json:"workload"`
			detector.RiskReport
		}{sc.Name, sh, rep})
	}
	return printRisk(env.Stdout, sc.Name, &sh, rep)
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
	speed := fs.Float64("speed", 1, "live: the endpoint's virtual seconds per wall second (1 for real engines)")
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
		b := bar(env, false, "step load on "+*target)
		res, err := calibrate.Run(ctx, calibrate.Options{Target: *target, Targets: targets, TargetFile: *targetFile,
			Scenario: sc, Step: *step, Speed: *speed, Progress: b.Set})
		b.Done()
		if err != nil {
			return err
		}
		if err := res.Calibration.Save(*out); err != nil {
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
	c, err := scenario.MeasureCurve(sc, "", co, b.Set)
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
	if err := cal.Save(*out); err != nil {
		return err
	}
	printCalibration(env.Stdout, cal, *out)
	return nil
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

// liveRisk watches live metrics for a window: the served fraction is averaged over the window
// (one instant is noisy), the rest read from the final snapshot.
func liveRisk(ctx context.Context, targets []collector.Target, window time.Duration, knee float64) (detector.RiskReport, error) {
	interval := min(collector.DefaultInterval, max(window/6, 100*time.Millisecond))
	col, err := collector.New(collector.Options{Targets: targets, Interval: interval, Timeout: interval,
		Window: max(2*interval, window)})
	if err != nil {
		return detector.RiskReport{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- col.Run(ctx) }()
	var sum float64
	var n int
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.After(window)
wait:
	for {
		select {
		case <-ctx.Done():
			return detector.RiskReport{}, ctx.Err()
		case <-end:
			break wait
		case <-tick.C:
			if f, err := detector.ServedFractionOf(col.Snapshot()); err == nil {
				sum += f
				n++
			}
		}
	}
	snap := col.Snapshot()
	cancel()
	<-done
	if n == 0 {
		_, err := detector.ServedFractionOf(snap)
		return detector.RiskReport{}, fmt.Errorf("no served fraction in %v: %w", window, err)
	}
	in, err := detector.RiskInputsFrom(snap, sum/float64(n), knee)
	if err != nil {
		return detector.RiskReport{}, err
	}
	return detector.Risk(in)
}
