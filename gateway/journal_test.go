package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
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
)

// childConfigEnv names the config file of the gateway process TestGatewayProcess runs.
const childConfigEnv = "BASIN_GATEWAY_TEST_CHILD_CONFIG"

// TestGatewayProcess is not a test: it is the gateway process that TestKill9KeepsAdmittedSessions
// starts (this test binary run again) and kills. Its periodic state save is an hour away, so that
// only the journal can keep what it admitted.
func TestGatewayProcess(t *testing.T) {
	path := os.Getenv(childConfigEnv)
	if path == "" {
		t.Skip("the gateway process of TestKill9KeepsAdmittedSessions")
	}
	cfg, err := LoadConfig(path)
	require.NoError(t, err)
	g, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	require.NoError(t, err)
	g.saveEvery = time.Hour
	ln, err := net.Listen("tcp", cfg.Listen)
	require.NoError(t, err)
	aln, err := net.Listen("tcp", cfg.AdminListen)
	require.NoError(t, err)
	go func() { _ = http.Serve(ln, g.Handler()) }()
	go func() { _ = http.Serve(aln, g.AdminHandler()) }()
	_ = g.Run(context.Background()) // until killed
}

// TestKill9KeepsAdmittedSessions admits a session in a gateway process, kills the process with
// SIGKILL right after the session's first answer (long before any periodic save), restarts it on
// the same state_file and checks that the session is still live: its next call passes at once, not
// as a new arrival, and the budget it holds still makes a newcomer queue.
func TestKill9KeepsAdmittedSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the gateway as a process twice")
	}
	up := newFakeUpstream(t, okJSON(100, 10))
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "admin-token"), []byte(testToken+"\n"), 0o600))
	listen, admin := freeAddr(t), freeAddr(t)
	cfgPath := filepath.Join(dir, "gateway.yaml")
	require.NoError(t, os.WriteFile(cfgPath, fmt.Appendf(nil, `listen: %s
admin_listen: %s
admin_token_file: admin-token
upstreams: [%s]
max_queue_wait: 30s
admission: {budget_tokens: 1, reference_budget_tokens: 1}
state_file: state.json
`, listen, admin, up.URL), 0o600))

	startProc := func() (stop func()) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestGatewayProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), childConfigEnv+"="+cfgPath)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		stop = func() {
			_ = cmd.Process.Kill() // SIGKILL: no shutdown path runs
			<-done
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := http.Get("http://" + admin + "/healthz")
			if err == nil {
				resp.Body.Close()
				break
			}
			select {
			case <-done:
				t.Fatalf("the gateway process exited: %s", out.String())
			default:
			}
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("the gateway process did not come up: %s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return stop
	}
	call := func(ctx context.Context, id string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+listen+"/v1/chat/completions",
			strings.NewReader(chatBody(3)))
		require.NoError(t, err)
		req.Header.Set("x-session-id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return -1, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	state := func() adminapi.StateView {
		req, err := http.NewRequest(http.MethodGet, "http://"+admin+"/admin/state", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var v adminapi.StateView
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		return v
	}

	stop := startProc()
	code, body := call(context.Background(), "veteran")
	require.Equal(t, http.StatusOK, code, body)
	stop()
	_, err := os.Stat(filepath.Join(dir, "state.json"))
	require.ErrorIs(t, err, os.ErrNotExist, "no state save happened: only the journal can know the session")

	stop = startProc()
	defer stop()
	v := state()
	require.Equal(t, 1, v.Live, "the session admitted before the kill is live again")
	require.Len(t, v.Sessions, 1)
	assert.Equal(t, "veteran", v.Sessions[0].ID)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	code, body = call(ctx, "veteran")
	require.Equal(t, http.StatusOK, code, body)
	v = state()
	assert.Zero(t, v.Counters.Arrivals, "its next call was not a new arrival")
	assert.Zero(t, v.Counters.Queued)

	// It still holds its share of the 1-token budget: a newcomer waits.
	nctx, ncancel := context.WithCancel(context.Background())
	newcomer := make(chan int, 1)
	go func() { c, _ := call(nctx, "newcomer"); newcomer <- c }()
	waitFor(t, "the newcomer queued", func() bool { return state().Queued == 1 })
	ncancel()
	<-newcomer
}

// journalConfig is a gateway config with a state file, and the state file's path.
func journalConfig(t *testing.T, upstream string) (*Config, string) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "state.json")
	return baseConfig(t, []string{upstream}, func(c *Config) { c.StateFile = state }), state
}

// abandon leaves a gateway as a crash would: no shutdown, no final save. The test servers are
// closed so that nothing more reaches it. Its Run loop is stopped only when the test ends, after
// the gateways started later (their cleanups run first), so that no goroutine outlives the test.
func (h *harness) abandon() {
	h.ts.Close()
	h.admin.Close()
	stop := h.stop
	h.stop = func() error { return nil }
	h.t.Cleanup(func() { _ = stop() }) // its late shutdown's save is of no interest
}

func TestJournalKeepsEachChangeUntilTheNextSave(t *testing.T) {
	up := newFakeUpstream(t, okJSON(100, 10))
	cfg, state := journalConfig(t, up.URL)
	h1 := start(t, cfg, nil)
	decodeCompletion(t, h1.chat("kept", 5, nil))
	decodeCompletion(t, h1.chat("ended", 5, nil))
	r, err := h1.do(context.Background(), http.MethodPost, "/v1/sessions/ended/end", nil, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	decodeCompletion(t, h1.chat("", 5, nil)) // anonymous: a one-call session, not journaled
	r = h1.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":5000,"reference_tokens":4000,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	r = h1.adminDo(http.MethodPut, "/admin/affinity", testToken, `{"enabled":true,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	h1.settle()
	waitFor(t, "the end record written", func() bool {
		b, _ := os.ReadFile(state + journalSuffix)
		return bytes.Count(b, []byte(`"op":"end"`)) == 1
	})
	lines, err := os.ReadFile(state + journalSuffix)
	require.NoError(t, err)
	assert.Equal(t, 5, bytes.Count(lines, []byte("\n")), "admit kept, admit ended, end ended, budget, affinity:\n%s", lines)
	h1.abandon()

	h2 := start(t, cfg, nil)
	s := h2.state()
	require.Len(t, s.Sessions, 1)
	assert.Equal(t, "kept", s.Sessions[0].ID)
	assert.Equal(t, int64(5000), s.Budget)
	assert.Equal(t, int64(4000), s.ReferenceBudget)
	assert.True(t, s.Affinity.Enabled)
	assert.Equal(t, 1, s.Upstreams[0].Sessions, "the session keeps its upstream")
	// The replay was compacted at start: the state file holds it and the journal is empty.
	data, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"kept"`)
	assert.NotContains(t, string(data), `"ended"`)
	lines, err = os.ReadFile(state + journalSuffix)
	require.NoError(t, err)
	assert.Empty(t, lines)
	assert.NoFileExists(t, state+journalOldSuffix)
}

// TestRunFlushesTheJournalAndSavesTheState runs in a testing/synctest bubble: a session's end,
// a record nobody waits for, reaches the journal file at the Run loop's next second, and the
// state file is first written 10 s after the start, compacting the journal.
func TestRunFlushesTheJournalAndSavesTheState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newMemNet()
		up := newMemUpstream(t, n, okJSON(100, 10))
		cfg, state := journalConfig(t, up.URL)
		start := time.Now()
		h := startInBubble(t, n, cfg)
		journal := func() string {
			b, err := os.ReadFile(state + journalSuffix)
			require.NoError(t, err)
			return string(b)
		}
		savedAt := func() time.Time {
			b, err := os.ReadFile(state)
			require.NoError(t, err)
			var st stateFile
			require.NoError(t, json.Unmarshal(b, &st))
			return st.SavedAt
		}
		decodeCompletion(t, h.chat("a", 5, nil))
		decodeCompletion(t, h.chat("a", 5, map[string]string{"x-session-end": "true"}))
		h.settle()
		assert.Contains(t, journal(), `"op":"admit"`, "an admission is written before its call goes on")
		assert.NotContains(t, journal(), `"op":"end"`, "an end waits for the next flush")
		advance(time.Second)
		assert.Contains(t, journal(), `"op":"end"`, "flushed by the Run loop within the second")

		const every = 10 * time.Second // as Run's doc says, not the constant it is built from
		advance(every - 2*time.Second)
		assert.NoFileExists(t, state, "not saved before 10 s")
		assert.NotEmpty(t, journal())
		advance(time.Second)
		assert.True(t, start.Add(every).Equal(savedAt()), "saved at 10 s, not %v", savedAt().Sub(start))
		assert.Empty(t, journal(), "compacted into the state file")
	})
}

func TestJournalCompactionAtTheSave(t *testing.T) {
	up := newFakeUpstream(t, okJSON(100, 10))
	cfg, state := journalConfig(t, up.URL)
	h := start(t, cfg, nil)
	decodeCompletion(t, h.chat("a", 5, nil))
	h.settle()
	require.NoError(t, h.g.saveState())
	lines, err := os.ReadFile(state + journalSuffix)
	require.NoError(t, err)
	assert.Empty(t, lines, "compacted into the state file")
	assert.NoFileExists(t, state+journalOldSuffix)
	decodeCompletion(t, h.chat("b", 5, nil))
	lines, err = os.ReadFile(state + journalSuffix)
	require.NoError(t, err)
	assert.Contains(t, string(lines), `"id":"b"`, "records after the save go to the fresh journal")
	assert.NotContains(t, string(lines), `"id":"a"`)
}

func TestJournalReplayAtStart(t *testing.T) {
	admit := func(id string) string {
		return fmt.Sprintf(`{"op":"admit","at":"2026-06-01T08:00:00Z","session":{"id":%q,"arrival":"2026-06-01T08:00:00Z",`+
			`"admitted":"2026-06-01T08:00:00Z","last_done":"2026-06-01T08:00:00Z","context_tokens":120,"peak_tokens":120,`+
			`"predicted_peak_tokens":4000}}`+"\n", id)
	}
	end := func(id string) string {
		return fmt.Sprintf(`{"op":"end","at":"2026-06-01T08:00:01Z","id":%q}`+"\n", id)
	}
	for _, tc := range []struct {
		name      string
		old, cur  string
		wantLive  []string
		wantErr   string // New fails naming this
		wantLog   string
		wantNoLog string
	}{
		{name: "records in order", cur: admit("a") + admit("b") + end("a"), wantLive: []string{"b"}},
		{name: "an unfinished compaction's records first", old: admit("a") + admit("b"), cur: end("b") + admit("c"),
			wantLive: []string{"a", "c"}},
		{name: "replay is idempotent", old: admit("a"), cur: admit("a") + end("a") + admit("a"), wantLive: []string{"a"}},
		{name: "a torn last line is skipped and reported", cur: admit("a") + admit("b")[:40],
			wantLive: []string{"a"}, wantLog: "torn last record"},
		{name: "a whole last line is not reported", cur: admit("a"), wantLive: []string{"a"}, wantNoLog: "torn"},
		{name: "a bad line in the middle is an error naming it", cur: admit("a") + "{not json\n" + admit("b"),
			wantErr: "state.json.journal: line 2"},
		{name: "an unknown op is an error naming its line", cur: `{"op":"grow","at":"2026-06-01T08:00:00Z"}` + "\n" + admit("a"),
			wantErr: `line 1: unknown op "grow"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, state := journalConfig(t, "http://127.0.0.1:1")
			if tc.old != "" {
				require.NoError(t, os.WriteFile(state+journalOldSuffix, []byte(tc.old), 0o600))
			}
			require.NoError(t, os.WriteFile(state+journalSuffix, []byte(tc.cur), 0o600))
			logs := &syncBuffer{}
			g, err := New(Options{Config: cfg, Registerer: prometheus.NewRegistry(),
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			defer func() { _ = g.journal.close() }()
			var live []string
			for _, ls := range g.core.Snapshot(g.now(), true).Sessions {
				live = append(live, ls.ID)
			}
			assert.Equal(t, tc.wantLive, live)
			if tc.wantLog != "" {
				assert.Contains(t, logs.String(), tc.wantLog)
			}
			if tc.wantNoLog != "" {
				assert.NotContains(t, logs.String(), tc.wantNoLog)
			}
			assert.NoFileExists(t, state+journalOldSuffix, "compacted at start")
		})
	}
}

// TestJournalGroupCommit admits many sessions at once: every first call waits for its own record,
// and the records share writes.
func TestJournalGroupCommit(t *testing.T) {
	up := newFakeUpstream(t, okJSON(100, 10))
	cfg, state := journalConfig(t, up.URL)
	cfg.Admission.BudgetTokens = 1 << 40
	h := start(t, cfg, nil)
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			decodeCompletion(t, h.chat(fmt.Sprintf("s%d", i), 3, nil))
		}()
	}
	wg.Wait()
	lines, err := os.ReadFile(state + journalSuffix)
	require.NoError(t, err)
	assert.Equal(t, n, bytes.Count(lines, []byte(`"op":"admit"`)))
}

// BenchmarkAdmissionJournal is the cost the journal adds to an admission: a new session's first
// call through the gateway (to a loopback upstream), without a state file and with one, one
// client at a time and many at once (group commit).
func BenchmarkAdmissionJournal(b *testing.B) {
	up := httptest.NewServer(okJSON(100, 10))
	b.Cleanup(up.Close)
	for _, bc := range []struct {
		name     string
		state    bool
		parallel bool
	}{
		{"no-state-file/serial", false, false},
		{"journal/serial", true, false},
		{"no-state-file/parallel", false, true},
		{"journal/parallel", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := baseConfig(b, []string{up.URL}, func(c *Config) {
				c.Admission.BudgetTokens = 1 << 50
				if bc.state {
					c.StateFile = filepath.Join(b.TempDir(), "state.json")
				}
			})
			g, err := New(Options{Config: cfg, Registerer: prometheus.NewRegistry()})
			require.NoError(b, err)
			if g.journal != nil {
				b.Cleanup(func() { _ = g.journal.close() })
			}
			h := g.Handler()
			body := chatBody(3)
			var seq atomicCounter
			one := func() {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("x-session-id", fmt.Sprintf("s%d", seq.next()))
				req.Header.Set("x-session-end", "true")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
			b.ResetTimer()
			if bc.parallel {
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						one()
					}
				})
				return
			}
			for b.Loop() {
				one()
			}
		})
	}
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCounter) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n
}
