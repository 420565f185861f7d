package collector

import (
	"bytes"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"
)

// t0 is an arbitrary wall-clock start for Ingest-driven tests.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// fixture parses testdata/<name>.prom with the collector's parser, every family kept.
func fixture(t testing.TB, name string) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := parseBytes(fixtureBytes(t, name))
	require.NoError(t, err, name)
	return fams
}

func fixtureBytes(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".prom"))
	require.NoError(t, err)
	return b
}

// clock is a settable clock for Options.Now.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// newTest builds a collector with a private registry and a clock at t0 (or o.Now if set).
func newTest(t testing.TB, o Options) (*Collector, *prometheus.Registry, *clock) {
	t.Helper()
	reg := prometheus.NewRegistry()
	clk := &clock{now: t0}
	if o.Now == nil {
		o.Now = clk.Now
	}
	o.Registerer = reg
	c, err := New(o)
	require.NoError(t, err)
	return c, reg, clk
}

func ptr[T any](v T) *T { return &v }

// matches reports whether a series has all the given labels.
func matches(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		if labelValue(m, k) != v {
			return false
		}
	}
	return true
}

// bump adds delta to every counter/gauge/untyped series of name matching the labels, in place;
// it fails the test if nothing matched.
func bump(t testing.TB, fams map[string]*dto.MetricFamily, name string, match map[string]string, delta float64) {
	t.Helper()
	n := 0
	for _, m := range fams[name].GetMetric() {
		if !matches(m, match) {
			continue
		}
		n++
		switch {
		case m.Counter != nil:
			m.Counter.Value = ptr(m.Counter.GetValue() + delta)
		case m.Gauge != nil:
			m.Gauge.Value = ptr(m.Gauge.GetValue() + delta)
		case m.Untyped != nil:
			m.Untyped.Value = ptr(m.Untyped.GetValue() + delta)
		}
	}
	require.NotZero(t, n, "bump %s%v: no series", name, match)
}

// setValue sets every matching series of name to v, in place.
func setValue(t testing.TB, fams map[string]*dto.MetricFamily, name string, match map[string]string, v float64) {
	t.Helper()
	n := 0
	for _, m := range fams[name].GetMetric() {
		if !matches(m, match) {
			continue
		}
		n++
		switch {
		case m.Counter != nil:
			m.Counter.Value = ptr(v)
		case m.Gauge != nil:
			m.Gauge.Value = ptr(v)
		case m.Untyped != nil:
			m.Untyped.Value = ptr(v)
		}
	}
	require.NotZero(t, n, "set %s%v: no series", name, match)
}

// observe records n observations of value v in every matching series of histogram name.
func observe(t testing.TB, fams map[string]*dto.MetricFamily, name string, match map[string]string, v, n float64) {
	t.Helper()
	k := 0
	for _, m := range fams[name].GetMetric() {
		h := m.GetHistogram()
		if h == nil || !matches(m, match) {
			continue
		}
		k++
		for _, b := range h.Bucket {
			if v <= b.GetUpperBound() {
				if b.CumulativeCountFloat != nil {
					b.CumulativeCountFloat = ptr(b.GetCumulativeCountFloat() + n)
				} else {
					b.CumulativeCount = ptr(b.GetCumulativeCount() + uint64(n))
				}
			}
		}
		if h.SampleCountFloat != nil {
			h.SampleCountFloat = ptr(h.GetSampleCountFloat() + n)
		} else {
			h.SampleCount = ptr(h.GetSampleCount() + uint64(n))
		}
		h.SampleSum = ptr(h.GetSampleSum() + v*n)
	}
	require.NotZero(t, k, "observe %s%v: no series", name, match)
}

// text encodes families in the text format, as an engine would serve them.
func text(t testing.TB, fams map[string]*dto.MetricFamily) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, n := range slices.Sorted(maps.Keys(fams)) {
		_, err := expfmt.MetricFamilyToText(&b, fams[n])
		require.NoError(t, err)
	}
	return b.Bytes()
}

// gather returns the registry's families keyed by name.
func gather(t testing.TB, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// metricValue returns the value of the series of name with exactly the given labels, and
// whether it exists.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, m := range fams[name].GetMetric() {
		if len(m.GetLabel()) != len(labels) || !matches(m, labels) {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// replaceLine rewrites the first line of body starting with prefix.
func replaceLine(t testing.TB, body []byte, prefix, line string) []byte {
	t.Helper()
	lines := strings.Split(string(body), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, prefix) {
			lines[i] = line
			return []byte(strings.Join(lines, "\n"))
		}
	}
	t.Fatalf("no line starting with %q", prefix)
	return nil
}

// slogTo logs everything, debug included, to w.
func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
