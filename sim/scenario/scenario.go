// Package scenario reads simulation scenarios: YAML files that name a deployment, a workload, an
// arrival process with its spikes and the SLO, and turns them into simulator options. Unknown keys
// and bad values are errors that name the key and the line, because a typo in a scenario otherwise
// silently measures something else.
package scenario

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/trace"
	"github.com/basin-dev/basin/internal/yamlconf"
	"github.com/basin-dev/basin/scenarios"
	"github.com/basin-dev/basin/sim"
)

// Duration is a time.Duration written the Go way in YAML ("90m", "1h30m", "45s").
type Duration = yamlconf.Duration

// Window is the measurement window.
type Window struct {
	From Duration `yaml:"from"`
	To   Duration `yaml:"to"`
}

// DeploymentSpec is a preset plus overrides; every sim.Deployment field may be overridden.
type DeploymentSpec struct {
	Preset         string `yaml:"preset"`
	sim.Deployment `yaml:",inline"`
}

// TraceSpec points a trace workload at its file.
type TraceSpec struct {
	Path   string `yaml:"path"`
	Format string `yaml:"format"` // basin | tracelab
}

// WorkloadSpec selects a workload generator or a trace.
type WorkloadSpec struct {
	Kind  string     `yaml:"kind"`
	Trace *TraceSpec `yaml:"trace"`
}

// Spike multiplies the base arrival rate between From and To.
type Spike struct {
	From       Duration `yaml:"from"`
	To         Duration `yaml:"to"`
	Multiplier float64  `yaml:"multiplier"`
}

// Extra is an additional arrival stream, optionally killed at KillAt (the paper's intervention).
type Extra struct {
	From       Duration `yaml:"from"`
	To         Duration `yaml:"to"`
	RatePerMin float64  `yaml:"rate_per_min"`
	Workload   string   `yaml:"workload"`
	KillAt     Duration `yaml:"kill_at"`
}

// Arrivals is the arrival process: Poisson at RatePerMin, with spikes and extra streams.
type Arrivals struct {
	RatePerMin float64 `yaml:"rate_per_min"`
	Spikes     []Spike `yaml:"spikes"`
	Extra      []Extra `yaml:"extra"`
}

// Scenario is a parsed, validated scenario file, and nothing else: what a run is built with
// beyond the file (basin's policies, observers) is a Wiring, passed where the run is built.
type Scenario struct {
	Name       string         `yaml:"name"`
	Seed       uint64         `yaml:"seed"`
	Duration   Duration       `yaml:"duration"`
	Measure    Window         `yaml:"measure"`
	Deployment DeploymentSpec `yaml:"deployment"`
	Workload   WorkloadSpec   `yaml:"workload"`
	Arrivals   Arrivals       `yaml:"arrivals"`
	SLO        sim.SLO        `yaml:"slo"`
	// Policy is the policy runs use unless the command line names one: an engine baseline, or a
	// name the runs' Wiring.Policies knows.
	Policy string `yaml:"policy"`

	// dir is where relative trace paths are resolved.
	dir string
	// traceSessions holds the loaded trace of a trace workload.
	traceSessions []trace.Session
}

// Load reads a scenario from a file path, or from the presets when no such file exists and the
// name is a preset's ("paper-1p1d-h100").
func Load(nameOrPath string) (*Scenario, error) {
	data, err := os.ReadFile(nameOrPath)
	dir := filepath.Dir(nameOrPath)
	if errors.Is(err, fs.ErrNotExist) && !strings.ContainsAny(nameOrPath, `/\`) {
		data, err = fs.ReadFile(scenarios.FS, strings.TrimSuffix(nameOrPath, ".yaml")+".yaml")
		dir = "."
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("scenario %q: no such file and no such preset (presets: %s)",
				nameOrPath, strings.Join(Presets(), ", "))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	sc, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", nameOrPath, err)
	}
	sc.dir = dir
	if sc.Workload.Kind == "trace" {
		if err := sc.loadTrace(); err != nil {
			return nil, fmt.Errorf("scenario %s: %w", nameOrPath, err)
		}
	}
	return sc, nil
}

// Presets lists the embedded scenario presets.
func Presets() []string {
	var out []string
	entries, _ := fs.ReadDir(scenarios.FS, ".")
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			out = append(out, n)
		}
	}
	return out
}

// Parse reads a scenario from YAML. It does not load trace files (Load does).
func Parse(data []byte) (*Scenario, error) {
	// First pass, strict: unknown keys and type errors, with their lines.
	var strict Scenario
	if _, err := yamlconf.Decode(data, &strict); err != nil {
		return nil, err
	}
	// Second pass onto the preset, so only the keys the file sets override it.
	sc := &Scenario{SLO: sim.DefaultSLO()}
	if p := strict.Deployment.Preset; p != "" {
		d, err := sim.DeploymentPreset(p)
		if err != nil {
			return nil, fmt.Errorf("deployment.preset: %w", err)
		}
		sc.Deployment.Deployment = d
	} else {
		sc.Deployment.Deployment.Lending.MaxFraction = 0.5
	}
	if err := yamlconf.Overlay(data, sc); err != nil {
		return nil, err
	}
	if err := sc.validate(); err != nil {
		return nil, err
	}
	return sc, nil
}

func (sc *Scenario) validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if sc.Name == "" {
		add("name: missing")
	}
	if sc.Duration <= 0 {
		add("duration: missing or zero")
	}
	if sc.Measure.To == 0 {
		sc.Measure.To = sc.Duration
	}
	if sc.Measure.From >= sc.Measure.To || sc.Measure.To > sc.Duration {
		add("measure: need from < to ≤ duration, got from %v to %v (duration %v)",
			time.Duration(sc.Measure.From), time.Duration(sc.Measure.To), time.Duration(sc.Duration))
	}
	if err := sc.Deployment.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch sc.Workload.Kind {
	case "":
		add("workload.kind: missing (one of %s, trace)", strings.Join(sim.SyntheticWorkloadNames(), ", "))
	case "trace":
		t := sc.Workload.Trace
		if t == nil || t.Path == "" {
			add("workload.trace.path: missing (workload kind trace needs a file)")
		} else if t.Format != "basin" && t.Format != "tracelab" {
			add("workload.trace.format: %q, want basin or tracelab", t.Format)
		}
	default:
		if _, err := sim.SyntheticWorkload(sc.Workload.Kind); err != nil {
			add("workload.kind: %v", err)
		}
		if sc.Workload.Trace != nil {
			add("workload.trace: only for kind trace")
		}
	}
	if !(sc.Arrivals.RatePerMin >= 0) {
		add("arrivals.rate_per_min: must be ≥ 0, got %v", sc.Arrivals.RatePerMin)
	}
	for i, sp := range sc.Arrivals.Spikes {
		if sp.To <= sp.From {
			add("arrivals.spikes[%d]: to (%v) must be after from (%v)", i, time.Duration(sp.To), time.Duration(sp.From))
		}
		if !(sp.Multiplier >= 0) {
			add("arrivals.spikes[%d].multiplier: must be ≥ 0, got %v", i, sp.Multiplier)
		}
	}
	for i, ex := range sc.Arrivals.Extra {
		if ex.To <= ex.From {
			add("arrivals.extra[%d]: to (%v) must be after from (%v)", i, time.Duration(ex.To), time.Duration(ex.From))
		}
		if !(ex.RatePerMin > 0) {
			add("arrivals.extra[%d].rate_per_min: must be > 0, got %v", i, ex.RatePerMin)
		}
		kind := ex.Workload
		if kind == "" {
			kind = sc.Workload.Kind
		}
		if _, err := sim.SyntheticWorkload(kind); err != nil && kind != "trace" {
			add("arrivals.extra[%d].workload: %v", i, err)
		}
	}
	if err := sc.SLO.Validate(); err != nil {
		errs = append(errs, err)
	}
	if sc.Policy != "" && !strings.HasPrefix(sc.Policy, "basin") && sc.Policy != "oracle" {
		// basin's own policies are resolved when a run is built (Wiring.Policies).
		if _, err := sim.ParsePolicy(sc.Policy); err != nil {
			add("policy: %v", err)
		}
	}
	return errors.Join(errs...)
}

func (sc *Scenario) loadTrace() error {
	t := sc.Workload.Trace
	path := t.Path
	if !filepath.IsAbs(path) {
		path = filepath.Join(sc.dir, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("workload.trace.path: %w", err)
	}
	defer f.Close()
	var ss []trace.Session
	if t.Format == "tracelab" {
		ss, err = trace.ReadTraceLab(f)
	} else {
		ss, err = trace.ReadBasin(f)
	}
	if err != nil {
		return fmt.Errorf("workload.trace %s: %w", t.Path, err)
	}
	sc.traceSessions = ss
	return nil
}

func (sc *Scenario) workload(kind string) (sim.Workload, error) {
	if kind == "" {
		kind = sc.Workload.Kind
	}
	if kind == "trace" {
		return sim.NewReplay(sc.Workload.Trace.Path, sc.traceSessions)
	}
	return sim.SyntheticWorkload(kind)
}

// WithoutSpikes is the same scenario with spikes and extra streams removed: the baseline a spike's
// damage is measured against. The seed is kept, so base sessions are identical.
func (sc *Scenario) WithoutSpikes() *Scenario {
	c := *sc
	c.Arrivals.Spikes = nil
	c.Arrivals.Extra = nil
	return &c
}

// HasSpikes reports whether the scenario has spikes or extra streams.
func (sc *Scenario) HasSpikes() bool {
	return len(sc.Arrivals.Spikes) > 0 || len(sc.Arrivals.Extra) > 0
}

// PolicySet configures runs for policies the simulator does not know itself.
type PolicySet interface {
	// Apply configures o (built for the engine baseline) for the named policy, with a fresh
	// state for this run; it reports false for a name it does not know.
	Apply(name string, o *sim.Options) (bool, error)
	// Names lists the policies it knows, for help texts and errors.
	Names() []string
}

// Wiring is what runs are built with beyond what a scenario file says: code, not configuration.
// It is kept out of Scenario so that a Scenario is only its YAML — copied (WithoutSpikes) and
// shared between runs as plain data — and so that this package holds no basin logic: the harness
// supplies the policies and the observers. The zero Wiring builds the engine baselines with
// nothing attached, which is what Scenario.Options, Run, RunPair, Compare and MeasureCurve do.
type Wiring struct {
	// Policies resolves policy names beyond the engine baselines: basin's own policies. Nil:
	// engine baselines only.
	Policies PolicySet
	// Observe, when set, attaches observers (basin's collector and detector) to every run built.
	Observe func(*sim.Options) error
}

// Options builds simulator options for a policy ("" means the scenario's own, or none) with the
// engine baselines only and nothing attached; Wiring.Options is the wired form.
func (sc *Scenario) Options(policy string) (sim.Options, error) { return Wiring{}.Options(sc, policy) }

// Options builds simulator options for the scenario under a policy ("" means the scenario's own,
// or none): an engine baseline, or one of w.Policies applied on top of the engine baseline none;
// then w.Observe attaches its observers.
func (w Wiring) Options(sc *Scenario, policy string) (sim.Options, error) {
	if policy == "" {
		policy = sc.Policy
	}
	if policy == "" {
		policy = string(sim.PolicyNone)
	}
	engine := policy
	custom := false
	if w.Policies != nil && slices.Contains(w.Policies.Names(), policy) {
		engine, custom = string(sim.PolicyNone), true
	}
	p, err := sim.ParsePolicy(engine)
	if err != nil {
		if w.Policies != nil {
			return sim.Options{}, fmt.Errorf("unknown policy %q (known: none, hicache, continuum, %s)", policy,
				strings.Join(w.Policies.Names(), ", "))
		}
		return sim.Options{}, err
	}
	base, err := sc.workload("")
	if err != nil {
		return sim.Options{}, err
	}
	o := sim.Options{
		Seed: sc.Seed, Deployment: sc.Deployment.Deployment, Policy: p, SLO: sc.SLO,
		Duration: time.Duration(sc.Duration), MeasureFrom: time.Duration(sc.Measure.From),
		MeasureTo: time.Duration(sc.Measure.To),
	}
	main := sim.Stream{Class: "base", Workload: base, RatePerMin: sc.Arrivals.RatePerMin}
	var spikes []sim.Stream
	for _, sp := range sc.Arrivals.Spikes {
		switch {
		case sp.Multiplier > 1:
			// A spike is a second Poisson stream on top of the base one, so that removing it
			// leaves the base arrivals exactly as they were.
			spikes = append(spikes, sim.Stream{Class: "spike", Workload: base,
				RatePerMin: sc.Arrivals.RatePerMin * (sp.Multiplier - 1),
				From:       time.Duration(sp.From), To: time.Duration(sp.To)})
		case sp.Multiplier < 1:
			main.Thin = append(main.Thin, sim.Thinning{From: time.Duration(sp.From), To: time.Duration(sp.To),
				Keep: sp.Multiplier})
		}
	}
	o.Streams = append(o.Streams, main)
	o.Streams = append(o.Streams, spikes...)
	for i, ex := range sc.Arrivals.Extra {
		w, err := sc.workload(ex.Workload)
		if err != nil {
			return sim.Options{}, fmt.Errorf("arrivals.extra[%d]: %w", i, err)
		}
		o.Streams = append(o.Streams, sim.Stream{Class: fmt.Sprintf("extra-%d", i), Workload: w,
			RatePerMin: ex.RatePerMin, From: time.Duration(ex.From), To: time.Duration(ex.To),
			KillAt: time.Duration(ex.KillAt)})
	}
	if custom {
		if _, err := w.Policies.Apply(policy, &o); err != nil {
			return sim.Options{}, fmt.Errorf("policy %s: %w", policy, err)
		}
	}
	if w.Observe != nil {
		if err := w.Observe(&o); err != nil {
			return sim.Options{}, fmt.Errorf("observe: %w", err)
		}
	}
	return o, nil
}
