package sessionstore

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The op label of the store's series.
const (
	opLoad      = "load"
	opSave      = "save"
	opCommit    = "commit" // the group-committed writes of Admit and End
	opLeader    = "leader"
	opHeartbeat = "heartbeat"
	opReplicas  = "replicas"
)

// metrics are the store's basin_gateway_store_* series.
type metrics struct {
	writes   *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	sessions prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_gateway_store_writes_total",
			Help: "Calls that wrote to the session store (one script call each; a group commit is one), by operation (save, commit, leader, heartbeat).",
		}, []string{"op"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "basin_gateway_store_write_seconds",
			Help:    "Latency of one write call to the session store, by operation (save, commit, leader, heartbeat).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 100 µs … 3.3 s
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_gateway_store_errors_total",
			Help: "Calls to the session store that failed, by operation; fenced writes are not errors here (basin_lease_fenced_writes_total counts them).",
		}, []string{"op"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "basin_gateway_store_sessions",
			Help: "Live sessions in the table as of the last successful Save or Load.",
		}),
	}
	for _, c := range []prometheus.Collector{m.writes, m.seconds, m.errors, m.sessions} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	// The series exist from the start, so that a rate over them is 0 rather than absent.
	for _, op := range []string{opSave, opCommit, opLeader, opHeartbeat} {
		m.writes.WithLabelValues(op)
		m.seconds.WithLabelValues(op)
	}
	for _, op := range []string{opLoad, opSave, opCommit, opLeader, opHeartbeat, opReplicas} {
		m.errors.WithLabelValues(op)
	}
	return m, nil
}
