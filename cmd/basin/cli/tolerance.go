package cli

import (
	"flag"
	"fmt"
	"time"

	"github.com/basin-dev/basin/lab/experiment"
)

// simTolerance validates the detector's spike tolerance against the simulator over a grid of
// deployments, tiers and base loads. The wall time goes to stderr: it is about this machine, not
// the result, so it stays out of the Markdown and JSON.
func simTolerance(env Env, args []string) error {
	def := experiment.DefaultToleranceSpec()
	fs := newFlags(env)
	seeds := seedsFlag(fs, len(def.Seeds))
	markdown := fs.Bool("markdown", false, "print the Markdown section of docs/results.md")
	asJSON := fs.Bool("json", false, "print every point, with the multipliers tried, as JSON")
	quick := fs.Bool("quick", false, "a slice of the grid (1P3D, GPU tier, three loads, three seeds, four steps) for a quick look")
	steps := fs.Int("steps", def.Steps, "bisection steps on the spike multiplier")
	workers := fs.Int("workers", def.Workers, "points searched at once (results do not depend on it)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	spec := def
	if *quick {
		spec = experiment.QuickToleranceSpec()
	}
	if set["seeds"] || !*quick {
		list, err := seeds()
		if err != nil {
			return err
		}
		spec.Seeds = list
	}
	if set["steps"] || !*quick {
		spec.Steps = *steps
	}
	spec.Workers = *workers
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	b := bar(env, *asJSON || *markdown, "spike tolerance")
	start := time.Now()
	res, err := experiment.RunTolerance(spec, func(done, total int) { b.Set(float64(done) / float64(total)) })
	b.Done()
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "basin sim tolerance: %d points in %v\n", len(res.Points), time.Since(start).Round(time.Second))
	if *asJSON {
		return writeJSON(env.Stdout, res)
	}
	cmd := "basin sim tolerance"
	if *quick {
		cmd += " --quick"
	}
	if *markdown {
		cmd += fmt.Sprintf(" --seeds %d --markdown", len(spec.Seeds))
	}
	return experiment.ToleranceMarkdown(env.Stdout, res, cmd)
}
