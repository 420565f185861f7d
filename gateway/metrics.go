package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/gateway/admission"
)

// metrics are the gateway's own instruments; the gauges and the admission counters are read from
// the admission core at scrape time by stateCollector.
type metrics struct {
	refusals      *prometheus.CounterVec
	queueWait     prometheus.Histogram
	heldWait      *prometheus.HistogramVec
	firstCallWait prometheus.Histogram
	peak          prometheus.Histogram
	authFailures  prometheus.Counter
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
		heldWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "basin_gateway_held_call_wait_seconds",
			Help: "How long calls of held sessions waited at the gateway, by how the wait ended: resumed, hold_bound, " +
				"ended (the session ended), client_gone or shutting_down.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 15), // 50 ms … 13.7 min
		}, []string{"reason"}),
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
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "basin_gateway_admin_auth_failures_total",
			Help: "Admin API requests refused 401 for a missing or wrong bearer token.",
		}),
	}
	for _, c := range []prometheus.Collector{m.refusals, m.queueWait, m.heldWait, m.firstCallWait, m.peak, m.authFailures,
		leaderOnly{Collector: admission.NewCollector(g.core.Core, g.now, g.affinity.Load), g: g}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// The refusal series exist from the start, so that a rate over them is 0 rather than absent.
	for _, l := range [][2]string{{"503", reasonQueueTimeout}, {"503", reasonTooLate}, {"429", reasonTenantQuota}, {"529", reasonShed},
		{"503", reasonShuttingDown}} {
		m.refusals.WithLabelValues(l[0], l[1])
	}
	// Likewise the held-call waits' usual endings.
	for _, r := range []string{admission.ResumeReasonResumed, admission.ResumeReasonBound} {
		m.heldWait.WithLabelValues(r)
	}
	return m, nil
}

// leaderOnly exports the admission core's gauges and counters on a gateway alone and on the
// admission leader only: a follower's core mirrors the sessions it serves, and the recording
// rules that sum basin_gateway_* by deployment would count them twice.
type leaderOnly struct {
	prometheus.Collector
	g *Gateway
}

// Collect implements prometheus.Collector.
func (l leaderOnly) Collect(ch chan<- prometheus.Metric) {
	if !l.g.repl.Leads() {
		return
	}
	l.Collector.Collect(ch)
}
