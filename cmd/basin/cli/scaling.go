package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/basin-dev/basin/lab/experiment"
)

// simScaling is `basin sim scaling`: the table of docs/results.md's "Scaling" section.
func simScaling(env Env, args []string) error {
	def := experiment.DefaultScaling()
	fs := newFlags(env)
	seeds := seedsFlag(fs, len(def.Seeds))
	firstSeed := fs.Int("first-seed", 1, "number the seeds from this one (4 with --seeds 3: seeds 4, 5, 6)")
	deps := fs.String("deployments", strings.Join(def.Deployments, ","), "comma-separated deployments (1p1d, 1p3d)")
	workload := fs.String("workload", def.Workload, "synthetic workload")
	loads := fs.String("loads", joinFloats(def.Loads, 1), "comma-separated base loads, fractions of the calibrated peak")
	spikes := fs.String("spikes", joinFloats(def.Spikes, 100), "comma-separated spikes over minutes 15–25, per cent of the base rate")
	ceiling := fs.Int("ceiling", def.Ceiling, "most instances of a role either scaling arm may run")
	second := fs.Duration("second-spike", 0, "repeat each row's spike from this minute (45m: over minutes 45–55), inside the goodput window; 0: one spike")
	spikeSize := fs.Float64("spike-size", 0, "basin's sizing: the spike absorbed, a fraction of the long-run arrival rate (0: the default)")
	kneeShare := fs.Float64("knee-share", 0, "basin's sizing: the share of the knee the steady working set may reach (0: the default)")
	workers := fs.Int("workers", def.Workers, "runs at once (results do not depend on it)")
	markdown := fs.Bool("markdown", false, "print the docs/results.md section")
	plotTo := fs.String("plot", "", "also write the SVG plot of goodput per instance-hour to this file")
	asJSON := fs.Bool("json", false, "print every run as JSON")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	spec := def
	var err error
	if spec.Seeds, spec.Loads, spec.Spikes, err = sweepAxes(seeds, *loads, *spikes); err != nil {
		return err
	}
	if *firstSeed < 1 {
		return fmt.Errorf("%w: --first-seed must be ≥ 1", errUsage)
	}
	for i := range spec.Seeds {
		spec.Seeds[i] += uint64(*firstSeed - 1)
	}
	spec.Deployments, spec.Workload, spec.Ceiling, spec.Workers = splitList(*deps), *workload, *ceiling, *workers
	spec.Need.SpikeSize, spec.Need.KneeShare, spec.SecondSpikeFrom = *spikeSize, *kneeShare, *second
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	b := bar(env, *asJSON || *markdown, "scaling")
	start := time.Now()
	res, err := experiment.RunScaling(spec, func(done, total int) { b.Set(float64(done) / float64(total)) })
	b.Done()
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "basin sim scaling: %d rows in %v\n", len(res.Rows), time.Since(start).Round(time.Second))
	if *plotTo != "" {
		if err := writeFile(*plotTo, func(w io.Writer) error { return experiment.ScalingPlot(w, res) }); err != nil {
			return err
		}
	}
	switch {
	case *asJSON:
		return writeJSON(env.Stdout, res)
	case *markdown:
		return experiment.WriteScalingMarkdown(env.Stdout, res)
	}
	return writeScalingText(env.Stdout, res)
}

func writeScalingText(w io.Writer, r *experiment.ScalingResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "deployment\tload\tspike %\tarm\tscaled\tmax P/D\tgoodput/h\tfirst wait p50 s\tinstance-min\tper instance-h\t")
	for _, row := range r.Rows {
		for _, arm := range experiment.ScalingArms {
			a := row.Summary(arm, r.WindowMin)
			fmt.Fprintf(tw, "%s\t%g\t%g\t%s\t%d/%d\t%d/%d\t%.0f\t%.0f\t%.0f\t%.1f\t\n", row.Deployment, row.Load, 100*row.Spike, arm,
				a.ScaledOut, a.Seeds, a.MaxPrefill, a.MaxDecode, a.Goodput, a.FirstWait, a.InstanceMinutes, a.PerInstanceHour)
		}
	}
	return tw.Flush()
}
