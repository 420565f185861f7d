package experiment

import (
	"fmt"
	"github.com/basin-dev/basin/sim/harness"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/admission/inproc"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// A warning is worth what can still be done after it. The last rescue time of a collapsed run is
// the latest simulated minute at which an intervention still avoids the collapse: the same seed is
// re-run with the intervention made at different minutes, and the minute is found by bisection.
// There are two interventions, as the issue that asked for the measure names them: switching
// basin's daemon from watching to acting, and cutting the admission budget to the daemon's
// incident value by hand. Before the intervention the run is the detector evaluation's run exactly
// (the gateway only counts, lending is off, the engine queues are in arrival order), so its warning
// times apply to it.

// RescueResolution is how finely the last rescue time is bracketed, in simulated minutes.
const RescueResolution = 0.5

// Rescue is one collapsed run's last rescue time.
type Rescue struct {
	Scenario string `json:"scenario"`
	Seed     uint64 `json:"seed"`
	// CollapseMin is when the collapse began: the first of the five minutes under a 0.5 hit rate.
	CollapseMin float64 `json:"collapse_min"`
	// LastRescueMin is the latest minute (to RescueResolution) at which the daemon acting still
	// avoids the collapse; nil when acting from the start does not avoid it.
	LastRescueMin *float64 `json:"last_rescue_min"`
	// LastCutMin is the same for the budget cut (CutBudget).
	LastCutMin *float64 `json:"last_cut_min"`
	// FirstWarningMin and UtilisationFirstMin are the detector evaluation's for the same run.
	FirstWarningMin     *float64 `json:"first_warning_min"`
	UtilisationFirstMin *float64 `json:"utilisation_first_min"`
	// Tries and CutTries are the minutes tried, for the daemon and the budget cut, and whether the
	// run still collapsed.
	Tries    []RescueTry `json:"tries"`
	CutTries []RescueTry `json:"cut_tries"`
	// LateActs are the daemon started after the collapse (LateActOffsets minutes after it began),
	// holds on: whether each got the deployment out within LateRescueWithin.
	LateActs []LateAct `json:"late_acts"`
}

// LateAct is one late start of the daemon on a collapsed run.
type LateAct struct {
	ActAtMin float64 `json:"act_at_min"`
	// RecoveredAfterMin is minutes from acting to the first minute of RecoveryWindow minutes
	// with a hit rate ≥ RecoveryHitRate (nil: never before the run's end).
	RecoveredAfterMin *float64 `json:"recovered_after_min"`
}

// Rescued says whether acting then got the deployment out within LateRescueWithin.
func (l LateAct) Rescued() bool {
	return l.RecoveredAfterMin != nil && *l.RecoveredAfterMin <= LateRescueWithin.Minutes()
}

// LateActOffsets are the minutes after a collapse began at which `basin sim detect` starts the
// daemon on the collapsed run (the operator who installs basin because the deployment is stuck),
// and LateRescueWithin how soon it must get the deployment out to count as a rescue (issue 27's
// target).
var LateActOffsets = []float64{5, 15, 30}

const LateRescueWithin = 15 * time.Minute

// RescueTry is one re-run of the bisection.
type RescueTry struct {
	ActFromMin float64 `json:"act_from_min"`
	Collapsed  bool    `json:"collapsed"`
}

// MarginMin is how long before the daemon's last rescue time the first warning came: nil when
// either is unknown.
func (r Rescue) MarginMin() *float64 { return r.margin(r.LastRescueMin) }

// CutMarginMin is how long before the budget cut's last rescue time the first warning came.
func (r Rescue) CutMarginMin() *float64 { return r.margin(r.LastCutMin) }

func (r Rescue) margin(last *float64) *float64 {
	if last == nil || r.FirstWarningMin == nil {
		return nil
	}
	v := *last - *r.FirstWarningMin
	return &v
}

// collapseStart is the first minute of the first five-minute run under a 0.5 hit rate (the
// Collapsed test), or -1.
func collapseStart(tl []sim.Minute) int {
	low := 0
	for i, m := range tl {
		if m.HitRate < 0.5 {
			if low++; low >= 5 {
				return i - 4
			}
		} else {
			low = 0
		}
	}
	return -1
}

// Intervention is what a rescue re-run starts at its minute.
type Intervention string

const (
	// ActDaemon switches basin's daemon (collector, detector, remediation loop) from watching to
	// acting.
	ActDaemon Intervention = "daemon"
	// CutBudget cuts the gateway's admission budget once to the value the daemon's policy sets on
	// entering incident mode (IncidentFraction × B_ref, from remediate's defaults), and holds it:
	// what an operator does by hand on a warning, without basin's loop — no restoring, no
	// shedding, no lending.
	CutBudget Intervention = "budget cut"
)

// rerun runs a scenario's seed on its engine baseline with basin's collector and detector attached
// and the intervention made from minute start on. Before start the run is the detector
// evaluation's run exactly.
func rerun(name string, seed uint64, cal *detector.Calibration, iv Intervention, start time.Duration) ([]sim.Minute, error) {
	sc, err := scenario.Load(name)
	if err != nil {
		return nil, err
	}
	sc.Seed = seed
	o, err := sc.Options("")
	if err != nil {
		return nil, err
	}
	if o.Gate != nil {
		return nil, fmt.Errorf("scenario %s: its engine baseline already has a gate", name)
	}
	// A gateway that only counts admits as the observe-only gateway of the detector evaluation
	// does; the intervention takes admission over.
	core, err := admission.New(admission.Options{CountOnly: true})
	if err != nil {
		return nil, err
	}
	g := harness.NewGate(core, func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) })
	o.Gate = g
	do := detector.Options{Calibration: cal}
	switch iv {
	case ActDaemon:
		// Lending stays off until the daemon switches it on; it may lend up to basin's default.
		o.Deployment.Lending.MaxFraction = max(o.Deployment.Lending.MaxFraction, 0.5)
		if _, err := harness.AttachRemediationFrom(&o, g, do, remediate.Options{}, start, nil); err != nil {
			return nil, err
		}
	case CutBudget:
		if err := attachBudgetCut(&o, g, do, start); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("intervention %q: want %q or %q", iv, ActDaemon, CutBudget)
	}
	s, err := sim.New(o)
	if err != nil {
		return nil, err
	}
	return s.Run().Timeline, nil
}

// attachBudgetCut cuts the admission budget at the first observation step from start on: the
// budget is the one remediate's policy (default options) sets when an alert puts it in incident
// mode on that step's assessment, so the cut is the daemon's own incident value — the fraction and
// B_ref come from the policy, not from a copy here. Later steps only watch.
func attachBudgetCut(o *sim.Options, g *harness.Gate, do detector.Options, start time.Duration) error {
	pol, err := remediate.NewPolicy(remediate.Options{})
	if err != nil {
		return err
	}
	cut := false
	return harness.ObserveEach(o, do, func(t harness.Tick) {
		if cut || t.T < start {
			return
		}
		plan := pol.Decide(remediate.Inputs{At: t.Now, Assessment: t.Assessment, GatewayOK: true,
			Gateway: remediate.GatewayFrom(inproc.StateOf(g.Core().Snapshot(t.Now, true))), Alerts: []string{"rescue: budget cut"}})
		if plan.Budget == nil {
			return // no knee or capacity yet: the cut is made on the first step that has one
		}
		evs, err := g.Core().SetBudget(t.Now, plan.Budget.To, plan.Budget.Reference)
		if err != nil {
			panic(fmt.Sprintf("simulated budget cut: %v", err)) // the plan's budget is positive
		}
		g.Take(evs)
		cut = true
	})
}

// LastRescues finds the last rescue time of every collapsed run among runs whose scenario is in
// names (the +100% spike scenarios), two runs at a time; each run's bisection is sequential, so the
// result does not depend on the scheduling.
func LastRescues(runs []DetectionRun, names []string, progress func(done, total int)) ([]Rescue, error) {
	var jobs []Rescue
	cals := map[string]*detector.Calibration{}
	for _, r := range runs {
		if !r.Collapsed || !containsString(names, r.Scenario) {
			continue
		}
		if cals[r.Scenario] == nil {
			sc, err := scenario.Load(r.Scenario)
			if err != nil {
				return nil, err
			}
			if cals[r.Scenario], err = harness.Calibrate(sc.WithoutSpikes(), harness.Epoch); err != nil {
				return nil, fmt.Errorf("calibrate %s: %w", r.Scenario, err)
			}
		}
		jobs = append(jobs, Rescue{Scenario: r.Scenario, Seed: r.Seed, FirstWarningMin: r.Obs.FirstWarningMin,
			UtilisationFirstMin: r.Obs.UtilisationFirstMin})
	}
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, 2)
	var mu sync.Mutex
	done := 0
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = lastRescue(&jobs[i], cals[jobs[i].Scenario])
			mu.Lock()
			done++
			if progress != nil {
				progress(done, len(jobs))
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("last rescue of %s seed %d: %w", jobs[i].Scenario, jobs[i].Seed, err)
		}
	}
	return jobs, nil
}

// lastRescue bisects one run for each intervention. The run with nothing done reproduces the
// collapse and gives its start; intervening from the end of the collapse's fifth low minute is too
// late by definition (the five minutes are already past), so the bracket is [0, that minute].
func lastRescue(r *Rescue, cal *detector.Calibration) error {
	tl, err := rerun(r.Scenario, r.Seed, cal, ActDaemon, time.Duration(math.MaxInt64))
	if err != nil {
		return err
	}
	start := collapseStart(tl)
	if start < 0 {
		return fmt.Errorf("the run does not collapse when re-run with the daemon watching only")
	}
	r.CollapseMin = float64(start)
	if r.LastRescueMin, r.Tries, err = bisectRescue(r.Scenario, r.Seed, cal, ActDaemon, float64(start+5)); err != nil {
		return fmt.Errorf("%s: %w", ActDaemon, err)
	}
	if r.LastCutMin, r.CutTries, err = bisectRescue(r.Scenario, r.Seed, cal, CutBudget, float64(start+5)); err != nil {
		return fmt.Errorf("%s: %w", CutBudget, err)
	}
	sc, err := scenario.Load(r.Scenario)
	if err != nil {
		return err
	}
	sc.Seed = r.Seed
	for _, off := range LateActOffsets {
		act := time.Duration((float64(start) + off) * float64(time.Minute))
		if act+LateRescueWithin > time.Duration(sc.Duration) {
			continue // too near the end to tell
		}
		res, err := runLate(sc, cal, LateOptions{ActAt: act})
		if err != nil {
			return fmt.Errorf("act at %v: %w", act, err)
		}
		la := LateAct{ActAtMin: act.Minutes()}
		if res.RecoveredMin != nil {
			v := *res.RecoveredMin - act.Minutes()
			la.RecoveredAfterMin = &v
		}
		r.LateActs = append(r.LateActs, la)
	}
	return nil
}

// bisectRescue finds the latest minute in [0, late) at which the intervention avoids the collapse,
// to RescueResolution; nil when intervening from the start does not avoid it.
func bisectRescue(name string, seed uint64, cal *detector.Calibration, iv Intervention, late float64) (*float64, []RescueTry, error) {
	var tries []RescueTry
	try := func(min float64) (bool, error) {
		tl, err := rerun(name, seed, cal, iv, time.Duration(min*float64(time.Minute)))
		if err != nil {
			return false, err
		}
		c := Collapsed(tl)
		tries = append(tries, RescueTry{ActFromMin: min, Collapsed: c})
		return c, nil
	}
	if c, err := try(0); err != nil {
		return nil, nil, err
	} else if c {
		return nil, tries, nil // intervening from the start does not avoid it: no rescue time
	}
	lo, hi := 0.0, late
	for hi-lo > RescueResolution {
		mid := math.Round((lo+hi)/2*12) / 12 // on the 5-s observation grid
		if mid <= lo || mid >= hi {
			break
		}
		c, err := try(mid)
		if err != nil {
			return nil, nil, err
		}
		if c {
			hi = mid
		} else {
			lo = mid
		}
	}
	return &lo, tries, nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// RescueMarkdown writes the last rescue times, for the daemon and for the budget cut, and the
// issue's targets over them: every collapsed run warned at least two minutes before its last
// rescue time, the first warning ahead of the first utilisation alert in every collapsed run, the
// median lead at least five minutes.
func RescueMarkdown(w io.Writer, rescues []Rescue, runs []DetectionRun) error {
	var b strings.Builder
	b.WriteString("### Last rescue time\n\n")
	b.WriteString("For every collapsed run of the +100% scenarios, the same seed is re-run with an intervention made at " +
		"different minutes; the *last rescue time* is the latest minute at which it still avoids the collapse, " +
		"bracketed by bisection to half a minute. Two interventions: *daemon* switches basin's daemon (collector, " +
		"detector and remediation loop, as `basin daemon` acts on a gateway) from watching to acting; *budget cut* " +
		"sets the gateway's admission budget once to the daemon's incident value — the budget remediate's policy " +
		"sets when an alert puts it in incident mode, its incident fraction of B_ref — and holds it, as an operator " +
		"would by hand (no restoring, shedding or lending). Until the intervention the re-run is the run above: the " +
		"gateway only counts, lending is off, the engine queues are in arrival order. *Margin* = last rescue time − " +
		"first warning; *lead* = first utilisation alert − first warning.\n\n")
	b.WriteString("| scenario | seed | first warning | warned by | after spike start | first utilisation alert | lead | " +
		"collapse began | last rescue: daemon | margin | last rescue: budget cut | margin | daemon started late: minutes to recover |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	m := func(v *float64) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf("%.1f", *v)
	}
	lead := map[string]*float64{}
	byRun := map[string]DetectionRun{}
	for _, r := range runs {
		lead[fmt.Sprintf("%s/%d", r.Scenario, r.Seed)] = r.LeadMin()
		byRun[fmt.Sprintf("%s/%d", r.Scenario, r.Seed)] = r
	}
	var bound leadBound
	// target counts one intervention's runs warned two minutes ahead and its runs without a
	// rescue time.
	type target struct{ warned2, none int }
	var daemon, cut target
	count := func(t *target, last, margin *float64) string {
		if last == nil {
			t.none++
			return "none"
		}
		if margin != nil && *margin >= 2 {
			t.warned2++
		}
		return m(last)
	}
	var leadPos int
	var leads []float64
	lateActs := 0
	var lateFails []string
	for _, r := range rescues {
		l := lead[fmt.Sprintf("%s/%d", r.Scenario, r.Seed)]
		ls := "—"
		if l != nil {
			leads = append(leads, *l)
			if *l > 0 {
				leadPos++
			}
			ls = fmt.Sprintf("%.1f", *l)
			if math.IsInf(*l, 1) {
				ls = "no alert"
			}
		}
		last := count(&daemon, r.LastRescueMin, r.MarginMin())
		lastCut := count(&cut, r.LastCutMin, r.CutMarginMin())
		run := byRun[fmt.Sprintf("%s/%d", r.Scenario, r.Seed)]
		by, after := "—", "—"
		if run.Obs != nil {
			by = warnedBy(run.Obs)
			bound.add(run, by)
		}
		if run.SpikeStartMin != nil && r.FirstWarningMin != nil {
			after = fmt.Sprintf("%+.1f", *r.FirstWarningMin-*run.SpikeStartMin)
		}
		var lates []string
		for _, la := range r.LateActs {
			lateActs++
			v := "never"
			if la.RecoveredAfterMin != nil {
				v = fmt.Sprintf("%.0f", *la.RecoveredAfterMin)
			}
			if !la.Rescued() {
				v = "**" + v + "** ✗"
				lateFails = append(lateFails, fmt.Sprintf("%s seed %d at %.0f", r.Scenario, r.Seed, la.ActAtMin))
			}
			lates = append(lates, fmt.Sprintf("%+.0f: %s", la.ActAtMin-r.CollapseMin, v))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %s |\n", r.Scenario, r.Seed,
			m(r.FirstWarningMin), by, after, m(r.UtilisationFirstMin), ls, r.CollapseMin, last, m(r.MarginMin()), lastCut,
			m(r.CutMarginMin()), strings.Join(lates, ", "))
	}
	med := "—"
	if len(leads) > 0 {
		sort.Float64s(leads)
		v := median(leads)
		med = fmt.Sprintf("%.1f", v)
		if math.IsInf(v, 1) {
			med = "no alert"
		}
	}
	fmt.Fprintf(&b, "\nAgainst the targets, over %d collapsed +100%% runs: warned at least 2 minutes before the last "+
		"rescue time in %d with the daemon and %d with the budget cut (target: all; without a rescue time — "+
		"intervening from the start did not avoid the collapse — %d and %d); the first warning ahead of the first "+
		"utilisation alert in %d (target: all); median lead %s minutes (target ≥ 5).\n",
		len(rescues), daemon.warned2, cut.warned2, daemon.none, cut.none, leadPos, med)
	fmt.Fprintf(&b, "\nStarted late on a collapsed run (the last column: the daemon, holds on, started the given minutes after the "+
		"collapse began; minutes from then to the first of %d minutes with a hit rate ≥ %.2f; ✗ past %.0f minutes): "+
		"%d of %d late starts got the deployment out within %.0f minutes", RecoveryWindow, RecoveryHitRate,
		LateRescueWithin.Minutes(), lateActs-len(lateFails), lateActs, LateRescueWithin.Minutes())
	if len(lateFails) > 0 {
		fmt.Fprintf(&b, "; still failing to rescue: %s", strings.Join(lateFails, ", "))
	}
	b.WriteString(".\n")
	bound.markdown(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// warnedBy names the signals of the transition that began a run's first warning, from its reasons
// (the detector states each condition with a fixed opening): "—" when there is none.
func warnedBy(obs *harness.Observation) string {
	if obs.FirstWarningMin == nil {
		return "—"
	}
	for _, tr := range obs.Transitions {
		if math.Abs(tr.At.Sub(harness.Epoch).Minutes()-*obs.FirstWarningMin) > 1e-9 {
			continue
		}
		var names []string
		for _, why := range tr.Reasons {
			if n := signalOf(why); n != "" && !containsString(names, n) {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return "other"
		}
		return strings.Join(names, " + ")
	}
	return "—"
}

// signalOf names the detector condition a transition reason states, by the reason's opening.
func signalOf(why string) string {
	switch {
	case strings.HasPrefix(why, "W/C"):
		return "working set"
	case strings.HasPrefix(why, "arrivals"):
		return "arrivals > peak"
	case strings.HasPrefix(why, "live sessions rising"):
		return "drift flow"
	case strings.HasPrefix(why, "live sessions"):
		return "past the edge"
	case strings.HasPrefix(why, "hit rate"):
		return "hit rate"
	}
	return ""
}

// leadBound gathers what bounds the lead over the collapsed runs: when the first warning and the
// first utilisation alert came after the spike began, which signal warned, and the median lead a
// detector would have had that warned every run a given time after the spike's start (a run
// warned earlier keeps its warning).
type leadBound struct {
	warnAfter, alertAfter []float64
	warnedBefore          int
	by                    map[string]int
	runs                  []DetectionRun
}

func (lb *leadBound) add(r DetectionRun, by string) {
	w, u, sp := r.Obs.FirstWarningMin, r.Obs.UtilisationFirstMin, r.SpikeStartMin
	if w == nil || u == nil || sp == nil {
		return
	}
	if lb.by == nil {
		lb.by = map[string]int{}
	}
	lb.by[by]++
	lb.warnAfter = append(lb.warnAfter, *w-*sp)
	lb.alertAfter = append(lb.alertAfter, *u-*sp)
	if *w < *sp {
		lb.warnedBefore++
	}
	lb.runs = append(lb.runs, r)
}

// quartiles of a non-empty slice, each the median of its half as median does for the whole.
func quartiles(v []float64) (q1, q2, q3 float64) {
	s := slices.Clone(v)
	sort.Float64s(s)
	h := len(s) / 2
	return median(s[:max(h, 1)]), median(s), median(s[len(s)-max(h, 1):])
}

func (lb *leadBound) markdown(b *strings.Builder) {
	if len(lb.runs) == 0 {
		return
	}
	w1, w2, w3 := quartiles(lb.warnAfter)
	a1, a2, a3 := quartiles(lb.alertAfter)
	names := make([]string, 0, len(lb.by))
	for n := range lb.by {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return lb.by[names[i]] > lb.by[names[j]] || lb.by[names[i]] == lb.by[names[j]] && names[i] < names[j]
	})
	var by []string
	for _, n := range names {
		by = append(by, fmt.Sprintf("%s %d", n, lb.by[n]))
	}
	ifBy := func(after float64) float64 {
		var leads []float64
		for _, r := range lb.runs {
			leads = append(leads, *r.Obs.UtilisationFirstMin-min(*r.Obs.FirstWarningMin, *r.SpikeStartMin+after))
		}
		return median(leads)
	}
	fmt.Fprintf(b, "\nWhat bounds the lead, over the %d of them with a warning and a utilisation alert: the first warning came "+
		"%.1f / %.1f / %.1f minutes after the spike began (quartiles; %d before it, in a pressure episode the spike "+
		"prolonged), the first utilisation alert %.1f / %.1f / %.1f minutes after it (earliest %.1f). Warned by: %s. "+
		"A detector that warned every run the moment the spike began would have a median lead of %.1f minutes; half a "+
		"minute after it %.1f, one minute after it %.1f.\n", len(lb.runs), w1, w2, w3, lb.warnedBefore, a1, a2, a3,
		slices.Min(lb.alertAfter), strings.Join(by, ", "), ifBy(0), ifBy(0.5), ifBy(1))
}
