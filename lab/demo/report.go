package demo

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// MinReferenceGood is the share of its sessions the no-spike reference must serve within the SLO
// for a ratio to it to mean anything. The reference is the scenario's traffic without the spike,
// at a rate the deployment serves comfortably: healthy, it serves nearly all of its sessions
// within the SLO (217 of 221 in the README's run); trapped, well under half (the dry runs: 0.08–0.11
// of the reference's goodput). Under 80% it did not stay healthy, and dividing by it flatters
// whatever is compared with it — a busy machine once made a collapsed reference (28 sessions/h)
// read as "kept 696%".
const MinReferenceGood = 0.8

// Write prints the runs side by side, how well each kept the deployment's time, and the verdict.
// A run that did not keep time is marked, with its lateness, and there is then no verdict and no
// ratio to the reference: those numbers measured the machine, not the deployment.
func Write(w io.Writer, res *Result) {
	whyNot := noVerdict(res)
	if !res.KeptTime() {
		fmt.Fprintf(w, "NOT KEEPING TIME at %g×: the numbers below are what this machine managed to play, not what the\n"+
			"deployment would do (late per wait past %s on average or %s over %s in the table).\n\n",
			res.Speed, seconds(MaxMeanLag), seconds(MaxLag), minutes(LagWindow))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, r := range res.Runs {
		fmt.Fprintf(tw, "%s\t", r.Name)
	}
	fmt.Fprintln(tw)
	var ref *float64
	if len(res.Runs) > 0 && res.Runs[0].Report != nil {
		ref = res.Runs[0].Report.GoodputPerHour
	}
	row := func(name string, f func(r RunResult) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range res.Runs {
			v := "—"
			if r.Report != nil {
				v = f(r)
			}
			fmt.Fprintf(tw, "%s\t", v)
		}
		fmt.Fprintln(tw)
	}
	row("goodput (sessions/h)", func(r RunResult) string { return num(r.Report.GoodputPerHour, 1) })
	row("ratio to no spike", func(r RunResult) string {
		if whyNot != "" || ref == nil || *ref == 0 || r.Report.GoodputPerHour == nil {
			return "—"
		}
		return fmt.Sprintf("%.2f", *r.Report.GoodputPerHour / *ref)
	})
	row("prefix hit rate", func(r RunResult) string { return num(r.Report.PrefixHitRate, 3) })
	row("first answer p50 (s)", func(r RunResult) string { return num(r.Report.FirstCallWaitP50, 1) })
	row("sessions completed", func(r RunResult) string {
		return fmt.Sprintf("%d/%d", r.Report.Sessions.Completed, r.Report.Sessions.Arrived)
	})
	row("detector at the end", func(r RunResult) string {
		if r.FinalState == "" {
			return "—"
		}
		return r.FinalState
	})
	row("daemon actions", func(r RunResult) string {
		if r.StatusURL == "" {
			return "—"
		}
		return strconv.Itoa(r.Actions)
	})
	row("session budget at the end", func(r RunResult) string {
		switch {
		case r.Budget < 0:
			return "?"
		case r.CountOnly:
			return "count only"
		}
		return Tokens(r.Budget)
	})
	row("late per wait, mean/worst (s)", func(r RunResult) string {
		t := r.Timing
		switch {
		case t.Waits == 0:
			return "?"
		case !t.Kept():
			return fmt.Sprintf("%.2f/%.2f NOT KEPT", hundredths(t.Mean), hundredths(t.Worst))
		}
		return fmt.Sprintf("%.2f/%.2f", hundredths(t.Mean), hundredths(t.Worst))
	})
	tw.Flush()
	from, to := measureWindow(res)
	fmt.Fprintf(w, "\nSessions are counted if they arrived in minutes %g–%g; goodput counts those finished within their\n"+
		"SLO by the end, the hit rate is the share of their prompt tokens the engine served from cache, the\n"+
		"first answer is the time from a session's start to its first call's whole answer, queueing included.\n"+
		"Daemon actions leave out the budget updates that only moved the reference budget B_ref.\n"+
		"Late per wait is how much later than asked the load generator's arrivals and tool pauses ended,\n"+
		"in the deployment's seconds: the mean over the run, and the worst mean over %s. Past %s\n"+
		"or %s the machine is behind enough to crowd the cache by itself: the run did not keep time.\n",
		from, to, minutes(LagWindow), seconds(MaxMeanLag), seconds(MaxLag))
	fmt.Fprintf(w, "\n%s\n", Verdict(res))
	if len(res.Virtual) > 0 {
		fmt.Fprintf(w, "\nSo the same three runs were played in virtual time, off the wall clock: the simulator's deployment\n"+
			"with basin's own policy code wired in (the gateway's admission core, the daemon's remediation),\n"+
			"as `basin sim run --scenario %s --policy basin` plays one.\n"+
			"Nothing can fall behind there, and the same seed gives the same numbers on any machine:\n\n", res.Scenario)
		writeVirtual(w, res.Virtual)
		fmt.Fprintf(w, "\n%s\n", virtualVerdict(res.Virtual))
	}
}

// needsVirtual says whether the live runs, finished and not interrupted, still give no verdict
// because of the machine: a run did not keep time, or the reference did not stay healthy.
func needsVirtual(res *Result) bool {
	ref, dry, act := goodput(res, NoSpike), goodput(res, DryRun), goodput(res, Acting)
	if ref == nil || dry == nil || act == nil || res.Interrupted {
		return false
	}
	return noVerdict(res) != ""
}

// KeptTime reports whether every run kept the deployment's time (Timing.Kept).
func (res *Result) KeptTime() bool {
	for _, r := range res.Runs {
		if !r.Timing.Kept() {
			return false
		}
	}
	return len(res.Runs) > 0
}

// Verdict says in a sentence what the table shows, from the numbers: it does not assume the trap
// closed or that basin avoided it. When the runs cannot be compared — unfinished, interrupted,
// behind the wall clock, or against a reference that did not stay healthy — it says why instead.
func Verdict(res *Result) string {
	if why := noVerdict(res); why != "" {
		return why
	}
	ref, dry, act := goodput(res, NoSpike), goodput(res, DryRun), goodput(res, Acting)
	return compare(*dry / *ref, *act / *ref, "another speed")
}

// compare is the verdict on the dry run's and the acting run's goodput as ratios to the
// reference's; retry names what to vary when the spike did not trap the deployment.
func compare(rd, ra float64, retry string) string {
	switch {
	case rd < 0.5 && ra >= 0.9:
		return fmt.Sprintf("Without basin acting, the spike left the deployment in the trap (%.0f%% of its no-spike goodput);\n"+
			"with basin acting on the gateway's session budget and decode KV lending it kept %.0f%%.", 100*rd, 100*ra)
	case rd < 0.5:
		return fmt.Sprintf("The spike trapped the dry run (%.0f%% of no-spike goodput); basin acting kept %.0f%%.", 100*rd, 100*ra)
	default:
		return fmt.Sprintf("On this run the spike did not trap the deployment (dry run %.0f%% of no-spike goodput, acting %.0f%%):\n"+
			"the trap is stochastic; try %s, or a scenario with a larger spike.", 100*rd, 100*ra, retry)
	}
}

// noVerdict says why the runs cannot be compared, or "" when they can.
func noVerdict(res *Result) string {
	ref, dry, act := goodput(res, NoSpike), goodput(res, DryRun), goodput(res, Acting)
	if ref == nil || dry == nil || act == nil {
		return "The runs did not all finish: no verdict."
	}
	if res.Interrupted {
		return "Interrupted: no verdict from a partial run."
	}
	if !res.KeptTime() {
		var (
			behind []string
			worst  Timing // the largest mean and worst window of the runs behind
		)
		for _, r := range res.Runs {
			if !r.Timing.Kept() {
				behind = append(behind, r.Name)
				worst.Mean, worst.Worst = max(worst.Mean, r.Timing.Mean), max(worst.Worst, r.Timing.Worst)
			}
		}
		return fmt.Sprintf("No verdict from the live runs: the %s run%s did not keep time.\n"+
			"Waits ended up to %s late on average (tolerance %s) and up to %s over the worst\n"+
			"%s (tolerance %s), in the deployment's time: the table shows this machine's lag, not\n"+
			"the deployment. %s, or a quieter machine, to see it live.",
			strings.Join(behind, ", "), plural(len(behind)), lateness(worst.Mean), seconds(MaxMeanLag),
			lateness(worst.Worst), minutes(LagWindow), seconds(MaxLag), slower(res.Speed, worst))
	}
	r := res.Runs[0]
	good, arrived := r.Report.Sessions.Good, r.Report.Sessions.Arrived
	if good == nil || arrived == 0 {
		return "The no-spike reference has no goodput to compare with: no verdict."
	}
	if share := float64(*good) / float64(arrived); share < MinReferenceGood {
		return fmt.Sprintf("No verdict: the no-spike reference did not stay healthy — it served %d of its %d sessions within the\n"+
			"SLO (%.0f%%, under %.0f%%), so a ratio to it would mean nothing. The runs kept time by the measure\n"+
			"above: either the scenario's traffic without the spike is past what the deployment serves, or the\n"+
			"machine hurt it in a way lateness does not show (`basin sim run` plays it in virtual time).",
			*good, arrived, 100*share, 100*MinReferenceGood)
	}
	if *ref == 0 {
		return "The no-spike reference had no goodput: no verdict."
	}
	return ""
}

// slower suggests a speed at which a run with this timing at speed would have kept time, if its
// lateness in wall time stayed the same (it shrinks at a lower speed, so this errs on the safe side).
func slower(speed float64, t Timing) string {
	over := t.over()
	if !(over > 0) {
		return "Try a lower speed"
	}
	s := speed / over
	switch {
	case s >= 10:
		s = math.Floor(s/10) * 10
	case s >= 1:
		s = math.Floor(s)
	default:
		return fmt.Sprintf("Even 1× would be %s late per wait here: try a quieter machine instead of a lower speed",
			seconds(time.Duration(float64(t.Worst)/speed)))
	}
	return fmt.Sprintf("Try a speed of %g (--speed or BASIN_DEMO_SPEED)", s)
}

func goodput(res *Result, name string) *float64 {
	for _, r := range res.Runs {
		if r.Name == name && r.Report != nil {
			return r.Report.GoodputPerHour
		}
	}
	return nil
}

// measureWindow is the measurement window of the runs' reports, in minutes.
func measureWindow(res *Result) (from, to float64) {
	for _, r := range res.Runs {
		if r.Report != nil {
			return r.Report.MeasureFromMin, r.Report.MeasureToMin
		}
	}
	return 0, 0
}

func num(v *float64, prec int) string {
	if v == nil {
		return "—"
	}
	return strconv.FormatFloat(*v, 'f', prec, 64)
}

// lateness writes a lateness in seconds, rounded up to the hundredth, so that one just past its
// tolerance never reads as equal to it.
func lateness(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%.2f s", hundredths(d))
	}
	return fmt.Sprintf("%d s", (d+time.Second-1)/time.Second)
}

// hundredths is d in seconds, rounded up to the hundredth.
func hundredths(d time.Duration) float64 {
	const h = 10 * time.Millisecond
	return float64((d+h-1)/h) / 100
}

// seconds writes a duration in seconds for people: "0.35 s", "12 s".
func seconds(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f s", d.Seconds())
}

// minutes writes a duration in minutes: "5 minutes".
func minutes(d time.Duration) string { return fmt.Sprintf("%g minutes", d.Minutes()) }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
