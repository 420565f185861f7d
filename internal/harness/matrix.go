package harness

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// MatrixScenario is one row group of the policy comparison: a scenario preset and what the paper
// calls its deployment (cache-first: the cache limit binds before decode memory).
type MatrixScenario struct {
	Name string
	// CacheFirst is the deployment's class in the Basin paper (1P3D cache-first, 1P1D decode-first).
	CacheFirst bool
	// TerminalBench marks the Terminal-Bench-like workload (the first-call-wait target's scope).
	TerminalBench bool
}

// Matrix is the scenario matrix of docs/results.md.
var Matrix = []MatrixScenario{
	{"paper-1p3d-h200-spike", true, true},
	{"paper-1p3d-h200-spike300", true, true},
	{"paper-1p3d-h200-host-spike", true, true},
	{"paper-1p3d-h200-host-spike300", true, true},
	{"swebench-pro-1p3d-spike", true, false},
	{"paper-1p1d-h100-spike", false, true},
}

// MatrixPolicies are the compared policies, baselines first.
var MatrixPolicies = []string{"none", "hicache", "continuum", BasinCurrent, Basin, Oracle}

// MatrixCell is one scenario × policy over the seeds.
type MatrixCell struct {
	Scenario string        `json:"scenario"`
	Policy   string        `json:"policy"`
	Runs     []*sim.Result `json:"runs"`
}

// MatrixResult is the whole comparison.
type MatrixResult struct {
	Seeds []uint64     `json:"seeds"`
	Cells []MatrixCell `json:"cells"`
	// Calibrations are the deployments' calibrations the basin policies' detectors used, and the
	// source of the load column (arrivals ÷ peak completion rate).
	Calibrations map[string]*detector.Calibration `json:"calibrations"`
	scenarios    map[string]*scenario.Scenario
}

// RunMatrix runs every scenario of ms under every policy for each seed (with the spike-free twin
// of each run, for the ratio), calibrating each deployment once as an operator would.
func RunMatrix(ms []MatrixScenario, policies []string, seeds []uint64, progress func(done, total int)) (*MatrixResult, error) {
	out := &MatrixResult{Seeds: seeds, Calibrations: map[string]*detector.Calibration{}, scenarios: map[string]*scenario.Scenario{}}
	total, done := len(ms)*len(seeds), 0
	for _, m := range ms {
		sc, err := scenario.Load(m.Name)
		if err != nil {
			return nil, err
		}
		cal, err := Calibrate(sc.WithoutSpikes(), epoch)
		if err != nil {
			return nil, fmt.Errorf("calibrate %s: %w", m.Name, err)
		}
		out.Calibrations[m.Name] = cal
		out.scenarios[m.Name] = sc
		cells := make([]MatrixCell, len(policies))
		for i, p := range policies {
			cells[i] = MatrixCell{Scenario: m.Name, Policy: p}
		}
		for _, seed := range seeds {
			run, err := scenario.Load(m.Name)
			if err != nil {
				return nil, err
			}
			run.Seed = seed
			run.Policies = Policies{Calibrate: func() (*detector.Calibration, error) { return cal, nil }}
			res, err := scenario.Compare(run, policies, nil)
			if err != nil {
				return nil, fmt.Errorf("%s seed %d: %w", m.Name, seed, err)
			}
			for i, r := range res {
				r.Timeline = nil
				cells[i].Runs = append(cells[i].Runs, r)
			}
			done++
			if progress != nil {
				progress(done, total)
			}
		}
		out.Cells = append(out.Cells, cells...)
	}
	return out, nil
}

// spread is a median with its min–max over seeds.
type spread struct{ med, lo, hi float64 }

func spreadOf(vs []float64) (spread, bool) {
	if len(vs) == 0 {
		return spread{}, false
	}
	s := slices.Clone(vs)
	sort.Float64s(s)
	return spread{med: s[len(s)/2], lo: s[0], hi: s[len(s)-1]}, true
}

func (s spread) format(prec int) string {
	if s.lo == s.hi {
		return fmt.Sprintf("%.*f", prec, s.med)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.med, prec, s.lo, prec, s.hi)
}

func (c MatrixCell) values(f func(*sim.Result) *float64) []float64 {
	var out []float64
	for _, r := range c.Runs {
		if v := f(r); v != nil {
			out = append(out, *v)
		}
	}
	return out
}

func goodput(r *sim.Result) *float64 { return &r.GoodputPerHour }

func (m *MatrixResult) cell(scn, policy string) *MatrixCell {
	for i := range m.Cells {
		if m.Cells[i].Scenario == scn && m.Cells[i].Policy == policy {
			return &m.Cells[i]
		}
	}
	return nil
}

// ratioTo is, per seed, this cell's goodput over another policy's in the same run set.
func (m *MatrixResult) ratioTo(c MatrixCell, other string) []float64 {
	o := m.cell(c.Scenario, other)
	if o == nil {
		return nil
	}
	var out []float64
	for i, r := range c.Runs {
		if b := o.Runs[i].GoodputPerHour; b > 0 {
			out = append(out, r.GoodputPerHour/b)
		}
	}
	return out
}

func fmtSpread(vs []float64, prec int) string {
	s, ok := spreadOf(vs)
	if !ok {
		return "—"
	}
	return s.format(prec)
}

// MatrixMarkdown writes the comparison as the docs/results.md section, with what AdmitPerf asks an
// honest benchmark to disclose and the targets checked.
func MatrixMarkdown(w io.Writer, m *MatrixResult, ms []MatrixScenario, command string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## Remediation: basin against the baselines\n\n")
	fmt.Fprintf(&b, "Generated by `%s` (seeds %v; each cell is the median over seeds with min–max in brackets). "+
		"Every run has a spike-free twin with the same policy and seed, for the ratio to no spike; "+
		"*vs continuum* is the ratio of goodputs in the same seed.\n\n", command, m.Seeds)
	b.WriteString("What the numbers rest on (AdmitPerf's checklist):\n\n")
	b.WriteString("- **Load relative to capacity**: arrivals ÷ the deployment's peak session completion rate, measured by " +
		"`basin calibrate` (closed-loop step load in the same simulator), base rate and during the spike, in the table below.\n")
	b.WriteString("- **SLO relative to unloaded time**: a session is good when it finishes within 4× its unloaded time " +
		"(the simulator's time for the same session alone on the deployment) and 95% of its decode steps are under 50 ms " +
		"(the Basin paper's SLO). Goodput counts good sessions that arrived in the window (minutes 25–85: after the " +
		"spike, while its effect lasts), per hour.\n")
	b.WriteString("- **Signals**: basin's policies read the simulated engines' SGLang-named metrics and the gateway's through the " +
		"collector every 5 s of simulated time (60 s rate windows, a signal is stale after 3 missed scrapes); the detector " +
		"uses each deployment's calibration; the remediation loop is `remediate.Policy` and `remediate.Executor`, the code " +
		"`basin daemon` runs, acting on the admission core instead of the gateway's admin API.\n")
	b.WriteString("- **Parameters and where they come from**: deployments and workloads are the simulator's presets " +
		"(docs/simulator.md); baselines follow their papers without tuning — `none` is SGLang's default radix cache, " +
		"`hicache` adds a host tier twice the GPU pool (SGLang's `--hicache-ratio` default), `continuum` pins tool-running " +
		"sessions' KV with its TTL rule (docs/simulator.md); basin's thresholds are the defaults documented in " +
		"`detector` and `remediate` (the paper's where it gives one).\n\n")

	b.WriteString("| scenario | class | load ÷ peak (base / spike) |\n|---|---|---|\n")
	for _, s := range ms {
		sc, cal := m.scenarios[s.Name], m.Calibrations[s.Name]
		if sc == nil || cal == nil {
			continue
		}
		class := "decode-first"
		if s.CacheFirst {
			class = "cache-first"
		}
		peak := cal.PeakCompletionRatePerS * 60
		spike := sc.Arrivals.RatePerMin
		for _, sp := range sc.Arrivals.Spikes {
			spike = max(spike, sc.Arrivals.RatePerMin*sp.Multiplier)
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f / %.2f (%.1f and %.1f sessions/min vs peak %.1f) |\n", s.Name, class,
			sc.Arrivals.RatePerMin/peak, spike/peak, sc.Arrivals.RatePerMin, spike, peak)
	}
	b.WriteString("\n| scenario | policy | goodput/h | ratio to no spike | vs continuum | first-call wait p50 (s) | hit rate (window) |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, c := range m.Cells {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", c.Scenario, c.Policy,
			fmtSpread(c.values(goodput), 0),
			fmtSpread(c.values(func(r *sim.Result) *float64 { return r.GoodputRatio }), 2),
			fmtSpread(m.ratioTo(c, "continuum"), 2),
			fmtSpread(c.values(func(r *sim.Result) *float64 { return r.FirstCallWaitP50 }), 1),
			fmtSpread(c.values(func(r *sim.Result) *float64 { return r.HitRateMeanWindow }), 3))
	}
	b.WriteString("\nAgainst basin's targets (worst seed):\n\n")
	for _, s := range ms {
		c := m.cell(s.Name, Basin)
		if c == nil {
			continue
		}
		var checks []string
		if r, ok := spreadOf(c.values(func(r *sim.Result) *float64 { return r.GoodputRatio })); ok && strings.HasSuffix(s.Name, "-spike") {
			checks = append(checks, target(fmt.Sprintf("goodput %.2f× no spike", r.lo), r.lo >= 0.9, "≥ 0.9"))
		}
		if s.CacheFirst {
			if r, ok := spreadOf(m.ratioTo(*c, "continuum")); ok {
				checks = append(checks, target(fmt.Sprintf("%.2f× continuum", r.lo), r.lo >= 1.2, "≥ 1.2"))
			}
		} else {
			best := 0.0
			worst := -1.0
			for i, r := range c.Runs {
				best = 0
				for _, p := range []string{"none", "hicache", "continuum"} {
					if o := m.cell(s.Name, p); o != nil {
						best = max(best, o.Runs[i].GoodputPerHour)
					}
				}
				if best > 0 && (worst < 0 || r.GoodputPerHour/best < worst) {
					worst = r.GoodputPerHour / best
				}
			}
			if worst >= 0 {
				checks = append(checks, target(fmt.Sprintf("%.2f× the best baseline", worst), worst >= 1.0, "≥ 1.0"))
			}
		}
		if r, ok := spreadOf(m.ratioTo(*c, Oracle)); ok {
			checks = append(checks, target(fmt.Sprintf("%.2f× oracle", r.lo), r.lo >= 0.9, "≥ 0.9"))
		}
		if s.TerminalBench {
			if r, ok := spreadOf(c.values(func(r *sim.Result) *float64 { return r.FirstCallWaitP50 })); ok {
				checks = append(checks, target(fmt.Sprintf("first-call wait p50 %.1f s", r.hi), r.hi <= 15, "≤ 15 s"))
			}
		}
		fmt.Fprintf(&b, "- %s: %s\n", s.Name, strings.Join(checks, "; "))
	}
	b.WriteString("\nWhere basin only ties continuum, both keep the deployment on its plateau after the spike: goodput " +
		"counts sessions that arrive after it, and a policy that does not get stuck serves them all. The ≥ 1.2× target " +
		"presumes a continuum that stays degraded (the paper's runs stayed 10–15 points under their pre-spike hit rate); " +
		"in this model it comes back, and the baselines are not tuned to lose. basin's edge shows in the hit rate and the " +
		"first-call wait during the recovery.\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func target(got string, ok bool, want string) string {
	if ok {
		return got + " ✓"
	}
	return fmt.Sprintf("%s ✗ (target %s)", got, want)
}
