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
	"testing/synctest"
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

// harness is a gateway on loopback test servers (start), or on an in-memory network in a
// testing/synctest bubble (startInBubble), its Run loop going.
type harness struct {
	t   testing.TB
	g   *Gateway
	cfg *Config
	// ts and admin are the loopback servers (nil in a bubble): the tests of real clients use them.
	ts    *httptest.Server
	admin *httptest.Server
	// url and adminURL are the listeners' base URLs, which client and adminClient reach.
	url, adminURL       string
	client, adminClient *http.Client
	// bubble: the harness runs in a testing/synctest bubble (startInBubble), where await checks
	// its condition once every goroutine is blocked instead of polling.
	bubble bool
	// callTimeout bounds a call sent by do (0: none). In a bubble a call may wait as long as the
	// test makes the fake clock run, and a call that never ends is a deadlock the bubble reports.
	callTimeout time.Duration
	reg         *prometheus.Registry
	log         *syncBuffer
	stop        func() error // cancels Run and waits for it
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
	h := newHarness(t, cfg, now, prepare)
	h.ts = httptest.NewServer(h.g.Handler())
	admin.Config.Handler = h.g.AdminHandler()
	admin.Start()
	h.admin = admin
	h.url, h.client, h.callTimeout = h.ts.URL, h.ts.Client(), 10*time.Second
	h.adminURL, h.adminClient = admin.URL, admin.Client()
	h.run()
	t.Cleanup(func() {
		assert.NoError(t, h.stop())
		h.ts.Close()
		h.admin.Close()
	})
	return h
}

// startInBubble builds a gateway from cfg on the clock of the testing/synctest bubble it is
// called in, serves it on n (gateway.test, admin.test) and runs it. Its upstreams must be served
// on n too: the gateway dials them there.
func startInBubble(t *testing.T, n *memNet, cfg *Config) *harness {
	t.Helper()
	h := newHarness(t, cfg, nil, func(g *Gateway) { g.transport.DialContext = n.dial })
	h.url = n.serve(t, "gateway.test", h.g.Handler())
	h.adminURL = n.serve(t, "admin.test", h.g.AdminHandler())
	h.client, h.adminClient = n.client(t), n.client(t)
	h.bubble = true
	h.run()
	// Registered after the listeners' cleanups, so run before them: the gateway's shutdown
	// answers the calls it still holds while the listeners are up, as start's cleanup does.
	t.Cleanup(func() { assert.NoError(t, h.stop()) })
	return h
}

// newHarness builds the gateway, prepare run on it first (nil: nothing).
func newHarness(t testing.TB, cfg *Config, now func() time.Time, prepare func(*Gateway)) *harness {
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
	return h
}

// run starts the gateway's Run loop; h.stop cancels it and waits for it.
func (h *harness) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.g.Run(ctx) }()
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
	if h.callTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.callTimeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, method, h.url+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
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
	req, err := http.NewRequest(method, h.adminURL+path, strings.NewReader(body))
	require.NoError(h.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := h.adminClient.Do(req)
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

// await waits until cond holds: on loopback, polling it for up to 3 s (waitFor); in a bubble,
// checking it once every goroutine of the bubble is blocked, when whatever the gateway was
// doing is done and the fake clock has not moved.
func (h *harness) await(what string, cond func() bool) {
	h.t.Helper()
	if !h.bubble {
		waitFor(h.t, what, cond)
		return
	}
	synctest.Wait()
	if !cond() {
		h.t.Fatalf("not so once the bubble is idle: %s", what)
	}
}

// settle waits until the gateway has finished accounting for every call (a client has its
// response a moment before the gateway books the usage). Only for tests with no call held.
func (h *harness) settle() {
	h.t.Helper()
	h.await("calls accounted for", func() bool { return h.g.calls.count() == 0 })
}

// waitQueued waits until the queue holds n sessions.
func (h *harness) waitQueued(n int) adminapi.StateView {
	h.t.Helper()
	var v adminapi.StateView
	h.await(fmt.Sprintf("%d queued", n), func() bool {
		v = h.state()
		return len(v.Queue) == n
	})
	return v
}

// advance moves a bubble's fake clock on by d, then waits until every goroutine is blocked:
// the gateway's Run loop has swept at each second on the way.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// answeredNow is a call's answer, which must be there once every goroutine of the bubble is
// blocked.
func answeredNow(t *testing.T, ch <-chan response) response {
	t.Helper()
	synctest.Wait()
	select {
	case r := <-ch:
		return r
	default:
		t.Fatal("the call was not answered")
		return response{}
	}
}

// pendingNow fails if the call is answered once every goroutine of the bubble is blocked.
func pendingNow(t *testing.T, ch <-chan response, what string) {
	t.Helper()
	synctest.Wait()
	select {
	case r := <-ch:
		t.Fatalf("%s: the call was answered: %s", what, r)
	default:
	}
}

// fakeUpstream is an upstream whose handler the test writes; it records the requests' headers.
type fakeUpstream struct {
	URL     string
	close   func()
	mu      sync.Mutex
	headers []http.Header
	paths   []string // escaped request paths
}

// newFakeUpstream serves h on a loopback test server until the test ends.
func newFakeUpstream(t testing.TB, h http.HandlerFunc) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{}
	ts := httptest.NewServer(f.recording(h))
	f.URL, f.close = ts.URL, ts.Close
	t.Cleanup(f.Close)
	return f
}

// newMemUpstream serves h as http://upstream.test on n until the test ends.
func newMemUpstream(t testing.TB, n *memNet, h http.HandlerFunc) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{}
	f.URL, f.close = n.serveUntil(t, "upstream.test", f.recording(h))
	return f
}

// recording is h recording each request's headers and path first.
func (f *fakeUpstream) recording(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.headers = append(f.headers, r.Header.Clone())
		f.paths = append(f.paths, r.URL.EscapedPath())
		f.mu.Unlock()
		h(w, r)
	})
}

// Close stops the upstream before the test's end.
func (f *fakeUpstream) Close() { f.close() }

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
