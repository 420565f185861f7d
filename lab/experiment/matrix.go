package experiment

import (
	"errors"
	"fmt"
	"github.com/basin-dev/basin/sim/harness"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// The policy matrix of docs/results.md sweeps load as a fraction of each deployment's own
// calibrated peak, so that every policy is measured where the trap can happen: at and past the
// capacity of the engine configuration it runs on, not at a fixed arrival rate that one deployment
// finds easy. A row is a deployment × tier × workload × load × spike; every policy runs every row
// with the same seeds, and the spike-free row at the same load is every spiked row's twin.

// Tier is a row's engine configuration, which every policy of the row runs on: the comparison is
// always on the same hardware.
type Tier string

// Tiers.
const (
	// TierGPU is the SGLang default engine: radix cache on the GPU only.
	TierGPU Tier = "gpu"
	// TierHost adds SGLang's hierarchical cache (a host tier twice the GPU pool, its
	// --hicache-ratio default) for every policy: the engine baseline is HiCache, continuum and
	// basin run with the same host tier.
	TierHost Tier = "host"
)

// MatrixDeployment is a deployment axis value.
type MatrixDeployment struct {
	// Name is the short name the matrix flags use ("1p3d").
	Name string
	// Preset is the simulator's deployment preset.
	Preset string
	// CacheFirst is the deployment's class in the Basin paper: the cache limit binds before
	// decode memory (1P3D), or decode memory first (1P1D).
	CacheFirst bool
}

// MatrixDeployments are the paper's two testbeds.
var MatrixDeployments = []MatrixDeployment{
	{Name: "1p1d", Preset: "paper-1p1d-h100", CacheFirst: false},
	{Name: "1p3d", Preset: "paper-1p3d-h200", CacheFirst: true},
}

// EnginePolicy names the row's engine baseline in a policy list: SGLang's default engine on
// GPU-only rows ("none"), HiCache on host-tier rows.
const EnginePolicy = "none"

// MatrixBaselines are the policies "the best baseline" ranges over.
var MatrixBaselines = []string{EnginePolicy, string(sim.PolicyContinuum)}

// MatrixSpec is the sweep: every combination of its axes is a row.
type MatrixSpec struct {
	// Loads are base arrival rates as fractions of the row's calibrated peak completion rate.
	Loads []float64
	// Spikes are the extra arrivals during the spike as a fraction of the base rate (1: +100%);
	// 0 is the spike-free row, always run because it is the spiked rows' twin.
	Spikes      []float64
	Tiers       []Tier
	Deployments []string
	Workloads   []string
	Seeds       []uint64
	// Policies run on every row; EnginePolicy is HiCache on host-tier rows.
	Policies []string
	// Workers is how many runs go at once (results do not depend on it).
	Workers int
	// LongWindow, when set, re-measures every row where basin falls short of the best baseline
	// on some seed over this much longer a window (minutes 25 to 25 + LongWindow): basin and
	// the baselines, same seeds. A shortfall of a session or two an hour in the one-hour window
	// can be the start of a backlog a baseline has not yet paid for (DefaultLongWindow).
	LongWindow time.Duration
}

// DefaultLongWindow is the long re-measurement's window: four hours. A backlog that grows by a
// session a minute (1P1D at 1.2 × its peak) makes a newcomer wait past a Terminal-Bench session's
// deadline (≈ 26 minutes) after about two hours and a half, well inside it.
const DefaultLongWindow = 4 * time.Hour

// Matrix geometry, the same as the paper-* spike presets: the spike covers minutes 15–25 and
// goodput counts the sessions that arrive in minutes 25–85, after it, while its effect lasts.
const (
	matrixDuration    = 90 * time.Minute
	matrixSpikeFrom   = 15 * time.Minute
	matrixSpikeTo     = 25 * time.Minute
	matrixMeasureFrom = 25 * time.Minute
	matrixMeasureTo   = 85 * time.Minute
	// calibrationSeed is the seed of every calibration, so that the load column does not depend
	// on which seeds a matrix runs.
	calibrationSeed = 1
)

// DefaultMatrix is the sweep: {0.5 … 1.5} × peak, no spike / +100% / +300% for ten
// minutes, GPU-only and host tier, 1P1D and 1P3D, Terminal-Bench-like and SWE-bench-Pro-like, three
// seeds.
func DefaultMatrix() MatrixSpec {
	return MatrixSpec{
		Loads:       []float64{0.5, 0.66, 0.8, 0.9, 1.0, 1.2, 1.5},
		Spikes:      []float64{0, 1, 3},
		Tiers:       []Tier{TierGPU, TierHost},
		Deployments: []string{"1p1d", "1p3d"},
		Workloads:   []string{"terminal-bench", "swebench-pro"},
		Seeds:       []uint64{1, 2, 3},
		Policies:    []string{EnginePolicy, string(sim.PolicyContinuum), harness.BasinBlind, harness.Basin, harness.Oracle},
		Workers:     2,
		LongWindow:  DefaultLongWindow,
	}
}

// Validate checks the spec up front, naming the field.
func (s MatrixSpec) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(s.Loads) == 0 {
		add("loads: empty")
	}
	for _, l := range s.Loads {
		if !(l > 0 && l <= 10) {
			add("loads: %v, want a fraction of peak in (0, 10]", l)
		}
	}
	if len(s.Spikes) == 0 {
		add("spikes: empty")
	}
	for _, sp := range s.Spikes {
		if !(sp >= 0 && sp <= 20) {
			add("spikes: %v, want extra arrivals in [0, 20] × the base rate", sp)
		}
	}
	if len(s.Tiers) == 0 {
		add("tiers: empty")
	}
	for _, t := range s.Tiers {
		if t != TierGPU && t != TierHost {
			add("tiers: %q, want gpu or host", t)
		}
	}
	if len(s.Deployments) == 0 {
		add("deployments: empty")
	}
	for _, d := range s.Deployments {
		if _, ok := matrixDeployment(d); !ok {
			add("deployments: %q, want one of %s", d, strings.Join(matrixDeploymentNames(), ", "))
		}
	}
	if len(s.Workloads) == 0 {
		add("workloads: empty")
	}
	for _, w := range s.Workloads {
		if _, err := sim.SyntheticWorkload(w); err != nil {
			add("workloads: %w", err)
		}
	}
	if len(s.Seeds) == 0 {
		add("seeds: empty")
	}
	if len(s.Policies) == 0 {
		add("policies: empty")
	}
	for _, p := range s.Policies {
		switch {
		case p == string(sim.PolicyHiCache):
			add("policies: hicache is the engine baseline of host-tier rows (%q there); choose tiers with --tiers", EnginePolicy)
		case harness.Validate(p) != nil:
			add("policies: %w", harness.Validate(p))
		}
	}
	if s.Workers < 1 {
		add("workers: %d, want ≥ 1", s.Workers)
	}
	if s.LongWindow < 0 || s.LongWindow > 0 && s.LongWindow < time.Minute {
		add("long-window: %v, want 0 (off) or at least a minute", s.LongWindow)
	}
	return errors.Join(errs...)
}

func matrixDeployment(name string) (MatrixDeployment, bool) {
	for _, d := range MatrixDeployments {
		if d.Name == name {
			return d, true
		}
	}
	return MatrixDeployment{}, false
}

func matrixDeploymentNames() []string {
	var out []string
	for _, d := range MatrixDeployments {
		out = append(out, d.Name)
	}
	return out
}

// MatrixGroup is the part of a row that fixes its hardware and workload, and so its calibration.
type MatrixGroup struct {
	Deployment string `json:"deployment"`
	Tier       Tier   `json:"tier"`
	Workload   string `json:"workload"`
}

func (g MatrixGroup) String() string { return g.Deployment + "/" + string(g.Tier) + "/" + g.Workload }

// MatrixRow is one load and spike on one group.
type MatrixRow struct {
	MatrixGroup
	CacheFirst bool `json:"cache_first"`
	// Load is the base arrival rate over the group's calibrated peak completion rate.
	Load float64 `json:"load"`
	// Spike is the extra arrivals during minutes 15–25 as a fraction of the base rate.
	Spike float64 `json:"spike"`
	// ArrivalsPerMin is the base rate; PeakPerMin the calibrated peak it is a fraction of.
	ArrivalsPerMin float64 `json:"arrivals_per_min"`
	PeakPerMin     float64 `json:"peak_per_min"`
}

// ArrivalsPerHour is the base arrival rate per hour.
func (r MatrixRow) ArrivalsPerHour() float64 { return r.ArrivalsPerMin * 60 }

// SpikeArrivalsPerHour is the arrival rate during the spike, per hour.
func (r MatrixRow) SpikeArrivalsPerHour() float64 { return r.ArrivalsPerMin * (1 + r.Spike) * 60 }

// GateActivity is what basin's gate and remediation loop did in a run: the evidence that the
// feature under test engaged. All zero for the engine baselines, which have no gate.
type GateActivity struct {
	// Held counts sessions the gate queued on arrival instead of admitting them.
	Held int `json:"held"`
	// MaxQueued is the most sessions waiting at the gate at the end of any minute.
	MaxQueued int `json:"max_queued"`
	// BudgetCuts counts budget decreases by the remediation loop; Sheds the sessions it shed.
	BudgetCuts int `json:"budget_cuts"`
	Sheds      int `json:"sheds"`
	// PeakLentTokens is the most decode KV lent to the prefix cache at any control tick.
	PeakLentTokens int64 `json:"peak_lent_tokens"`
	// HoldMax is the most admitted sessions whose next calls the remediation loop held at once
	// (remediate's hold rule): 0 when holds never engaged.
	HoldMax int `json:"hold_max"`
}

// Engaged reports whether the gate held or shed anyone: the admission decisions a plain engine
// does not make. Budget cuts alone do not count — the controller trims the budget as the knee
// estimate moves even when nobody is waiting.
func (a GateActivity) Engaged() bool { return a.Held > 0 || a.Sheds > 0 || a.HoldMax > 0 }

// MatrixRun is one policy on one row and seed.
type MatrixRun struct {
	Seed   uint64       `json:"seed"`
	Result *sim.Result  `json:"result"`
	Gate   GateActivity `json:"gate"`
}

// MatrixCell is one row × policy over the seeds (Runs in the order of the seeds).
type MatrixCell struct {
	Row    int         `json:"row"`
	Policy string      `json:"policy"`
	Runs   []MatrixRun `json:"runs"`
}

// MatrixResult is the whole sweep.
type MatrixResult struct {
	Spec MatrixSpec  `json:"spec"`
	Rows []MatrixRow `json:"rows"`
	// Cells are indexed [row × len(policies) + policy].
	Cells []MatrixCell `json:"cells"`
	// Calibrations are per group (MatrixGroup.String()): the source of the load column and the
	// basin policies' detector calibration.
	Calibrations map[string]*detector.Calibration `json:"calibrations"`
	// Long are the rows re-measured over Spec.LongWindow (basin short of the best baseline on
	// some seed in the standard window).
	Long []LongCheck `json:"long,omitempty"`
}

// LongCheck is one row re-measured over the long window: basin's and each baseline's goodput per
// hour, per seed (in the order of the spec's seeds).
type LongCheck struct {
	Row int `json:"row"`
	// Goodput is per policy (basin and the baselines the spec runs), per seed.
	Goodput map[string][]float64 `json:"goodput_per_hour"`
}

// WorstRatio is basin's smallest per-seed goodput over the best baseline's on the same seed.
func (l LongCheck) WorstRatio() float64 {
	worst := math.Inf(1)
	for k, b := range l.Goodput[harness.Basin] {
		worst = min(worst, ratio(b, l.best(k)))
	}
	return worst
}

// best is the best baseline's goodput on seed k.
func (l LongCheck) best(k int) float64 {
	best := 0.0
	for _, p := range MatrixBaselines {
		if g, ok := l.Goodput[p]; ok {
			best = max(best, g[k])
		}
	}
	return best
}

// PolicyLabel is the name a policy is shown under on a tier: the engine baseline is HiCache on
// host-tier rows.
func PolicyLabel(t Tier, policy string) string {
	if policy == EnginePolicy && t == TierHost {
		return string(sim.PolicyHiCache)
	}
	return policy
}

// engineName is the policy name the row's scenario runs.
func engineName(t Tier, policy string) string { return PolicyLabel(t, policy) }

// expand lists the rows in a fixed order: deployment, tier, workload, load, spike (the spike-free
// spike first, added when the spec omits it).
func (s MatrixSpec) expand(cals map[string]*detector.Calibration) []MatrixRow {
	spikes := slices.Clone(s.Spikes)
	if !slices.Contains(spikes, 0) {
		spikes = append(spikes, 0)
	}
	slices.Sort(spikes)
	spikes = slices.Compact(spikes)
	var rows []MatrixRow
	for _, dn := range s.Deployments {
		d, _ := matrixDeployment(dn)
		for _, t := range s.Tiers {
			for _, w := range s.Workloads {
				g := MatrixGroup{Deployment: dn, Tier: t, Workload: w}
				peak := cals[g.String()].PeakCompletionRatePerS * 60
				for _, l := range s.Loads {
					for _, sp := range spikes {
						rows = append(rows, MatrixRow{MatrixGroup: g, CacheFirst: d.CacheFirst, Load: l, Spike: sp,
							ArrivalsPerMin: l * peak, PeakPerMin: peak})
					}
				}
			}
		}
	}
	return rows
}

// groups lists the spec's groups in row order.
func (s MatrixSpec) groups() []MatrixGroup {
	var out []MatrixGroup
	for _, d := range s.Deployments {
		for _, t := range s.Tiers {
			for _, w := range s.Workloads {
				out = append(out, MatrixGroup{Deployment: d, Tier: t, Workload: w})
			}
		}
	}
	return out
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// matrixScenario writes a row as a scenario file and parses it, so that a row is exactly what
// `basin sim compare --scenario` would run from the same YAML.
func matrixScenario(g MatrixGroup, ratePerMin, spike float64, long time.Duration) (*scenario.Scenario, error) {
	d, ok := matrixDeployment(g.Deployment)
	if !ok {
		return nil, fmt.Errorf("deployment %q: unknown", g.Deployment)
	}
	dep, err := sim.DeploymentPreset(d.Preset)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	duration, to := matrixDuration, matrixMeasureTo
	if long > 0 { // the same run, measured longer; the five minutes after the window stay
		to = matrixMeasureFrom + long
		duration = to + (matrixDuration - matrixMeasureTo)
	}
	fmt.Fprintf(&b, "name: matrix-%s-%s-%s\nseed: %d\nduration: %v\nmeasure: {from: %v, to: %v}\n", g.Deployment, g.Tier,
		g.Workload, calibrationSeed, duration, matrixMeasureFrom, to)
	fmt.Fprintf(&b, "deployment:\n  preset: %s\n", d.Preset)
	if g.Tier == TierHost {
		// SGLang's --hicache-ratio default: the host pool is twice the GPU pool.
		fmt.Fprintf(&b, "  prefill: {host_cache_tokens: %d}\n", 2*dep.Prefill.CacheTokens)
	}
	fmt.Fprintf(&b, "workload: {kind: %s}\narrivals:\n  rate_per_min: %s\n", g.Workload, fmtFloat(ratePerMin))
	if spike > 0 {
		fmt.Fprintf(&b, "  spikes: [{from: %v, to: %v, multiplier: %s}]\n", matrixSpikeFrom, matrixSpikeTo, fmtFloat(1+spike))
	}
	sc, err := scenario.Parse([]byte(b.String()))
	if err != nil {
		return nil, fmt.Errorf("matrix row %s: %w", g, err)
	}
	return sc, nil
}

// calibrate measures each group's deployment on its engine configuration (SGLang default, or
// HiCache for host-tier rows) as `basin calibrate` does.
func (s MatrixSpec) calibrate() (map[string]*detector.Calibration, error) {
	cals := map[string]*detector.Calibration{}
	for _, g := range s.groups() {
		sc, err := matrixScenario(g, 1, 0, 0)
		if err != nil {
			return nil, err
		}
		cal, err := harness.Calibrate(sc, harness.Epoch)
		if err != nil {
			return nil, fmt.Errorf("calibrate %s: %w", g, err)
		}
		cals[g.String()] = cal
	}
	return cals, nil
}

// RunMatrix runs the sweep: each group calibrated once, then every row × policy × seed on a
// worker pool. Every run is independent and lands in its own slot, so the result is the same for
// any number of workers.
func RunMatrix(spec MatrixSpec, progress func(done, total int)) (*MatrixResult, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("matrix: %w", err)
	}
	cals, err := spec.calibrate()
	if err != nil {
		return nil, err
	}
	out := &MatrixResult{Spec: spec, Calibrations: cals, Rows: spec.expand(cals)}
	np, ns := len(spec.Policies), len(spec.Seeds)
	out.Cells = make([]MatrixCell, len(out.Rows)*np)
	for r := range out.Rows {
		for p, name := range spec.Policies {
			out.Cells[r*np+p] = MatrixCell{Row: r, Policy: name, Runs: make([]MatrixRun, ns)}
		}
	}
	total := len(out.Cells) * ns
	jobs := make(chan int)
	errs := make([]error, total)
	var mu sync.Mutex
	done := 0
	var wg sync.WaitGroup
	for range spec.Workers {
		wg.Go(func() {
			for k := range jobs {
				c := &out.Cells[k/ns]
				row := out.Rows[c.Row]
				run, err := runMatrixCell(row, engineName(row.Tier, c.Policy), spec.Seeds[k%ns], cals[row.MatrixGroup.String()], 0)
				if err != nil {
					errs[k] = fmt.Errorf("%s load %.2f spike +%.0f%% %s seed %d: %w", row.MatrixGroup, row.Load,
						100*row.Spike, c.Policy, spec.Seeds[k%ns], err)
				}
				c.Runs[k%ns] = run
				mu.Lock()
				done++
				if progress != nil {
					progress(done, total)
				}
				mu.Unlock()
			}
		})
	}
	for k := range total {
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out.fillRatios()
	if spec.LongWindow > 0 {
		if err := out.remeasureLong(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// remeasureLong re-runs, over the spec's LongWindow, basin and the baselines on every row where
// basin's goodput is under the best baseline's on some seed.
func (m *MatrixResult) remeasureLong() error {
	spec := m.Spec
	m.Long = nil
	var policies []string
	for _, p := range append([]string{harness.Basin}, MatrixBaselines...) {
		if slices.Contains(spec.Policies, p) {
			policies = append(policies, p)
		}
	}
	if !slices.Contains(policies, harness.Basin) || len(policies) < 2 {
		return nil
	}
	for r := range m.Rows {
		if v, ok := m.worstVsBest(r); ok && v < TargetVsBest {
			lc := LongCheck{Row: r, Goodput: map[string][]float64{}}
			for _, p := range policies {
				lc.Goodput[p] = make([]float64, len(spec.Seeds))
			}
			m.Long = append(m.Long, lc)
		}
	}
	type job struct {
		check, seed int
		policy      string
	}
	var jobs []job
	for i := range m.Long {
		for _, p := range policies {
			for k := range spec.Seeds {
				jobs = append(jobs, job{i, k, p})
			}
		}
	}
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, max(1, spec.Workers))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			row := m.Rows[m.Long[j.check].Row]
			run, err := runMatrixCell(row, engineName(row.Tier, j.policy), spec.Seeds[j.seed], m.Calibrations[row.MatrixGroup.String()],
				spec.LongWindow)
			if err != nil {
				errs[i] = fmt.Errorf("%s load %.2f spike +%.0f%% %s seed %d over %v: %w", row.MatrixGroup, row.Load, 100*row.Spike,
					j.policy, spec.Seeds[j.seed], spec.LongWindow, err)
				return
			}
			m.Long[j.check].Goodput[j.policy][j.seed] = run.Result.GoodputPerHour // own slot: no lock needed
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// countingGate counts the sessions a gate holds on arrival.
type countingGate struct {
	sim.Gate
	held int
}

func (g *countingGate) Arrive(now time.Duration, s sim.SessionInfo) sim.Verdict {
	v := g.Gate.Arrive(now, s)
	if v.Action == sim.Hold {
		g.held++
	}
	return v
}

func runMatrixCell(row MatrixRow, policy string, seed uint64, cal *detector.Calibration, long time.Duration) (MatrixRun, error) {
	sc, err := matrixScenario(row.MatrixGroup, row.ArrivalsPerMin, row.Spike, long)
	if err != nil {
		return MatrixRun{}, err
	}
	sc.Seed = seed
	w := scenario.Wiring{Policies: harness.Policies{Calibrate: func() (*detector.Calibration, error) { return cal, nil }}}
	o, err := w.Options(sc, policy)
	if err != nil {
		return MatrixRun{}, err
	}
	var gate *countingGate
	if o.Gate != nil {
		gate = &countingGate{Gate: o.Gate}
		o.Gate = gate
	}
	var lent int64
	if c := o.Controller; c != nil {
		tick := c.Tick
		o.Controller = &sim.Controller{Every: c.Every, Tick: func(now time.Duration, ctl sim.Control) {
			tick(now, ctl)
			var sum int64
			for _, st := range ctl.Stats() {
				sum += int64(st.LentTokens)
			}
			lent = max(lent, sum)
		}}
	}
	s, err := sim.New(o)
	if err != nil {
		return MatrixRun{}, err
	}
	r := s.Run()
	r.Scenario = sc.Name
	r.Policy = sim.Policy(policy)
	run := MatrixRun{Seed: seed, Result: r, Gate: GateActivity{PeakLentTokens: lent}}
	if gate != nil {
		run.Gate.Held = gate.held
	}
	for _, m := range r.Timeline {
		run.Gate.MaxQueued = max(run.Gate.MaxQueued, m.QueuedSessions)
	}
	r.Timeline = nil
	if obs, ok := r.Detector.(*harness.Observation); ok && obs.Remediation != nil {
		run.Gate.Sheds = obs.Remediation.Sheds
		for _, p := range obs.Remediation.Plans {
			if b := p.Budget; b != nil && b.To < b.From {
				run.Gate.BudgetCuts++
			}
			if h := p.Hold; h != nil {
				run.Gate.HoldMax = max(run.Gate.HoldMax, h.Held)
			}
		}
	}
	return run, nil
}

// twin is the spike-free row at the same group and load.
func (m *MatrixResult) twin(r int) int {
	row := m.Rows[r]
	for i, o := range m.Rows {
		if o.MatrixGroup == row.MatrixGroup && o.Load == row.Load && o.Spike == 0 {
			return i
		}
	}
	return -1
}

// fillRatios sets every run's no-spike goodput and ratio from its twin (same policy and seed).
func (m *MatrixResult) fillRatios() {
	np := len(m.Spec.Policies)
	for i := range m.Cells {
		c := &m.Cells[i]
		t := m.twin(c.Row)
		if t < 0 {
			continue
		}
		tc := m.Cells[t*np+i%np]
		for k := range c.Runs {
			calm := tc.Runs[k].Result.GoodputPerHour
			r := c.Runs[k].Result
			r.NoSpikeGoodputPerHour = &calm
			r.GoodputRatio = nil
			if calm > 0 {
				v := r.GoodputPerHour / calm
				r.GoodputRatio = &v
			}
		}
	}
}

// Cell returns the cell of a row and policy, or nil.
func (m *MatrixResult) Cell(row int, policy string) *MatrixCell {
	i := slices.Index(m.Spec.Policies, policy)
	if i < 0 || row < 0 || row >= len(m.Rows) {
		return nil
	}
	return &m.Cells[row*len(m.Spec.Policies)+i]
}
