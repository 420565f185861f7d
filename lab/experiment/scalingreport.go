package experiment

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// ScalingCommand regenerates the scaling section of docs/results.md, SecondSpikeCommand its
// second-spike section.
const (
	ScalingCommand     = "basin sim scaling --markdown --plot docs/results-scaling.svg"
	SecondSpikeCommand = "basin sim scaling --loads 1.2,1.5 --spikes 100 --second-spike 45m --seeds 6 --markdown"
	HeldOutCommand     = "basin sim scaling --first-seed 4 --markdown"
)

// medianOrNaN is the median of vs, NaN for none.
func medianOrNaN(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	return median(vs)
}

// ArmSummary is one arm of a row over its seeds: medians, and what engaged.
type ArmSummary struct {
	Goodput, FirstWait, InstanceMinutes, PerInstanceHour float64
	// ScaledOut counts the seeds on which the arm added an instance; MaxPrefill and MaxDecode are
	// the most instances over the seeds.
	ScaledOut, Seeds      int
	MaxPrefill, MaxDecode int
	// ServesAllMin is the median first minute from which nobody waits until the window's end
	// (NaN: somebody still waits then, on most seeds); ScaleBeforeAlert counts the seeds that scaled out before
	// the first utilisation alert held (or with none).
	ServesAllMin     float64
	ScaleBeforeAlert int
	// CeilingMin is the median first minute from which every arriving session is good (NaN:
	// not by the window's end, on most seeds).
	CeilingMin float64
	// Arrived is the median all-arrivals ceiling (sessions arriving in the window per hour) and
	// ShortMinutes the median minutes of the window that ended with somebody waiting.
	Arrived, ShortMinutes float64
}

// Summary summarises arm's runs of the row.
func (r ScalingRow) Summary(arm string, windowMin float64) ArmSummary {
	runs := r.Runs[arm]
	s := ArmSummary{Seeds: len(runs)}
	var good, wait, im, per, serves, ceiling, arrived, short []float64
	for _, x := range runs {
		good = append(good, x.GoodputPerHour)
		arrived = append(arrived, x.ArrivedPerHour)
		short = append(short, float64(x.ShortMinutes))
		if x.FirstWaitP50 != nil {
			wait = append(wait, *x.FirstWaitP50)
		}
		im = append(im, x.InstanceMinutes)
		per = append(per, x.GoodputPerInstanceHour(windowMin))
		serves, ceiling = append(serves, minuteOrInf(x.ServesAllMin)), append(ceiling, minuteOrInf(x.CeilingMin))
		s.MaxPrefill, s.MaxDecode = max(s.MaxPrefill, x.MaxPrefill), max(s.MaxDecode, x.MaxDecode)
		if x.MaxPrefill > r.Provisioned[0] || x.MaxDecode > r.Provisioned[1] {
			s.ScaledOut++
			if x.FirstScaleOutMin != nil && (x.FirstUtilAlertMin == nil || *x.FirstScaleOutMin < *x.FirstUtilAlertMin) {
				s.ScaleBeforeAlert++
			}
		}
	}
	s.Goodput, s.FirstWait, s.InstanceMinutes, s.PerInstanceHour = medianOrNaN(good), medianOrNaN(wait), medianOrNaN(im), medianOrNaN(per)
	s.ServesAllMin, s.CeilingMin = finiteOrNaN(medianOrNaN(serves)), finiteOrNaN(medianOrNaN(ceiling))
	s.Arrived, s.ShortMinutes = medianOrNaN(arrived), medianOrNaN(short)
	return s
}

// minuteOrInf is a run's minute, +Inf for never (null), so that medians over seeds order it last.
func minuteOrInf(m *float64) float64 {
	if m == nil {
		return math.Inf(1)
	}
	return *m
}

// finiteOrNaN turns a median that is never (+Inf) into NaN, printed "—".
func finiteOrNaN(v float64) float64 {
	if math.IsInf(v, 1) {
		return math.NaN()
	}
	return v
}

// AfterShortage is, for arm, the median over seeds of the minutes from when the pools as
// provisioned first left somebody waiting (the basin arm on the same seed: when arrivals first
// outran the deployment) to the minute from (a run's CeilingMin or ServesAllMin). NaN when the
// provisioned pools never fell short on most seeds, +Inf when arm does not get there by the
// window's end on most of those.
func (r ScalingRow) AfterShortage(arm string, from func(ScalingRun) *float64) float64 {
	base, runs := r.Runs[ArmBasin], r.Runs[arm]
	var lags []float64
	for i, x := range runs {
		if i >= len(base) || base[i].FirstShortMin == nil {
			continue
		}
		lags = append(lags, max(0, minuteOrInf(from(x))-*base[i].FirstShortMin))
	}
	if 2*len(lags) <= len(runs) {
		return math.NaN()
	}
	return median(lags)
}

// shortRowMinutes: a row's arrivals outrun the pools as provisioned when those leave somebody
// waiting at the gateway for at least this many minutes of the window (median over seeds) — the
// issue's "arrivals exceed the peak for 20 minutes or more", read off the deployment itself
// rather than the calibrated peak, which understates what basin's admission completes.
const shortRowMinutes = 20

// ceilingShare: an arm reaches the all-arrivals ceiling when its goodput is within 2% of the
// sessions arriving (a few arrive too close to the window's end to finish as good).
const ceilingShare = 0.98

// WriteScalingMarkdown writes the docs/results.md section.
func WriteScalingMarkdown(w io.Writer, r *ScalingResult) error {
	var b strings.Builder
	s := r.Spec
	if s.SecondSpikeFrom > 0 {
		writeSecondSpikeMarkdown(&b, r)
		_, err := io.WriteString(w, b.String())
		return err
	}
	if len(s.Seeds) > 0 && s.Seeds[0] != 1 {
		writeHeldOutMarkdown(&b, r)
		_, err := io.WriteString(w, b.String())
		return err
	}
	fmt.Fprintf(&b, "## Scaling: asking for capacity before the knee\n\n")
	fmt.Fprintf(&b, "Generated by `%s`. %s workload, seeds %v, medians over seeds. Each row runs basin's admission and\n", ScalingCommand, s.Workload, s.Seeds)
	fmt.Fprintf(&b, "remediation three ways on the same seeds: the pools as provisioned (**basin**); with the peers' utilisation\n")
	fmt.Fprintf(&b, "autoscaler sizing them (**+ autoscaler**: the Kubernetes HPA's algorithm on decode KV usage, target 0.8, and\n")
	fmt.Fprintf(&b, "prefill queued requests, target 5 an instance, polled every 30 s as KEDA does; docs/simulator.md has each\n")
	fmt.Fprintf(&b, "parameter's source); and with basin's own scaling (**+ scaling**, docs/daemon.md, \"Capacity and scaling\"). Both\n")
	fmt.Fprintf(&b, "scaling arms start from the provisioned pools (their floor), may grow to %d instances a role, and every added\n", s.Ceiling)
	fmt.Fprintf(&b, "instance serves only after the simulator's start-up delay (%v), its cache cold. Load is the base arrival rate\n", r.StartupDelay)
	fmt.Fprintf(&b, "over the deployment's calibrated peak completion rate, from minute 0; the spike is +100%% over minutes 15–25;\n")
	fmt.Fprintf(&b, "goodput counts the sessions arriving in minutes 25–85, and instance-minutes (prefill + decode, an instance\n")
	fmt.Fprintf(&b, "counted from when it is asked for) are over the same window. \"scaled\" says on how many seeds the arm added an\n")
	fmt.Fprintf(&b, "instance (the feature engaged) and to how many at most; \"all good from\" is the median first minute from which\n")
	fmt.Fprintf(&b, "every session arriving until minute 85 finishes within its deadline, the all-arrivals ceiling (0: from the\n")
	fmt.Fprintf(&b, "start; —: not by then, on most seeds); \"nobody waits from\", stricter, the first minute from which nobody waits at\n")
	fmt.Fprintf(&b, "the gateway at a minute's end until minute 85.\n")
	fmt.Fprintf(&b, "\"short min\" counts the window's minutes that ended with somebody waiting at the gateway: on the basin row, how\n")
	fmt.Fprintf(&b, "long the arrivals outran the pools as provisioned (the load the deployment itself felt, whatever the calibrated\n")
	fmt.Fprintf(&b, "peak says); \"arrived /h\" is the sessions arriving in the window, the goodput no arm can pass.\n\n")
	writeScalingRows(&b, r)
	writeScalingTargets(&b, r)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeHeldOutMarkdown is the section for the sweep on later seeds (HeldOutCommand): the policy's
// defaults were chosen on seeds 1–3, and a rule that only holds there is tuned to them.
func writeHeldOutMarkdown(b *strings.Builder, r *ScalingResult) {
	s := r.Spec
	fmt.Fprintf(b, "### Seeds the policy was never tuned on\n\n")
	fmt.Fprintf(b, "Generated by `%s`. %s workload, seeds %v, medians over seeds. The sweep above, row for row, on seeds\n", HeldOutCommand, s.Workload, s.Seeds)
	fmt.Fprintf(b, "that none of the scaling policy's defaults or rules was chosen on. Columns and targets as above.\n\n")
	writeScalingRows(b, r)
	writeScalingTargets(b, r)
}

// writeSecondSpikeMarkdown is the section for a sweep with a second spike (SecondSpikeFrom).
func writeSecondSpikeMarkdown(b *strings.Builder, r *ScalingResult) {
	s := r.Spec
	second := s.SecondSpikeFrom.Minutes()
	fmt.Fprintf(b, "### A second spike: what the room kept after a spike buys\n\n")
	fmt.Fprintf(b, "Generated by `%s`. %s workload, seeds %v, medians over seeds. The rows with a spike, as above,\n", SecondSpikeCommand, s.Workload, s.Seeds)
	fmt.Fprintf(b, "with the spike repeated over minutes %.0f–%.0f, inside the goodput window. basin's scaling keeps room\n", second, second+(matrixSpikeTo-matrixSpikeFrom).Minutes())
	fmt.Fprintf(b, "after a scale-in (the live working set under `scale_in_below` of the knee, and under the knee with the planned\n")
	fmt.Fprintf(b, "spike on top), while the utilisation autoscaler gives its instances back within minutes; here the second spike\n")
	fmt.Fprintf(b, "meets what each arm kept. Columns as above.\n\n")
	writeScalingRows(b, r)
	var perIH instanceHourTally
	for _, row := range r.Rows {
		perIH.add(row, r.WindowMin)
	}
	b.WriteString("| target | result |\n|---|---|\n")
	perIH.write(b)
	b.WriteString("\n")
}

// writeScalingRows writes the table of rows × arms.
func writeScalingRows(b *strings.Builder, r *ScalingResult) {
	b.WriteString("| deployment | load | spike | arm | scaled (prefill/decode max) | arrived /h | goodput /h | ÷ basin | first-call wait p50 s | short min | instance-min | goodput per instance-h | all good from min | nobody waits from min |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		base := row.Summary(ArmBasin, r.WindowMin)
		for _, arm := range ScalingArms {
			a := row.Summary(arm, r.WindowMin)
			scaled := "—"
			if arm != ArmBasin {
				scaled = fmt.Sprintf("%d/%d (%d/%d)", a.ScaledOut, a.Seeds, a.MaxPrefill, a.MaxDecode)
			}
			fmt.Fprintf(b, "| %s %dP%dD | %.1f | %s | %s | %s | %.0f | %.0f | %s | %s | %.0f | %.0f | %.1f | %s | %s |\n", row.Deployment,
				row.Provisioned[0], row.Provisioned[1], row.Load, spikeLabel(row.Spike), armLabel(arm), scaled, a.Arrived, a.Goodput,
				ratioText(a.Goodput, base.Goodput), num1(a.FirstWait, 0), a.ShortMinutes, a.InstanceMinutes, a.PerInstanceHour,
				num1(a.CeilingMin, 0), num1(a.ServesAllMin, 0))
		}
	}
	b.WriteString("\n")
}

// writeScalingTargets checks the targets row by row.
func writeScalingTargets(b *strings.Builder, r *ScalingResult) {
	var shortRows, gain, atCeiling, reachable, quiet, quietRows, early, scaledRuns int
	worstGain := math.Inf(1)
	bound := r.StartupDelay.Minutes() + 5
	ceiling, noWait := lagTally{bound: bound}, lagTally{bound: bound}
	var perIH instanceHourTally
	for _, row := range r.Rows {
		perIH.add(row, r.WindowMin)
		base, sc := row.Summary(ArmBasin, r.WindowMin), row.Summary(ArmScaling, r.WindowMin)
		if base.ShortMinutes >= shortRowMinutes {
			shortRows++
			g := sc.Goodput / base.Goodput
			worstGain = min(worstGain, g)
			if base.Arrived >= 1.3*base.Goodput {
				reachable++
			}
			switch {
			case g >= 1.3:
				gain++
			case sc.Goodput >= ceilingShare*sc.Arrived:
				atCeiling++
			}
		}
		ceiling.add(row, row.AfterShortage(ArmScaling, func(x ScalingRun) *float64 { return x.CeilingMin }))
		noWait.add(row, row.AfterShortage(ArmScaling, func(x ScalingRun) *float64 { return x.ServesAllMin }))
		if row.Load < 1 && row.Spike == 0 {
			quietRows++
			if sc.ScaledOut == 0 {
				quiet++
			}
		}
		scaledRuns += sc.ScaledOut
		early += sc.ScaleBeforeAlert
	}
	fmt.Fprintf(b, "**Against the targets.** A row's arrivals outrun the deployment when the pools as provisioned leave somebody\n")
	fmt.Fprintf(b, "waiting for %d minutes of the window or more (the basin row's \"short min\"); on such a row, goodput 1.3 × basin's\n", shortRowMinutes)
	fmt.Fprintf(b, "is only possible where as many sessions arrive (\"arrived /h\" ≥ 1.3 × basin's goodput), so the all-arrivals\n")
	fmt.Fprintf(b, "ceiling (goodput ≥ %.0f%% of the sessions arriving) meets it too. Reaching the ceiling (every arriving session good from\n", 100*ceilingShare)
	fmt.Fprintf(b, "then on) is timed from the minute the pools as provisioned first left somebody waiting on the same seed; so is\n")
	fmt.Fprintf(b, "the stricter reading, nobody waiting at the gateway from then on, which a spike's first minutes break even\n")
	fmt.Fprintf(b, "where every session arriving in them is served within its deadline.\n\n")
	b.WriteString("| target | result |\n|---|---|\n")
	worst := "—"
	if shortRows > 0 {
		worst = fmt.Sprintf("%.2f×", worstGain)
	}
	fmt.Fprintf(b, "| goodput ≥ 1.3 × basin without scaling, or every arrival served, where arrivals outrun the deployment | %d of %d rows (1.3× or more on %d, the ceiling on %d; 1.3× was possible on %d; lowest %s) |\n",
		gain+atCeiling, shortRows, gain, atCeiling, reachable, worst)
	fmt.Fprintf(b, "| reaches the all-arrivals ceiling within the start-up delay + 5 min (%v) of the first shortage | %s |\n", bound, ceiling)
	fmt.Fprintf(b, "| (stricter) nobody waits at the gateway from within %v min of the first shortage | %s |\n", bound, noWait)
	perIH.write(b)
	fmt.Fprintf(b, "| no scale-out on a quiet deployment (load under 1, no spike) | %d of %d rows |\n", quiet, quietRows)
	fmt.Fprintf(b, "| scale-out before the first utilisation alert | %d of %d runs that scaled out |\n\n", early, scaledRuns)
}

// instanceHourTally compares basin's scaling with the utilisation autoscaler in goodput per
// instance-hour, by the rows' medians and run by run.
type instanceHourTally struct {
	rows, above, same int // rows; above the autoscaler; equal where neither scaled (the same pools)
	// sameWindow counts rows equal where an arm scaled, but with the same instance-minutes in
	// the window (it gave them back before); below names the rows under the autoscaler.
	sameWindow int
	below      []string
	runs       runTally
}

func (t *instanceHourTally) add(row ScalingRow, windowMin float64) {
	t.rows++
	t.runs.add(row, windowMin)
	auto, sc := row.Summary(ArmAutoscaler, windowMin), row.Summary(ArmScaling, windowMin)
	switch {
	case sc.PerInstanceHour > auto.PerInstanceHour:
		t.above++
	case sc.PerInstanceHour == auto.PerInstanceHour && sc.ScaledOut == 0 && auto.ScaledOut == 0:
		t.same++
	case sc.PerInstanceHour == auto.PerInstanceHour && sc.InstanceMinutes == auto.InstanceMinutes:
		t.sameWindow++
	default:
		t.below = append(t.below, fmt.Sprintf("%s %.1f %s", row.Deployment, row.Load, spikeLabel(row.Spike)))
	}
}

func (t instanceHourTally) write(b *strings.Builder) {
	equal := fmt.Sprintf("equal on %d where neither scaled", t.same)
	if t.sameWindow > 0 {
		equal += fmt.Sprintf(", on %d with the same instance-minutes in the window", t.sameWindow)
	}
	var below string
	if len(t.below) > 0 {
		below = "; below it: " + strings.Join(t.below, ", ")
	}
	fmt.Fprintf(b, "| goodput per instance-hour above the utilisation autoscaler's | %d of %d rows (and %s)%s |\n", t.above, t.rows, equal, below)
	fmt.Fprintf(b, "| (run by run) the same, each seed against the same seed (equal: the same instance-minutes in the window) | %s |\n", t.runs)
}

// runTally compares basin's scaling with the utilisation autoscaler in goodput per instance-hour
// seed by seed, where the row's medians could hide a seed that loses.
type runTally struct {
	above, same, runs int
	below             []string // "row: n of m"
}

// add counts row's runs. Two runs are equal where they used the same instance-minutes in the
// window: neither arm scaled (the same pools), or an arm scaled only outside the window.
func (t *runTally) add(row ScalingRow, windowMin float64) {
	auto := map[uint64]ScalingRun{}
	for _, x := range row.Runs[ArmAutoscaler] {
		auto[x.Seed] = x
	}
	lost, n := 0, 0
	for _, x := range row.Runs[ArmScaling] {
		a, ok := auto[x.Seed]
		if !ok {
			continue
		}
		n++
		t.runs++
		s, o := x.GoodputPerInstanceHour(windowMin), a.GoodputPerInstanceHour(windowMin)
		switch {
		case s > o:
			t.above++
		case s == o:
			t.same++
		default:
			lost++
		}
	}
	if lost > 0 {
		t.below = append(t.below, fmt.Sprintf("%s %.1f %s: %d of %d", row.Deployment, row.Load, spikeLabel(row.Spike), lost, n))
	}
}

func (t runTally) String() string {
	s := fmt.Sprintf("%d of %d runs (and equal on %d)", t.above, t.runs, t.same)
	if len(t.below) > 0 {
		s += "; below it: " + strings.Join(t.below, ", ")
	}
	return s
}

// lagTally counts the rows that fell short by whether arm got there (AfterShortage) within bound.
type lagTally struct {
	bound     float64
	rows, met int
	worst     float64
	late      []string
}

func (t *lagTally) add(row ScalingRow, lag float64) {
	if math.IsNaN(lag) {
		return // the provisioned pools never fell short
	}
	t.rows++
	t.worst = max(t.worst, lag)
	if lag <= t.bound {
		t.met++
		return
	}
	t.late = append(t.late, fmt.Sprintf("%s %.1f %s: %s", row.Deployment, row.Load, spikeLabel(row.Spike), lagMinutes(lag)))
}

func (t lagTally) String() string {
	s := fmt.Sprintf("%d of %d rows that fell short (latest: %s min", t.met, t.rows, lagMinutes(t.worst))
	if len(t.late) > 0 {
		s += "; later: " + strings.Join(t.late, ", ")
	}
	return s + ")"
}

// lagMinutes formats an AfterShortage: "never" for +Inf.
func lagMinutes(v float64) string {
	if math.IsInf(v, 1) {
		return "never"
	}
	return num1(v, 0)
}

func armLabel(arm string) string {
	switch arm {
	case ArmAutoscaler:
		return "+ autoscaler"
	case ArmScaling:
		return "+ scaling"
	}
	return arm
}

// ratioText is a ÷ b for a table, "—" when b is not positive.
func ratioText(a, b float64) string {
	if !(b > 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func num1(v float64, prec int) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// ScalingPlot draws, per deployment and spike, goodput (bars' height) against instance-minutes for
// each arm and load: one point per arm and load, so an arm up and to the left does more with less.
func ScalingPlot(w io.Writer, r *ScalingResult) error {
	var deps []string
	var spikes []float64
	for _, row := range r.Rows {
		if !slices.Contains(deps, row.Deployment) {
			deps = append(deps, row.Deployment)
		}
		if !slices.Contains(spikes, row.Spike) {
			spikes = append(spikes, row.Spike)
		}
	}
	slices.Sort(spikes)
	colours := map[string]color.Color{ArmBasin: color.RGBA{R: 120, G: 120, B: 120, A: 255},
		ArmAutoscaler: color.RGBA{R: 230, G: 159, B: 0, A: 255}, ArmScaling: color.RGBA{R: 0, G: 114, B: 178, A: 255}}
	grid := make([][]*plot.Plot, len(spikes))
	for i, sp := range spikes {
		grid[i] = make([]*plot.Plot, len(deps))
		for j, d := range deps {
			p := plot.New()
			p.Title.Text = fmt.Sprintf("%s, spike %s", d, spikeLabel(sp))
			p.X.Label.Text = "load ÷ calibrated peak"
			p.Y.Label.Text = "goodput per instance-hour"
			p.Y.Min = 0
			p.Add(plotter.NewGrid())
			p.Legend.Top, p.Legend.Left = true, true
			for _, arm := range ScalingArms {
				var xys plotter.XYs
				for _, row := range r.Rows {
					if row.Deployment == d && row.Spike == sp {
						xys = append(xys, plotter.XY{X: row.Load, Y: row.Summary(arm, r.WindowMin).PerInstanceHour})
					}
				}
				l, pts, err := plotter.NewLinePoints(xys)
				if err != nil {
					return fmt.Errorf("plot %s %s: %w", d, arm, err)
				}
				l.Color, l.Width = colours[arm], vg.Points(1.5)
				pts.Color, pts.Shape, pts.Radius = colours[arm], draw.CircleGlyph{}, vg.Points(2)
				p.Add(l, pts)
				if i == 0 && j == 0 {
					p.Legend.Add(armLabel(arm), l, pts)
				}
			}
			grid[i][j] = p
		}
	}
	width, height := vg.Length(len(deps))*4*vg.Inch, vg.Length(len(spikes))*3*vg.Inch
	c := vgsvg.New(width, height)
	return drawGrid(w, c, draw.New(c), grid)
}
