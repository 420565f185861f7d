package cli

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/lab/experiment"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// simRunLate is `basin sim run --act-at`: the daemon watches the scenario's engine baseline until
// the acting minute, then acts.
func simRunLate(env Env, sc *scenario.Scenario, actAt float64, duration time.Duration, holds bool, policy, calib string,
	asJSON bool, timeline string) error {
	if policy != "" {
		return fmt.Errorf("%w: --act-at runs the scenario's engine baseline with basin's daemon acting from that minute; --policy does not apply", errUsage)
	}
	var cal *detector.Calibration
	if calib != "" {
		var err error
		if cal, err = detector.LoadCalibration(calib); err != nil {
			return err
		}
	}
	b := bar(env, asJSON, "simulating "+sc.Name)
	res, err := experiment.RunLate(sc, experiment.LateOptions{ActAt: time.Duration(actAt * float64(time.Minute)), Duration: duration,
		Calibration: cal, Remediate: remediate.Options{DisableHolds: !holds}})
	b.Done()
	if err != nil {
		return err
	}
	if timeline != "" {
		if err := writeFile(timeline, func(w io.Writer) error { return sim.WriteTimelineCSV(w, res.Timeline) }); err != nil {
			return err
		}
	}
	if asJSON {
		return writeJSON(env.Stdout, res)
	}
	printResult(env.Stdout, res.Result)
	printLate(env.Stdout, res)
	return nil
}

func printLate(w io.Writer, r *experiment.LateResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rec := "never"
	if r.RecoveredMin != nil {
		rec = fmt.Sprintf("minute %.0f (%.0f after acting)", *r.RecoveredMin, *r.RecoveredMin-r.ActAtMin)
	}
	fmt.Fprintf(tw, "acting from\tminute %g\n", r.ActAtMin)
	fmt.Fprintf(tw, "recovered\t%s (first of %d minutes with hit rate ≥ %.2f)\n", rec, experiment.RecoveryWindow, experiment.RecoveryHitRate)
	fmt.Fprintf(tw, "holds\t%d sessions at most, %d calls held, %d of them at the %.0f s bound, longest %.0f s\n",
		r.HeldSessionsMax, r.CallsHeld, r.HoldBoundReleases, r.HoldBoundSeconds, r.HeldCallMaxSeconds)
	tw.Flush()
}

// simLate is `basin sim late`: the table of docs/results.md's "Acting on a trapped deployment".
func simLate(env Env, args []string) error {
	fs := newFlags(env)
	scen := fs.String("scenarios", strings.Join(experiment.LateScenarios, ","), "comma-separated scenarios (the +100% spike presets)")
	acts := fs.String("act-at", "25,30,40,60", "comma-separated minutes at which the daemon starts acting")
	seedFrom := fs.Uint64("seed-from", 41, "first seed (seeds never used to tune basin)")
	seeds := fs.Int("seeds", 6, "number of seeds")
	duration := fs.Duration("duration", 150*time.Minute, "length of each run")
	markdown := fs.Bool("markdown", false, "print the docs/results.md section")
	also := fs.String("also-hold-bound", "", "comma-separated hold bounds to measure beside the default's (e.g. 8m)")
	deadline := fs.Duration("start-deadline", 0, "also measure holds with the gateway refusing first calls that cannot start within this (0: no such row)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	var bounds []time.Duration
	for _, f := range strings.Split(*also, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := time.ParseDuration(f)
		if err != nil || v <= 0 || v >= gateway.MaxHoldBound {
			return fmt.Errorf("%w: --also-hold-bound: %q is not a duration > 0 and under %v", errUsage, f, gateway.MaxHoldBound)
		}
		bounds = append(bounds, v)
	}
	var mins []float64
	for _, f := range strings.Split(*acts, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) {
			return fmt.Errorf("%w: --act-at: %q is not a minute", errUsage, f)
		}
		mins = append(mins, v)
	}
	if *deadline < 0 {
		return fmt.Errorf("%w: --start-deadline must be ≥ 0", errUsage)
	}
	if *seeds < 1 {
		return fmt.Errorf("%w: --seeds must be ≥ 1", errUsage)
	}
	o := experiment.LateTableOptions{Scenarios: strings.Split(*scen, ","), ActAt: mins, Duration: *duration, AlsoBounds: bounds, StartDeadline: *deadline}
	for i := range *seeds {
		o.Seeds = append(o.Seeds, *seedFrom+uint64(i))
	}
	b := bar(env, false, "acting late")
	t, err := experiment.MeasureLate(o, func(done, total int) { b.Set(float64(done) / float64(total)) })
	b.Done()
	if err != nil {
		return err
	}
	if *markdown {
		return experiment.WriteLateMarkdown(env.Stdout, t)
	}
	return writeLateText(env.Stdout, t)
}

func writeLateText(w io.Writer, t *experiment.LateTable) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tact at\tholds\trecovered\tmedian min\tmax min\tgoodput ÷ twin\tfirst-call wait p50 s\theld max\tbound releases\t")
	for _, r := range t.Rows {
		holds := "off"
		if r.Holds {
			holds = "bound " + (time.Duration(r.HoldBoundSeconds) * time.Second).String()
		}
		if r.StartDeadlineSeconds > 0 {
			holds += ", start deadline " + (time.Duration(r.StartDeadlineSeconds) * time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%g\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%d\t%d\t\n", r.Scenario, r.ActAtMin, holds, r.Recovered, r.Runs,
			num(r.RecoverMedian, 0), num(r.RecoverMax, 0), num(r.RatioMedian, 2), num(r.FirstWaitP50Median, 0), r.HeldMax,
			r.BoundReleases)
	}
	return tw.Flush()
}
