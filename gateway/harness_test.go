package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/test/servetest"
)

// testToken is the admin token of the test gateways.
const testToken = "test-admin-token-0123456789"

// syncBuffer is a log sink the test reads while the gateway writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startSim serves the paper's 1P1D H100 deployment at 600× on a loopback server, the way
// `basin sim serve --scenario paper-1p1d-h100` does.
func startSim(t testing.TB) string { return servetest.Start(t, 600).URL }

// simIdleTimeout is 10 minutes of wall time in front of startSim's simulator, which announces its
// 600×: the gateway keeps the idle timeout in the deployment's time.
const simIdleTimeout = Duration(100 * time.Hour)

// harness is a gateway on loopback test servers, its Run loop going.
type harness struct {
	t     testing.TB
	g     *Gateway
	cfg   *Config
	ts    *httptest.Server
	admin *httptest.Server
	reg   *prometheus.Registry
	log   *syncBuffer
	stop  func() error // cancels Run and waits for it
}

// baseConfig is a valid configuration in front of the given upstreams; tweak edits it.
func baseConfig(t testing.TB, upstreams []string, tweak func(*Config)) *Config {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600))
	var b strings.Builder
	fmt.Fprintf(&b, "admin_token_file: %s\nupstreams:\n", tokenFile)
	for _, u := range upstreams {
		fmt.Fprintf(&b, "  - %s\n", u)
	}
	b.WriteString("admission:\n  budget_tokens: 1000000\n")
	cfg, err := ParseConfig([]byte(b.String()))
	require.NoError(t, err)
	if tweak != nil {
		tweak(cfg)
	}
	return cfg
}

// start builds a gateway from cfg and runs it; now may be nil for the wall clock.
func start(t testing.TB, cfg *Config, now func() time.Time) *harness {
	t.Helper()
	return startOn(t, cfg, now, httptest.NewUnstartedServer(nil))
}

// startOn is start with the admin listener given, not yet started: a replica's advertised
// admin URL is known before the gateway is built.
func startOn(t testing.TB, cfg *Config, now func() time.Time, admin *httptest.Server) *harness {
	t.Helper()
	return startPrepared(t, cfg, now, admin, nil)
}

// startPrepared is startOn with prepare run on the gateway before it starts: a test's way to
// put a fault between the gateway and what it depends on.
func startPrepared(t testing.TB, cfg *Config, now func() time.Time, admin *httptest.Server, prepare func(*Gateway)) *harness {
	t.Helper()
	h := &harness{t: t, cfg: cfg, reg: prometheus.NewRegistry(), log: &syncBuffer{}}
	g, err := New(Options{Config: cfg, Now: now, Registerer: h.reg,
		Logger:          slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		ShutdownTimeout: 3 * time.Second})
	require.NoError(t, err)
	if prepare != nil {
		prepare(g)
	}
	h.g = g
	h.ts = httptest.NewServer(g.Handler())
	admin.Config.Handler = g.AdminHandler()
	admin.Start()
	h.admin = admin
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	var once sync.Once
	var runErr error
	h.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(5 * time.Second):
				runErr = fmt.Errorf("gateway Run did not return")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		assert.NoError(t, h.stop())
		h.ts.Close()
		h.admin.Close()
	})
	return h
}

// response is what a test call got back.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

// do sends a request to the main listener.
func (h *harness) do(ctx context.Context, method, path string, header map[string]string, body string) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, h.ts.URL+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// chat sends a chat call for session id (no header when id is "").
func (h *harness) chat(id string, words int, extra map[string]string) response {
	h.t.Helper()
	hdr := map[string]string{"Content-Type": "application/json"}
	if id != "" {
		hdr["x-session-id"] = id
	}
	for k, v := range extra {
		hdr[k] = v
	}
	r, err := h.do(context.Background(), http.MethodPost, "/v1/chat/completions", hdr, chatBody(words))
	require.NoError(h.t, err)
	return r
}

// chatAsync sends a chat call in the background.
func (h *harness) chatAsync(ctx context.Context, id string, words int, extra map[string]string) <-chan response {
	ch := make(chan response, 1)
	hdr := map[string]string{"Content-Type": "application/json", "x-session-id": id}
	for k, v := range extra {
		hdr[k] = v
	}
	go func() {
		r, err := h.do(ctx, http.MethodPost, "/v1/chat/completions", hdr, chatBody(words))
		if err != nil {
			r = response{status: -1, body: []byte(err.Error())}
		}
		ch <- r
	}()
	return ch
}

func chatBody(words int) string {
	return fmt.Sprintf(`{"model":"basin-sim","messages":[{"role":"system","content":"You are a coding agent."},`+
		`{"role":"user","content":"Fix the failing test in the parser package, please."}],"max_tokens":%d}`, words)
}

// adminDo calls the admin listener with the given token ("" for none).
func (h *harness) adminDo(method, path, token, body string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.admin.URL+path, strings.NewReader(body))
	require.NoError(h.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := h.admin.Client().Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// state reads GET /admin/state.
func (h *harness) state() adminapi.StateView {
	h.t.Helper()
	r := h.adminDo(http.MethodGet, "/admin/state", testToken, "")
	require.Equal(h.t, http.StatusOK, r.status, "%s", r)
	var v adminapi.StateView
	require.NoError(h.t, json.Unmarshal(r.body, &v))
	return v
}

// waitFor polls cond until it holds or 3 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settle waits until the gateway has finished accounting for every call (a client has its
// response a moment before the gateway books the usage). Only for tests with no call held.
func (h *harness) settle() {
	h.t.Helper()
	waitFor(h.t, "calls accounted for", func() bool { return h.g.calls.count() == 0 })
}

// waitQueued waits until the queue holds n sessions.
func (h *harness) waitQueued(n int) adminapi.StateView {
	h.t.Helper()
	var v adminapi.StateView
	waitFor(h.t, fmt.Sprintf("%d queued", n), func() bool {
		v = h.state()
		return len(v.Queue) == n
	})
	return v
}

// fakeUpstream is an upstream whose handler the test writes; it records the requests' headers.
type fakeUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
	paths   []string // escaped request paths
}

func newFakeUpstream(t testing.TB, h http.HandlerFunc) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.headers = append(f.headers, r.Header.Clone())
		f.paths = append(f.paths, r.URL.EscapedPath())
		f.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeUpstream) seenPaths() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.paths...)
}

func (f *fakeUpstream) seen() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]http.Header(nil), f.headers...)
}

// okJSON answers a chat call with a fixed completion and usage.
func okJSON(prompt, completion int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			prompt, completion, prompt+completion)
	}
}
