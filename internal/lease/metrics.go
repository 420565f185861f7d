package lease

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the campaign's basin_lease_* series, labelled with the lease's prefix so that
// several campaigns can share a registry.
type metrics struct {
	leader  prometheus.Gauge
	epoch   prometheus.Gauge
	changes *prometheus.CounterVec
	errors  *prometheus.CounterVec
	fenced  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, prefix string) (*metrics, error) {
	labels := prometheus.Labels{"lease": prefix}
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "basin_lease_leader", ConstLabels: labels,
			Help: "1 while this process leads the lease, 0 otherwise.",
		}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "basin_lease_epoch", ConstLabels: labels,
			Help: "The term this process last won or lost.",
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_lease_changes_total", ConstLabels: labels,
			Help: "Changes of leadership of this process, by the side it changed to (leader, follower).",
		}, []string{"to"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_lease_store_errors_total", ConstLabels: labels,
			Help: "Calls to the store that failed (not refusals), by operation (acquire, renew, release, write).",
		}, []string{"op"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "basin_lease_fenced_writes_total", ConstLabels: labels,
			Help: "Writes refused because the lease's epoch had moved past the writer's.",
		}),
	}
	for _, c := range []prometheus.Collector{m.leader, m.epoch, m.changes, m.errors, m.fenced} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	m.changes.WithLabelValues("leader")
	m.changes.WithLabelValues("follower")
	for _, op := range []string{"acquire", "renew", "release", "write"} {
		m.errors.WithLabelValues(op)
	}
	return m, nil
}

func (m *metrics) changed(ch Change) {
	m.epoch.Set(float64(ch.Epoch))
	if ch.Leader {
		m.leader.Set(1)
		m.changes.WithLabelValues("leader").Inc()
		return
	}
	m.leader.Set(0)
	m.changes.WithLabelValues("follower").Inc()
}
