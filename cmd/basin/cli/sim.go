package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/progress"
	"github.com/basin-dev/basin/scaler"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/fidelity"
	"github.com/basin-dev/basin/sim/harness"
	"github.com/basin-dev/basin/sim/scenario"
)

func bar(env Env, quiet bool, label string) *progress.Bar {
	if quiet {
		return nil
	}
	return progress.New(env.Stderr, label, time.Now, time.Second)
}

func loadScenario(name string) (*scenario.Scenario, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: --scenario is required (a file, or a preset: %s)", errUsage,
			strings.Join(scenario.Presets(), ", "))
	}
	return scenario.Load(name)
}

// basinWiring is how the commands build a scenario's runs: basin's policies next to the engine
// baselines, the detector in their remediation loop calibrated on the scenario's deployment on
// first use (once, however many runs ask).
func basinWiring(sc *scenario.Scenario) scenario.Wiring {
	return scenario.Wiring{Policies: harness.Policies{Calibrate: harness.CalibrateOnce(sc)}}
}

func simRun(env Env, args []string) error {
	fs := newFlags(env)
	scName := fs.String("scenario", "", "scenario file or preset name")
	policy := fs.String("policy", "", "policy: none, hicache, continuum, basin-current, basin or oracle (default: the scenario's, else none)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	timeline := fs.String("timeline", "", "write the per-minute timeline as CSV to this file")
	calib := fs.String("calibration", "", "the detector's calibration (default: measure the scenario's deployment now)")
	noDetect := fs.Bool("no-detector", false, "do not run basin's collector and detector alongside")
	actAt := fs.Float64("act-at", -1, "minute from which basin's daemon acts on the engine baseline (it watches before); goodput counts the sessions arriving from then on")
	duration := fs.Duration("duration", 0, "run this long instead of the scenario's duration (with --act-at)")
	holds := fs.Bool("holds", true, "with --act-at: let the daemon hold admitted sessions' next calls (false: today's budget, shedding and lending only)")
	scaleCeiling := fs.Int("scale-ceiling", 0, "with a basin policy: let its daemon scale each role from the scenario's pools up to this many instances (each starts after the simulator's start-up delay, cold); 0: the pools as provisioned")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	if *scaleCeiling != 0 && *actAt >= 0 {
		return fmt.Errorf("%w: --scale-ceiling does not go with --act-at", errUsage)
	}
	if *actAt >= 0 {
		return simRunLate(env, sc, *actAt, *duration, *holds, *policy, *calib, *asJSON, *timeline)
	}
	if *duration != 0 {
		return fmt.Errorf("%w: --duration goes with --act-at", errUsage)
	}
	w := basinWiring(sc)
	if *scaleCeiling != 0 {
		pol := harness.Policies{Calibrate: harness.CalibrateOnce(sc)}
		if pol.Scale, err = scaleOptions(sc, *policy, *scaleCeiling); err != nil {
			return err
		}
		w.Policies = pol
	}
	if !*noDetect {
		if w.Observe, err = observer(sc, *calib); err != nil {
			return err
		}
	}
	b := bar(env, *asJSON, "simulating "+sc.Name)
	res, err := w.Run(sc, *policy, b.Set)
	b.Done()
	if err != nil {
		return err
	}
	if *timeline != "" {
		if err := writeFile(*timeline, func(w io.Writer) error { return sim.WriteTimelineCSV(w, res.Timeline) }); err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(env.Stdout, res)
	}
	printResult(env.Stdout, res)
	return nil
}

// scaleOptions is basin's scaling on a scenario's run: each role from its provisioned instances
// (the floor) up to ceiling, the policy's other settings its defaults, as `basin sim scaling` runs it.
func scaleOptions(sc *scenario.Scenario, policy string, ceiling int) (*scaler.Options, error) {
	if policy == "" {
		policy = sc.Policy
	}
	if !strings.HasPrefix(policy, "basin") && policy != harness.Oracle {
		return nil, fmt.Errorf("%w: --scale-ceiling: scaling is basin's daemon's; policy %q has none (use --policy basin)", errUsage, policy)
	}
	p, d := sc.Deployment.Prefill.Instances, sc.Deployment.Decode.Instances
	if ceiling < max(p, d) {
		return nil, fmt.Errorf("%w: --scale-ceiling %d: under the scenario's %d prefill and %d decode instances", errUsage, ceiling, p, d)
	}
	return &scaler.Options{Roles: scaler.Roles(),
		Floor:   map[scaler.Role]int{scaler.RolePrefill: p, scaler.RoleDecode: d},
		Ceiling: map[scaler.Role]int{scaler.RolePrefill: ceiling, scaler.RoleDecode: ceiling}}, nil
}

func writeFile(path string, fill func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := fill(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// num formats an optional number; a missing value prints as "—", never as zero.
func num(v *float64, prec int) string {
	if v == nil {
		return "—"
	}
	return strconv.FormatFloat(*v, 'f', prec, 64)
}

func printResult(w io.Writer, r *sim.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\t%s (policy %s, seed %d, window minutes %g–%g)\n", r.Scenario, r.Policy, r.Seed,
		r.MeasureFromMin, r.MeasureToMin)
	fmt.Fprintf(tw, "goodput\t%.1f sessions/h (no spike %s, ratio %s)\n", r.GoodputPerHour,
		num(r.NoSpikeGoodputPerHour, 1), num(r.GoodputRatio, 2))
	c := r.Sessions
	fmt.Fprintf(tw, "sessions in window\tarrived %d, completed %d, good %d, rejected %d, shed %d, killed %d\n",
		c.Arrived, c.Completed, c.Good, c.Rejected, c.Shed, c.Killed)
	fmt.Fprintf(tw, "prefix hit rate\twindow %s, last 5 min %s\n", num(r.HitRateMeanWindow, 3), num(r.HitRateEnd, 3))
	fmt.Fprintf(tw, "TTFT p50 (window)\t%s s\n", num(r.TTFTP50Window, 2))
	fmt.Fprintf(tw, "first-call wait p50\t%s s\n", num(r.FirstCallWaitP50, 1))
	fmt.Fprintf(tw, "prefill busy (window)\t%s\n", num(r.PrefillBusyWindow, 3))
	fmt.Fprintf(tw, "at minute %g\tlive sessions %d, working set %.2f× cache\n", r.DurationMin, r.LiveSessionsEnd,
		float64(r.WorkingSetEnd)/float64(r.CacheCapacityEnd))
	if obs, ok := r.Detector.(*harness.Observation); ok {
		m := func(v *float64) string {
			if v == nil {
				return "never"
			}
			return fmt.Sprintf("minute %.1f", *v)
		}
		fmt.Fprintf(tw, "detector\tfirst warning %s, drifting %s, trapped %s; now %s\n", m(obs.FirstWarningMin),
			m(obs.FirstDriftingMin), m(obs.FirstTrappedMin), obs.FinalState)
		fmt.Fprintf(tw, "utilisation alerts\tfirst %s\n", m(r.UtilisationAlertFirstMin))
	}
	tw.Flush()
}

func simCompare(env Env, args []string) error {
	fs := newFlags(env)
	scName := fs.String("scenario", "", "scenario file or preset name")
	policies := fs.String("policies", "none,hicache,continuum,basin-current,basin,oracle",
		"comma-separated policies: engine baselines (none, hicache, continuum) and basin's (basin-current, basin, oracle)")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	ps := strings.Split(*policies, ",")
	for _, p := range ps {
		if err := harness.Validate(p); err != nil {
			return fmt.Errorf("%w: --policies: %v", errUsage, err)
		}
	}
	b := bar(env, *asJSON, "comparing "+sc.Name)
	res, err := basinWiring(sc).Compare(sc, ps, b.Set)
	b.Done()
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.Stdout, res)
	}
	printCompare(env.Stdout, sc.Name, res)
	return nil
}

func printCompare(w io.Writer, name string, res []*sim.Result) {
	fmt.Fprintf(w, "scenario %s, seed %d, window minutes %g–%g\n\n", name, res[0].Seed, res[0].MeasureFromMin,
		res[0].MeasureToMin)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tgoodput/h\tno spike\tratio\tvs "+string(res[0].Policy)+"\thit window\thit end\tTTFT p50 s\tfirst-call wait p50 s\tlive end\t")
	for _, r := range res {
		var vs *float64
		if res[0].GoodputPerHour > 0 {
			v := r.GoodputPerHour / res[0].GoodputPerHour
			vs = &v
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Policy, r.GoodputPerHour,
			num(r.NoSpikeGoodputPerHour, 1), num(r.GoodputRatio, 2), num(vs, 2), num(r.HitRateMeanWindow, 3),
			num(r.HitRateEnd, 3), num(r.TTFTP50Window, 2), num(r.FirstCallWaitP50, 1), r.LiveSessionsEnd)
	}
	tw.Flush()
}

func simCurve(env Env, args []string) error {
	fs := newFlags(env)
	scName := fs.String("scenario", "", "scenario file or preset name")
	policy := fs.String("policy", "", "engine policy (default: the scenario's, else none)")
	asJSON := fs.Bool("json", false, "print the curve as JSON")
	nList := fs.String("n", "", "comma-separated populations to measure (default: chosen from the cache size)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	var co scenario.CurveOptions
	if *nList != "" {
		for _, f := range strings.Split(*nList, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return fmt.Errorf("%w: -n: %q is not a positive integer", errUsage, f)
			}
			co.Ns = append(co.Ns, n)
		}
	}
	b := bar(env, *asJSON, "measuring X(N) for "+sc.Name)
	c, err := basinWiring(sc).MeasureCurve(sc, *policy, co, b.Set)
	b.Done()
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.Stdout, c)
	}
	printCurve(env.Stdout, c)
	return nil
}

func printCurve(w io.Writer, c *scenario.Curve) {
	fmt.Fprintf(w, "scenario %s, policy %s: K = %.1f calls per session, λ = %.2f sessions/min\n\n", c.Scenario,
		c.Policy, c.K, c.Lambda)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N live\tW/C\thit rate\tX(N) calls/s\tX(N)/K sessions/min\t\t")
	for _, p := range c.Points {
		mark := ""
		if p.SessionsPerMin >= c.Lambda {
			mark = "≥ λ"
		}
		fmt.Fprintf(tw, "%d\t%.2f\t%.3f\t%.3f\t%.2f\t%s\t\n", p.N, p.WorkingSetOverCache, p.HitRate, p.CallsPerSec,
			p.SessionsPerMin, mark)
	}
	tw.Flush()
	fmt.Fprintf(w, "\npeak %.2f sessions/min at N = %d\n", c.PeakSessionsPerMin, c.PeakN)
	fmt.Fprintf(w, "stable equilibrium N ≈ %s, unstable (basin edge) N ≈ %s\n", num(c.Stable, 1), num(c.Unstable, 1))
}

func simFidelity(env Env, args []string) error {
	fs := newFlags(env)
	seeds := seedsFlag(fs, 10)
	markdown := fs.Bool("markdown", false, "print the Markdown page docs/fidelity.md holds")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	list, err := seeds()
	if err != nil {
		return err
	}
	b := bar(env, *asJSON || *markdown, "checking fidelity")
	rep, err := fidelity.Run(list, b.Set)
	b.Done()
	if err != nil {
		return err
	}
	switch {
	case *asJSON:
		return writeJSON(env.Stdout, rep)
	case *markdown:
		return rep.Markdown(env.Stdout, fmt.Sprintf("basin sim fidelity --seeds %d --markdown", len(list)))
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	for _, c := range rep.Checks {
		fmt.Fprintf(tw, "(%s)\t%d/%d seeds\t%s\n", c.ID, c.Passed, c.Runs, c.Detail)
	}
	return tw.Flush()
}

// observer attaches basin's collector and detector to the scenario's runs (Wiring.Observe), with
// a calibration file or one measured on the scenario's deployment now (a closed-loop step load;
// well under a second in the simulator).
func observer(sc *scenario.Scenario, path string) (func(*sim.Options) error, error) {
	var cal *detector.Calibration
	var err error
	if path != "" {
		cal, err = detector.LoadCalibration(path)
	} else {
		cal, err = harness.Calibrate(sc.WithoutSpikes(), time.Now().UTC())
	}
	if err != nil {
		return nil, err
	}
	return func(o *sim.Options) error { return harness.Observe(o, detector.Options{Calibration: cal}) }, nil
}

// seedsFlag adds --seeds to fs; the function it returns checks the value and lists the seeds
// 1, 2, … n.
func seedsFlag(fs *flagSet, def int) func() ([]uint64, error) {
	n := fs.Int("seeds", def, "number of seeds (1, 2, …)")
	return func() ([]uint64, error) {
		if *n < 1 {
			return nil, fmt.Errorf("%w: --seeds must be ≥ 1", errUsage)
		}
		list := make([]uint64, *n)
		for i := range list {
			list[i] = uint64(i + 1)
		}
		return list, nil
	}
}
