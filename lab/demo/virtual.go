package demo

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/harness"
	"github.com/basin-dev/basin/sim/scenario"
)

// Playing in virtual time.
//
// A machine that cannot keep the demo's speed measures itself, not the deployment, and a lower
// speed that it would keep can take an hour. The story does not need the wall clock: the
// simulator's discrete-event core plays the same scenario in virtual time, where nothing can fall
// behind, with basin's own policy code wired in — the gateway's admission core and the daemon's
// remediation (harness.Policies), as `basin sim run --policy basin` plays it. So when
// the live runs cannot be compared (a run did not keep time, or the no-spike reference did not stay
// healthy), the demo plays the three runs that way as well, in seconds, and the verdict comes from
// them, saying so. The runs are deterministic: the same seed gives the same numbers on any machine.

// VirtualRun is one run played in virtual time.
type VirtualRun struct {
	Name   string
	Result *sim.Result
}

// playVirtual plays the scenario's three runs in virtual time: its spike-free twin and the spike
// without basin (policy none, the dry run's deployment), and the spike with basin acting (policy
// basin). progress hears the fraction done.
func playVirtual(sc *scenario.Scenario, progress func(float64)) ([]VirtualRun, error) {
	w := scenario.Wiring{Policies: harness.Policies{Calibrate: harness.CalibrateOnce(sc)}}
	part := func(from float64) scenario.Progress {
		return func(done float64) {
			if progress != nil {
				progress(from + done/2)
			}
		}
	}
	dry, ref, err := w.RunPair(sc, "none", part(0))
	if err != nil {
		return nil, fmt.Errorf("playing %s in virtual time without basin: %w", sc.Name, err)
	}
	act, _, err := w.RunPair(sc, "basin", part(0.5))
	if err != nil {
		return nil, fmt.Errorf("playing %s in virtual time with basin: %w", sc.Name, err)
	}
	return []VirtualRun{{NoSpike, ref}, {DryRun, dry}, {Acting, act}}, nil
}

// writeVirtual prints the runs played in virtual time side by side.
func writeVirtual(w io.Writer, runs []VirtualRun) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t", r.Name)
	}
	fmt.Fprintln(tw)
	row := func(name string, f func(r *sim.Result) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range runs {
			fmt.Fprintf(tw, "%s\t", f(r.Result))
		}
		fmt.Fprintln(tw)
	}
	ref := runs[0].Result.GoodputPerHour
	row("goodput (sessions/h)", func(r *sim.Result) string { return fmt.Sprintf("%.1f", r.GoodputPerHour) })
	row("ratio to no spike", func(r *sim.Result) string {
		if ref == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", r.GoodputPerHour/ref)
	})
	row("prefix hit rate", func(r *sim.Result) string { return num(r.HitRateMeanWindow, 3) })
	row("first-call wait p50 (s)", func(r *sim.Result) string { return num(r.FirstCallWaitP50, 1) })
	row("sessions completed", func(r *sim.Result) string {
		return fmt.Sprintf("%d/%d", r.Sessions.Completed, r.Sessions.Arrived)
	})
	tw.Flush()
}

// virtualVerdict is Verdict for the runs played in virtual time.
func virtualVerdict(runs []VirtualRun) string {
	ref, dry, act := runs[0].Result, runs[1].Result, runs[2].Result
	if ref.Sessions.Arrived == 0 || ref.GoodputPerHour == 0 {
		return "In virtual time the no-spike reference had no goodput: no verdict."
	}
	if share := float64(ref.Sessions.Good) / float64(ref.Sessions.Arrived); share < MinReferenceGood {
		return fmt.Sprintf("No verdict: even in virtual time the no-spike reference served only %d of its %d sessions within\n"+
			"the SLO (%.0f%%): the scenario's traffic without the spike is past what the deployment serves.",
			ref.Sessions.Good, ref.Sessions.Arrived, 100*share)
	}
	return "In virtual time: " + compare(dry.GoodputPerHour/ref.GoodputPerHour, act.GoodputPerHour/ref.GoodputPerHour, "another seed")
}
