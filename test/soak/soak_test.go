package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/client"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/serve"
)

// The soak's shape. Workers each run agent sessions back to back, so that this many sessions are
// under way at once for the whole load phase.
const (
	workers = 600
	// loadFor is how long new sessions start; the sessions under way then finish (a few seconds).
	loadFor = 62 * time.Second
	// speed is the simulator's clock: fast enough that a call takes tens of milliseconds of wall
	// time on two cores, slow enough that streams come in several chunks.
	speed = 50
	// maxQueueWait is the gateway's max_queue_wait: short, so that tight budgets time some
	// sessions out (503 queue_timeout) within the run.
	maxQueueWait = 5 * time.Second
	// budgetEvery and shedEvery pace the admin changes.
	budgetEvery = 3 * time.Second
	shedEvery   = 2 * time.Second
	// heapMedianLimit bounds the last third's median heap sample against the first third's (after
	// warm-up), and heapMaxLimit their largest samples. The live data is bounded by the
	// concurrency (600 conversations of ≤ ~60 KB, the gateway's live table, the simulator with
	// Forget); what grows legitimately — the gateway's retry and shed memories, a few hundred bytes
	// per refused session — adds well under a MB in a run. A leak of a conversation per session
	// (~4 000 sessions) or of a body per call (~19 000 calls) would be hundreds of MB, linear in
	// time, and pass both limits. A single sample is noisy: it catches whatever request bodies are
	// in flight (up to ~100 MB across client, gateway and simulator), so steady-state samples
	// range over 60–140 MiB; the median takes one outlier per third, and the max limit is looser
	// (2×) so that one spike in the last third against a quiet first third does not fail the run.
	heapMedianLimit = 1.5
	heapMaxLimit    = 2.0
	// warmUp is when heap samples start counting: the first sessions' conversations are still
	// growing and the connection pools filling until then.
	warmUp = 15 * time.Second
	// adminToken is the gateway's admin bearer token.
	adminToken = "soak-admin-token-0123456789abcdef"
)

// budgets is the budget schedule, cycled every budgetEvery: tight values queue new sessions (and
// time some out), loose ones admit the queue at once.
var budgets = []int64{1_200_000, 2_500_000, 700_000, 1_800_000, 3_500_000, 900_000}

// callKey names one call: the session and the index of the call in it.
type callKey struct {
	session string
	index   int
}

// result is what one call got.
type result struct {
	status  int    // -1: transport error
	reason  string // x-basin-reason
	errCode string // the error body's code
	respID  string
	text    string
	usage   *usage
	done    bool // the stream ended with [DONE]
	latency time.Duration
	err     error
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// ledger is the client's view of the run: every call sent and its outcome.
type ledger struct {
	mu struct {
		sync.Mutex
		sent      map[callKey]int
		outcomes  map[callKey]int
		completed map[callKey]int
		respIDs   map[string]callKey
		refusals  map[string]int // "503 queue_timeout" → sessions
		// refusedSession maps a refused session to its status.
		refusedSession map[string]int
		admitted       map[string]bool
		latAll         []time.Duration
		latFirst       []time.Duration
		latLater       []time.Duration
		violations     []string

		sessionsStarted, sessionsCompleted, sessionsFailed int
	}
	inSession atomic.Int64
}

func newLedger() *ledger {
	l := &ledger{}
	l.mu.sent = map[callKey]int{}
	l.mu.outcomes = map[callKey]int{}
	l.mu.completed = map[callKey]int{}
	l.mu.respIDs = map[string]callKey{}
	l.mu.refusals = map[string]int{}
	l.mu.refusedSession = map[string]int{}
	l.mu.admitted = map[string]bool{}
	return l
}

func (l *ledger) violate(format string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.mu.violations) < 50 {
		l.mu.violations = append(l.mu.violations, fmt.Sprintf(format, a...))
	}
}

func (l *ledger) send(k callKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.sent[k]++
}

// record books a call's outcome and reports whether the session may go on.
func (l *ledger) record(k callKey, r result) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.outcomes[k]++
	if k.index == 0 {
		l.mu.sessionsStarted++
	}
	ok := r.status == http.StatusOK && r.err == nil && r.done
	if ok {
		l.mu.completed[k]++
		if prev, dup := l.mu.respIDs[r.respID]; dup {
			l.mu.violations = append(l.mu.violations, fmt.Sprintf("response %s delivered to %v and %v", r.respID, prev, k))
		}
		l.mu.respIDs[r.respID] = k
		l.mu.latAll = append(l.mu.latAll, r.latency)
		if k.index == 0 {
			l.mu.admitted[k.session] = true
			l.mu.latFirst = append(l.mu.latFirst, r.latency)
		} else {
			l.mu.latLater = append(l.mu.latLater, r.latency)
		}
		return true
	}
	refusal := (r.status == http.StatusServiceUnavailable || r.status == http.StatusTooManyRequests || r.status == 529) &&
		r.reason != "" && r.reason == r.errCode
	switch {
	case k.index == 0 && refusal:
		l.mu.refusals[fmt.Sprintf("%d %s", r.status, r.reason)]++
		l.mu.refusedSession[k.session] = r.status
	case refusal:
		l.mu.sessionsFailed++
		l.mu.violations = append(l.mu.violations, fmt.Sprintf("admitted session %s refused on call %d: %d %s",
			k.session, k.index, r.status, r.reason))
	default:
		l.mu.sessionsFailed++
		l.mu.violations = append(l.mu.violations, fmt.Sprintf("call %v failed: status %d reason %q done %v: %v",
			k, r.status, r.reason, r.done, r.err))
	}
	return false
}

func (l *ledger) sessionDone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.sessionsCompleted++
}

// runner sends the sessions.
type runner struct {
	api     string
	hc      *http.Client
	led     *ledger
	loadEnd time.Time
	system  string
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRequest struct {
	Model         string    `json:"model"`
	Messages      []message `json:"messages"`
	MaxTokens     int       `json:"max_tokens"`
	Stream        bool      `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// filler is n characters of three-letter words.
func filler(n int) string {
	s := strings.Repeat("abc ", n/4+1)
	return s[:n]
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// worker runs sessions back to back until the load phase ends.
func (r *runner) worker(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(uint64(w), 0x50A4))
	if !sleepCtx(ctx, time.Duration(rng.Int64N(int64(3*time.Second)))) {
		return
	}
	for n := 0; time.Now().Before(r.loadEnd) && ctx.Err() == nil; n++ {
		if !r.session(ctx, fmt.Sprintf("soak-%03d-%04d", w, n), rng) {
			// A refused agent backs off a little before its next session, as a real one would.
			sleepCtx(ctx, 200*time.Millisecond+time.Duration(rng.Int64N(int64(300*time.Millisecond))))
		}
	}
}

// session runs one agent session of 3–7 calls with tool pauses between them; it reports whether
// the session completed.
func (r *runner) session(ctx context.Context, id string, rng *rand.Rand) bool {
	r.led.inSession.Add(1)
	defer r.led.inSession.Add(-1)
	calls := 3 + rng.IntN(5)
	msgs := []message{{Role: "system", Content: r.system},
		{Role: "user", Content: "Task: " + filler(2000+rng.IntN(10_000))}}
	for i := range calls {
		if i > 0 && !sleepCtx(ctx, 300*time.Millisecond+time.Duration(rng.Int64N(int64(1200*time.Millisecond)))) {
			return false
		}
		k := callKey{id, i}
		res := r.call(ctx, k, msgs, 16+rng.IntN(80), i == calls-1)
		if !r.led.record(k, res) {
			if i > 0 {
				r.endSession(id) // do not leave it live until the idle timeout
			}
			return false
		}
		msgs = append(msgs, message{Role: "assistant", Content: res.text},
			message{Role: "user", Content: "Tool result: " + filler(800+rng.IntN(5200))})
	}
	r.led.sessionDone()
	return true
}

func (r *runner) endSession(id string) {
	req, err := http.NewRequest(http.MethodPost, r.api+"/v1/sessions/"+id+"/end", nil)
	if err != nil {
		return
	}
	if resp, err := r.hc.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// call sends one streamed chat call and reads it to its end.
func (r *runner) call(ctx context.Context, k callKey, msgs []message, maxTokens int, last bool) result {
	body := chatRequest{Model: "basin-sim", Messages: msgs, MaxTokens: maxTokens, Stream: true}
	body.StreamOptions.IncludeUsage = true
	b, err := json.Marshal(body)
	if err != nil {
		return result{status: -1, err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.api+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return result{status: -1, err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", k.session)
	if last {
		req.Header.Set("x-session-end", "true")
	}
	r.led.send(k)
	start := time.Now()
	resp, err := r.hc.Do(req)
	if err != nil {
		return result{status: -1, err: err, latency: time.Since(start)}
	}
	defer resp.Body.Close()
	res := result{status: resp.StatusCode, reason: resp.Header.Get("x-basin-reason")}
	if resp.StatusCode != http.StatusOK {
		raw, err := io.ReadAll(resp.Body)
		res.err = err
		var e struct {
			Error struct {
				Code any `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil {
			if s, ok := e.Error.Code.(string); ok {
				res.errCode = s
			}
		}
		if res.err == nil {
			res.err = fmt.Errorf("body %.200s", raw)
		}
		res.latency = time.Since(start)
		return res
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		res.err = fmt.Errorf("content type %q", ct)
		return res
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			res.done = true
			continue
		}
		if res.done {
			res.err = fmt.Errorf("data after [DONE]: %.100s", line)
			continue
		}
		var chunk struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *usage          `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil {
			res.err = fmt.Errorf("bad chunk %.100q: %w", line, err)
			continue
		}
		if chunk.Error != nil {
			res.err = fmt.Errorf("error event: %s", chunk.Error)
		}
		if res.respID == "" {
			res.respID = chunk.ID
		} else if chunk.ID != res.respID {
			res.err = fmt.Errorf("chunk id %s in stream %s", chunk.ID, res.respID)
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Delta.Content)
		}
		if chunk.Usage != nil {
			res.usage = chunk.Usage
		}
	}
	res.latency = time.Since(start)
	if err := sc.Err(); err != nil && res.err == nil {
		res.err = fmt.Errorf("read stream: %w", err)
	}
	res.text = text.String()
	switch {
	case res.err != nil:
	case res.respID == "":
		res.err = fmt.Errorf("stream without an id")
	case res.usage == nil:
		res.err = fmt.Errorf("stream without usage")
	case res.usage.CompletionTokens < 1 || res.usage.CompletionTokens > maxTokens:
		res.err = fmt.Errorf("completion_tokens %d, max_tokens %d", res.usage.CompletionTokens, maxTokens)
	case len(strings.Fields(res.text)) != res.usage.CompletionTokens:
		res.err = fmt.Errorf("%d words streamed, usage says %d", len(strings.Fields(res.text)), res.usage.CompletionTokens)
	}
	if res.err != nil {
		res.done = false
	}
	return res
}

// simState is the part of sim serve's /admin/state the soak reads.
type simState struct {
	LiveSessions     int   `json:"live_sessions"`
	ExternalSessions int   `json:"external_sessions"`
	ExternalCalls    int   `json:"external_calls_in_flight"`
	CallsCompleted   int64 `json:"calls_completed"`
}

func readSimState(ctx context.Context, base string) (simState, error) {
	var s simState
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/admin/state", nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// checkSnapshot checks a gateway snapshot's own consistency (current mode: a live session's
// demand is its context, so reserved = working set = Σ contexts) and returns violations.
func checkSnapshot(v adminapi.StateView) []string {
	var bad []string
	var sum int64
	for _, s := range v.Sessions {
		if s.Context < 0 || s.Peak < s.Context {
			bad = append(bad, fmt.Sprintf("session %s: context %d, peak %d", s.ID, s.Context, s.Peak))
		}
		sum += s.Context
	}
	if v.Reserved != sum || v.WorkingSet != sum || v.Reserved < 0 {
		bad = append(bad, fmt.Sprintf("reserved %d, working set %d, Σ live contexts %d", v.Reserved, v.WorkingSet, sum))
	}
	if v.Live != len(v.Sessions) || v.InCall < 0 || v.InCall > v.Live {
		bad = append(bad, fmt.Sprintf("live %d, listed %d, in call %d", v.Live, len(v.Sessions), v.InCall))
	}
	for _, q := range v.Queue {
		if q.Demand < 0 {
			bad = append(bad, fmt.Sprintf("queued %s demand %d", q.ID, q.Demand))
		}
	}
	c := v.Counters
	if c.Queued < c.AdmittedFromQueue+c.Shed+c.Cancelled ||
		c.Queued-(c.AdmittedFromQueue+c.Shed+c.Cancelled) != uint64(len(v.Queue)) {
		bad = append(bad, fmt.Sprintf("queued %d ≠ from queue %d + shed %d + cancelled %d + in queue %d",
			c.Queued, c.AdmittedFromQueue, c.Shed, c.Cancelled, len(v.Queue)))
	}
	if admitted := c.AdmittedAtOnce + c.AdmittedFromQueue; admitted < c.Ended || admitted-c.Ended != uint64(v.Live) {
		bad = append(bad, fmt.Sprintf("admitted %d − ended %d ≠ live %d", admitted, c.Ended, v.Live))
	}
	return bad
}

type heapSample struct {
	at         time.Duration
	heap       uint64
	goroutines int
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: long test, skipped under -short")
	}
	if os.Getenv("BASIN_SOAK") != "1" && os.Getenv("CI") == "" {
		t.Skip("soak: set BASIN_SOAK=1 (or CI) to run it (about 80 s)")
	}
	runStart := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 115*time.Second)
	defer cancel()

	// The simulated deployment: the paper's 1P3D H200, with an idle timeout far past any tool
	// pause, so that only x-session-end ends sessions.
	dep, err := sim.DeploymentPreset("paper-1p3d-h200")
	require.NoError(t, err)
	simSrv, err := serve.New(serve.Options{Sim: sim.Options{Seed: 7, Deployment: dep}, Speed: speed,
		IdleTimeout: 24 * time.Hour})
	require.NoError(t, err)
	simCtx, simCancel := context.WithCancel(context.Background())
	simDone := make(chan error, 1)
	go func() { simDone <- simSrv.Run(simCtx) }()
	simTS := httptest.NewServer(simSrv.Handler())
	t.Cleanup(func() {
		simCancel()
		select {
		case err := <-simDone:
			assert.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Error("sim serve: Run did not return")
		}
		simTS.Close()
	})

	// The gateway in front of it.
	cfg, err := gateway.ParseConfig(fmt.Appendf(nil, "upstreams: [%s]\nmax_queue_wait: %s\nidle_timeout: 10m\n"+
		"admission:\n  budget_tokens: %d\n", simTS.URL, maxQueueWait, budgets[0]))
	require.NoError(t, err)
	g, err := gateway.New(gateway.Options{Config: cfg, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 5 * time.Second,
		Getenv: func(k string) string {
			if k == gateway.AdminTokenEnv {
				return adminToken
			}
			return ""
		}})
	require.NoError(t, err)
	apiTS := httptest.NewServer(g.Handler())
	adminTS := httptest.NewServer(g.AdminHandler())
	gwCtx, gwCancel := context.WithCancel(context.Background())
	gwDone := make(chan error, 1)
	go func() { gwDone <- g.Run(gwCtx) }()
	t.Cleanup(func() {
		gwCancel()
		select {
		case err := <-gwDone:
			assert.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("gateway Run did not return")
		}
		apiTS.Close()
		adminTS.Close()
	})
	// The admin calls wait up to 30 s, not the client's 5 s default: the soak runs under the race
	// detector (several times slower) beside make test's other packages, and a /admin/state of
	// 600 sessions took more than 5 s there while the gateway answered every call correctly.
	// A gateway that stopped answering would still fail the check.
	admin, err := client.New(client.Options{BaseURL: adminTS.URL, Token: adminToken, Timeout: 30 * time.Second})
	require.NoError(t, err)

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 2 * workers
	tr.MaxIdleConnsPerHost = 2 * workers
	hc := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	led := newLedger()
	loadStart := time.Now()
	r := &runner{api: apiTS.URL, hc: hc, led: led, loadEnd: loadStart.Add(loadFor),
		system: "You are a coding agent. " + filler(1200)}

	// Memory: HeapAlloc after a GC every 5 s, from the start of the load.
	var heapMu sync.Mutex
	var heap []heapSample
	sampleHeap := func() {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heapMu.Lock()
		heap = append(heap, heapSample{at: time.Since(loadStart), heap: ms.HeapAlloc, goroutines: runtime.NumGoroutine()})
		heapMu.Unlock()
	}
	sampleHeap()

	// The operator: budget changes, sheds and consistency checks of the snapshot while the load runs.
	var budgetChanges, budgetAdmitted, shedCalls, stateChecks int
	var maxLive, maxQueued, maxInSession int
	var inSessionSum, inSessionN int64
	shedIDs := map[string]bool{}
	// whileLoading calls f every period from its own goroutine until the load ends: the operator
	// and the heap sampler apart, so that a slow admin call (the race detector beside make test's
	// other pass) does not delay the heap samples (one run took 5 where the check needs 6).
	var opWG sync.WaitGroup
	whileLoading := func(period time.Duration, f func(now time.Time)) {
		opWG.Go(func() {
			tick := time.NewTicker(period)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tick.C:
					if now.After(r.loadEnd) {
						return
					}
					f(now)
				}
			}
		})
	}
	// The operator's state, read by its ticks only.
	nextBudget, nextShed := loadStart.Add(budgetEvery), loadStart.Add(shedEvery+time.Second)
	nextState := loadStart
	bi := 1
	whileLoading(250*time.Millisecond, func(now time.Time) {
		n := int(led.inSession.Load())
		maxInSession = max(maxInSession, n)
		if now.Sub(loadStart) > 5*time.Second {
			inSessionSum += int64(n)
			inSessionN++
		}
		if !now.Before(nextBudget) {
			nextBudget = nextBudget.Add(budgetEvery)
			b := budgets[bi%len(budgets)]
			bi++
			res, err := admin.SetBudget(ctx, adminapi.BudgetRequest{Tokens: &b, ReferenceTokens: &b, Reason: "soak: budget step"})
			if err != nil {
				led.violate("set budget %d: %v", b, err)
			} else {
				budgetChanges++
				budgetAdmitted += len(res.Admitted)
				if res.After.BudgetTokens != b {
					led.violate("set budget %d: after %+v", b, res.After)
				}
			}
		}
		if !now.Before(nextShed) {
			nextShed = nextShed.Add(shedEvery)
			one := 1
			res, err := admin.Shed(ctx, adminapi.ShedRequest{Count: &one, Reason: "soak: shed the lowest priority"})
			if err != nil {
				led.violate("shed: %v", err)
			} else {
				shedCalls++
				for _, id := range res.Shed {
					shedIDs[id] = true
				}
			}
		}
		if !now.Before(nextState) {
			nextState = nextState.Add(time.Second)
			v, err := admin.State(ctx)
			if err != nil {
				led.violate("state: %v", err)
				return
			}
			stateChecks++
			maxLive = max(maxLive, v.Live)
			maxQueued = max(maxQueued, len(v.Queue))
			for _, b := range checkSnapshot(v) {
				led.violate("state at %s: %s", now.Sub(loadStart).Round(time.Second), b)
			}
		}
	})
	whileLoading(5*time.Second, func(time.Time) { sampleHeap() })

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { r.worker(ctx, w) })
	}
	wg.Wait()
	opWG.Wait()
	loadWall := time.Since(loadStart)
	require.NoError(t, ctx.Err(), "the soak ran out of its %s bound", 115*time.Second)

	// Settle: every session ended with x-session-end; the gateway books the end when the call
	// finishes, a moment after the client has read it.
	var final adminapi.StateView
	var fs simState
	deadline := time.Now().Add(10 * time.Second)
	for {
		final, err = admin.State(ctx)
		require.NoError(t, err)
		fs, err = readSimState(ctx, simTS.URL)
		require.NoError(t, err)
		if (final.Live == 0 && len(final.Queue) == 0 && fs.LiveSessions == 0 && fs.ExternalCalls == 0) ||
			time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sampleHeap()

	led.mu.Lock()
	defer led.mu.Unlock()
	m := &led.mu

	// Zero lost: every call sent has exactly one outcome; zero duplicated: no call completed twice,
	// no upstream response delivered twice, and the simulator completed exactly the calls the
	// clients completed.
	var calls, completedCalls int
	for k, n := range m.sent {
		calls += n
		assert.Equal(t, 1, n, "call %v sent %d times", k, n)
		assert.Equal(t, 1, m.outcomes[k], "call %v has %d outcomes", k, m.outcomes[k])
	}
	assert.Len(t, m.outcomes, len(m.sent), "outcomes for calls never sent")
	for k, n := range m.completed {
		completedCalls += n
		assert.Equal(t, 1, n, "call %v completed %d times", k, n)
	}
	assert.Len(t, m.respIDs, completedCalls, "distinct upstream responses")
	assert.EqualValues(t, completedCalls, fs.CallsCompleted, "calls completed by the simulator vs by the clients")
	assert.Empty(t, m.violations, "violations")

	// Refusals: only first calls, only queue timeouts and sheds; every 529 is a session the admin
	// API shed, and every shed session got its 529.
	var shedRefused, timeouts int
	for id, status := range m.refusedSession {
		if status == 529 {
			shedRefused++
			assert.True(t, shedIDs[id], "session %s got 529 but was not shed", id)
		}
	}
	for id := range shedIDs {
		assert.Equal(t, 529, m.refusedSession[id], "shed session %s", id)
	}
	timeouts = m.refusals["503 queue_timeout"]
	for code := range m.refusals {
		assert.Contains(t, []string{"503 queue_timeout", "529 shed"}, code, "unexpected refusal")
	}
	sessionsRefused := len(m.refusedSession)
	assert.Equal(t, m.sessionsStarted, m.sessionsCompleted+sessionsRefused+m.sessionsFailed, "sessions accounted for")
	assert.Positive(t, budgetChanges)
	assert.Positive(t, len(shedIDs), "no session was shed: the budget never queued enough")

	// Accounting at the end: nothing live or queued on either side, nothing reserved, and the
	// gateway's counters agree with the clients.
	for _, b := range checkSnapshot(final) {
		t.Errorf("final state: %s", b)
	}
	c := final.Counters
	assert.Zero(t, final.Live, "gateway live sessions after the run")
	assert.Empty(t, final.Queue, "gateway queue after the run")
	assert.Zero(t, final.Reserved, "reserved tokens after the run")
	assert.Zero(t, final.WorkingSet, "working set after the run")
	assert.Zero(t, final.InCall, "sessions in call after the run")
	assert.EqualValues(t, m.sessionsStarted, c.Arrivals, "arrivals")
	assert.EqualValues(t, len(m.admitted), c.AdmittedAtOnce+c.AdmittedFromQueue, "admissions")
	assert.EqualValues(t, m.sessionsCompleted, c.Ended, "sessions ended")
	assert.EqualValues(t, len(shedIDs), c.Shed, "shed")
	assert.EqualValues(t, timeouts, c.Cancelled, "queue timeouts")
	assert.Zero(t, c.Refused+c.OverQuota, "refused / over quota")
	assert.Zero(t, fs.LiveSessions, "simulator live sessions after the run")
	assert.Zero(t, fs.ExternalCalls, "simulator calls in flight after the run")

	// Memory.
	heapMu.Lock()
	var steady []heapSample
	for _, s := range heap[:len(heap)-1] { // the last sample is after the drain
		if s.at >= warmUp {
			steady = append(steady, s)
		}
	}
	series := make([]string, 0, len(heap))
	for _, s := range heap {
		series = append(series, fmt.Sprintf("%ds:%.1fMiB/%dg", int(s.at.Round(time.Second)/time.Second),
			float64(s.heap)/(1<<20), s.goroutines))
	}
	heapMu.Unlock()
	require.GreaterOrEqual(t, len(steady), 6, "heap samples after warm-up")
	third := len(steady) / 3
	maxOf := func(s []heapSample) uint64 {
		var m uint64
		for _, x := range s {
			m = max(m, x.heap)
		}
		return m
	}
	median := func(s []heapSample) uint64 {
		h := make([]uint64, 0, len(s))
		for _, x := range s {
			h = append(h, x.heap)
		}
		slices.Sort(h)
		return h[len(h)/2]
	}
	firstThird, lastThird := steady[:third], steady[len(steady)-third:]
	growth := float64(maxOf(lastThird)) / float64(maxOf(firstThird))
	medianGrowth := float64(median(lastThird)) / float64(median(firstThird))
	assert.LessOrEqual(t, medianGrowth, heapMedianLimit, "heap: last third's median %d vs first third's %d",
		median(lastThird), median(firstThird))
	assert.LessOrEqual(t, growth, heapMaxLimit, "heap: last third's max %d vs first third's %d",
		maxOf(lastThird), maxOf(firstThird))

	refused := make([]string, 0, len(m.refusals))
	for code, n := range m.refusals {
		refused = append(refused, fmt.Sprintf("%s=%d", code, n))
	}
	slices.Sort(refused)
	meanInSession := 0.0
	if inSessionN > 0 {
		meanInSession = float64(inSessionSum) / float64(inSessionN)
	}
	t.Logf("soak figures:\n"+
		"  duration: sessions started for %s, last session done after %s, whole test %s\n"+
		"  workers %d; sessions in progress (client): max %d, mean %.0f; gateway max live %d, max queued %d\n"+
		"  sessions: started %d, completed %d, refused %d (%s), failed %d, admitted %d\n"+
		"  calls: sent %d, completed %d (simulator: %d), later-call refusals 0 expected, violations %d\n"+
		"  latency (send → [DONE]): all p50 %s p99 %s; first calls p50 %s p99 %s; later calls p50 %s p99 %s\n"+
		"  budget changes %d (admitted at once by a looser budget: %d); shed calls %d, sessions shed %d (529 seen %d)\n"+
		"  state checks mid-run %d; gateway counters %+v\n"+
		"  heap (HeapAlloc after GC / goroutines): %s\n"+
		"  heap growth, last third / first third after %s warm-up: median %.2f (limit %.1f), max %.2f (limit %.1f)",
		loadFor, loadWall.Round(time.Millisecond), time.Since(runStart).Round(time.Millisecond),
		workers, maxInSession, meanInSession, maxLive, maxQueued,
		m.sessionsStarted, m.sessionsCompleted, sessionsRefused, strings.Join(refused, ", "), m.sessionsFailed, len(m.admitted),
		calls, completedCalls, fs.CallsCompleted, len(m.violations),
		percentile(m.latAll, 0.5).Round(time.Microsecond*100), percentile(m.latAll, 0.99).Round(time.Microsecond*100),
		percentile(m.latFirst, 0.5).Round(time.Microsecond*100), percentile(m.latFirst, 0.99).Round(time.Microsecond*100),
		percentile(m.latLater, 0.5).Round(time.Microsecond*100), percentile(m.latLater, 0.99).Round(time.Microsecond*100),
		budgetChanges, budgetAdmitted, shedCalls, len(shedIDs), shedRefused,
		stateChecks, c,
		strings.Join(series, " "),
		warmUp, medianGrowth, heapMedianLimit, growth, heapMaxLimit)
}
