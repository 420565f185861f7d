package notify

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of basin_slack_messages_total.
const (
	resultSent         = "sent"
	resultFailed       = "failed"       // Slack or the network refused it, after any retries
	resultDropped      = "dropped"      // the queue was full, or Run stopped with it queued
	resultDeduplicated = "deduplicated" // it repeated its stream's latest message
	resultRateLimited  = "rate_limited" // Slack answered 429 to the last attempt
)

// kindSummary labels PostSummary's messages.
const kindSummary = "summary"

type metrics struct {
	messages *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, queueLen func() float64) (*metrics, error) {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_slack_messages_total",
			Help: "Slack messages by kind (transition, action, summary) and result (sent, failed, dropped, deduplicated, rate_limited).",
		}, []string{"kind", "result"}),
	}
	queue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "basin_slack_queue_length",
		Help: "Slack messages waiting to be sent.",
	}, queueLen)
	// Every series exists from the start, so rate(...{result="failed"}[5m]) > 0 can alert before
	// the first failure rather than only after the series appears.
	for _, k := range []string{string(KindTransition), string(KindAction), kindSummary} {
		for _, r := range []string{resultSent, resultFailed, resultDropped, resultDeduplicated, resultRateLimited} {
			m.messages.WithLabelValues(k, r)
		}
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.messages, queue} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return m, nil
}

func (m *metrics) count(kind, result string) {
	m.messages.WithLabelValues(kind, result).Inc()
}
