package admission

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stateCollector reports the admission core's state and counters at scrape time.
type stateCollector struct {
	core                                                          *Core
	now                                                           func() time.Time
	affinityOn                                                    func() bool
	live, inCall, queued, workingSet, reserved, budget, reference *prometheus.Desc
	affinity, arrivals, completions, admissions, oldestWait       *prometheus.Desc
	countOnly, stale, staled                                      *prometheus.Desc
	held, heldTokens, heldCalls, callsHeld, boundReleases         *prometheus.Desc
	tooLate                                                       *prometheus.Desc
	dormant, dormantTokens, dormantAfter, wentDormant, woken      *prometheus.Desc
}

// NewCollector exports a core's state and counters as the gateway's basin_gateway_* metrics, read
// at scrape time. The gateway serves it; the simulator harness gathers it in virtual time, so
// basin's collector reads the same series from both. affinity reports the sticky-routing switch
// (nil: off).
func NewCollector(core *Core, now func() time.Time, affinity func() bool) prometheus.Collector {
	return newStateCollector(core, now, affinity)
}

func newStateCollector(core *Core, now func() time.Time, affinity func() bool) *stateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &stateCollector{
		core:       core,
		now:        now,
		affinityOn: affinity,
		live: d("basin_gateway_sessions_live",
			"Sessions admitted and not yet ended (including those between calls), but the dormant ones (basin_gateway_sessions_dormant)."),
		inCall:     d("basin_gateway_sessions_in_call", "Live sessions with a model call in flight (the others are running tools or thinking)."),
		queued:     d("basin_gateway_sessions_queued", "Sessions waiting in the admission queue."),
		oldestWait: d("basin_gateway_queue_oldest_wait_seconds", "How long the longest-waiting queued session has waited (0 with an empty queue)."),
		workingSet: d("basin_gateway_working_set_tokens",
			"Working set W: the sum of the current contexts of the live sessions, but the dormant ones (basin_gateway_dormant_tokens)."),
		reserved: d("basin_gateway_reserved_tokens",
			"Sum of the live sessions' demands on the budget (current contexts, or predicted peaks in peak mode), but the dormant ones'."),
		budget:      d("basin_gateway_budget_tokens", "Admission budget B in tokens."),
		reference:   d("basin_gateway_reference_budget_tokens", "Reference budget: admission engages when the working set exceeds it."),
		countOnly:   d("basin_gateway_admission_count_only", "1 while the gateway admits every session and only counts, until a budget is set through the admin API (admission.count_only)."),
		stale:       d("basin_gateway_sessions_queued_stale", "Queued sessions that have waited admission.stale_after: they queue behind the fresh ones, newest first."),
		staled:      d("basin_gateway_sessions_staled_total", "Queued sessions that went stale (waited admission.stale_after)."),
		affinity:    d("basin_gateway_affinity_enabled", "1 when the gateway sets the sticky decode routing key on upstream requests."),
		arrivals:    d("basin_gateway_session_arrivals_total", "New sessions that arrived (admitted, queued or refused)."),
		completions: d("basin_gateway_session_completions_total", "Sessions that ended (explicitly or idle)."),
		admissions:  d("basin_gateway_admissions_total", "Sessions admitted, at once or after queueing.", "result"),
		held:        d("basin_gateway_sessions_held", "Live sessions on the hold list: their next model calls wait at the gateway (they count in basin_gateway_sessions_live)."),
		heldTokens:  d("basin_gateway_held_tokens", "Contexts of the held sessions (part of basin_gateway_working_set_tokens; the cache need not carry them)."),
		heldCalls:   d("basin_gateway_held_calls", "Calls of held sessions waiting at the gateway now."),
		callsHeld:   d("basin_gateway_calls_held_total", "Calls of held sessions that waited at the gateway."),
		boundReleases: d("basin_gateway_hold_bound_releases_total",
			"Held calls that went on because they had waited the hold bound (their sessions stay held)."),
		tooLate: d("basin_gateway_sessions_too_late_total",
			"Sessions refused because their first call could not start within admission.start_deadline (at arrival or in the queue)."),
		dormant: d("basin_gateway_sessions_dormant",
			"Live sessions idle long past the workload's tool time (basin_gateway_dormant_after_seconds): out of the working set, "+
				"the reserved tokens and basin_gateway_sessions_live until they call again."),
		dormantTokens: d("basin_gateway_dormant_tokens", "Contexts of the dormant sessions (not in basin_gateway_working_set_tokens)."),
		dormantAfter: d("basin_gateway_dormant_after_seconds",
			"Idleness that makes a live session dormant now: twice the 99th percentile of the tool gaps seen, within the dormant "+
				"floor and the idle timeout (the idle timeout until enough gaps are seen)."),
		wentDormant: d("basin_gateway_sessions_dormant_total", "Live sessions that went dormant."),
		woken:       d("basin_gateway_sessions_woken_total", "Dormant sessions that called again (active again, never refused)."),
	}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.live, c.inCall, c.queued, c.workingSet, c.reserved, c.budget, c.reference,
		c.affinity, c.arrivals, c.completions, c.admissions, c.oldestWait, c.countOnly, c.stale, c.staled,
		c.held, c.heldTokens, c.heldCalls, c.callsHeld, c.boundReleases, c.tooLate,
		c.dormant, c.dormantTokens, c.dormantAfter, c.wentDormant, c.woken} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.core.Snapshot(c.now(), false)
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.live, float64(s.Live))
	gauge(c.inCall, float64(s.InCall))
	gauge(c.queued, float64(s.Queued))
	gauge(c.oldestWait, s.OldestWaitSeconds)
	gauge(c.workingSet, float64(s.WorkingSet))
	gauge(c.reserved, float64(s.Reserved))
	gauge(c.budget, float64(s.Budget))
	gauge(c.reference, float64(s.ReferenceBudget))
	countOnly := 0.0
	if s.CountOnly {
		countOnly = 1
	}
	gauge(c.countOnly, countOnly)
	gauge(c.stale, float64(s.Stale))
	counter(c.staled, s.Counters.Staled)
	gauge(c.held, float64(s.Held))
	gauge(c.heldTokens, float64(s.HeldTokens))
	gauge(c.heldCalls, float64(s.HeldCalls))
	counter(c.callsHeld, s.Counters.CallsHeld)
	counter(c.boundReleases, s.Counters.HoldBoundReleases)
	counter(c.tooLate, s.Counters.TooLate)
	gauge(c.dormant, float64(s.Dormant))
	gauge(c.dormantTokens, float64(s.DormantTokens))
	gauge(c.dormantAfter, s.DormantAfterSeconds)
	counter(c.wentDormant, s.Counters.Dormant)
	counter(c.woken, s.Counters.Woken)
	aff := 0.0
	if c.affinityOn != nil && c.affinityOn() {
		aff = 1
	}
	gauge(c.affinity, aff)
	counter(c.arrivals, s.Counters.Arrivals)
	counter(c.completions, s.Counters.Ended)
	counter(c.admissions, s.Counters.AdmittedAtOnce, "immediate")
	counter(c.admissions, s.Counters.AdmittedFromQueue, "queued")
}
