package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's own instruments; the gauges and the admission counters are read from
// the admission core at scrape time by stateCollector.
type metrics struct {
	refusals      *prometheus.CounterVec
	queueWait     prometheus.Histogram
	firstCallWait prometheus.Histogram
	peak          prometheus.Histogram
}

func newMetrics(g *Gateway, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_gateway_refusals_total",
			Help: "Calls the gateway answered itself instead of proxying, by HTTP status code and reason (x-basin-reason).",
		}, []string{"code", "reason"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "basin_gateway_queue_wait_seconds",
			Help:    "How long sessions admitted from the queue waited, from their (original) arrival to admission.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 15), // 50 ms … 13.7 min
		}),
		firstCallWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "basin_gateway_first_call_wait_seconds",
			Help:    "From a session's first call reaching the gateway to the first response byte from the upstream (queueing included).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 15),
		}),
		peak: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "basin_gateway_session_peak_tokens",
			Help:    "Largest context of each session, observed when it ends.",
			Buckets: prometheus.ExponentialBuckets(1024, 2, 12), // 1Ki … 2Mi tokens
		}),
	}
	for _, c := range []prometheus.Collector{m.refusals, m.queueWait, m.firstCallWait, m.peak, newStateCollector(g)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// The refusal series exist from the start, so that a rate over them is 0 rather than absent.
	for _, l := range [][2]string{{"503", reasonQueueTimeout}, {"429", reasonTenantQuota}, {"529", reasonShed},
		{"503", reasonShuttingDown}} {
		m.refusals.WithLabelValues(l[0], l[1])
	}
	return m, nil
}

// stateCollector reports the admission core's state and counters at scrape time.
type stateCollector struct {
	g                                                     *Gateway
	live, queued, workingSet, reserved, budget, reference *prometheus.Desc
	affinity, arrivals, completions, admissions           *prometheus.Desc
}

func newStateCollector(g *Gateway) *stateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &stateCollector{
		g:           g,
		live:        d("basin_gateway_sessions_live", "Sessions admitted and not yet ended (including those between calls)."),
		queued:      d("basin_gateway_sessions_queued", "Sessions waiting in the admission queue."),
		workingSet:  d("basin_gateway_working_set_tokens", "Working set W: the sum of the current contexts of the live sessions."),
		reserved:    d("basin_gateway_reserved_tokens", "Sum of the live sessions' demands on the budget (current contexts, or predicted peaks in peak mode)."),
		budget:      d("basin_gateway_budget_tokens", "Admission budget B in tokens."),
		reference:   d("basin_gateway_reference_budget_tokens", "Reference budget: admission engages when the working set exceeds it."),
		affinity:    d("basin_gateway_affinity_enabled", "1 when the gateway sets the sticky decode routing key on upstream requests."),
		arrivals:    d("basin_gateway_session_arrivals_total", "New sessions that arrived (admitted, queued or refused)."),
		completions: d("basin_gateway_session_completions_total", "Sessions that ended (explicitly or idle)."),
		admissions:  d("basin_gateway_admissions_total", "Sessions admitted, at once or after queueing.", "result"),
	}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.live, c.queued, c.workingSet, c.reserved, c.budget, c.reference,
		c.affinity, c.arrivals, c.completions, c.admissions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.g.core.Snapshot(c.g.now(), false)
	queued := c.g.core.QueueLen()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.live, float64(s.Live))
	gauge(c.queued, float64(queued))
	gauge(c.workingSet, float64(s.WorkingSet))
	gauge(c.reserved, float64(s.Reserved))
	gauge(c.budget, float64(s.Budget))
	gauge(c.reference, float64(s.ReferenceBudget))
	aff := 0.0
	if c.g.affinity.Load() {
		aff = 1
	}
	gauge(c.affinity, aff)
	counter(c.arrivals, s.Counters.Arrivals)
	counter(c.completions, s.Counters.Ended)
	counter(c.admissions, s.Counters.AdmittedAtOnce, "immediate")
	counter(c.admissions, s.Counters.AdmittedFromQueue, "queued")
}
