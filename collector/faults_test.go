package collector_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
)

// The fault tests drive the collector only through its public API: collector.New with targets
// on loopback httptest servers, one Run per scrape round, a fake clock (Options.Now) that
// advances one Interval (5 s) per round, so staleness is exact while timeouts stay real.

var faultT0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const faultInterval = 5 * time.Second

// faultClock is Options.Now; it moves only between rounds but is read concurrently.
type faultClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *faultClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *faultClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Per-round counter increments of the healthy bodies: hit rate 0.95, 10 calls/s, 1 session/s.
const (
	inputPerRound = 5_000
	hitPerRound   = 95_000
	callsPerRound = 50
	sessPerRound  = 5
)

// prefillBody is an SGLang PD prefill instance at round k (counters from base); the hit counter
// is the last line, without a label set after it, so truncations can cut it.
func prefillBody(input, hit float64) string {
	return fmt.Sprintf(`# HELP sglang:max_total_num_tokens Maximum total tokens.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{tp_rank="0"} 650000
# TYPE sglang:kv_used_tokens gauge
sglang:kv_used_tokens{tp_rank="0"} 78000
# TYPE sglang:kv_evictable_tokens gauge
sglang:kv_evictable_tokens{tp_rank="0"} 490000
# TYPE sglang:token_usage gauge
sglang:token_usage{tp_rank="0"} 0.12
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{tp_rank="0"} 7
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{tp_rank="0"} 0
# TYPE sglang:prefill_effective_tokens_total counter
sglang:prefill_effective_tokens_total{mode="input",tp_rank="0"} %.0f
sglang:prefill_effective_tokens_total{mode="device_hit",tp_rank="0"} %.0f
`, input, hit)
}

func decodeBody(calls float64) string {
	return fmt.Sprintf(`# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{tp_rank="0"} 400000
# TYPE sglang:kv_available_tokens gauge
sglang:kv_available_tokens{tp_rank="0"} 372000
# TYPE sglang:kv_used_tokens gauge
sglang:kv_used_tokens{tp_rank="0"} 28000
# TYPE sglang:token_usage gauge
sglang:token_usage{tp_rank="0"} 0.07
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{tp_rank="0"} 1
# TYPE sglang:num_requests_total counter
sglang:num_requests_total %.0f
`, calls)
}

func gatewayBody(arrivals, completions float64) string {
	return fmt.Sprintf(`# TYPE basin_gateway_working_set_tokens gauge
basin_gateway_working_set_tokens 300000
# TYPE basin_gateway_sessions_live gauge
basin_gateway_sessions_live 38
# TYPE basin_gateway_sessions_in_call gauge
basin_gateway_sessions_in_call 10
# TYPE basin_gateway_sessions_queued gauge
basin_gateway_sessions_queued 0
# TYPE basin_gateway_budget_tokens gauge
basin_gateway_budget_tokens 1.8e+06
# TYPE basin_gateway_reserved_tokens gauge
basin_gateway_reserved_tokens 300000
# TYPE basin_gateway_session_arrivals_total counter
basin_gateway_session_arrivals_total %.0f
# TYPE basin_gateway_session_completions_total counter
basin_gateway_session_completions_total %.0f
`, arrivals, completions)
}

// healthy bodies at round k.
func prefillAt(k int) string {
	return prefillBody(1e6+float64(k*inputPerRound), 2e7+float64(k*hitPerRound))
}
func decodeAt(k int) string { return decodeBody(5000 + float64(k*callsPerRound)) }
func gatewayAt(k int) string {
	return gatewayBody(140+float64(k*sessPerRound), 96+float64(k*sessPerRound))
}

// endpoint is one target's loopback /metrics. A fault handler, when set, answers instead of
// the healthy body; down closes the listener (connection refused) and up reopens it on the same
// address.
type endpoint struct {
	t      *testing.T
	addr   string
	mu     sync.Mutex
	k      int
	render func(k int) string
	fault  func(w http.ResponseWriter, r *http.Request, body string)
	hits   int
	srv    *httptest.Server
}

func newEndpoint(t *testing.T, render func(int) string) *endpoint {
	e := &endpoint{t: t, render: render}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	e.addr = e.srv.Listener.Addr().String()
	t.Cleanup(func() { e.stop() })
	return e
}

func (e *endpoint) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.hits++
	body, fault := e.render(e.k), e.fault
	e.mu.Unlock()
	if fault != nil {
		fault(w, r, body)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(body))
}

func (e *endpoint) url() string { return "http://" + e.addr + "/metrics" }

func (e *endpoint) setFault(f func(w http.ResponseWriter, r *http.Request, body string)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fault = f
}

func (e *endpoint) setRender(f func(int) string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.render = f
}

func (e *endpoint) scrapes() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits
}

func (e *endpoint) stop() {
	e.mu.Lock()
	s := e.srv
	e.mu.Unlock()
	s.Close() // idempotent
}

func (e *endpoint) down() { e.stop() }

func (e *endpoint) up() {
	ln, err := net.Listen("tcp", e.addr)
	require.NoError(e.t, err, "reopen %s", e.addr)
	s := httptest.NewUnstartedServer(http.HandlerFunc(e.serve))
	_ = s.Listener.Close()
	s.Listener = ln
	s.Start()
	e.mu.Lock()
	e.srv = s
	e.mu.Unlock()
}

// rig is a collector over a prefill, a decode and a gateway endpoint, and a detector stepped on
// every round's snapshot.
type rig struct {
	t                        *testing.T
	c                        *collector.Collector
	reg                      *prometheus.Registry
	clk                      *faultClock
	prefill, decode, gateway *endpoint
	det                      *detector.Detector
	k                        int // the next round
	snaps                    []collector.Snapshot
	assessments              []detector.Assessment
}

// newRig builds the rig. With file set, prefill-0 comes from a file_sd target file (rig.file).
func newRig(t *testing.T, o collector.Options, file string) *rig {
	t.Helper()
	r := &rig{t: t, reg: prometheus.NewRegistry(), clk: &faultClock{now: faultT0}}
	r.prefill = newEndpoint(t, prefillAt)
	r.decode = newEndpoint(t, decodeAt)
	r.gateway = newEndpoint(t, gatewayAt)
	o.Targets = []collector.Target{
		{Name: "decode-0", URL: r.decode.url(), Role: collector.RoleDecode},
		{Name: "gateway", URL: r.gateway.url(), Role: collector.RoleGateway},
	}
	if file == "" {
		o.Targets = append(o.Targets, collector.Target{Name: "prefill-0", URL: r.prefill.url(), Role: collector.RolePrefill})
	} else {
		o.TargetFile = file
	}
	o.Interval = faultInterval
	o.Now = r.clk.Now
	o.Registerer = r.reg
	if o.Timeout == 0 {
		o.Timeout = 4 * time.Second // headroom for 10 MiB reads under -race
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 10 << 20
	}
	c, err := collector.New(o)
	require.NoError(t, err)
	require.NoError(t, c.Declare("detector", detector.Needs()...))
	r.c = c
	r.det, err = detector.New(detector.Options{})
	require.NoError(t, err)
	return r
}

// at is the fake time of round k.
func at(k int) time.Time { return faultT0.Add(time.Duration(k) * faultInterval) }

// progress is what shows that a target's scrape of this round is over: its error count over all
// reasons, and its last success time.
func (r *rig) progress(name string) (float64, float64) {
	fams, err := r.reg.Gather()
	require.NoError(r.t, err)
	var errs, last float64
	for _, mf := range fams {
		for _, m := range mf.GetMetric() {
			if label(m.GetLabel(), "target") != name {
				continue
			}
			switch mf.GetName() {
			case "basin_scrape_errors_total":
				errs += m.GetCounter().GetValue()
			case "basin_scrape_last_success_timestamp_seconds":
				last = m.GetGauge().GetValue()
			}
		}
	}
	return errs, last
}

// round runs one scrape round at the next fake instant: Run is started, stopped once every
// expected target's scrape is recorded (as a success or as a counted error), and the detector
// steps on the snapshot. expect defaults to the current targets.
func (r *rig) round(expect ...string) (collector.Snapshot, detector.Assessment) {
	t := r.t
	t.Helper()
	k := r.k
	r.k++
	r.clk.set(at(k))
	for _, e := range []*endpoint{r.prefill, r.decode, r.gateway} {
		e.mu.Lock()
		e.k = k
		e.mu.Unlock()
	}
	if expect == nil {
		for _, tg := range r.c.Targets() {
			expect = append(expect, tg.Name)
		}
	}
	type mark struct{ errs, last float64 }
	before := map[string]mark{}
	for _, n := range expect {
		e, l := r.progress(n)
		before[n] = mark{e, l}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.c.Run(ctx) }()
	ok := assert.Eventually(t, func() bool {
		for _, n := range expect {
			e, l := r.progress(n)
			if e == before[n].errs && l == before[n].last {
				return false
			}
		}
		return true
	}, 8*time.Second, time.Millisecond, "round %d: every target scraped", k)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(8 * time.Second):
		t.Fatal("Run did not return")
	}
	require.True(t, ok)
	snap := r.c.Snapshot()
	require.Equal(t, at(k), snap.At)
	a := r.det.Step(snap)
	r.snaps = append(r.snaps, snap)
	r.assessments = append(r.assessments, a)
	return snap, a
}

func label(ls []*dto.LabelPair, name string) string {
	for _, l := range ls {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// metric returns the value of the series of name with exactly these labels.
func (r *rig) metric(name string, labels map[string]string) (float64, bool) {
	fams, err := r.reg.Gather()
	require.NoError(r.t, err)
	for _, mf := range fams {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for k, v := range labels {
				if label(m.GetLabel(), k) != v {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

func (r *rig) errors(target, reason string) float64 {
	v, _ := r.metric("basin_scrape_errors_total", map[string]string{"target": target, "reason": reason})
	return v
}

func (r *rig) allErrors(target string) float64 {
	e, _ := r.progress(target)
	return e
}

func (r *rig) up(sig collector.Signal) float64 {
	v, found := r.metric("basin_signal_up", map[string]string{"signal": string(sig)})
	require.True(r.t, found, "basin_signal_up{%s}", sig)
	return v
}

// Signals fed by the prefill target only (with these bodies), and by the other targets only.
var (
	prefillSignals = []collector.Signal{collector.HitRate, collector.PromptTokenRate, collector.CacheCapacity}
	otherSignals   = []collector.Signal{
		collector.WorkingSet, collector.LiveSessions, collector.ArrivalRate, collector.CompletionRate,
		collector.CallRate, collector.DecodeFree, collector.DecodeCapacity,
	}
	healthyValues = map[collector.Signal]float64{
		collector.HitRate: 0.95, collector.PromptTokenRate: 20_000, collector.CacheCapacity: 650_000, collector.WorkingSet: 300_000,
		collector.LiveSessions: 38, collector.ArrivalRate: 1, collector.CompletionRate: 1, collector.CallRate: 10,
		collector.DecodeFree: 372_000, collector.DecodeCapacity: 400_000,
	}
)

// assertSane: no signal in a snapshot is OK with a NaN, an infinity, or (for rates and the hit
// rate) an impossible value.
func assertSane(t *testing.T, snap collector.Snapshot, round int) {
	t.Helper()
	for sig, v := range snap.Signals {
		if v.State != collector.OK {
			continue
		}
		assert.False(t, math.IsNaN(v.V) || math.IsInf(v.V, 0), "round %d: %s OK with %v", round, sig, v.V)
		assert.GreaterOrEqual(t, v.V, 0.0, "round %d: %s negative", round, sig)
		if sig == collector.HitRate {
			assert.LessOrEqual(t, v.V, 1.0, "round %d: hit rate", round)
		}
	}
}

func serveAs(contentType string) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, _ *http.Request, body string) {
		w.Header().Set("Content-Type", contentType)
		_, _ = w.Write([]byte(body))
	}
}

// serveText answers with a body derived from the healthy one.
func serveText(change func(body string) string) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, _ *http.Request, body string) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(change(body)))
	}
}

// filler is n bytes of comment lines (an unread family's HELP), as a huge body is made of.
func filler(n int) string {
	line := "# HELP sglang:some_unread_histogram_bucket padding padding padding padding padding\n"
	return strings.Repeat(line, n/len(line)+1)
}

const hugeBytes = 12 << 20 // > 10 MB and > MaxBodyBytes (10 MiB)

// cutLast drops the last n bytes of the body (its trailing newline included).
func cutLast(n int) func(string) string {
	return func(b string) string { return b[:len(b)-n] }
}

// TestFaultEngineEndpoint: the prefill engine's /metrics misbehaves from round 2 to 5 (fake 10 s
// to 25 s), after two good rounds, then recovers for rounds 6 and 7. A failed scrape is counted
// once per round under its reason; the prefill signals keep their last good value — never a
// zero — while fresh (last good at 5 s, ok up to 20 s) and turn stale at 25 s with
// basin_signal_up 0; the decode and gateway signals stay ok throughout; the detector is blind at
// 25 s and holds its state; after recovery everything is ok again.
func TestFaultEngineEndpoint(t *testing.T) {
	bigHandler := func(chunked bool) func(http.ResponseWriter, *http.Request, string) {
		return func(w http.ResponseWriter, _ *http.Request, body string) {
			b := []byte(body + filler(hugeBytes))
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			if !chunked {
				w.Header().Set("Content-Length", fmt.Sprint(len(b)))
				_, _ = w.Write(b)
				return
			}
			for len(b) > 0 {
				n := min(len(b), 1<<20)
				if _, err := w.Write(b[:n]); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				b = b[n:]
			}
		}
	}
	var bomb []byte // 12 MiB of filler around a valid body, gzipped to a few KiB
	{
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write([]byte(filler(hugeBytes) + prefillAt(0)))
		require.NoError(t, zw.Close())
		bomb = buf.Bytes()
		require.Less(t, len(bomb), 1<<20)
	}

	type tc struct {
		name    string
		timeout time.Duration
		// fault starts the fault (on the rig's prefill endpoint); heal ends it.
		fault, heal func(r *rig)
		// reason is the basin_scrape_errors_total reason counted once per faulty round.
		reason string
		// stale are the signals expected stale at the end of the fault (default prefillSignals).
		stale []collector.Signal
		// rewarm are signals whose window restarted during the fault: after recovery they need
		// a second scrape, and stay stale (with the old value) on the first.
		rewarm []collector.Signal
	}
	setFault := func(f func(http.ResponseWriter, *http.Request, string)) func(r *rig) {
		return func(r *rig) { r.prefill.setFault(f) }
	}
	clear := func(r *rig) { r.prefill.setFault(nil) }
	cases := []tc{
		// (1) down
		{name: "down/connection refused", fault: func(r *rig) { r.prefill.down() }, heal: func(r *rig) { r.prefill.up() },
			reason: "request"},
		// (2) slow
		{name: "slow/no headers before the timeout", timeout: 300 * time.Millisecond,
			fault: setFault(func(w http.ResponseWriter, r *http.Request, body string) {
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			}), reason: "timeout"},
		{name: "slow/body trickles past the timeout", timeout: 300 * time.Millisecond,
			fault: setFault(func(w http.ResponseWriter, r *http.Request, body string) {
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				for i := range len(body) {
					if _, err := w.Write([]byte{body[i]}); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
			}), reason: "timeout"},
		// (3) malformed
		{name: "malformed/value not a number", fault: setFault(serveText(func(b string) string {
			return strings.Replace(b, `{tp_rank="0"} 650000`, `{tp_rank="0"} six-fifty-k`, 1)
		})), reason: "parse"},
		{name: "malformed/unclosed label set", fault: setFault(serveText(func(b string) string {
			return strings.Replace(b, `{mode="input",tp_rank="0"}`, `{mode="input",tp_rank="0"`, 1)
		})), reason: "parse"},
		// A histogram TYPE over a plain sample parses, but the family no longer has a usable
		// gauge: capacity loses its only input and goes stale, nothing else does.
		{name: "malformed/TYPE contradicts samples", fault: setFault(serveText(func(b string) string {
			return strings.Replace(b, "# TYPE sglang:max_total_num_tokens gauge", "# TYPE sglang:max_total_num_tokens histogram", 1)
		})), stale: []collector.Signal{collector.CacheCapacity}},
		{name: "malformed/syntax error in an unread family", fault: setFault(serveText(func(b string) string {
			return strings.Replace(b, `sglang:gen_throughput{tp_rank="0"} 0`, `sglang:gen_throughput{tp_rank="0" 0 0 0`, 1)
		})), stale: []collector.Signal{}},
		{name: "malformed/binary garbage", fault: setFault(serveText(func(string) string {
			return "\x00\x01\x02\xff\xfe garbage \x1b[31m\n"
		})), reason: "dialect"},
		// (4) truncated mid-line (no Content-Length: the connection just ends)
		{name: "truncated/inside the label set", fault: setFault(serveText(func(b string) string {
			return b[:strings.LastIndex(b, `device_hit"`)+4]
		})), reason: "parse"},
		{name: "truncated/before the value", fault: setFault(serveText(func(b string) string {
			return b[:strings.LastIndex(b, "} ")+1]
		})), reason: "parse"},
		{name: "truncated/inside the last number", fault: setFault(serveText(cutLast(5))), reason: "parse"},
		{name: "truncated/short of Content-Length", fault: setFault(func(w http.ResponseWriter, _ *http.Request, body string) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			_, _ = w.Write([]byte(body[:len(body)-20]))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}), reason: "read"},
		// Cut exactly at a line end: the text format cannot show it (README), so the scrape
		// succeeds without the hit counter's line.
		{name: "truncated/at a line end (last series lost)", fault: setFault(serveText(func(b string) string {
			return b[:strings.LastIndex(strings.TrimSuffix(b, "\n"), "\n")+1]
		})), stale: []collector.Signal{collector.HitRate, collector.PromptTokenRate}},
		// (5) huge
		{name: "huge/12 MiB with Content-Length", fault: setFault(bigHandler(false)), reason: "body_too_large"},
		{name: "huge/12 MiB chunked", fault: setFault(bigHandler(true)), reason: "body_too_large"},
		{name: "huge/gzip bomb", fault: setFault(func(w http.ResponseWriter, _ *http.Request, _ string) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(bomb)
		}), reason: "body_too_large"},
		// (6) wrong content type, with a valid text body
		{name: "content type/text/html", fault: setFault(serveAs("text/html; charset=utf-8")), reason: "content_type"},
		{name: "content type/protobuf header", fault: setFault(serveAs(
			"application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited")), reason: "content_type"},
		{name: "content type/openmetrics", fault: setFault(serveAs("application/openmetrics-text; version=1.0.0")), reason: "content_type"},
		{name: "content type/json", fault: setFault(serveAs("application/json")), reason: "content_type"},
		// (8) NaN and ±Inf: the scrape succeeds, the unusable input is absent
		{name: "nan/capacity gauge NaN", fault: setFault(serveText(func(b string) string {
			return strings.Replace(b, `{tp_rank="0"} 650000`, `{tp_rank="0"} NaN`, 1)
		})), stale: []collector.Signal{collector.CacheCapacity}},
		{name: "nan/capacity gauge +Inf", fault: setFault(serveText(func(b string) string {
			return strings.Replace(b, `{tp_rank="0"} 650000`, `{tp_rank="0"} +Inf`, 1)
		})), stale: []collector.Signal{collector.CacheCapacity}},
		{name: "nan/every hit-rate counter series NaN", fault: setFault(serveText(func(b string) string {
			lines := strings.Split(b, "\n")
			for i, l := range lines {
				if strings.HasPrefix(l, "sglang:prefill_effective_tokens_total{") {
					lines[i] = l[:strings.LastIndex(l, " ")+1] + "NaN"
				}
			}
			return strings.Join(lines, "\n")
		})), stale: []collector.Signal{collector.HitRate, collector.PromptTokenRate}, rewarm: []collector.Signal{collector.HitRate, collector.PromptTokenRate}},
		{name: "nan/hit counter NaN", fault: setFault(serveText(func(b string) string {
			i := strings.LastIndex(b, "} ")
			return b[:i+2] + "NaN\n"
		})), stale: []collector.Signal{collector.HitRate, collector.PromptTokenRate}, rewarm: []collector.Signal{collector.HitRate, collector.PromptTokenRate}},
		{name: "nan/input counter -Inf", rewarm: []collector.Signal{collector.HitRate, collector.PromptTokenRate}, fault: setFault(serveText(func(b string) string {
			lines := strings.Split(b, "\n")
			for i, l := range lines {
				if strings.HasPrefix(l, `sglang:prefill_effective_tokens_total{mode="input"`) {
					lines[i] = `sglang:prefill_effective_tokens_total{mode="input",tp_rank="0"} -Inf`
				}
			}
			return strings.Join(lines, "\n")
		})), stale: []collector.Signal{collector.HitRate, collector.PromptTokenRate}},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, collector.Options{Timeout: tc.timeout}, "")
			heal := tc.heal
			if heal == nil {
				heal = clear
			}
			stale := tc.stale
			if stale == nil {
				stale = prefillSignals
			}
			// Rounds 0 and 1: healthy; the rates need two scrapes.
			r.round()
			snap, a := r.round()
			for sig, v := range healthyValues {
				got, ok := snap.Get(sig)
				require.True(t, ok, "%s ok before the fault", sig)
				require.InDelta(t, v, got, 1e-9, "%s before the fault", sig)
			}
			require.Empty(t, a.Blind)
			observed := a.At

			tc.fault(r)
			for k := 2; k <= 5; k++ {
				snap, a = r.round()
				assertSane(t, snap, k)
				if tc.reason != "" {
					assert.Equal(t, float64(k-1), r.errors("prefill-0", tc.reason), "round %d: one %s error per round", k, tc.reason)
					assert.Equal(t, float64(k-1), r.allErrors("prefill-0"), "round %d: under that reason only", k)
				} else {
					assert.Zero(t, r.allErrors("prefill-0"), "round %d: the scrape itself succeeds", k)
				}
				for _, sig := range stale {
					v := snap.Signals[sig]
					if k < 5 {
						// Last good value at 5 s: fresh until 20 s, and not zero.
						assert.Equal(t, collector.OK, v.State, "round %d: %s", k, sig)
						assert.InDelta(t, healthyValues[sig], v.V, 1e-9, "round %d: %s keeps its last good value", k, sig)
						assert.Equal(t, at(1), v.At, "round %d: %s keeps its time", k, sig)
						observed = a.At
						continue
					}
					assert.Equal(t, collector.Stale, v.State, "round %d: %s", k, sig)
					_, ok := snap.Get(sig)
					assert.False(t, ok, "Get refuses a stale %s", sig)
					assert.InDelta(t, healthyValues[sig], v.V, 1e-9, "%s: the last good value is kept, not zeroed", sig)
					assert.Zero(t, r.up(sig), "basin_signal_up{%s}", sig)
					st, _ := r.metric("basin_signal_state", map[string]string{"signal": string(sig), "state": "stale"})
					assert.Equal(t, 1.0, st, "basin_signal_state{%s,stale}", sig)
					_, exported := r.metric("basin_signal_value", map[string]string{"signal": string(sig)})
					assert.False(t, exported, "no basin_signal_value for a stale %s", sig)
				}
				for _, sig := range otherSignals {
					got, ok := snap.Get(sig)
					assert.True(t, ok, "round %d: %s does not depend on prefill-0", k, sig)
					assert.InDelta(t, healthyValues[sig], got, 1e-9, "round %d: %s", k, sig)
					assert.Equal(t, 1.0, r.up(sig), "round %d: basin_signal_up{%s}", k, sig)
				}
			}
			// The detector at 25 s: blind on exactly the stale signals, state held, no transition,
			// numbers of the last complete step.
			assert.Equal(t, detector.Healthy, a.State)
			assert.Nil(t, a.Transition)
			assert.Equal(t, at(0), a.Since, "state held since the first step")
			var wantBlind []string
			for _, sig := range stale {
				wantBlind = append(wantBlind, string(sig)+" stale")
			}
			assert.ElementsMatch(t, wantBlind, a.Blind)
			require.NotEmpty(t, a.Reasons)
			if len(stale) > 0 {
				assert.Equal(t, observed, a.ObservedAt, "the numbers of the last complete step (20 s)")
				assert.Contains(t, a.Reasons[0], "blind (")
				assert.Contains(t, a.Reasons[0], "holding healthy")
			} else {
				assert.Equal(t, a.At, a.ObservedAt, "nothing stale: a complete step")
			}

			// Recovery.
			heal(r)
			errsBefore := r.allErrors("prefill-0")
			for k := 6; k <= 7; k++ {
				snap, a = r.round()
				assertSane(t, snap, k)
				var blind []string
				for sig, v := range healthyValues {
					got := snap.Signals[sig]
					want := collector.OK
					if k == 6 && slices.Contains(tc.rewarm, sig) {
						want = collector.Stale
						blind = append(blind, string(sig)+" stale")
					}
					assert.Equal(t, want, got.State, "round %d: %s after recovery", k, sig)
					assert.InDelta(t, v, got.V, 1e-9, "round %d: %s after recovery", k, sig)
				}
				assert.ElementsMatch(t, blind, a.Blind, "round %d", k)
				assert.Equal(t, detector.Healthy, a.State)
			}
			assert.Equal(t, errsBefore, r.allErrors("prefill-0"), "no error after recovery")
		})
	}
}

// TestFaultDuplicateSeries: (7) duplicated series in one scrape. The first occurrence is used,
// the rest are counted in basin_scrape_duplicate_series_total; nothing goes stale.
func TestFaultDuplicateSeries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(string) string
		dups   float64 // per scrape
	}{
		{"gauge repeated with another value", func(b string) string {
			return strings.Replace(b, "sglang:max_total_num_tokens{tp_rank=\"0\"} 650000\n",
				"sglang:max_total_num_tokens{tp_rank=\"0\"} 650000\nsglang:max_total_num_tokens{tp_rank=\"0\"} 1\n", 1)
		}, 1},
		{"counter repeated with zero (a reset-looking twin)", func(b string) string {
			return b + "sglang:prefill_effective_tokens_total{mode=\"device_hit\",tp_rank=\"0\"} 0\n"
		}, 1},
		{"labels in another order and an empty label", func(b string) string {
			return b + "sglang:prefill_effective_tokens_total{tp_rank=\"0\",mode=\"input\",priority=\"\"} 0\n"
		}, 1},
		{"every line twice", func(b string) string {
			var out []string
			for _, l := range strings.Split(strings.TrimSuffix(b, "\n"), "\n") {
				out = append(out, l)
				if !strings.HasPrefix(l, "#") {
					out = append(out, l)
				}
			}
			return strings.Join(out, "\n") + "\n"
		}, 7}, // gen_throughput is not read: its lines are dropped before parsing
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, collector.Options{}, "")
			r.prefill.setFault(serveText(tc.change))
			for k := range 4 {
				snap, a := r.round()
				assertSane(t, snap, k)
				assert.Zero(t, r.allErrors("prefill-0"), "round %d", k)
				n, _ := r.metric("basin_scrape_duplicate_series_total", map[string]string{"target": "prefill-0"})
				assert.Equal(t, tc.dups*float64(k+1), n, "round %d: duplicates counted", k)
				if k == 0 {
					continue
				}
				for sig, v := range healthyValues {
					got, ok := snap.Get(sig)
					assert.True(t, ok, "round %d: %s", k, sig)
					assert.InDelta(t, v, got, 1e-9, "round %d: %s uses the first series", k, sig)
				}
				assert.Empty(t, a.Blind)
			}
		})
	}
}

// TestFaultCounterReset: (9) the engines and the gateway restart at round 6 (counters fall to
// about 0) and count on at the same pace. No rate is ever negative or above its steady value; on
// the restart round the rates hold their last value with its old time (still ok: 5 s old), and
// from the next round on they are exact again. The detector never goes blind after warm-up and
// never changes state.
func TestFaultCounterReset(t *testing.T) {
	for _, tc := range []struct {
		name string
		// restart gives the counters of round k ≥ 6 (j = k − 6 rounds after the restart).
		prefill func(j int) string
	}{
		{"all counters to ~0", func(j int) string {
			return prefillBody(30+float64(j*inputPerRound), 10+float64(j*hitPerRound))
		}},
		{"all counters to exactly 0", func(j int) string {
			return prefillBody(float64(j*inputPerRound), float64(j*hitPerRound))
		}},
		{"only the hit counter drops", func(j int) string {
			return prefillBody(1e6+float64((6+j)*inputPerRound), 10+float64(j*hitPerRound))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, collector.Options{}, "")
			restart := func(j int) string { return decodeBody(3 + float64(j*callsPerRound)) }
			gwRestart := func(j int) string {
				return gatewayBody(1+float64(j*sessPerRound), float64(j*sessPerRound))
			}
			rates := []collector.Signal{collector.HitRate, collector.CallRate, collector.ArrivalRate, collector.CompletionRate}
			for k := range 12 {
				if k == 6 {
					r.prefill.setRender(func(k int) string { return tc.prefill(k - 6) })
					r.decode.setRender(func(k int) string { return restart(k - 6) })
					r.gateway.setRender(func(k int) string { return gwRestart(k - 6) })
				}
				snap, a := r.round()
				assertSane(t, snap, k)
				for _, sig := range rates {
					v := snap.Signals[sig]
					if k == 0 {
						assert.Equal(t, collector.Missing, v.State, "%s: one scrape is no rate", sig)
						continue
					}
					require.Equal(t, collector.OK, v.State, "round %d: %s", k, sig)
					assert.InDelta(t, healthyValues[sig], v.V, 1e-9, "round %d: %s neither negative nor a spike", k, sig)
					if k == 6 {
						assert.Equal(t, at(5), v.At, "round 6: %s held with its old time", sig)
					} else {
						assert.Equal(t, at(k), v.At, "round %d: %s fresh", k, sig)
					}
				}
				if k > 0 {
					assert.Empty(t, a.Blind, "round %d", k)
				}
				assert.Equal(t, detector.Healthy, a.State, "round %d", k)
				assert.Nil(t, a.Transition, "round %d", k)
			}
			for _, n := range []string{"prefill-0", "decode-0", "gateway"} {
				assert.Zero(t, r.allErrors(n), "%s: a reset is not a scrape error", n)
			}
		})
	}
}

// TestFaultTargetFile: (10) prefill-0 comes from a file_sd file; it disappears from the file at
// round 2 and comes back at round 6. While gone it is not scraped and its basin_scrape_* series
// are gone; its signals keep their last value and turn stale (never zero); the others stay ok.
// Back, it starts afresh: capacity is ok at once, the hit rate (a window rate) after a second
// scrape.
func TestFaultTargetFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "targets.json")
	mtime := time.Now().Add(-time.Hour)
	write := func(body string) {
		t.Helper()
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		mtime = mtime.Add(time.Second)
		require.NoError(t, os.Chtimes(path, mtime, mtime))
	}
	// The file starts empty (New needs it); prefill-0 is written in once its endpoint exists.
	r := newRig(t, collector.Options{}, writeLater(t, path))
	with := fmt.Sprintf(`[{"targets": [%q], "labels": {"role": "prefill", "name": "prefill-0"}}]`, r.prefill.addr)
	write(with)
	all := []string{"decode-0", "gateway", "prefill-0"}
	rest := []string{"decode-0", "gateway"}

	r.round(all...)
	snap, a := r.round(all...)
	require.Empty(t, a.Blind)
	for _, sig := range prefillSignals {
		require.Equal(t, collector.OK, snap.State(sig))
	}

	write("[]")
	scrapes := r.prefill.scrapes()
	for k := 2; k <= 5; k++ {
		snap, a = r.round(rest...)
		assertSane(t, snap, k)
		var names []string
		for _, tg := range r.c.Targets() {
			names = append(names, tg.Name)
		}
		assert.Equal(t, rest, names, "round %d", k)
		_, found := r.metric("basin_scrape_last_success_timestamp_seconds", map[string]string{"target": "prefill-0"})
		assert.False(t, found, "round %d: a removed target's series go", k)
		for _, sig := range prefillSignals {
			v := snap.Signals[sig]
			assert.InDelta(t, healthyValues[sig], v.V, 1e-9, "round %d: %s keeps its last value", k, sig)
			want := collector.OK
			if k == 5 {
				want = collector.Stale
			}
			assert.Equal(t, want, v.State, "round %d: %s", k, sig)
		}
		for _, sig := range otherSignals {
			_, ok := snap.Get(sig)
			assert.True(t, ok, "round %d: %s", k, sig)
		}
	}
	assert.Equal(t, scrapes, r.prefill.scrapes(), "not scraped while out of the file")
	for _, sig := range prefillSignals {
		assert.Zero(t, r.up(sig), "basin_signal_up{%s}", sig)
	}
	assert.ElementsMatch(t, []string{"hit_rate stale", "prompt_token_rate stale", "cache_capacity_tokens stale"}, a.Blind)
	assert.Equal(t, detector.Healthy, a.State)
	assert.Nil(t, a.Transition)

	write(with)
	snap, a = r.round(all...)
	assert.Equal(t, collector.OK, snap.State(collector.CacheCapacity), "back: capacity ok at once")
	assert.Equal(t, collector.Stale, snap.State(collector.HitRate), "back: one sample is no rate; the old value stays stale")
	assert.InDelta(t, 0.95, snap.Signals[collector.HitRate].V, 1e-9)
	assert.Equal(t, []string{"hit_rate stale", "prompt_token_rate stale"}, a.Blind)
	snap, a = r.round(all...)
	for sig, v := range healthyValues {
		got, ok := snap.Get(sig)
		assert.True(t, ok, "%s after the target returned", sig)
		assert.InDelta(t, v, got, 1e-9, "%s", sig)
	}
	assert.Empty(t, a.Blind)
	assert.Equal(t, detector.Healthy, a.State)
	_, found := r.metric("basin_scrape_last_success_timestamp_seconds", map[string]string{"target": "prefill-0"})
	assert.True(t, found, "its series are back")
}

// writeLater creates an empty target file so New accepts it; the test fills it in.
func writeLater(t *testing.T, path string) string {
	require.NoError(t, os.WriteFile(path, []byte("[]"), 0o600))
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(path, old, old))
	return path
}

// TestFaultDetectorHoldsThroughBlindness: with the detector resumed in pressure and data that
// would take it back to healthy after MinHold (15 s), a prefill endpoint that is down, or serves
// malformed text, from round 2 on (StaleAfter 1: stale from round 3) leaves it in pressure for
// as long as it lasts; after recovery the exit needs its full hold again.
func TestFaultDetectorHoldsThroughBlindness(t *testing.T) {
	for _, tc := range []struct {
		name        string
		fault, heal func(r *rig)
	}{
		{"down", func(r *rig) { r.prefill.down() }, func(r *rig) { r.prefill.up() }},
		{"malformed", func(r *rig) {
			r.prefill.setFault(serveText(func(b string) string { return strings.Replace(b, " 650000", " 6.5.0", 1) }))
		}, func(r *rig) { r.prefill.setFault(nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, collector.Options{StaleAfter: 1}, "")
			require.NoError(t, r.det.Resume(detector.Pressure, faultT0))
			r.round()
			_, a := r.round() // 5 s: complete; the exit condition starts its hold
			require.Empty(t, a.Blind)
			require.Equal(t, detector.Pressure, a.State)
			tc.fault(r)
			r.round() // 10 s: values from 5 s still ok
			for k := 3; k <= 9; k++ {
				_, a = r.round()
				assert.Equal(t, detector.Pressure, a.State, "round %d: held while blind", k)
				assert.Nil(t, a.Transition, "round %d", k)
				assert.Contains(t, a.Blind, "hit_rate stale", "round %d", k)
				assert.Contains(t, a.Blind, "cache_capacity_tokens stale", "round %d", k)
			}
			tc.heal(r)
			var left time.Time
			for k := 10; k <= 16 && left.IsZero(); k++ {
				_, a = r.round()
				assert.Empty(t, a.Blind, "round %d", k)
				if a.Transition != nil {
					left = a.At
					assert.Equal(t, detector.Healthy, a.State)
				}
			}
			require.False(t, left.IsZero(), "leaves pressure once it sees the data again")
			assert.GreaterOrEqual(t, left.Sub(at(10)), detector.DefaultMinHold, "the hold restarted after the gap")
		})
	}
}
