package harness

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// A warning is worth what can still be done after it. The last rescue time of a collapsed run is
// the latest simulated minute at which switching basin's daemon from watching to acting still
// avoids the collapse: the same seed is re-run with the daemon acting from different minutes, and
// the minute is found by bisection. Before the switch the run is the detector evaluation's run
// exactly (the gateway only counts, lending is off, the engine queues are in arrival order), so
// its warning times apply to it.

// RescueResolution is how finely the last rescue time is bracketed, in simulated minutes.
const RescueResolution = 0.5

// Rescue is one collapsed run's last rescue time.
type Rescue struct {
	Scenario string `json:"scenario"`
	Seed     uint64 `json:"seed"`
	// CollapseMin is when the collapse began: the first of the five minutes under a 0.5 hit rate.
	CollapseMin float64 `json:"collapse_min"`
	// LastRescueMin is the latest minute (to RescueResolution) at which acting still avoids the
	// collapse; nil when acting from the start does not avoid it.
	LastRescueMin *float64 `json:"last_rescue_min"`
	// FirstWarningMin and UtilisationFirstMin are the detector evaluation's for the same run.
	FirstWarningMin     *float64 `json:"first_warning_min"`
	UtilisationFirstMin *float64 `json:"utilisation_first_min"`
	// Tries are the minutes tried and whether the run still collapsed.
	Tries []RescueTry `json:"tries"`
}

// RescueTry is one re-run of the bisection.
type RescueTry struct {
	ActFromMin float64 `json:"act_from_min"`
	Collapsed  bool    `json:"collapsed"`
}

// MarginMin is how long before the last rescue time the first warning came: nil when either is
// unknown.
func (r Rescue) MarginMin() *float64 {
	if r.LastRescueMin == nil || r.FirstWarningMin == nil {
		return nil
	}
	v := *r.LastRescueMin - *r.FirstWarningMin
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

// runActingFrom runs a scenario's seed on its engine baseline with basin's collector, detector and
// remediation loop attached, the loop acting from minute start on.
func runActingFrom(name string, seed uint64, cal *detector.Calibration, start time.Duration) ([]sim.Minute, error) {
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
	// does; the daemon takes admission over when it starts acting.
	core, err := admission.New(admission.Options{CountOnly: true})
	if err != nil {
		return nil, err
	}
	g := &Gate{core: core, predict: func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) }}
	o.Gate = g
	// Lending stays off until the daemon switches it on; it may lend up to basin's default.
	o.Deployment.Lending.MaxFraction = max(o.Deployment.Lending.MaxFraction, 0.5)
	if _, err := attachRemediationFrom(&o, g, detector.Options{Calibration: cal}, remediate.Options{}, start); err != nil {
		return nil, err
	}
	s, err := sim.New(o)
	if err != nil {
		return nil, err
	}
	return s.Run().Timeline, nil
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
			if cals[r.Scenario], err = Calibrate(sc.WithoutSpikes(), epoch); err != nil {
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

// lastRescue bisects one run. The daemon never acting reproduces the collapse and gives its start;
// acting from the end of the collapse's fifth low minute is too late by definition (the five
// minutes are already past), so the bracket is [0, that minute].
func lastRescue(r *Rescue, cal *detector.Calibration) error {
	try := func(min float64) (bool, error) {
		tl, err := runActingFrom(r.Scenario, r.Seed, cal, time.Duration(min*float64(time.Minute)))
		if err != nil {
			return false, err
		}
		c := Collapsed(tl)
		r.Tries = append(r.Tries, RescueTry{ActFromMin: min, Collapsed: c})
		return c, nil
	}
	tl, err := runActingFrom(r.Scenario, r.Seed, cal, time.Duration(math.MaxInt64))
	if err != nil {
		return err
	}
	start := collapseStart(tl)
	if start < 0 {
		return fmt.Errorf("the run does not collapse when re-run with the daemon watching only")
	}
	r.CollapseMin = float64(start)
	if c, err := try(0); err != nil {
		return err
	} else if c {
		return nil // acting from the start does not avoid it: no rescue time
	}
	lo, hi := 0.0, float64(start+5)
	for hi-lo > RescueResolution {
		mid := math.Round((lo+hi)/2*12) / 12 // on the 5-s observation grid
		if mid <= lo || mid >= hi {
			break
		}
		c, err := try(mid)
		if err != nil {
			return err
		}
		if c {
			hi = mid
		} else {
			lo = mid
		}
	}
	r.LastRescueMin = &lo
	return nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// RescueMarkdown writes the last rescue times and the targets over them: every collapsed
// run warned at least two minutes before its last rescue time, the first warning ahead of the first
// utilisation alert in every collapsed run, the median lead at least five minutes.
func RescueMarkdown(w io.Writer, rescues []Rescue, runs []DetectionRun) error {
	var b strings.Builder
	b.WriteString("### Last rescue time\n\n")
	b.WriteString("For every collapsed run of the +100% scenarios, the same seed is re-run with basin's daemon " +
		"(collector, detector and remediation loop, as `basin daemon` acts on a gateway) switched from watching to " +
		"acting at different minutes; the *last rescue time* is the latest minute at which acting still avoids the " +
		"collapse, bracketed by bisection to half a minute. Until the switch the re-run is the run above: the gateway " +
		"only counts, lending is off, the engine queues are in arrival order. *Margin* = last rescue time − first " +
		"warning; *lead* = first utilisation alert − first warning.\n\n")
	b.WriteString("| scenario | seed | first warning | first utilisation alert | lead | collapse began | last rescue | margin |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	m := func(v *float64) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf("%.1f", *v)
	}
	lead := map[string]*float64{}
	for _, r := range runs {
		lead[fmt.Sprintf("%s/%d", r.Scenario, r.Seed)] = r.LeadMin()
	}
	var warned2, leadPos, noRescue int
	var leads []float64
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
		last := m(r.LastRescueMin)
		if r.LastRescueMin == nil {
			last = "none"
			noRescue++
		}
		if mg := r.MarginMin(); mg != nil && *mg >= 2 {
			warned2++
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %.0f | %s | %s |\n", r.Scenario, r.Seed, m(r.FirstWarningMin),
			m(r.UtilisationFirstMin), ls, r.CollapseMin, last, m(r.MarginMin()))
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
		"rescue time in %d (target: all; %d had no rescue time — acting from the start did not avoid the "+
		"collapse); the first warning ahead of the first utilisation alert in %d (target: all); median lead %s "+
		"minutes (target ≥ 5).\n", len(rescues), warned2, noRescue, leadPos, med)
	_, err := io.WriteString(w, b.String())
	return err
}
