package harness

import (
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/enginemetrics"
)

// Observation is what basin's collector and detector saw of a simulated run, next to the
// conventional utilisation alerts computed from the same snapshots.
type Observation struct {
	// FirstWarningMin is when the warning that led into the first trap began: the start of the
	// unbroken run of non-healthy states that contains the first trapped state. Without a trap,
	// the first time the detector left healthy (pressure or worse).
	FirstWarningMin *float64 `json:"first_warning_min"`
	// FirstDriftingMin and FirstTrappedMin are the first entries into those states.
	FirstDriftingMin *float64              `json:"first_drifting_min"`
	FirstTrappedMin  *float64              `json:"first_trapped_min"`
	Transitions      []detector.Transition `json:"transitions"`
	FinalState       detector.State        `json:"final_state"`
	// Utilisation gives, per conventional rule, the first minute it held for AlertFor; null when
	// it never did. UtilisationFirstMin is the earliest of them.
	Utilisation         map[string]*float64 `json:"utilisation_alerts_first_min"`
	UtilisationFirstMin *float64            `json:"-"`
	// Remediation counts what basin's remediation loop did (basin's policies only).
	Remediation *RemediationSummary `json:"remediation,omitempty"`

	trace func(time.Duration, detector.Assessment)
}

// ObserveEvery is how often the virtual-time harness scrapes and steps the detector: the
// collector's default scrape interval.
const ObserveEvery = collector.DefaultInterval

// AlertFor is how long a conventional alert's condition must hold before it counts as fired, as a
// Prometheus rule's `for:`; one minute, shorter than such rules usually use, so the comparison errs
// in the conventional alerts' favour.
const AlertFor = time.Minute

// instanceLoad is what the per-endpoint rules read of one engine instance: requests waiting in
// its queues (scheduler plus PD bootstrap/prealloc/transfer queues) and its KV usage.
type instanceLoad struct{ queue, kv float64 }

func loads(stats []sim.InstanceStats) []instanceLoad {
	out := make([]instanceLoad, 0, len(stats))
	for _, st := range stats {
		l := instanceLoad{queue: float64(st.Queued + st.BootstrapQueue + st.PreallocQueue + st.TransferQueue)}
		if st.MaxTotalTokens > 0 {
			l.kv = float64(st.UsedTokens) / float64(st.MaxTotalTokens)
		}
		out = append(out, l)
	}
	return out
}

func anyInstance(ls []instanceLoad, f func(instanceLoad) bool) bool {
	for _, l := range ls {
		if f(l) {
			return true
		}
	}
	return false
}

// The conventional alerts basin is compared with. GAIE's saturation detector and the llm-d alerts
// are per endpoint, so they read each instance as its own metrics would show it; the TTFT alert
// reads the collector's windowed p99.
var utilisationRules = []struct {
	name string
	fire func(collector.Snapshot, []instanceLoad) bool
}{
	{"gaie_saturation", func(_ collector.Snapshot, ls []instanceLoad) bool {
		return anyInstance(ls, func(l instanceLoad) bool { return max(l.queue/5, l.kv/0.8) >= 1 })
	}},
	{"llmd_kv_usage_0.9", func(_ collector.Snapshot, ls []instanceLoad) bool {
		return anyInstance(ls, func(l instanceLoad) bool { return l.kv > 0.9 })
	}},
	{"llmd_waiting_50", func(_ collector.Snapshot, ls []instanceLoad) bool {
		return anyInstance(ls, func(l instanceLoad) bool { return l.queue > 50 })
	}},
	{"ttft_p99_10s", func(s collector.Snapshot, _ []instanceLoad) bool {
		v, ok := s.Get(collector.TTFTp99)
		return ok && v > 10
	}},
}

// Observe attaches basin's collector and detector to a run: every ObserveEvery of virtual time the
// simulated instances' SGLang-named metrics and the gateway's basin_gateway_* metrics are gathered
// and ingested exactly as scrapes would be, the detector steps on the snapshot, and the result
// gains the Observation. A run without a gate gets an observe-only one (an admission core that
// admits everything): the gateway is how basin sees sessions, even when it does not enforce.
func Observe(o *sim.Options, do detector.Options) error { return ObserveEach(o, do, nil) }

// Tick is one observation step, for a hook that acts on it (basin's remediation loop).
type Tick struct {
	// T is the simulated time, Now the same on the wall-clock axis the core and detector use.
	T          time.Duration
	Now        time.Time
	Snapshot   collector.Snapshot
	Assessment detector.Assessment
	Control    sim.Control
	Gate       *Gate
}

// observe is Observe with a hook called after every detector step.
func ObserveEach(o *sim.Options, do detector.Options, after func(Tick)) error {
	g, ok := o.Gate.(*Gate)
	if o.Gate != nil && !ok {
		return fmt.Errorf("observe: the run's gate is not basin's admission core")
	}
	if g == nil {
		core, err := admission.New(admission.Options{Budget: math.MaxInt64 / 2})
		if err != nil {
			return err
		}
		g = NewGate(core, func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) })
		o.Gate = g
	}
	var now time.Time
	var stats []sim.InstanceStats
	var lending bool
	clock := func() time.Time { return now }
	col, err := collector.New(collector.Options{Interval: ObserveEvery, Now: clock})
	if err != nil {
		return err
	}
	det, err := detector.New(do)
	if err != nil {
		return err
	}
	gw := prometheus.NewRegistry()
	if err := gw.Register(admission.NewCollector(g.core, clock, func() bool { return lending })); err != nil {
		return err
	}
	gwTarget := collector.Target{Name: "gateway", Role: collector.RoleGateway, Dialect: collector.DialectGateway}
	regs := map[string]*prometheus.Registry{}
	var targets []collector.Target

	obs := &Observation{Utilisation: map[string]*float64{}}
	held := map[string]time.Duration{}
	episode := time.Duration(-1) // when the current run of non-healthy states began
	mark := func(p **float64, t time.Duration) {
		if *p == nil {
			m := t.Minutes()
			*p = &m
		}
	}
	prev := o.Controller
	o.Controller = &sim.Controller{Every: ObserveEvery, Tick: func(t time.Duration, c sim.Control) {
		if prev != nil && t%prev.Every == 0 {
			prev.Tick(t, c)
		}
		now = Epoch.Add(t)
		stats = c.Stats()
		lending = c.Observe().Lending.Enabled
		targets = followInstances(stats, targets, regs, col, func() []sim.InstanceStats { return stats })
		for _, tg := range targets {
			if fams, err := regs[tg.Name].Gather(); err == nil {
				_ = col.IngestGathered(now, tg, fams)
			}
		}
		if fams, err := gw.Gather(); err == nil {
			_ = col.IngestGathered(now, gwTarget, fams)
		}
		snap := col.SnapshotAt(now)
		a := det.Step(snap)
		if obs.trace != nil {
			obs.trace(t, a)
		}
		if after != nil {
			after(Tick{T: t, Now: now, Snapshot: snap, Assessment: a, Control: c, Gate: g})
		}
		if tr := a.Transition; tr != nil {
			obs.Transitions = append(obs.Transitions, *tr)
			switch {
			case tr.To == detector.Healthy:
				episode = -1
			case tr.From == detector.Healthy:
				episode = t
			}
			switch tr.To {
			case detector.Drifting:
				mark(&obs.FirstDriftingMin, t)
			case detector.Trapped:
				if obs.FirstTrappedMin == nil && episode >= 0 {
					m := episode.Minutes()
					obs.FirstWarningMin = &m // the warning that led here
				}
				mark(&obs.FirstTrappedMin, t)
			}
			if tr.To != detector.Healthy && obs.FirstTrappedMin == nil {
				mark(&obs.FirstWarningMin, t)
			}
		}
		obs.FinalState = a.State
		ls := loads(stats)
		for _, r := range utilisationRules {
			if !r.fire(snap, ls) {
				held[r.name] = 0
				continue
			}
			held[r.name] += ObserveEvery
			if held[r.name] >= AlertFor && obs.Utilisation[r.name] == nil {
				m := (t - AlertFor + ObserveEvery).Minutes()
				obs.Utilisation[r.name] = &m
				if obs.UtilisationFirstMin == nil || m < *obs.UtilisationFirstMin {
					obs.UtilisationFirstMin = &m
				}
			}
		}
	}}
	if prev != nil && prev.Every%ObserveEvery != 0 {
		return fmt.Errorf("observe: the run's controller ticks every %v, not a multiple of %v", prev.Every, ObserveEvery)
	}
	done := o.OnResult
	o.OnResult = func(r *sim.Result) {
		for _, rule := range utilisationRules {
			if _, ok := obs.Utilisation[rule.name]; !ok {
				obs.Utilisation[rule.name] = nil
			}
		}
		r.Detector = obs
		r.UtilisationAlertFirstMin = obs.UtilisationFirstMin
		if done != nil {
			done(r)
		}
	}
	return nil
}

// followInstances keeps one scrape target per simulated instance, as a deployment's service
// discovery does: an instance the simulator lists for the first time (the run's own, or one a
// scale-out started) gets a registry and a target; one it no longer lists (removed by a scale-in)
// loses both, and the collector forgets it, so its last reading leaves the sums. Targets stay in
// the simulator's order.
func followInstances(stats []sim.InstanceStats, targets []collector.Target, regs map[string]*prometheus.Registry,
	col *collector.Collector, src enginemetrics.Source) []collector.Target {
	listed := make(map[string]bool, len(stats))
	out := targets[:0]
	for _, st := range stats {
		listed[st.Name] = true
	}
	for _, tg := range targets {
		if listed[tg.Name] {
			out = append(out, tg)
			continue
		}
		delete(regs, tg.Name)
		col.Forget(tg.Name)
	}
	for _, st := range stats {
		if _, ok := regs[st.Name]; ok {
			continue
		}
		name := st.Name
		r, err := enginemetrics.Registries(src, []string{name}, enginemetrics.Options{})
		if err != nil {
			panic(fmt.Sprintf("observe: %v", err)) // one fresh name, the simulator's own: cannot fail
		}
		regs[name] = r[name]
		out = append(out, collector.Target{Name: name, Role: collector.Role(st.Role), Dialect: collector.DialectSGLang})
	}
	return out
}
