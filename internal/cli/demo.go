package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// runDemo shows the trap on the paper's 1P1D preset: the same sessions with and without a
// ten-minute +100% spike, simulated in virtual time.
func runDemo(_ context.Context, env Env, args []string) error {
	fs := newFlags(env, "demo")
	scName := fs.String("scenario", "paper-1p1d-h100-spike", "spike scenario (file or preset) to compare with its spike-free twin")
	policy := fs.String("policy", "", "engine policy (default: the scenario's, else none)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	if !sc.HasSpikes() {
		return fmt.Errorf("%w: scenario %s has no spike to compare", errUsage, sc.Name)
	}
	b := bar(env, false, "simulating")
	spiked, calm, err := scenario.RunPair(sc, *policy, b.Set)
	b.Done()
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s: %s deployment, %g sessions/min, spikes %s\n\n", sc.Name,
		sc.Deployment.Preset, sc.Arrivals.RatePerMin, describeSpikes(sc))
	printSideBySide(env.Stdout, calm, spiked)
	fmt.Fprintf(env.Stdout, "\nThe spike ended at minute %s; arrivals went back to the rate the deployment served "+
		"comfortably, yet the spiked run %s.\n", spikeEnd(sc), verdict(calm, spiked))
	return nil
}

func describeSpikes(sc *scenario.Scenario) string {
	s := ""
	for _, sp := range sc.Arrivals.Spikes {
		s += fmt.Sprintf("×%g from %v to %v ", sp.Multiplier, sp.From, sp.To)
	}
	for _, ex := range sc.Arrivals.Extra {
		s += fmt.Sprintf("+%g/min %s from %v to %v ", ex.RatePerMin, ex.Workload, ex.From, ex.To)
	}
	return s
}

func spikeEnd(sc *scenario.Scenario) string {
	var end scenario.Duration
	for _, sp := range sc.Arrivals.Spikes {
		end = max(end, sp.To)
	}
	for _, ex := range sc.Arrivals.Extra {
		end = max(end, ex.To)
	}
	return fmt.Sprintf("%g", time.Duration(end).Minutes())
}

func verdict(calm, spiked *sim.Result) string {
	if spiked.HitRateEnd != nil && calm.HitRateEnd != nil && *spiked.HitRateEnd < 0.5 && *calm.HitRateEnd > 0.8 {
		return fmt.Sprintf("was still stuck at the end: hit rate %.2f against %.2f, %d live sessions against %d",
			*spiked.HitRateEnd, *calm.HitRateEnd, spiked.LiveSessionsEnd, calm.LiveSessionsEnd)
	}
	return "recovered on this seed (the trap is stochastic: try --scenario with another seed)"
}

func printSideBySide(w io.Writer, calm, spiked *sim.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tno spike\t+spike\t")
	row := func(name, a, b string) { fmt.Fprintf(tw, "%s\t%s\t%s\t\n", name, a, b) }
	f := func(v float64) *float64 { return &v }
	row("goodput (sessions/h)", num(f(calm.GoodputPerHour), 1), num(f(spiked.GoodputPerHour), 1))
	row("ratio to no spike", "1.00", num(spiked.GoodputRatio, 2))
	row("prefix hit rate (window)", num(calm.HitRateMeanWindow, 3), num(spiked.HitRateMeanWindow, 3))
	row("prefix hit rate (last 5 min)", num(calm.HitRateEnd, 3), num(spiked.HitRateEnd, 3))
	row("TTFT p50 (s)", num(calm.TTFTP50Window, 2), num(spiked.TTFTP50Window, 2))
	row("first-call wait p50 (s)", num(calm.FirstCallWaitP50, 1), num(spiked.FirstCallWaitP50, 1))
	row("prefill busy (window)", num(calm.PrefillBusyWindow, 3), num(spiked.PrefillBusyWindow, 3))
	row("live sessions at the end", fmt.Sprint(calm.LiveSessionsEnd), fmt.Sprint(spiked.LiveSessionsEnd))
	row("working set / cache at the end", fmt.Sprintf("%.2f", float64(calm.WorkingSetEnd)/float64(calm.CacheCapacityEnd)),
		fmt.Sprintf("%.2f", float64(spiked.WorkingSetEnd)/float64(spiked.CacheCapacityEnd)))
	tw.Flush()
}
