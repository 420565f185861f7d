package collector

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of basin_scrape_errors_total.
const (
	reasonRequest     = "request"      // the request failed (connection refused, DNS, TLS, …)
	reasonTimeout     = "timeout"      // the scrape took longer than Timeout
	reasonStatus      = "status"       // not 200 OK
	reasonContentType = "content_type" // not the text format
	reasonTooLarge    = "body_too_large"
	reasonRead        = "read"    // the body broke off (connection reset, short body)
	reasonParse       = "parse"   // not valid text exposition format
	reasonDialect     = "dialect" // no metric of a known dialect, or one that does not fit the role
	reasonOutOfOrder  = "out_of_order"
	reasonSpeed       = "sim_speed" // basin_sim_speed invalid, or not the speed of the collector's clock
)

// metrics are the collector's own instruments.
type metrics struct {
	scrapeDuration *prometheus.HistogramVec
	scrapeErrors   *prometheus.CounterVec
	scrapeSamples  *prometheus.GaugeVec
	lastSuccess    *prometheus.GaugeVec
	duplicates     *prometheus.CounterVec
	targets        *prometheus.GaugeVec
	fileErrors     prometheus.Counter
	familyFlat     *prometheus.GaugeVec
}

func newMetrics(c *Collector, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		scrapeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "basin_scrape_duration_seconds",
			Help:    "Duration of scrapes of a target's /metrics, body and parsing included, failed ones too.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 11), // 5 ms … 5.1 s
		}, []string{"target"}),
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_scrape_errors_total",
			Help: "Failed scrapes (or ingests) of a target, by reason: request, timeout, status, content_type, body_too_large, read, parse, dialect, out_of_order, sim_speed.",
		}, []string{"target", "reason"}),
		scrapeSamples: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "basin_scrape_samples",
			Help: "Samples in the target's last successful scrape (a histogram counts its buckets, _sum and _count).",
		}, []string{"target"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "basin_scrape_last_success_timestamp_seconds",
			Help: "Unix time of the target's last successful scrape.",
		}, []string{"target"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "basin_scrape_duplicate_series_total",
			Help: "Series the collector reads that appeared more than once in one scrape; the first occurrence is used.",
		}, []string{"target"}),
		targets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "basin_targets",
			Help: "Targets by role and dialect (the detected dialect once an auto target has answered).",
		}, []string{"role", "dialect"}),
		familyFlat: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "basin_counter_family_flat",
			Help: "1 while the target's preferred prompt-token counter family (family) stands still over the window while another of the same meaning (used) advances; the collector reads the one that advances.",
		}, []string{"target", "family", "used"}),
		fileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "basin_target_file_errors_total",
			Help: "Reloads of the target file that failed; the previous target list was kept.",
		}),
	}
	var errs []error
	for _, col := range []prometheus.Collector{m.scrapeDuration, m.scrapeErrors, m.scrapeSamples, m.lastSuccess,
		m.duplicates, m.targets, m.fileErrors, m.familyFlat, &signalCollector{c: c}} {
		if err := reg.Register(col); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return m, nil
}

// forget drops a removed target's series.
func (m *metrics) forget(name string) {
	l := prometheus.Labels{"target": name}
	m.scrapeDuration.DeletePartialMatch(l)
	m.scrapeErrors.DeletePartialMatch(l)
	m.scrapeSamples.DeletePartialMatch(l)
	m.lastSuccess.DeletePartialMatch(l)
	m.duplicates.DeletePartialMatch(l)
	m.familyFlat.DeletePartialMatch(l)
}

var (
	descSignalUp = prometheus.NewDesc("basin_signal_up",
		"1 when the signal is ok (fresh), 0 when stale or missing.", []string{"signal"}, nil)
	descSignalState = prometheus.NewDesc("basin_signal_state",
		"The signal's state, one-hot over ok, stale and missing.", []string{"signal", "state"}, nil)
	descSignalValue = prometheus.NewDesc("basin_signal_value",
		"The signal's value; present only while the signal is ok.", []string{"signal"}, nil)
)

// signalCollector exports a Snapshot taken at scrape time.
type signalCollector struct{ c *Collector }

// Describe implements prometheus.Collector.
func (s *signalCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSignalUp
	ch <- descSignalState
	ch <- descSignalValue
}

// Collect implements prometheus.Collector.
func (s *signalCollector) Collect(ch chan<- prometheus.Metric) {
	snap := s.c.Snapshot()
	for _, sig := range AllSignals() {
		v := snap.Signals[sig]
		up := 0.0
		if v.State == OK {
			up = 1
			ch <- prometheus.MustNewConstMetric(descSignalValue, prometheus.GaugeValue, v.V, string(sig))
		}
		ch <- prometheus.MustNewConstMetric(descSignalUp, prometheus.GaugeValue, up, string(sig))
		for _, st := range [...]State{OK, Stale, Missing} {
			x := 0.0
			if v.State == st {
				x = 1
			}
			ch <- prometheus.MustNewConstMetric(descSignalState, prometheus.GaugeValue, x, string(sig), st.String())
		}
	}
}
