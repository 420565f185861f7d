package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/adminapi"
)

// trappedEngines serves a deployment stuck in the trap: W = 2.4 × C, 30% of prompt tokens hit.
// Counters advance with the wall clock times speed, as an accelerated deployment's do.
type trappedEngines struct {
	start time.Time
	speed float64
}

func (e trappedEngines) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := time.Since(e.start).Seconds() * e.speed
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	switch r.URL.Path {
	case "/metrics/prefill-0":
		fmt.Fprintf(w, "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{engine_type=\"prefill\",tp_rank=\"0\"} 1000000\n"+
			"# TYPE sglang:realtime_tokens_total counter\n"+
			"sglang:realtime_tokens_total{engine_type=\"prefill\",mode=\"prefill_cache\",tp_rank=\"0\"} %.0f\n"+
			"sglang:realtime_tokens_total{engine_type=\"prefill\",mode=\"prefill_compute\",tp_rank=\"0\"} %.0f\n",
			1e6+20000*s*0.3, 1e6+20000*s*0.7)
	case "/metrics/decode-0":
		fmt.Fprintf(w, "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{engine_type=\"decode\",tp_rank=\"0\"} 800000\n"+
			"# TYPE sglang:kv_used_tokens gauge\nsglang:kv_used_tokens{engine_type=\"decode\",tp_rank=\"0\"} 300000\n"+
			"# TYPE sglang:kv_available_tokens gauge\nsglang:kv_available_tokens{engine_type=\"decode\",tp_rank=\"0\"} 500000\n"+
			"# TYPE sglang:num_requests_total counter\nsglang:num_requests_total{engine_type=\"decode\",tp_rank=\"0\"} %.0f\n", 1000+1.5*s)
	case "/metrics/gateway":
		fmt.Fprintf(w, "# TYPE basin_gateway_working_set_tokens gauge\nbasin_gateway_working_set_tokens 2400000\n"+
			"# TYPE basin_gateway_sessions_live gauge\nbasin_gateway_sessions_live 96\n"+
			"# TYPE basin_gateway_sessions_queued gauge\nbasin_gateway_sessions_queued 0\n"+
			"# TYPE basin_gateway_session_arrivals_total counter\nbasin_gateway_session_arrivals_total %.3f\n"+
			"# TYPE basin_gateway_session_completions_total counter\nbasin_gateway_session_completions_total %.3f\n",
			100+0.05*s, 4+0.02*s)
	default:
		http.NotFound(w, r)
	}
}

// adminStandIn is the gateway's admin API as far as the daemon uses it. killAt, when set, is
// called with each budget request before it is applied; it decides whether to apply it.
type adminStandIn struct {
	mu      sync.Mutex
	budget  int64
	ref     int64
	applied []int64  // budgets applied, in order
	seen    []int64  // budget requests received, in order
	terms   []string // their Basin-Daemon-Term headers
	hook    func(tokens int64) (apply bool)
}

func (g *adminStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/admin/state":
		v := adminapi.StateView{Budget: g.budget, ReferenceBudget: g.ref,
			Reserved: 2_400_000, WorkingSet: 2_400_000, Live: 96, Queue: []adminapi.QueuedSession{}, Now: time.Now()}
		_ = json.NewEncoder(w).Encode(v)
	case r.Method == http.MethodPut && r.URL.Path == "/admin/budget":
		var req struct {
			Tokens    int64 `json:"tokens"`
			Reference int64 `json:"reference_tokens"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		g.seen = append(g.seen, req.Tokens)
		g.terms = append(g.terms, r.Header.Get("Basin-Daemon-Term"))
		if g.hook != nil && !g.hook(req.Tokens) {
			return // killed before the gateway applied it: no answer
		}
		before := g.budget
		g.budget, g.applied = req.Tokens, append(g.applied, req.Tokens)
		if req.Reference > 0 {
			g.ref = req.Reference
		}
		fmt.Fprintf(w, `{"before":{"budget_tokens":%d},"after":{"budget_tokens":%d},"admitted":[]}`, before, g.budget)
	case r.Method == http.MethodPut && r.URL.Path == "/admin/daemon-term":
		fmt.Fprintf(w, `{"daemon_term":%s}`, r.Header.Get("Basin-Daemon-Term")) // a takeover's claim
	default:
		http.NotFound(w, r)
	}
}

func (g *adminStandIn) count(list func(*adminStandIn) []int64, tokens int64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, t := range list(g) {
		if t == tokens {
			n++
		}
	}
	return n
}

// TestDaemonKilledMidAction kills the daemon process with SIGKILL while its budget cut is in
// flight — once after the gateway applied it, once before — restarts it on the same data
// directory, and checks that the cut is applied exactly once and recorded done.
func TestDaemonKilledMidAction(t *testing.T) {
	if testing.Short() {
		t.Skip("builds basin and runs the daemon twice")
	}
	if raceEnabled {
		t.Skip("end to end: the processes under test are built without the race detector; `go test` without -race runs it")
	}
	busy.Add(1) // before t.Parallel: TestReplicatedGateways waits for it
	defer busy.Done()
	t.Parallel()
	const cut = 700_000 // 0.7 × B_ref, B_ref = min(0.9 × 1.9 × C, C) = C = 1M
	bin := basinBinary(t)

	for _, tc := range []struct {
		name      string
		applyIt   bool // the gateway applied the cut before the daemon died
		wantSeen  int  // cut requests the gateway received in all
		wantAudit string
	}{
		{"after the gateway applied it", true, 1, "found applied after a restart"},
		{"before the gateway applied it", false, 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ps := newProcs(t, dir)
			started := time.Now()
			engines := httptest.NewServer(trappedEngines{start: started, speed: 20})
			// Both daemons watch the deployment on its clock, from its start: the restarted one
			// carries on its time.
			clock := []string{"--clock-speed", "20", "--clock-start", started.Format(time.RFC3339Nano)}
			t.Cleanup(engines.Close)
			admin := &adminStandIn{budget: 1_000_000, ref: 1_000_000}
			adminSrv := httptest.NewServer(admin)
			t.Cleanup(adminSrv.Close)

			listen := freeAddrs(t, 1)[0]
			cfg := fmt.Sprintf("deployment: kill\nlisten: %s\ntoken_file: token\ndata_dir: data\n", listen) +
				trappedDeployment(t, dir, engines.URL, adminSrv.URL)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "daemon.yaml"), []byte(cfg), 0o600))

			var first *proc
			killed := make(chan struct{})
			admin.mu.Lock()
			admin.hook = func(tokens int64) bool {
				if tokens != cut || first == nil {
					return true
				}
				select {
				case <-killed:
					return true // the restarted daemon
				default:
				}
				_ = syscall.Kill(-first.cmd.Process.Pid, syscall.SIGKILL)
				<-first.done
				close(killed)
				return tc.applyIt
			}
			admin.mu.Unlock()
			d1 := ps.start("daemon-1", bin, append([]string{"daemon", "--config", "daemon.yaml"}, clock...)...)
			admin.mu.Lock()
			first = d1
			admin.mu.Unlock()
			select {
			case <-killed:
			case <-time.After(45 * time.Second):
				t.Fatalf("the daemon never cut the budget; log:\n%s", tail(d1.log, 30))
			}
			// The audit log holds the intent and no outcome: the process died mid-action.
			audit := filepath.Join(dir, "data", "audit.jsonl")
			assert.Equal(t, 0, outcomes(t, audit, cut), "no outcome recorded before the kill")

			second := ps.start("daemon-2", bin, append([]string{"daemon", "--config", "daemon.yaml"}, clock...)...)
			mustWaitFor(t, time.Now().Add(30*time.Second), "the interrupted cut recorded done", []*proc{second}, func() (bool, string) {
				n := outcomes(t, audit, cut)
				return n >= 1, fmt.Sprintf("%d outcomes", n)
			})
			time.Sleep(time.Second) // a few more steps: nothing may repeat
			second.stop()
			assert.Equal(t, 1, admin.count(func(g *adminStandIn) []int64 { return g.applied }, cut), "the cut applied once")
			assert.Equal(t, tc.wantSeen, admin.count(func(g *adminStandIn) []int64 { return g.seen }, cut), "cut requests received")
			assert.Equal(t, 1, outcomes(t, audit, cut), "one outcome for the cut")
			if tc.wantAudit != "" {
				b, err := os.ReadFile(audit)
				require.NoError(t, err)
				assert.Contains(t, string(b), tc.wantAudit)
			}
		})
	}
}

// trappedDeployment writes into dir what a daemon watching the trapped stand-in engines needs —
// their calibration (the knee at 1.9 × C), the daemon's token and the gateway admin token — and
// returns the daemon config's collector, gateway and remediation blocks for engines and admin.
func trappedDeployment(t *testing.T, dir, engines, admin string) string {
	t.Helper()
	var pts []detector.Point
	for i := 1; i <= 12; i++ {
		wc := 0.2 * float64(i)
		hit := 0.95
		if wc > 1.9 {
			hit = 0.5
		}
		pts = append(pts, detector.Point{WorkingSetOverCache: wc, HitRate: hit, Sessions: 40 * wc, CompletionRatePerS: 0.08})
	}
	cal, err := detector.NewCalibration(pts, 30, time.Now(), "test")
	require.NoError(t, err)
	require.NoError(t, cal.Save(filepath.Join(dir, "calibration.json")))
	writeTestFile(t, dir, "token", "daemon-token\n")
	writeTestFile(t, dir, "admin-token", "admin-token\n")
	return fmt.Sprintf(`interval: 5s
calibration: calibration.json
collector:
  targets:
    - {name: prefill-0, url: "%[1]s/metrics/prefill-0", role: prefill, dialect: sglang}
    - {name: decode-0, url: "%[1]s/metrics/decode-0", role: decode, dialect: sglang}
    - {name: gateway, url: "%[1]s/metrics/gateway", role: gateway, dialect: basin-gateway}
gateway: {admin_url: "%[2]s", token_file: admin-token}
remediate: {disable_shedding: true}
cron: {daily_summary: "-", knee_reestimate: "-"}
`, engines, admin)
}

// outcomes counts the done or failed records of budget actions to tokens in an audit log.
func outcomes(t *testing.T, path string, tokens int64) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Phase  string `json:"phase"`
			Budget *struct {
				To int64 `json:"to_tokens"`
			} `json:"budget"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Budget != nil && r.Budget.To == tokens &&
			(r.Phase == "done" || r.Phase == "failed") {
			n++
		}
	}
	return n
}
