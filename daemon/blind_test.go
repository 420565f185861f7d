package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/scaledclock"
)

// syncBuffer is a log sink safe for the daemon's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestBlindWhenNothingIsReachable runs the daemon as `basin daemon` runs (Serve, real scrapes, the
// real gateway client) with every target and the gateway's admin API on a closed port: it must
// say it is blind — in the status, on /readyz, in basin_blind — not show a green "healthy".
func TestBlindWhenNothingIsReachable(t *testing.T) {
	dir := t.TempDir()
	down := "http://" + closedPort(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte(testToken), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "admin-token"), []byte("admin"), 0o600))
	cfgYAML := fmt.Sprintf(`deployment: unit
token_file: token
data_dir: data
collector:
  targets:
    - {name: prefill-0, url: "%[1]s/metrics/p", role: prefill, dialect: sglang}
    - {name: decode-0, url: "%[1]s/metrics/d", role: decode, dialect: sglang}
    - {name: gateway, url: "%[1]s/metrics", role: gateway, dialect: basin-gateway}
gateway:
  admin_url: %[1]s
  token_file: admin-token
cron: {daily_summary: "-", knee_reestimate: "-"}
`, down)
	path := filepath.Join(dir, "daemon.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cfgYAML), 0o600))
	cfg, err := LoadConfig(path)
	require.NoError(t, err)
	var logs syncBuffer
	// A deployment's clock 50 times faster than the wall clock: a 5 s interval is 100 ms of wall time.
	fast, err := scaledclock.New(50, nil)
	require.NoError(t, err)
	d, err := New(cfg, Options{Clock: fast, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ln := listen(t)
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
	})
	base := "http://" + ln.Addr().String()

	// Wait (bounded) for steps to complete; every one of them is blind.
	deadline := time.Now().Add(20 * time.Second)
	var s Status
	for {
		getJSON(t, base+"/api/v1/status", &s)
		if s.Gateway != nil && !slices.Contains(s.Unseen, notStepped) { // a step completed
			break
		}
		require.True(t, time.Now().Before(deadline), "no step completed: %+v", s)
		time.Sleep(20 * time.Millisecond) // polling with a deadline, not synchronising
	}
	assert.True(t, s.Blind, "%+v", s)
	joined := strings.Join(s.Unseen, "\n")
	assert.Contains(t, joined, "working_set_tokens", "the missing signals are named")
	assert.Contains(t, joined, GatewayUnseen, "the unreachable admin API is named")
	assert.NotEmpty(t, s.Assessment.Blind, "the assessment says so too")

	code, body := call(t, http.MethodGet, base+"/readyz", "", "")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	msg := decodeErr(t, body).Error.Message
	assert.Contains(t, msg, "blind")
	assert.Contains(t, msg, "gateway admin API")
	code, _ = call(t, http.MethodGet, base+"/healthz", "", "")
	assert.Equal(t, http.StatusOK, code, "the process is up")

	code, body = call(t, http.MethodGet, base+"/metrics", "", "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, string(body), `basin_blind{deployment="unit"} 1`)
	assert.Contains(t, string(body), `basin_gateway_admin_up{deployment="unit"} 0`)

	// The unreachable admin API is logged once, not once per step.
	for d.StatusNow().Now.Sub(s.Now) < time.Minute { // a minute of deployment time: 12 steps
		require.True(t, time.Now().Before(deadline), "the daemon stopped stepping")
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "gateway admin API unreachable"), "%s", logs.String())
}

// TestBlindStatusReadinessAndMetrics: a step with nothing scraped and the gateway unread is blind
// in every view; once the signals and the gateway are back it is not.
func TestBlindStatusReadinessAndMetrics(t *testing.T) {
	e := newEnv(t, "")
	d := e.daemon()
	api := serveAPI(t, d)
	e.gw.set(func(g *fakeGateway) { g.stateErr = errors.New("dial tcp 127.0.0.1:8081: connection refused") })

	s := d.StatusNow()
	assert.True(t, s.Blind, "nothing seen before the first step")
	assert.Equal(t, []string{notStepped}, s.Unseen)

	e.clock.Advance(stepEvery)
	d.Step(t.Context()) // nothing fed: every signal missing
	s = d.StatusNow()
	assert.True(t, s.Blind)
	assert.Equal(t, detector.Healthy, s.Assessment.State, "the detector holds its state...")
	assert.Contains(t, strings.Join(s.Unseen, "\n"), "gateway admin API: dial tcp 127.0.0.1:8081: connection refused")
	code, body := call(t, http.MethodGet, api.URL+"/readyz", "", "")
	assert.Equal(t, http.StatusServiceUnavailable, code, "...but the daemon is not ready")
	assert.Contains(t, decodeErr(t, body).Error.Message, "blind: cannot see")
	_, body = call(t, http.MethodGet, api.URL+"/metrics", "", "")
	assert.Contains(t, string(body), `basin_blind{deployment="unit"} 1`)
	assert.Contains(t, string(body), `basin_gateway_admin_up{deployment="unit"} 0`)

	e.gw.set(func(g *fakeGateway) { g.stateErr = nil })
	e.stepUntil(d, 5, "seeing again", func(s Status) bool { return !s.Blind })
	s = d.StatusNow()
	assert.Empty(t, s.Unseen)
	code, body = call(t, http.MethodGet, api.URL+"/readyz", "", "")
	assert.Equal(t, http.StatusOK, code, "%s", body)
	_, body = call(t, http.MethodGet, api.URL+"/metrics", "", "")
	assert.Contains(t, string(body), `basin_blind{deployment="unit"} 0`)
	assert.Contains(t, string(body), `basin_gateway_admin_up{deployment="unit"} 1`)
}

// TestBlindActingDaemonDoesNotCut: a dry-run daemon saw the deployment trapped; restarted acting,
// it resumes the detector's trapped state but its targets are down. It must not cut the budget on
// a state it cannot see (the "blind, holding trapped" daemon that cut and stayed cut).
func TestBlindActingDaemonDoesNotCut(t *testing.T) {
	e := newEnv(t, "dry_run: true\n")
	d1 := e.daemon()
	for range 4 {
		e.step(d1)
	}
	e.dep.collapse()
	e.stepUntil(d1, 40, "trapped in dry run", func(s Status) bool { return s.Assessment.State == detector.Trapped })
	require.Empty(t, e.gw.Budgets(), "dry run")

	e.cfg.DryRun = false
	d2 := e.daemon()
	require.Equal(t, detector.Trapped, d2.StatusNow().Assessment.State, "resumed")
	for range 30 { // the targets are down: nothing is fed
		e.clock.Advance(stepEvery)
		d2.Step(t.Context())
	}
	s := d2.StatusNow()
	assert.True(t, s.Blind)
	assert.Empty(t, e.gw.Budgets(), "no action on a state basin cannot see")
}

// TestGatewayFailureLogRateLimited: an unreachable admin API is logged when it starts failing,
// reminded at most every failureLogEvery, and its recovery logged once.
func TestGatewayFailureLogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	f := failureLog{down: "unreachable"}
	now := t0
	err := errors.New("connection refused")
	count := func(s string) int { return strings.Count(buf.String(), s) }
	for range 60 { // 5 minutes at 5 s
		f.observe(log, now, "gateway admin API", err)
		now = now.Add(5 * time.Second)
	}
	assert.Equal(t, 1, count("level=WARN"), "one warning in the first %v: %s", failureLogEvery, buf.String())
	f.observe(log, now, "gateway admin API", err)
	assert.Equal(t, 2, count("level=WARN"), "a reminder after %v", failureLogEvery)
	assert.Contains(t, buf.String(), "gateway admin API still failing")
	assert.Contains(t, buf.String(), "failed_attempts=61")
	f.observe(log, now.Add(5*time.Second), "gateway admin API", nil)
	f.observe(log, now.Add(10*time.Second), "gateway admin API", nil)
	assert.Equal(t, 1, count("recovered"), "%s", buf.String())
	f.observe(log, now.Add(15*time.Second), "gateway admin API", err)
	assert.Equal(t, 3, count("level=WARN"), "a new outage warns at once")
}
