package alerts

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of basin_webhook_requests_total.
const (
	resultOK               = "ok"
	resultUnauthorized     = "unauthorized"
	resultMethodNotAllowed = "method_not_allowed"
	resultBadRequest       = "bad_request"
	resultTooLarge         = "too_large" // answered 400 like any bad body, counted apart to show MaxBody is hit
)

// Reasons of basin_webhook_alerts_ignored_total.
const (
	reasonNotMatching = "not_matching"
	reasonStale       = "stale"
	reasonDuplicate   = "duplicate"
)

type metrics struct {
	requests *prometheus.CounterVec
	alerts   *prometheus.CounterVec
	ignored  *prometheus.CounterVec
	expired  prometheus.Counter
	incident prometheus.Gauge
	active   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_webhook_requests_total",
			Help: "Alertmanager webhook requests, by result: ok, unauthorized, method_not_allowed, bad_request, too_large.",
		}, []string{"result"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_webhook_alerts_total",
			Help: "Alerts in accepted webhook payloads, matching or not, by the status they were sent with: firing, resolved.",
		}, []string{"status"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_webhook_alerts_ignored_total",
			Help: "Alerts in accepted webhook payloads that changed nothing, by reason: not_matching (no matcher selects it), stale (overtaken by a newer notification), duplicate (a resolve already known).",
		}, []string{"reason"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "basin_webhook_alerts_expired_total",
			Help: "Active alerts dropped because neither a repeat nor a resolve came in time; more than a few means the Alertmanager route repeats too rarely for MaxAge.",
		}),
		incident: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "basin_webhook_incident_active",
			Help: "1 while a configured alert fires and the daemon is in incident mode, else 0.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "basin_webhook_active_alerts",
			Help: "Matching alerts currently active.",
		}),
	}
	// Every series exists from the start, so rate() and absent() see zeros, not gaps.
	for _, r := range []string{resultOK, resultUnauthorized, resultMethodNotAllowed, resultBadRequest, resultTooLarge} {
		m.requests.WithLabelValues(r)
	}
	for _, s := range []string{statusFiring, statusResolved} {
		m.alerts.WithLabelValues(s)
	}
	for _, r := range []string{reasonNotMatching, reasonStale, reasonDuplicate} {
		m.ignored.WithLabelValues(r)
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.alerts, m.ignored, m.expired, m.incident, m.active} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return m, nil
}
