package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/scaler"
)

// metrics exports the daemon's view as basin_* series, read from the last assessment and plan at
// scrape time (a custom collector: the values are one struct's fields, not counters to keep).
type metrics struct {
	d                                                            *Daemon
	state, mode, wc, hit, plateau, knee, live, stable, unstable  *prometheus.Desc
	ttt, edge, budget, reference, paused, lending, ready, lambda *prometheus.Desc
	peak, dryRun, blind, gatewayUp, tolRatio, tolSessions, tolAt *prometheus.Desc
	leader, term, wouldBudget                                    *prometheus.Desc
	needed, instances, binding, scaleAsked                       *prometheus.Desc
	cronRuns, cronPanics                                         *prometheus.CounterVec
}

func newMetrics(d *Daemon) *metrics {
	g := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("basin_"+name, help, labels, prometheus.Labels{"deployment": d.cfg.Deployment})
	}
	return &metrics{d: d,
		state:    g("state", "1 for the detector's current state, 0 for the others.", "state"),
		mode:     g("remediation_mode", "1 for the budget controller's current mode (normal, incident, restoring).", "mode"),
		wc:       g("working_set_over_cache", "Working set ÷ cache capacity (W/C)."),
		hit:      g("hit_rate", "Windowed prefix-cache hit rate from counters."),
		plateau:  g("plateau_hit_rate", "The hit rate's plateau (calibrated or learnt)."),
		knee:     g("knee_ratio", "The knee as W/C (calibrated, learnt or default)."),
		live:     g("live_sessions", "Live sessions seen by the detector."),
		stable:   g("equilibrium_stable_sessions", "Fluid model: the stable equilibrium N at the current arrival rate."),
		unstable: g("equilibrium_unstable_sessions", "Fluid model: the unstable equilibrium N (the edge of the basin)."),
		ttt:      g("time_to_trap_seconds", "Fluid model: time until N reaches the edge at its current growth."),
		edge:     g("distance_to_edge_sessions", "Fluid model: the edge minus N."),
		tolRatio: g("spike_tolerance_ratio", "Fluid model: the largest multiplier of the current arrival rate, held for 10 minutes, "+
			"after which the deployment still comes back by itself (1: it absorbs nothing more; 20: at least that)."),
		tolSessions: g("spike_tolerance_sessions", "Fluid model: the extra sessions of the largest 10-minute spike the deployment absorbs now."),
		tolAt:       g("spike_tolerance_alert_ratio", "1 + spike_tolerance_margin: BasinSpikeToleranceLow warns while basin_spike_tolerance_ratio stays under it."),
		lambda:      g("arrival_rate_per_second", "Smoothed session arrival rate λ."),
		peak:        g("peak_completion_rate_per_second", "Peak session completion rate in use (calibrated or learnt)."),
		budget: g("budget_tokens", "The budget basin set on the gateway, in force (absent in a dry run, which sets none: "+
			"basin_gateway_budget_tokens is the gateway's own, 0 while it only counts)."),
		wouldBudget: g("dry_run_budget_tokens", "In a dry run: the budget basin would set if it acted (never applied)."),
		reference:   g("reference_budget_tokens", "The B_ref the policy uses: min(0.9 × knee·C, C) with C the cache capacity it holds (a fall followed over reference_window), re-sent when it moves by more than one step."),
		paused:      g("remediation_paused", "1 while remediation is paused through the API."),
		lending:     g("lending_enabled", "1 while basin has KV lending switched on."),
		ready:       g("daemon_ready", "1 once the daemon has completed a step."),
		dryRun:      g("dry_run", "1 when the daemon only records what it would do."),
		blind: g("blind", "1 while the daemon cannot see a signal the detector needs or the gateway's admin API "+
			"(GET /api/v1/status lists what): basin_state is then the state held, not a reading."),
		gatewayUp: g("gateway_admin_up", "1 when the last read of the gateway's admin API succeeded (absent without a gateway)."),
		leader:    g("daemon_leader", "With a store: 1 while this daemon acts (holds the lease and took over), 0 while standby (absent without a store)."),
		term:      g("daemon_term", "With a store: the lease's term this daemon acts under, or while standby the last it held or saw won (absent without a store)."),
		needed: g("capacity_needed_instances", "Instances of the role the deployment needs now: its arrivals over a session's "+
			"lifetime under the knee with the headroom of capacity.spike_size, or what the live sessions hold if more "+
			"(absent while it cannot be sized; basin_capacity_instances says how many serve). An autoscaler's target.", "role"),
		instances: g("capacity_instances", "Instances of the role serving: engine targets read fresh and whole.", "role"),
		binding: g("capacity_binding", "1 on the limit the deployment reaches first at its instances now (cache: the prefill "+
			"pool's knee; decode: decode KV), 0 on the other; absent while unknown.", "limit"),
		scaleAsked: g("scale_desired_instances", "The instances of the role basin's scaling last asked for (absent without "+
			"scaling, or before its first step with the role read).", "role"),
		cronRuns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "basin_cron_runs_total",
			Help: "Cron job runs by job.", ConstLabels: prometheus.Labels{"deployment": d.cfg.Deployment}}, []string{"job"}),
		cronPanics: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "basin_cron_panics_total",
			Help: "Cron job panics recovered, by job.", ConstLabels: prometheus.Labels{"deployment": d.cfg.Deployment}}, []string{"job"}),
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(m, ch) }

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	d := m.d
	d.mu.Lock()
	a, ready, ps, unseen, gwErr := d.mu.shown, d.mu.ready, d.mu.policy, len(d.mu.unseen), d.mu.gatewayErr
	need, needErr := d.mu.need, d.mu.needErr
	d.mu.Unlock()
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	gauge(m.ready, b2f(ready))
	gauge(m.dryRun, b2f(d.cfg.DryRun))
	gauge(m.tolAt, 1+d.cfg.SpikeToleranceMargin)
	m.cronRuns.Collect(ch)
	m.cronPanics.Collect(ch)
	if d.ha != nil {
		role, term, _, _ := d.role()
		gauge(m.leader, b2f(role == RoleActing))
		gauge(m.term, float64(term))
	}
	if !ready {
		return
	}
	if needErr == "" {
		for _, r := range scaler.Roles() {
			gauge(m.needed, float64(need.Of(r)), string(r))
			gauge(m.instances, float64(need.Serving(r)), string(r))
		}
		if need.Binding != "" {
			gauge(m.binding, b2f(need.Binding == detector.CacheFirst), "cache")
			gauge(m.binding, b2f(need.Binding == detector.DecodeFirst), "decode")
		}
	}
	if d.scale != nil {
		st := d.scale.State()
		for _, r := range scaler.Roles() {
			if s, ok := st[r]; ok && s.Asked > 0 {
				gauge(m.scaleAsked, float64(s.Asked), string(r))
			}
		}
	}
	gauge(m.blind, b2f(unseen > 0))
	if d.gw != nil {
		gauge(m.gatewayUp, b2f(gwErr == ""))
	}
	for _, s := range []detector.State{detector.Healthy, detector.Pressure, detector.Drifting, detector.Trapped, detector.Recovering} {
		gauge(m.state, b2f(a.State == s), string(s))
	}
	for _, md := range []remediate.Mode{remediate.Normal, remediate.Incident, remediate.Restoring} {
		gauge(m.mode, b2f(ps.Mode == md), string(md))
	}
	paused, _, _ := d.exec.Paused(d.clock.Now())
	gauge(m.paused, b2f(paused))
	en, _ := d.lend.State()
	gauge(m.lending, b2f(en))
	// A dry run's target is a decision never applied: the gateway keeps its own budget (or counts
	// only), so it is no budget in force, and a series named for one would put a budget that
	// does not exist on the dashboards and into the budget-over-reference rule.
	switch {
	case ps.Target <= 0:
	case d.cfg.DryRun:
		gauge(m.wouldBudget, float64(ps.Target))
	default:
		gauge(m.budget, float64(ps.Target))
	}
	if ps.Reference > 0 {
		gauge(m.reference, float64(ps.Reference))
	}
	if a.ObservedAt.IsZero() {
		return // no complete observation yet: no numbers rather than zeros
	}
	gauge(m.wc, a.WorkingSetOverCache)
	if a.HitEvidence.Enough { // a quiet window has no hit rate: no series rather than a made-up 0
		gauge(m.hit, a.HitRate)
	}
	gauge(m.plateau, a.Plateau)
	gauge(m.knee, a.Knee.Ratio)
	gauge(m.live, a.LiveSessions)
	gauge(m.lambda, a.Lambda)
	if a.PeakCompletionRate > 0 {
		gauge(m.peak, a.PeakCompletionRate)
	}
	if v := a.Equilibria.Stable; v != nil {
		gauge(m.stable, *v)
	}
	if v := a.Equilibria.Unstable; v != nil {
		gauge(m.unstable, *v)
	}
	if v := a.DistanceToEdge; v != nil {
		gauge(m.edge, *v)
	}
	if v := a.TimeToTrap; v != nil {
		gauge(m.ttt, v.Seconds())
	}
	if v := a.SpikeTolerance; v != nil {
		gauge(m.tolRatio, v.Ratio)
		gauge(m.tolSessions, v.Sessions)
	}
}
