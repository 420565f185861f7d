//go:build unix

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/redistest"
)

// TestDaemonsOnAStore runs two `basin daemon` processes on one real redis-server in front of a
// trapped deployment: one acts, the other waits (no request of its own reaches the gateway).
// The acting one is SIGKILLed mid-incident, after its budget cut left but before the gateway
// answered; the other takes over within the lease, reconciles the intent it finds in the shared
// audit stream, and exactly one outcome is recorded for it.
func TestDaemonsOnAStore(t *testing.T) {
	if testing.Short() {
		t.Skip("builds basin and runs two daemons and redis-server")
	}
	if raceEnabled {
		t.Skip("end to end: the processes under test are built without the race detector; `go test` without -race runs it")
	}
	busy.Add(1) // before t.Parallel: TestReplicatedGateways waits for it
	defer busy.Done()
	t.Parallel()
	const cut = 700_000 // 0.7 × B_ref, as in TestDaemonKilledMidAction
	const ttl = 2 * time.Second
	srv := redistest.Start(t, "always")
	dir := t.TempDir()
	bin := basinBinary(t)
	ps := newProcs(t, dir)
	started := time.Now()
	engines := httptest.NewServer(trappedEngines{start: started, speed: 20})
	t.Cleanup(engines.Close)
	admin := &adminStandIn{budget: 1_000_000, ref: 1_000_000}
	adminSrv := httptest.NewServer(admin)
	t.Cleanup(adminSrv.Close)

	common := trappedDeployment(t, dir, engines.URL, adminSrv.URL)
	dp := startDaemonPair(t, ps, bin, dir, common, srv.Addr(), ttl, started)
	names, procsByName, status := dp.names, dp.procs, dp.status
	acting, actingTerm := dp.acting, dp.actingTerm
	other := 1 - acting
	t.Logf("%s acts in term %d, %s waits", names[acting], actingTerm, names[other])

	// SIGKILL the acting daemon when its cut reaches the gateway, before the gateway applies it.
	killed := make(chan struct{})
	admin.mu.Lock()
	admin.hook = func(tokens int64) bool {
		select {
		case <-killed:
			return true // the successor's
		default:
		}
		if tokens != cut {
			return true
		}
		p := procsByName[names[acting]]
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		close(killed)
		return false
	}
	admin.mu.Unlock()
	select {
	case <-killed:
	case <-time.After(45 * time.Second):
		t.Fatalf("the acting daemon never cut the budget; log:\n%s", tail(procsByName[names[acting]].log, 30))
	}
	killedAt := time.Now()

	mustWaitFor(t, time.Now().Add(3*ttl+20*time.Second), names[other]+" acting", []*proc{procsByName[names[other]]}, func() (bool, string) {
		r, term, err := status(other)
		if err != nil {
			return false, err.Error()
		}
		return r == "acting" && term > actingTerm, fmt.Sprintf("%s term %d", r, term)
	})
	t.Logf("%s took over %v after the kill", names[other], time.Since(killedAt).Round(10*time.Millisecond))

	// The interrupted cut: exactly one outcome in the shared audit stream, applied once.
	client := srv.Client(t)
	streamOutcomes := func() (intents, outcomes int) {
		return budgetAudit(t, client, func(to int64) bool { return to == cut })
	}
	mustWaitFor(t, time.Now().Add(30*time.Second), "the interrupted cut recorded", nil, func() (bool, string) {
		_, o := streamOutcomes()
		return o >= 1, strconv.Itoa(o) + " outcomes"
	})
	time.Sleep(2 * time.Second) // a few more steps: nothing may repeat
	intents, outs := streamOutcomes()
	assert.Equal(t, intents, outs, "exactly one outcome per intent in the shared audit stream")
	assert.Equal(t, 1, admin.count(func(g *adminStandIn) []int64 { return g.applied }, cut), "the cut applied once")
	admin.mu.Lock()
	defer admin.mu.Unlock()
	for i, term := range admin.terms {
		assert.NotEmpty(t, term, "admin write %d carries the daemon's term", i)
	}
}

// daemonPair is two `basin daemon` processes, a and b, on one store: one acting, one standby.
type daemonPair struct {
	names      []string
	listens    []string
	procs      map[string]*proc
	acting     int
	actingTerm uint64
	// status reads daemon i's role and term from its API.
	status func(i int) (role string, term uint64, err error)
}

// startDaemonPair writes the two daemons' configurations (deployment "ha", common appended)
// into dir, the directory ps starts its processes in, starts them on the store at redisAddr with their clocks 20× from started, and
// waits until one acts and the other stands by.
func startDaemonPair(t *testing.T, ps *procs, bin, dir, common, redisAddr string, ttl time.Duration, started time.Time) *daemonPair {
	t.Helper()
	dp := &daemonPair{names: []string{"a", "b"}, listens: freeAddrs(t, 2), procs: map[string]*proc{}}
	for i, n := range dp.names {
		writeTestFile(t, dir, "daemon-"+n+".yaml", fmt.Sprintf(`deployment: ha
listen: %s
token_file: token
data_dir: data-%s
instance: %s
store: {url: "redis://%s/0", lease_ttl: %s}
`, dp.listens[i], n, n, redisAddr, ttl)+common)
	}
	clock := []string{"--clock-speed", "20", "--clock-start", started.Format(time.RFC3339Nano)}
	for _, n := range dp.names {
		dp.procs[n] = ps.start("daemon-"+n, bin, append([]string{"daemon", "--config", "daemon-" + n + ".yaml"}, clock...)...)
	}
	dp.status = func(i int) (role string, term uint64, err error) {
		var s struct {
			Role string `json:"role"`
			Term uint64 `json:"term"`
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		err = getJSON(ctx, "http://"+dp.listens[i]+"/api/v1/status", "", &s)
		return s.Role, s.Term, err
	}
	mustWaitFor(t, time.Now().Add(20*time.Second), "one daemon acting, the other standby", nil, func() (bool, string) {
		r0, t0, e0 := dp.status(0)
		r1, t1, e1 := dp.status(1)
		switch {
		case e0 != nil || e1 != nil:
			return false, fmt.Sprint(e0, e1)
		case r0 == "acting" && r1 == "standby":
			dp.acting, dp.actingTerm = 0, t0
			return true, ""
		case r1 == "acting" && r0 == "standby":
			dp.acting, dp.actingTerm = 1, t1
			return true, ""
		}
		return false, r0 + "/" + r1
	})
	return dp
}

// budgetAudit counts the intents and the outcomes (done or failed) of the budget actions whose
// target match accepts, in the daemons' shared audit stream.
func budgetAudit(t *testing.T, client *redis.Client, match func(to int64) bool) (intents, outcomes int) {
	t.Helper()
	msgs, err := client.XRange(t.Context(), "basin:ha:daemon:audit", "-", "+").Result()
	require.NoError(t, err)
	for _, m := range msgs {
		var r struct {
			Phase  string `json:"phase"`
			Budget *struct {
				To int64 `json:"to_tokens"`
			} `json:"budget"`
		}
		raw, _ := m.Values["rec"].(string)
		if json.Unmarshal([]byte(raw), &r) != nil || r.Budget == nil || !match(r.Budget.To) {
			continue
		}
		switch r.Phase {
		case "intent":
			intents++
		case "done", "failed":
			outcomes++
		}
	}
	return intents, outcomes
}
