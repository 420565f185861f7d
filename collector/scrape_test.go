package collector

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// server serves fixtures (or misbehaviour) per path on loopback.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	handlers map[string]http.HandlerFunc
	accept   []string
}

func newServer(t *testing.T) *server {
	t.Helper()
	s := &server{handlers: map[string]http.HandlerFunc{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		h := s.handlers[r.URL.Path]
		s.accept = append(s.accept, r.Header.Get("Accept"))
		s.mu.Unlock()
		if h == nil {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) handle(path string, h http.HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[path] = h
}

// serveBody answers with body and the text content type prometheus_client uses.
func serveBody(body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(body)
	}
}

// TestScrape runs single scrape rounds against a loopback server.
func TestScrape(t *testing.T) {
	srv := newServer(t)
	for _, name := range fixtureNames {
		srv.handle("/"+name, serveBody(fixtureBytes(t, name)))
	}
	targets := []Target{
		{Name: "prefill-0", URL: srv.URL + "/sglang_pd_prefill", Role: RolePrefill},
		{Name: "decode-0", URL: srv.URL + "/sglang_pd_decode", Role: RoleDecode},
		{Name: "gateway", URL: srv.URL + "/gateway", Role: RoleGateway, Dialect: DialectGateway},
	}
	c, reg, clk := newTest(t, Options{Targets: targets, MaxBodyBytes: 64 << 10})
	c.round(t.Context())
	assertSignals(t, c.Snapshot(), map[Signal]want{
		CacheCapacity: ok(2_050_000), WorkingSet: ok(1_412_000), DecodeCapacity: ok(800_000), EngineQueue: ok(16),
	})
	srv.mu.Lock()
	assert.Equal(t, []string{acceptHeader, acceptHeader, acceptHeader}, srv.accept)
	srv.mu.Unlock()
	fams := gather(t, reg)
	n, _ := metricValue(fams, "basin_scrape_samples", map[string]string{"target": "decode-0"})
	assert.Equal(t, float64(countSamples(fixture(t, "sglang_pd_decode"))), n)
	d, _ := metricValue(fams, "basin_scrape_duration_seconds", map[string]string{"target": "gateway"})
	assert.Equal(t, 1.0, d, "one observation")

	// The decode instance starts failing in every way: each failure is counted with its
	// reason, names the target, and the last good data stays.
	big := bytes.Repeat([]byte("# filler comment line to exceed the limit\n"), 2000)
	for _, tc := range []struct {
		name    string
		h       http.HandlerFunc
		reason  string
		message string
	}{
		{"oversize body with length", serveBody(append(fixtureBytes(t, "sglang_pd_decode"), big...)), reasonTooLarge,
			"exceeds the limit of 65536 bytes"},
		{"oversize chunked body", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			for range 4 {
				w.Write(big[:len(big)/2])
				w.(http.Flusher).Flush()
			}
		}, reasonTooLarge, "body exceeds the limit of 65536 bytes"},
		{"openmetrics", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
			w.Write([]byte("# TYPE x counter\nx_total 1\n# EOF\n"))
		}, reasonContentType, "application/openmetrics-text"},
		{"protobuf", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited")
			w.Write([]byte{0x0a, 0x01})
		}, reasonContentType, "not the text exposition format"},
		{"html error page", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html>login</html>"))
		}, reasonContentType, "text/html"},
		{"truncated mid-line", serveBody(fixtureBytes(t, "sglang_pd_decode")[:3000]), reasonParse, "parse"},
		{"short body", func(w http.ResponseWriter, _ *http.Request) {
			body := fixtureBytes(t, "sglang_pd_decode")
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.Write(body[:len(body)/2])
			// The handler returns early: the client sees an unexpected EOF.
			panic(http.ErrAbortHandler)
		}, reasonRead, "read body"},
		{"server error", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "scheduler is dead", http.StatusInternalServerError)
		}, reasonStatus, "unexpected status 500 Internal Server Error"},
		{"not metrics at all", serveBody([]byte("# TYPE node_load1 gauge\nnode_load1 0.5\n")), reasonDialect, "cannot tell the dialect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			c.log = slogTo(&logs)
			srv.handle("/sglang_pd_decode", tc.h)
			clk.now = clk.now.Add(5 * time.Second)
			errs := map[string]string{"target": "decode-0", "reason": tc.reason}
			before, _ := metricValue(gather(t, reg), "basin_scrape_errors_total", errs)
			c.round(t.Context())
			after, _ := metricValue(gather(t, reg), "basin_scrape_errors_total", errs)
			assert.Equal(t, 1.0, after-before, "counted once under %s", tc.reason)
			assert.Contains(t, logs.String(), "decode-0")
			if tc.reason != reasonDialect {
				assert.Contains(t, logs.String(), tc.message)
			}
			assertSignals(t, c.Snapshot(), map[Signal]want{DecodeCapacity: ok(800_000)})
			srv.handle("/sglang_pd_decode", serveBody(fixtureBytes(t, "sglang_pd_decode")))
			c.round(t.Context())
		})
	}

	t.Run("no content type is text", func(t *testing.T) {
		srv.handle("/bare", func(w http.ResponseWriter, _ *http.Request) {
			w.Header()["Content-Type"] = nil
			w.Write(fixtureBytes(t, "vllm_v1"))
		})
		c, _, _ := newTest(t, Options{Targets: []Target{{Name: "v", URL: srv.URL + "/bare", Role: RoleUnified}}})
		c.round(t.Context())
		assertSignals(t, c.Snapshot(), map[Signal]want{EngineQueue: ok(12)})
	})

	t.Run("utf-8 names fall back from the legacy scheme", func(t *testing.T) {
		body := append([]byte("# TYPE \"my.dotted.metric\" gauge\n{\"my.dotted.metric\"} 1\n"), fixtureBytes(t, "vllm_v1")...)
		srv.handle("/utf8", serveBody(body))
		c, _, _ := newTest(t, Options{Targets: []Target{{Name: "v", URL: srv.URL + "/utf8", Role: RoleUnified}}})
		c.round(t.Context())
		assertSignals(t, c.Snapshot(), map[Signal]want{EngineQueue: ok(12)})
		_, err := parseBytes(body)
		require.NoError(t, err)
	})
}

// TestScrapeTimeoutAndRefused: a hanging target is cut at Timeout; a closed port fails fast.
func TestScrapeTimeoutAndRefused(t *testing.T) {
	srv := newServer(t)
	srv.handle("/hang", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())

	c, reg, _ := newTest(t, Options{
		Interval: time.Second, Timeout: 200 * time.Millisecond, Now: time.Now,
		Targets: []Target{
			{Name: "hang", URL: srv.URL + "/hang", Role: RoleDecode},
			{Name: "refused", URL: "http://" + closed + "/metrics", Role: RoleDecode},
		},
	})
	start := time.Now()
	c.round(t.Context())
	assert.Less(t, time.Since(start), 5*time.Second, "bounded by the timeout")
	fams := gather(t, reg)
	n, _ := metricValue(fams, "basin_scrape_errors_total", map[string]string{"target": "hang", "reason": reasonTimeout})
	assert.Equal(t, 1.0, n)
	n, _ = metricValue(fams, "basin_scrape_errors_total", map[string]string{"target": "refused", "reason": reasonRequest})
	assert.Equal(t, 1.0, n)
}

// TestRunStops: Run returns when its context ends, and refuses a second concurrent Run.
func TestRunStops(t *testing.T) {
	srv := newServer(t)
	srv.handle("/m", serveBody(fixtureBytes(t, "sglang_pd_decode")))
	c, _, _ := newTest(t, Options{Interval: 50 * time.Millisecond, Now: time.Now,
		Targets: []Target{{Name: "d", URL: srv.URL + "/m", Role: RoleDecode}}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return c.Snapshot().State(DecodeCapacity) == OK }, 5*time.Second, 10*time.Millisecond)
	assert.ErrorContains(t, c.Run(ctx), "already running")
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestIsText(t *testing.T) {
	for ct, want := range map[string]bool{
		"":                          true,
		"text/plain":                true,
		"text/plain; version=0.0.4": true,
		"text/plain; version=1.0.0; escaping=allow-utf-8": true,
		"application/openmetrics-text; version=1.0.0":     false,
		"application/json": false,
		"text/plain;;":     false,
	} {
		assert.Equal(t, want, isText(ct), "%q", ct)
	}
}
