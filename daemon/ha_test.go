package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/client"
	"github.com/basin-dev/basin/internal/httpjson"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/test/testclock"
)

// haPair is daemons of one deployment, each with its own data directory, on one miniredis, one
// clock and one fake gateway. The campaigns are stepped by hand with the daemons' steps, and
// the store's TTLs follow the clock.
type haPair struct {
	t     *testing.T
	m     *miniredis.Miniredis
	clock *testclock.Clock
	gw    *fakeGateway
	envs  []*env
	ds    []*Daemon
}

func newHAPair(t *testing.T, names ...string) *haPair {
	t.Helper()
	p := &haPair{t: t, m: miniredis.RunT(t), clock: testclock.New(t0), gw: newFakeGateway(testReference)}
	for _, name := range names {
		e := newEnv(t, fmt.Sprintf("store:\n  url: redis://%s/0\ninstance: %s\n", p.m.Addr(), name))
		e.clock, e.gw = p.clock, p.gw
		d := e.daemon()
		t.Cleanup(func() { _ = d.Close() })
		p.envs, p.ds = append(p.envs, e), append(p.ds, d)
	}
	return p
}

// advance moves the daemons' clock and the store's TTLs together.
func (p *haPair) advance(d time.Duration) {
	p.clock.Advance(d)
	p.m.FastForward(d)
}

// step advances one interval and, for each daemon in alive, renews or campaigns, then steps.
func (p *haPair) step(alive ...int) {
	p.t.Helper()
	p.advance(stepEvery)
	for _, i := range alive {
		e, d := p.envs[i], p.ds[i]
		e.dep.advance(stepEvery)
		e.dep.feed(p.t, d, d.clock.Now())
		d.ha.camp.Step(context.Background())
		d.Step(context.Background())
	}
}

func (p *haPair) collapse() {
	for _, e := range p.envs {
		e.dep.collapse()
	}
}

// stream is the shared audit as the store holds it.
func (p *haPair) stream() []remediate.Record {
	p.t.Helper()
	recs, err := auditStream{d: p.ds[0], key: p.ds[0].cfg.Store.Prefix + ":daemon:audit"}.Load(context.Background())
	require.NoError(p.t, err)
	return recs
}

// outcomes counts each (seq, kind)'s outcomes in recs.
func outcomes(recs []remediate.Record) map[string]int {
	out := map[string]int{}
	for _, r := range recs {
		k := fmt.Sprintf("%d %s", r.Seq, r.Kind)
		switch r.Phase {
		case remediate.PhaseIntent:
			out[k] += 0
		case remediate.PhaseDone, remediate.PhaseFailed:
			out[k]++
		}
	}
	return out
}

// gauge reads a gauge of the daemon's registry (-1 when absent).
func gauge(t *testing.T, d *Daemon, name string) float64 {
	t.Helper()
	mfs, err := d.gather.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func counter(t *testing.T, d *Daemon, name, label string) float64 {
	t.Helper()
	mfs, err := d.gather.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabel(m, "reason", label) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// TestHAExactlyOneActs: two daemons on one store; the one that wins the lease acts and the other
// watches — it detects the same incident, but makes no plan and sends nothing to the gateway.
// Their statuses and metrics say which is which.
func TestHAExactlyOneActs(t *testing.T) {
	p := newHAPair(t, "a", "b")
	a, b := p.ds[0], p.ds[1]
	p.step(0, 1)
	sa, sb := a.StatusNow(), b.StatusNow()
	assert.Equal(t, RoleActing, sa.Role)
	assert.Equal(t, uint64(1), sa.Term)
	assert.Equal(t, "a", sa.Instance)
	assert.Equal(t, RoleStandby, sb.Role)
	assert.Equal(t, 1.0, gauge(t, a, "basin_daemon_leader"))
	assert.Equal(t, 1.0, gauge(t, a, "basin_daemon_term"))
	assert.Equal(t, 0.0, gauge(t, b, "basin_daemon_leader"))

	for range 3 {
		p.step(0, 1)
	}
	p.collapse()
	for range 40 {
		p.step(0, 1)
		if a.StatusNow().Policy.Target == testCut {
			break
		}
	}
	require.Equal(t, int64(testCut), a.StatusNow().Policy.Target, "the acting daemon cuts")
	p.step(0, 1)
	assert.Equal(t, 1, callsTo(p.gw.Budgets(), testCut), "one cut, by one daemon: %+v", p.gw.Budgets())
	assert.Equal(t, b.StatusNow().Assessment.State, a.StatusNow().Assessment.State, "the standby detects too")
	assert.Nil(t, b.StatusNow().LastPlan, "the standby plans nothing")
	assert.Empty(t, b.audit.Records(0), "and records nothing")
	assert.Len(t, auditLines(t, p.envs[0].cfg.DataDir), len(p.stream()), "the acting daemon's audit.jsonl is a copy of the stream")

	code, _ := call(t, http.MethodPost, serveAPI(t, b).URL+"/api/v1/pause", testToken, `{"minutes": 5, "reason": "test"}`)
	assert.Equal(t, http.StatusConflict, code, "a pause goes to the acting daemon")
}

// TestHATakeoverReconcilesTheIntent: the acting daemon is killed mid-step, after its intent and
// before its outcome. The standby takes the lease once its TTL has run out, not before, and
// reconciles the intent from the shared stream as a restarted daemon reconciles its file: the
// cut is applied once, and the intent gets exactly one outcome.
func TestHATakeoverReconcilesTheIntent(t *testing.T) {
	for _, reached := range []bool{false, true} {
		t.Run("gateway reached "+strconv.FormatBool(reached), func(t *testing.T) {
			p := newHAPair(t, "a", "b")
			a, b := p.ds[0], p.ds[1]
			for range 4 {
				p.step(0, 1)
			}
			p.collapse()
			p.gw.set(func(g *fakeGateway) {
				g.onSetBudget = func(tokens int64, apply func()) {
					if tokens == testCut && reached {
						apply()
					}
					if tokens == testCut {
						runtime.Goexit() // a is killed mid-call
					}
					apply()
				}
			})
			killed := false
			for range 40 {
				p.advance(stepEvery)
				for i, d := range p.ds {
					p.envs[i].dep.advance(stepEvery)
					p.envs[i].dep.feed(t, d, d.clock.Now())
					d.ha.camp.Step(context.Background())
				}
				b.Step(context.Background())
				if killed = stepKillable(a); killed {
					break
				}
			}
			require.True(t, killed, "a never cut")
			p.gw.set(func(g *fakeGateway) { g.onSetBudget = nil })
			require.NotEmpty(t, outcomesMissing(p.stream()), "a's intent is in the stream without an outcome")

			// Within the TTL b stays standby: a's lease has not run out.
			ttl := time.Duration(a.cfg.Store.LeaseTTL)
			p.advance(ttl - 2*time.Second)
			b.ha.camp.Step(context.Background())
			b.Step(context.Background())
			require.Equal(t, RoleStandby, b.StatusNow().Role)
			p.advance(3 * time.Second)
			b.ha.camp.Step(context.Background())
			b.Step(context.Background())
			s := b.StatusNow()
			require.Equal(t, RoleActing, s.Role, "b takes over once a's lease has run out")
			assert.Equal(t, uint64(2), s.Term)
			assert.Empty(t, s.Pending, "b reconciled a's intent")
			assert.Equal(t, int64(testCut), p.gw.Budget())
			assert.Equal(t, 1, callsTo(p.gw.Budgets(), testCut), "the cut reached the gateway once: %+v", p.gw.Budgets())
			for k, n := range outcomes(p.stream()) {
				assert.Equal(t, 1, n, "%s: one outcome per intent", k)
			}
			assert.Equal(t, int64(testCut), s.Policy.Target, "b holds the cut a decided")
			p.step(1)
			assert.Equal(t, 1, callsTo(p.gw.Budgets(), testCut), "and does not cut again")
		})
	}
}

// TestHALateOutcomeIsFenced: the acting daemon is paused in the gateway call (a GC pause, a
// SIGSTOP) while the store hands the lease to the other, which reconciles the intent. When the
// first wakes, its outcome is refused by the store's fence, it does not retry, and it steps down:
// the intent keeps exactly one outcome, the successor's.
func TestHALateOutcomeIsFenced(t *testing.T) {
	p := newHAPair(t, "a", "b")
	a, b := p.ds[0], p.ds[1]
	for range 4 {
		p.step(0, 1)
	}
	p.collapse()
	inCall, wake := make(chan struct{}), make(chan struct{})
	p.gw.set(func(g *fakeGateway) {
		g.onSetBudget = func(tokens int64, apply func()) {
			apply()
			if tokens == testCut {
				close(inCall)
				<-wake
			}
		}
	})
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		require.Less(t, i, 40, "a never cut")
		p.step(1)
		p.envs[0].dep.advance(stepEvery)
		p.envs[0].dep.feed(t, a, a.clock.Now())
		a.ha.camp.Step(context.Background())
		stepped := make(chan struct{})
		wg.Go(func() {
			defer close(stepped)
			a.Step(context.Background())
		})
		select {
		case <-inCall:
		case <-stepped:
			continue
		}
		break
	}
	p.gw.set(func(g *fakeGateway) { g.onSetBudget = nil })
	// The lease passes to b while a sleeps and still believes it leads.
	p.m.Del(a.cfg.Store.Prefix + ":daemon:lease")
	b.ha.camp.Step(context.Background())
	b.Step(context.Background())
	require.Equal(t, RoleActing, b.StatusNow().Role)
	require.Empty(t, b.StatusNow().Pending, "b found the cut applied")
	if _, ok := a.ha.camp.Leader(); !ok {
		t.Fatal("a should still believe it leads: its deadline has not passed")
	}
	close(wake)
	wg.Wait()
	s := a.StatusNow()
	assert.Equal(t, RoleStandby, s.Role, "a stepped down on the fenced write")
	assert.Contains(t, s.RoleReason, "fenced")
	assert.Equal(t, 1.0, counter(t, a, "basin_daemon_step_downs_total", "fenced"))
	assert.Empty(t, s.Pending, "the intent a holds open is b's, reconciled")
	for k, n := range outcomes(p.stream()) {
		assert.Equal(t, 1, n, "%s: one outcome per intent", k)
	}
	var cutOutcomes int
	for _, r := range p.stream() {
		if r.Budget != nil && r.Budget.To == testCut && r.Phase != remediate.PhaseIntent {
			assert.True(t, r.Reconciled, "the cut's outcome is b's reconciliation, not a's late one: %+v", r)
			cutOutcomes++
		}
	}
	assert.Equal(t, 1, cutOutcomes)
	assert.Equal(t, 1, callsTo(p.gw.Budgets(), testCut))
}

// daemonBehindStaleGateway is one daemon on a store, acting on a staleGateway over HTTP through
// the real gateway client, which refuses terms under floor.
func daemonBehindStaleGateway(t *testing.T, floor uint64) (*staleGateway, *Daemon, *haPair) {
	t.Helper()
	m := miniredis.RunT(t)
	gw := &staleGateway{fake: newFakeGateway(testReference), floor: floor}
	ts := httptest.NewServer(gw)
	t.Cleanup(ts.Close)
	t.Setenv(GatewayTokenEnv, "gateway-test-token")
	e := newEnv(t, fmt.Sprintf("store:\n  url: redis://%s/0\ninstance: a\n", m.Addr()))
	e.cfg.Gateway.AdminURL = ts.URL
	reg := prometheus.NewRegistry()
	d, err := New(e.cfg, Options{Clock: e.deploymentClock(), Logger: testLogger(t), Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return gw, d, &haPair{t: t, m: m, clock: e.clock, gw: gw.fake, envs: []*env{e}, ds: []*Daemon{d}}
}

// staleGateway is a gateway admin API over HTTP that refuses writes whose Basin-Daemon-Term is
// under floor with the contract's 409, and records the terms it was sent.
type staleGateway struct {
	fake  *fakeGateway
	mu    sync.Mutex
	floor uint64
	terms []string
}

func (g *staleGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if r.Method == http.MethodGet {
		st, _ := g.fake.State(r.Context())
		httpjson.Write(w, http.StatusOK, st)
		return
	}
	term, _ := strconv.ParseUint(r.Header.Get(client.TermHeader), 10, 64)
	g.mu.Lock()
	g.terms = append(g.terms, r.Method+" "+r.URL.Path+" "+r.Header.Get(client.TermHeader))
	floor := g.floor
	g.mu.Unlock()
	if term < floor {
		httpjson.Write(w, http.StatusConflict, map[string]any{"error": httpjson.NewError("invalid_request_error", "", "",
			fmt.Sprintf("daemon term %d is lower than %d", term, floor)).Error, "reason": client.ReasonStaleDaemonTerm})
		return
	}
	httpjson.Write(w, http.StatusOK, map[string]any{})
}

// TestHAStaleTermStepsDown: the acting daemon's writes carry its term; when the gateway answers
// 409 stale_daemon_term it steps down at once — the rest of the plan is not begun — and records
// the failed outcome (the store's epoch has not moved here, so the write is accepted).
func TestHAStaleTermStepsDown(t *testing.T) {
	gw, d, p := daemonBehindStaleGateway(t, 0)
	for range 4 {
		p.step(0)
	}
	require.Equal(t, RoleActing, d.StatusNow().Role)
	gw.mu.Lock()
	assert.Equal(t, "PUT /admin/daemon-term 1", gw.terms[0], "the term claimed as the daemon took over, before any action")
	gw.floor, gw.terms = 2, nil
	gw.mu.Unlock()
	p.collapse()
	for range 40 {
		p.step(0)
		if d.StatusNow().Role == RoleStandby {
			break
		}
	}
	s := d.StatusNow()
	require.Equal(t, RoleStandby, s.Role, "a 409 for a stale term ends the term")
	assert.Contains(t, s.RoleReason, "stale_term")
	assert.Equal(t, 1.0, counter(t, d, "basin_daemon_step_downs_total", "stale_term"))
	gw.mu.Lock()
	assert.Equal(t, []string{"PUT /admin/budget 1"}, gw.terms, "one write, with the term; nothing after the 409")
	gw.mu.Unlock()
	var failed int
	for _, r := range p.stream() {
		if r.Phase == remediate.PhaseFailed {
			failed++
			assert.Contains(t, r.Error, "409")
		}
	}
	assert.Equal(t, 1, failed, "the failed outcome is recorded: %+v", p.stream())
	assert.Empty(t, outcomesMissing(p.stream()))
}

// TestHAStaleClaimStepsDown: a daemon that takes over while the gateway already holds a later
// term (a successor it does not know of) is refused its claim and stands by before any action.
func TestHAStaleClaimStepsDown(t *testing.T) {
	gw, d, p := daemonBehindStaleGateway(t, 9)
	p.step(0)
	assert.Equal(t, RoleStandby, d.StatusNow().Role)
	assert.Equal(t, 1.0, counter(t, d, "basin_daemon_step_downs_total", "stale_term"))
	gw.mu.Lock()
	defer gw.mu.Unlock()
	assert.Equal(t, []string{"PUT /admin/daemon-term 1"}, gw.terms, "the claim, and no action after its 409")
}

// outcomesMissing lists the intents without an outcome.
func outcomesMissing(recs []remediate.Record) []string {
	var out []string
	for k, n := range outcomes(recs) {
		if n == 0 {
			out = append(out, k)
		}
	}
	return out
}

// TestHAServeHandsOver: two daemons served on the wall clock, as `basin daemon` runs them. The
// first to win the lease takes over at once (not at its next step); when it stops, it releases
// the lease and the other takes over within the lease's TTL with the next term.
func TestHAServeHandsOver(t *testing.T) {
	m := miniredis.RunT(t)
	gw := newFakeGateway(testReference)
	serve := func(name string) (*Daemon, context.CancelFunc, chan error) {
		e := newEnv(t, fmt.Sprintf("store:\n  url: redis://%s/0\n  lease_ttl: 900ms\ninstance: %s\n", m.Addr(), name))
		d, err := New(e.cfg, Options{Gateway: gw, Logger: testLogger(t)})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		served := make(chan error, 1)
		go func() { served <- d.Serve(ctx, listen(t)) }()
		t.Cleanup(func() {
			cancel()
			<-served
		})
		return d, cancel, served
	}
	role := func(d *Daemon, want string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < within {
			if d.StatusNow().Role == want {
				return time.Since(start)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: role %q after %v, want %q", d.ha.instance, d.StatusNow().Role, within, want)
		return 0
	}
	a, stopA, servedA := serve("a")
	role(a, RoleActing, 5*time.Second)
	b, _, _ := serve("b")
	time.Sleep(500 * time.Millisecond) // b campaigns a few times
	require.Equal(t, RoleStandby, b.StatusNow().Role)
	assert.Equal(t, uint64(1), a.StatusNow().Term)

	stopA()
	require.NoError(t, <-servedA)
	servedA <- nil // for the cleanup
	took := role(b, RoleActing, 5*time.Second)
	t.Logf("b took over %v after a stopped", took)
	assert.Less(t, took, 900*time.Millisecond, "a released the lease: b need not wait for the TTL")
	assert.Equal(t, uint64(2), b.StatusNow().Term)
}

// TestHAOnlyTheActingDaemonHolds: with a store (a replicated deployment, whose gateways enforce
// holds on every replica), the acting daemon holds the lowest-priority live sessions in a trap as
// a daemon alone does; the standby neither lists the live sessions nor holds any.
func TestHAOnlyTheActingDaemonHolds(t *testing.T) {
	p := newHAPair(t, "a", "b")
	a, b := p.ds[0], p.ds[1]
	for i := range 10 {
		p.gw.sessions = append(p.gw.sessions, adminapi.LiveSession{ID: fmt.Sprintf("s%d", i), Admitted: time.Unix(0, 0),
			Priority: time.Unix(int64(i), 0), Context: 150_000})
	}
	for range 4 {
		p.step(0, 1)
	}
	p.collapse()
	held := func() []holdCall {
		p.gw.mu.Lock()
		defer p.gw.mu.Unlock()
		return append([]holdCall(nil), p.gw.holds...)
	}
	for range 40 + int(remediate.DefaultHoldAfter/stepEvery) {
		p.step(0, 1)
		if len(held()) > 0 {
			break
		}
	}
	require.Equal(t, RoleActing, a.StatusNow().Role)
	holds := held()
	require.NotEmpty(t, holds, "the acting daemon held sessions")
	assert.Equal(t, []string{"s9", "s8", "s7", "s6", "s5", "s4"}, holds[0].Hold)

	p.gw.mu.Lock()
	listed := p.gw.stateSessions
	p.gw.mu.Unlock()
	p.step(1) // the standby alone, still trapped
	p.gw.mu.Lock()
	assert.Equal(t, listed, p.gw.stateSessions, "the standby does not list the live sessions")
	p.gw.mu.Unlock()
	assert.Len(t, held(), len(holds), "the standby holds nothing")
	assert.Equal(t, RoleStandby, b.StatusNow().Role)
	assert.Nil(t, b.StatusNow().LastPlan, "the standby plans nothing")
}
