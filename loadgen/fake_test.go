package loadgen

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// twoCallTrace is one recorded session of two calls, so that fake-server tests know what every
// session sends: 1000 then 1300 prompt tokens (600 shared), 20 output tokens each, 5 s of tool
// between.
const twoCallTrace = `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":1000,"reused_tokens":600,"output_tokens":20}
{"session_id":"a","call":1,"start":"2026-06-01T00:00:30Z","prompt_tokens":1300,"output_tokens":20,"gap_before_s":5}
`

// traceScenario writes the two-call trace and a scenario replaying it; arrivals is the YAML of
// the arrivals block.
func traceScenario(t *testing.T, seed uint64, duration, arrivals string) *scenario.Scenario {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "trace.jsonl"), []byte(twoCallTrace), 0o600))
	yaml := fmt.Sprintf(`name: fake
seed: %d
duration: %s
deployment: {preset: paper-1p1d-h100}
workload: {kind: trace, trace: {path: trace.jsonl, format: basin}}
arrivals: %s
`, seed, duration, arrivals)
	path := filepath.Join(dir, "scenario.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	sc, err := scenario.Load(path)
	require.NoError(t, err)
	return sc
}

// oneSessionScenario is a trace scenario whose seed offers exactly one session, so that waits
// recorded by a fake Sleep belong to it.
func oneSessionScenario(t *testing.T) *scenario.Scenario {
	t.Helper()
	for seed := uint64(1); seed <= 100; seed++ {
		sc := traceScenario(t, seed, "1m", "{rate_per_min: 1}")
		so, err := sc.Options("")
		require.NoError(t, err)
		ofs, err := offers(so, 10)
		require.NoError(t, err)
		if len(ofs) == 1 {
			return sc
		}
	}
	t.Fatal("no seed in 1..100 offers exactly one session")
	return nil
}

// reply is what the fake server answers one request with.
type reply struct {
	status     int
	retryAfter string
	body       string // for errors; a 200 answers a proper completion
	broken     string // for a 200 stream: "error" ends with an error event, "cut" without [DONE]
	// blockUntil, when set, holds the answer until then (or until the client goes away).
	blockUntil time.Time
}

// fake is an OpenAI-compatible server whose replies a script chooses per session and attempt. It
// ends sessions as the gateway does (POST /v1/sessions/{id}/end: 200 for a session it has seen a
// call of, else 404) and records each end; while down, it drops every request unanswered, as a
// crashed server would.
type fake struct {
	script func(session string, attempt int) reply
	// down, when set, says whether the server is down at that instant; crashed takes it down
	// for good.
	down    func(time.Time) bool
	crashed atomic.Bool
	mu      struct {
		sync.Mutex
		attempts  map[string]int // by session
		headers   []http.Header
		bodies    []chatRequest
		cancelled int
		// ends counts the end requests answered 200, by session; endAt is when the last came.
		ends  map[string]int
		endAt map[string]time.Time
		// refused holds the sessions an end was answered 404 for; crossed those of them whose
		// call reached the server after that answer (a call cut by a cancelled run can cross
		// its session's end on the wire).
		refused, crossed map[string]bool
		// lastCall is when the last call was answered.
		lastCall time.Time
	}
}

func newFake(script func(session string, attempt int) reply) *fake {
	f := &fake{script: script}
	f.mu.attempts = map[string]int{}
	f.mu.ends = map[string]int{}
	f.mu.endAt = map[string]time.Time{}
	f.mu.refused, f.mu.crossed = map[string]bool{}, map[string]bool{}
	return f
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.crashed.Load() || f.down != nil && f.down(time.Now()) {
		panic(http.ErrAbortHandler) // the connection drops with no answer
	}
	if id, ok := strings.CutPrefix(r.URL.Path, "/v1/sessions/"); ok && r.Method == http.MethodPost {
		if id, ok := strings.CutSuffix(id, "/end"); ok {
			f.serveEnd(w, id)
			return
		}
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.Header.Get("x-session-id")
	f.mu.Lock()
	n := f.mu.attempts[id]
	f.mu.attempts[id]++
	if f.mu.refused[id] {
		f.mu.crossed[id] = true
	}
	f.mu.lastCall = time.Now()
	f.mu.headers = append(f.mu.headers, r.Header.Clone())
	f.mu.bodies = append(f.mu.bodies, req)
	f.mu.Unlock()
	rp := f.script(id, n)
	if !rp.blockUntil.IsZero() {
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
		}
		select {
		case <-r.Context().Done():
			f.mu.Lock()
			f.mu.cancelled++
			f.mu.Unlock()
			return
		case <-time.After(time.Until(rp.blockUntil)):
		}
	}
	if rp.status != 0 && rp.status != http.StatusOK {
		if rp.retryAfter != "" {
			w.Header().Set("Retry-After", rp.retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rp.status)
		_, _ = io.WriteString(w, rp.body)
		return
	}
	prompt := 0
	for _, m := range req.Messages {
		prompt += len(m.Content)
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}`,
		(prompt+3)/4+4*len(req.Messages), req.MaxTokens)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok done"},"finish_reason":"stop"}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, ": comment\n\n")
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	fmt.Fprint(w, "data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\n\n")
	switch rp.broken {
	case "error":
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine died\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n")
		return
	case "cut":
		return
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" done\"},\"finish_reason\":\"stop\"}]}\n\n")
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\n", usage)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// serveEnd ends a session the server has seen a call of, as the gateway does: 200 and counted, or
// 404 when it knows no such session.
func (f *fake) serveEnd(w http.ResponseWriter, id string) {
	f.mu.Lock()
	_, seen := f.mu.attempts[id]
	if seen {
		f.mu.ends[id]++
		f.mu.endAt[id] = time.Now()
	} else {
		f.mu.refused[id] = true
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if !seen {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"session %q is not live","code":"session_not_found"}}`, id)
		return
	}
	_, _ = io.WriteString(w, `{"ended":true}`)
}

// ends returns the sessions ended, with how many times each.
func (f *fake) ends() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.mu.ends {
		out[k] = v
	}
	return out
}

// crossed returns the sessions whose call reached the server after their end was refused.
func (f *fake) crossed() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.mu.crossed)
}

func (f *fake) attempts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.mu.attempts {
		out[k] = v
	}
	return out
}

// sleeps is an injected Sleep that returns at once and records what it was asked to wait.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

// atLeast returns the recorded waits of at least min (Retry-After waits, as arrivals and tool
// pauses at the tests' speed are far shorter).
func (s *sleeps) atLeast(min time.Duration) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	for _, d := range s.d {
		if d >= min {
			out = append(out, d)
		}
	}
	return out
}

func TestRefusals(t *testing.T) {
	errBody := `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`
	cases := []struct {
		name        string
		script      func(attempt int) reply
		opts        func(*Options)
		outcome     Outcome
		retries     int
		attempts    int
		waits       int           // Retry-After waits
		waitEach    time.Duration // Retry-After, before jitter
		errContains string
	}{
		{name: "503 twice then answered", outcome: Completed, retries: 2, attempts: 4, waits: 2, waitEach: time.Second,
			script: func(n int) reply {
				if n < 2 {
					return reply{status: 503, retryAfter: "1", body: errBody}
				}
				return reply{}
			}},
		{name: "429 deferred by default", outcome: Completed, retries: 1, attempts: 3, waits: 1, waitEach: 2 * time.Second,
			script: func(n int) reply {
				if n == 0 {
					return reply{status: 429, retryAfter: "2"}
				}
				return reply{}
			}},
		{name: "503 without Retry-After waits the default", outcome: Completed, retries: 1, attempts: 3, waits: 1,
			waitEach: DefaultRetryAfter,
			script: func(n int) reply {
				if n == 0 {
					return reply{status: 503}
				}
				return reply{}
			}},
		{name: "529 sheds without retry", outcome: Shed, attempts: 1, errContains: "status 529",
			script: func(int) reply { return reply{status: 529, retryAfter: "1", body: errBody} }},
		{name: "429 terminal rejects", outcome: Rejected, attempts: 1, errContains: "status 429",
			opts:   func(o *Options) { o.Reject429Terminal = true },
			script: func(int) reply { return reply{status: 429, retryAfter: "1"} }},
		{name: "503 still deferred with 429 terminal", outcome: Completed, retries: 1, attempts: 3, waits: 1,
			waitEach: time.Second,
			opts:     func(o *Options) { o.Reject429Terminal = true },
			script: func(n int) reply {
				if n == 0 {
					return reply{status: 503, retryAfter: "1"}
				}
				return reply{}
			}},
		{name: "retry budget exhausted rejects", outcome: Rejected, retries: 3, attempts: 4, waits: 3, waitEach: time.Second,
			errContains: "retry budget of 3 spent",
			opts:        func(o *Options) { o.RetryBudget = 3 },
			script:      func(int) reply { return reply{status: 503, retryAfter: "1"} }},
		{name: "no retries with a negative budget", outcome: Rejected, attempts: 1,
			opts:   func(o *Options) { o.RetryBudget = -1 },
			script: func(int) reply { return reply{status: 503, retryAfter: "1"} }},
		{name: "max retry wait rejects", outcome: Rejected, retries: 1, attempts: 2, waits: 1, waitEach: 10 * time.Second,
			errContains: "max_retry_wait",
			opts:        func(o *Options) { o.MaxRetryWait = 15 * time.Second },
			script:      func(int) reply { return reply{status: 503, retryAfter: "10"} }},
		{name: "500 is an error", outcome: Error, attempts: 1, errContains: "status 500: boom",
			script: func(int) reply { return reply{status: 500, body: errBody} }},
		{name: "400 is an error", outcome: Error, attempts: 1, errContains: "status 400",
			script: func(int) reply { return reply{status: 400, body: "bad"} }},
		{name: "error event mid-stream", outcome: Error, attempts: 1, errContains: "engine died",
			script: func(int) reply { return reply{broken: "error"} }},
		{name: "stream cut before DONE", outcome: Error, attempts: 1, errContains: "[DONE]",
			script: func(int) reply { return reply{broken: "cut"} }},
		{name: "second call refused", outcome: Shed, attempts: 2,
			script: func(n int) reply {
				if n == 1 {
					return reply{status: 529}
				}
				return reply{}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(func(_ string, n int) reply { return tc.script(n) })
			ts := httptest.NewServer(f)
			defer ts.Close()
			sl := &sleeps{}
			o := Options{Target: ts.URL, Scenario: oneSessionScenario(t), Speed: 600, PerSession: true,
				HTTPClient: ts.Client(), Sleep: sl.sleep, RunID: "r"}
			if tc.opts != nil {
				tc.opts(&o)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rep, err := Run(ctx, o)
			require.NoError(t, err)
			require.Len(t, rep.PerSession, 1)
			s := rep.PerSession[0]
			assert.Equal(t, tc.outcome, s.Outcome, s.Error)
			assert.Equal(t, tc.retries, s.Retries)
			assert.Equal(t, tc.retries, rep.Retries)
			assert.Equal(t, map[string]int{"r-1": tc.attempts}, f.attempts())
			if tc.errContains != "" {
				assert.Contains(t, s.Error, tc.errContains)
			}
			if tc.outcome == Completed {
				assert.Empty(t, s.Error)
				assert.Equal(t, 2, s.CallsDone)
			}
			waits := sl.atLeast(500 * time.Millisecond)
			require.Len(t, waits, tc.waits, "Retry-After waits: %v", waits)
			for _, w := range waits {
				assert.GreaterOrEqual(t, w, tc.waitEach)
				assert.LessOrEqual(t, w, time.Duration(float64(tc.waitEach)*(1+DefaultJitterFraction)))
			}
		})
	}
}

func TestJitterSpreadsRetries(t *testing.T) {
	f := newFake(func(_ string, n int) reply {
		if n < 5 {
			return reply{status: 503, retryAfter: "1"}
		}
		return reply{}
	})
	ts := httptest.NewServer(f)
	defer ts.Close()
	for _, tc := range []struct {
		jitter   float64
		distinct bool
	}{{0, true}, {-1, false}, {0.5, true}} {
		sl := &sleeps{}
		rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: oneSessionScenario(t), Speed: 600,
			HTTPClient: ts.Client(), Sleep: sl.sleep, JitterFraction: tc.jitter})
		require.NoError(t, err)
		require.Equal(t, 1, rep.Sessions.Completed)
		waits := sl.atLeast(500 * time.Millisecond)
		require.Len(t, waits, 5)
		hi := 1 + max(tc.jitter, 0)
		if tc.jitter == 0 {
			hi = 1 + DefaultJitterFraction
		}
		seen := map[time.Duration]bool{}
		for _, w := range waits {
			assert.GreaterOrEqual(t, w, time.Second)
			assert.LessOrEqual(t, w, time.Duration(hi*float64(time.Second)))
			seen[w] = true
		}
		assert.Equal(t, tc.distinct, len(seen) > 1, "jitter %v: %v", tc.jitter, waits)
	}
}

func TestRequests(t *testing.T) {
	f := newFake(func(string, int) reply { return reply{} })
	ts := httptest.NewServer(f)
	defer ts.Close()
	sl := &sleeps{}
	rep, err := Run(context.Background(), Options{Target: ts.URL + "/", Scenario: oneSessionScenario(t), Speed: 600,
		HTTPClient: ts.Client(), Sleep: sl.sleep, RunID: "run7", SessionHeader: "x-claude-code-session-id",
		APIKey: "sk-test", Model: "m1", PerSession: true})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Sessions.Completed)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.mu.bodies, 2)
	for i, h := range f.mu.headers {
		assert.Equal(t, "run7-1", h.Get("x-claude-code-session-id"))
		assert.Empty(t, h.Get("x-session-id"))
		assert.Equal(t, "Bearer sk-test", h.Get("Authorization"))
		assert.Equal(t, strconv.FormatBool(i == 1), strings.ToLower(cmp.Or(h.Get("x-session-end"), "false")),
			"x-session-end only on the last call")
	}
	first, second := f.mu.bodies[0], f.mu.bodies[1]
	assert.Equal(t, "m1", first.Model)
	assert.True(t, first.Stream)
	require.NotNil(t, first.StreamOptions)
	assert.True(t, first.StreamOptions.IncludeUsage)
	assert.Equal(t, 20, first.MaxTokens)
	assert.True(t, first.IgnoreEOS, "exactly max_tokens: the scenario's output length")
	require.Len(t, first.Messages, 2)
	assert.Equal(t, "system", first.Messages[0].Role)
	require.Len(t, second.Messages, 4)
	assert.Equal(t, first.Messages, second.Messages[:2], "the second call repeats the first prompt")
	assert.Equal(t, message{Role: "assistant", Content: "ok done"}, second.Messages[2],
		"the answer is the concatenated stream")
	assert.Equal(t, "user", second.Messages[3].Role)
	p, shared := serveTokens(second.Messages)
	assert.Equal(t, 1300, p)
	assert.Equal(t, 600, shared)
	// The tool pause is the trace's 5 s of virtual time at 600×.
	assert.Contains(t, sl.d, 5*time.Second/600)
	s := rep.PerSession[0]
	require.NotNil(t, s.MaxPromptError)
	assert.Zero(t, *s.MaxPromptError)
}

func TestNonStreamingAnswer(t *testing.T) {
	f := newFake(func(string, int) reply { return reply{} })
	ts := httptest.NewServer(f)
	defer ts.Close()
	sl := &sleeps{}
	rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: oneSessionScenario(t), Speed: 600,
		HTTPClient: ts.Client(), Sleep: sl.sleep, NoStream: true})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Sessions.Completed)
	assert.NotNil(t, rep.FirstCallWaitP50)
	assert.Nil(t, rep.TTFTP50)
	require.NotNil(t, rep.PrefixHitRate, "the fake reports cached_tokens 0: a hit rate of 0, not unknown")
	assert.Zero(t, *rep.PrefixHitRate)
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.False(t, f.mu.bodies[0].Stream)
	assert.Nil(t, f.mu.bodies[0].StreamOptions)
	assert.Equal(t, "ok done", f.mu.bodies[1].Messages[2].Content)
}

// blocking answers nothing for 5 s or until the client goes away.
func blocking(string, int) reply { return reply{blockUntil: time.Now().Add(5 * time.Second)} }

func TestKillAtCancelsSessionsInFlight(t *testing.T) {
	// Answers are held until 400 ms from now, past the KillAt of 1 min (100 ms at 600×): sessions
	// that arrived before it are still in flight then; later ones complete.
	release := time.Now().Add(400 * time.Millisecond)
	f := newFake(func(string, int) reply { return reply{blockUntil: release} })
	ts := httptest.NewServer(f)
	defer ts.Close()
	check := noLeaks(t)
	// Only the extra stream offers sessions, for 2 min; it is killed at 1 min.
	sc := traceScenario(t, 5, "2m", "{rate_per_min: 0, extra: [{from: 0s, to: 2m, rate_per_min: 8, kill_at: 1m}]}")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, Options{Target: ts.URL, Scenario: sc, Speed: 600, PerSession: true})
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 3*time.Second)
	check()
	assert.False(t, rep.Interrupted)
	before := 0
	for _, s := range rep.PerSession {
		assert.Equal(t, "extra-0", s.Class)
		if s.ArrivalS < 60 {
			before++
			assert.Equal(t, Killed, s.Outcome, "session %s arrived at %.1f s", s.ID, s.ArrivalS)
			assert.InDelta(t, 60, s.EndS, 30, "killed at 1 min of virtual time")
		} else {
			assert.Equal(t, Completed, s.Outcome, "session %s arrived at %.1f s, after the kill", s.ID, s.ArrivalS)
		}
	}
	require.GreaterOrEqual(t, before, 2, "sessions before the kill")
	require.Less(t, before, rep.Sessions.Arrived, "sessions after the kill")
	assert.Equal(t, before, rep.Sessions.Killed)
	// Killed sessions are ended at the server, as the simulator ends them at KillAt.
	checkEnded(t, f, rep)
	assert.Equal(t, before, rep.SessionEnds.Ended)
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, before, f.mu.cancelled, "every in-flight call of a killed session was cancelled")
}

func TestCancelReturnsPartialReport(t *testing.T) {
	f := newFake(blocking)
	ts := httptest.NewServer(f)
	defer ts.Close()
	check := noLeaks(t)
	// 60 sessions over 10 virtual minutes, 1 s of wall time at 600×; cancelled after 150 ms.
	sc := traceScenario(t, 9, "10m", "{rate_per_min: 6}")
	so, err := sc.Options("")
	require.NoError(t, err)
	all, err := offers(so, DefaultMaxSessions)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(150*time.Millisecond, cancel)
	start := time.Now()
	rep, err := Run(ctx, Options{Target: ts.URL, Scenario: sc, Speed: 600})
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 2*time.Second)
	check()
	assert.True(t, rep.Interrupted)
	require.Positive(t, rep.Sessions.Arrived, "some sessions arrived in 150 ms")
	assert.Less(t, rep.Offered, len(all), "later sessions never arrived")
	assert.Equal(t, rep.Sessions.Arrived, rep.Sessions.Unfinished)
	assert.Zero(t, rep.Sessions.Completed)
	assert.Equal(t, 0.0, *rep.CompletionRate)
}

func TestGoodputAccounting(t *testing.T) {
	// Sessions 1, 4, 7… are shed, 2, 5, 8… rejected (no retries), the rest completed.
	script := func(id string, _ int) reply {
		n, err := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
		if err != nil {
			return reply{status: 400}
		}
		switch n % 3 {
		case 1:
			return reply{status: 529}
		case 2:
			return reply{status: 503, retryAfter: "1"}
		}
		return reply{}
	}
	sc := traceScenario(t, 4, "10m", "{rate_per_min: 1.5}")
	cases := []struct {
		name     string
		unloaded func(s sim.SessionSpec) time.Duration
		allGood  bool
	}{
		{name: "no unloaded time"},
		{name: "generous deadline", unloaded: func(sim.SessionSpec) time.Duration { return time.Hour }, allGood: true},
		{name: "impossible deadline", unloaded: func(sim.SessionSpec) time.Duration { return time.Nanosecond }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(newFake(script))
			defer ts.Close()
			sl := &sleeps{}
			rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: sc, Speed: 600, HTTPClient: ts.Client(),
				Sleep: sl.sleep, RetryBudget: -1, Unloaded: tc.unloaded})
			require.NoError(t, err)
			c := rep.Sessions
			require.GreaterOrEqual(t, c.Arrived, 6)
			assert.Equal(t, c.Arrived, c.Completed+c.Rejected+c.Shed)
			assert.Equal(t, (c.Arrived+2)/3, c.Shed)
			assert.Equal(t, (c.Arrived+1)/3, c.Rejected)
			require.NotNil(t, rep.CompletionRate)
			assert.InDelta(t, float64(c.Completed)/float64(c.Arrived), *rep.CompletionRate, 1e-12,
				"refused sessions stay in the denominator")

			js, err := json.Marshal(rep)
			require.NoError(t, err)
			var m map[string]any
			require.NoError(t, json.Unmarshal(js, &m))
			for _, k := range []string{"target", "scenario", "seed", "speed", "sessions", "goodput_per_hour",
				"completion_rate", "first_call_wait_p50_s", "ttft_p50_s", "retries"} {
				assert.Contains(t, m, k)
			}
			assert.NotContains(t, m, "per_session", "per-session records only when asked for")
			if tc.unloaded == nil {
				assert.Nil(t, rep.GoodputPerHour)
				assert.Nil(t, c.Good)
				assert.Nil(t, m["goodput_per_hour"], "null, not a silent zero")
				assert.Nil(t, m["sessions"].(map[string]any)["good"])
				return
			}
			require.NotNil(t, rep.GoodputPerHour)
			require.NotNil(t, c.Good)
			want := 0
			if tc.allGood {
				want = c.Completed
			}
			assert.Equal(t, want, *c.Good)
			assert.InDelta(t, float64(want)/(10.0/60), *rep.GoodputPerHour, 1e-9)
		})
	}
}

func TestMeasurementWindow(t *testing.T) {
	ts := httptest.NewServer(newFake(func(string, int) reply { return reply{} }))
	defer ts.Close()
	sc := traceScenario(t, 2, "10m", "{rate_per_min: 2}")
	sc.Measure.From, sc.Measure.To = scenario.Duration(3*time.Minute), scenario.Duration(6*time.Minute)
	sl := &sleeps{}
	rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: sc, Speed: 600, HTTPClient: ts.Client(),
		Sleep: sl.sleep, PerSession: true})
	require.NoError(t, err)
	in := 0
	for _, s := range rep.PerSession {
		inWindow := s.ArrivalS >= 180 && s.ArrivalS < 360
		assert.Equal(t, inWindow, s.Measured, "session %s at %.0f s", s.ID, s.ArrivalS)
		if inWindow {
			in++
		}
	}
	require.Positive(t, in)
	assert.Less(t, in, rep.Offered)
	assert.Equal(t, in, rep.Sessions.Arrived)
	assert.Equal(t, 3.0, rep.MeasureFromMin)
	assert.Equal(t, 6.0, rep.MeasureToMin)
}

// TestCutBeforeTheWindow: a run cancelled before any session arrived in the window measured
// nothing, so its goodput is unknown (null), not zero.
func TestCutBeforeTheWindow(t *testing.T) {
	f := newFake(func(string, int) reply { return reply{} })
	ts := httptest.NewServer(f)
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := Run(ctx, Options{Target: ts.URL, Scenario: oneSessionScenario(t), Speed: 600, HTTPClient: ts.Client(),
		Unloaded: func(sim.SessionSpec) time.Duration { return time.Minute }})
	require.NoError(t, err)
	assert.True(t, rep.Interrupted)
	assert.Zero(t, rep.Sessions.Arrived)
	assert.Nil(t, rep.GoodputPerHour, "nothing arrived in the window: goodput unknown")
	require.NotNil(t, rep.Sessions.Good)
	assert.Zero(t, *rep.Sessions.Good)
}

// TestProgress: a run reports how it is going while it runs, and its last report agrees with the
// final counts.
func TestProgress(t *testing.T) {
	script := func(id string, _ int) reply {
		n, err := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
		if err != nil {
			return reply{status: 400}
		}
		if n%3 == 1 {
			return reply{status: 529}
		}
		return reply{}
	}
	ts := httptest.NewServer(newFake(script))
	defer ts.Close()
	sc := traceScenario(t, 4, "10m", "{rate_per_min: 1.5}")
	var (
		mu   sync.Mutex
		seen []Progress
	)
	rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: sc, Speed: 600, HTTPClient: ts.Client(),
		RetryBudget: -1, ProgressEvery: 10 * time.Millisecond, Progress: func(p Progress) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, p)
		}})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(seen), 2, "reports along the way and at the end")
	for i, p := range seen {
		assert.Equal(t, 10*time.Minute, p.Duration)
		assert.LessOrEqual(t, p.Elapsed, p.Duration)
		assert.Equal(t, rep.Offered, p.Offered)
		assert.Equal(t, p.Arrived, p.Live+p.Completed+p.Refused+p.Failed+p.Unfinished, "every arrived session is counted once")
		if i > 0 {
			assert.GreaterOrEqual(t, p.Elapsed, seen[i-1].Elapsed)
			assert.GreaterOrEqual(t, p.Arrived, seen[i-1].Arrived)
		}
	}
	last := seen[len(seen)-1]
	c := rep.Sessions
	assert.Equal(t, Progress{Elapsed: last.Elapsed, Duration: 10 * time.Minute, Offered: rep.Offered, Arrived: c.Arrived,
		Completed: c.Completed, Refused: c.Rejected + c.Shed}, last)
	assert.Positive(t, last.Refused)
	assert.Positive(t, last.Completed)

	_, err = Run(context.Background(), Options{Target: ts.URL, Scenario: sc, ProgressEvery: -time.Second})
	assert.ErrorContains(t, err, "progress_every: must be > 0")
}
