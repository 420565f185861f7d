package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/replication"
	"github.com/basin-dev/basin/test/testclock"
)

// replicaConfig is a replicated-mode configuration in front of upstream, sharing the store at
// addr, advertising admin; extra is appended to the replication block (", key: value").
func replicaConfig(t testing.TB, id, addr string, admin *httptest.Server, upstream, extra string) *Config {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600))
	y := fmt.Sprintf(`admin_token_file: %s
upstreams: [%s]
max_queue_wait: 5s
admission: {budget_tokens: 1}
store: {url: "redis://%s", prefix: "test", lease_ttl: 1s, op_timeout: 500ms}
replication: {replica_id: %s, advertise_url: "http://%s", report_interval: 20ms%s}
`, tokenFile, upstream, addr, id, admin.Listener.Addr(), extra)
	cfg, err := ParseConfig([]byte(y))
	require.NoError(t, err)
	return cfg
}

// startReplicas starts n gateway replicas on one store.
func startReplicas(t testing.TB, n int, addr, upstream, extra string) []*harness {
	t.Helper()
	hs := make([]*harness, n)
	for i := range hs {
		admin := httptest.NewUnstartedServer(nil)
		hs[i] = startOn(t, replicaConfig(t, fmt.Sprintf("gw-%d", i), addr, admin, upstream, extra), nil, admin)
	}
	return hs
}

// replication reads a replica's own view.
func (h *harness) replication() adminapi.ReplicationView {
	h.t.Helper()
	r := h.adminDo(http.MethodGet, "/admin/replication", testToken, "")
	require.Equal(h.t, http.StatusOK, r.status, "%s", r)
	var v adminapi.ReplicationView
	require.NoError(h.t, json.Unmarshal(r.body, &v))
	return v
}

// leaderOf waits until exactly one replica leads and every other one knows it.
func leaderOf(t testing.TB, hs []*harness) (leader *harness, followers []*harness) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		leader, followers = nil, nil
		views := make([]adminapi.ReplicationView, len(hs))
		for i, h := range hs {
			views[i] = h.replication()
			if views[i].Leading {
				if leader != nil {
					leader = nil
					break
				}
				leader = h
			} else {
				followers = append(followers, h)
			}
		}
		if leader != nil {
			id := leader.replication().ReplicaID
			known := true
			for i, h := range hs {
				if h != leader && views[i].Leader != id {
					known = false
				}
			}
			if known {
				return leader, followers
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no single admission leader known to all within 10s")
	return nil, nil
}

// TestReplicasShareOneBudget: three replicas on one store admit as one gateway does. The
// budget (1 token: one live session at a time) holds across replicas; any replica serves any
// session's later calls; a first call queued through a follower is admitted when a session on
// another replica ends; admin requests to a follower reach the leader; only the leader exports
// the admission gauges.
func TestReplicasShareOneBudget(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	hs := startReplicas(t, 3, mr.Addr(), up.URL, "")
	leader, fs := leaderOf(t, hs)

	// Session a starts on a follower; its later calls pass on every replica.
	r := fs[0].chat("a", 5, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	for _, h := range hs {
		r := h.chat("a", 5, nil)
		require.Equal(t, http.StatusOK, r.status, "a live session's call on any replica passes: %s", r)
	}
	waitFor(t, "the leader sees a's calls", func() bool {
		st := leader.state()
		return st.Live == 1 && st.WorkingSet == 1010 && st.InCall == 0
	})

	// Session b, on the other follower, queues behind a: the budget is the deployment's.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := fs[1].chatAsync(ctx, "b", 5, nil)
	waitFor(t, "b queued at the leader", func() bool { return len(leader.state().Queue) == 1 })
	c := leader.chatAsync(ctx, "c", 5, nil)
	waitFor(t, "c queued at the leader", func() bool { return len(leader.state().Queue) == 2 })

	// Admin through a follower: the state is the leader's.
	st := fs[0].state()
	require.NotNil(t, st.Replication)
	assert.True(t, st.Replication.Leading, "a follower forwards /admin/state to the leader")
	assert.Equal(t, 2, st.Queued)

	// a ends on the third replica (the leader): b, queued through a follower, goes.
	r = leader.chat("a", 5, map[string]string{"x-session-end": "true"})
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	select {
	case r := <-b:
		require.Equal(t, http.StatusOK, r.status, "b admitted from the queue: %s", r)
	case <-time.After(5 * time.Second):
		t.Fatal("b not admitted")
	}
	// b ends on a follower that never saw it: its end reaches the leader, and c goes.
	r = fs[0].chat("b", 5, map[string]string{"x-session-end": "true"})
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	select {
	case r := <-c:
		require.Equal(t, http.StatusOK, r.status, "%s", r)
	case <-time.After(5 * time.Second):
		t.Fatal("c not admitted")
	}

	// A budget set through a follower is set on the leader.
	r = fs[1].adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":50000,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, int64(50000), leader.state().Budget)

	// /metrics/admission on any replica is the leader's: what a daemon reads through a Service.
	for _, h := range hs {
		r := h.adminDo(http.MethodGet, AdmissionMetricsPath, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		assert.Contains(t, string(r.body), "basin_gateway_budget_tokens 50000")
		assert.Contains(t, string(r.body), "basin_gateway_sessions_live ")
		assert.NotContains(t, string(r.body), "go_goroutines")
	}

	// Only the leader exports the admission gauges; every replica its replication gauges.
	for _, h := range hs {
		n, err := testutil.GatherAndCount(h.reg, "basin_gateway_sessions_live")
		require.NoError(t, err)
		want := 0
		if h == leader {
			want = 1
		}
		assert.Equal(t, want, n, "basin_gateway_sessions_live on %s", h.replication().ReplicaID)
		n, err = testutil.GatherAndCount(h.reg, "basin_gateway_replication_leader")
		require.NoError(t, err)
		assert.Equal(t, 1, n)
	}
}

// TestLeaderHandsOver: when the leader stops, another replica takes over with the table (the
// live session stays live: its next call passes on a replica that never saw it), and queued
// first calls held by the old leader ask the new one.
func TestLeaderHandsOver(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	hs := startReplicas(t, 3, mr.Addr(), up.URL, "")
	leader, fs := leaderOf(t, hs)
	require.Equal(t, http.StatusOK, fs[0].chat("a", 5, nil).status)
	waitFor(t, "a saved", func() bool { return leader.state().Live == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := fs[1].chatAsync(ctx, "q", 5, nil)
	waitFor(t, "q queued", func() bool { return len(leader.state().Queue) == 1 })

	require.NoError(t, leader.stop()) // releases the lease
	newLeader, _ := leaderOf(t, fs)
	st := newLeader.state()
	assert.Equal(t, 1, st.Live, "the table moved to the new leader")
	assert.True(t, st.Replication.Leading)

	// a's next call on the replica that never saw it passes at once: the new leader knows it.
	other := fs[0]
	if other == newLeader {
		other = fs[1]
	}
	require.Equal(t, http.StatusOK, other.chat("a", 5, map[string]string{"x-session-end": "true"}).status)
	select {
	case r := <-q:
		require.Equal(t, http.StatusOK, r.status, "q, queued at the old leader, admitted by the new one: %s", r)
	case <-time.After(8 * time.Second):
		t.Fatal("q not admitted after the handover")
	}
}

// TestDegradedWithoutTheStore: with the store gone, a follower is degraded: a live session's
// calls pass from its local core, new sessions are admitted against its local slice, or, with
// degraded_admission: refuse, refused 503 degraded (readiness fails then). When the store is
// back, what it admitted alone is reported to the leader.
func TestDegradedWithoutTheStore(t *testing.T) {
	for _, mode := range []string{DegradedLocalSlice, DegradedRefuse} {
		t.Run(mode, func(t *testing.T) {
			mr := miniredis.RunT(t)
			up := newFakeUpstream(t, okJSON(1000, 10))
			hs := startReplicas(t, 2, mr.Addr(), up.URL, ", degraded_admission: "+mode)
			leader, fs := leaderOf(t, hs)
			f := fs[0]
			require.Equal(t, http.StatusOK, f.chat("a", 5, nil).status)
			r := f.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":100000,"reason":"test"}`)
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			waitFor(t, "the follower knows the budget", func() bool {
				return f.g.repl.(*replication.Replica).LeaderView().Budget == 100000
			})

			addr := mr.Addr()
			mr.Close()
			// The leader steps down at its lease's deadline; the follower, asking it, is degraded.
			waitFor(t, "the leader stepped down", func() bool { return !leader.replication().Leading })
			require.Equal(t, http.StatusOK, f.chat("a", 5, nil).status, "a live session's call passes while degraded")
			r = f.chat("new", 5, nil)
			v := f.replication()
			assert.True(t, v.Degraded, "%+v", v)
			ready := f.adminDo(http.MethodGet, "/readyz", "", "")
			if mode == DegradedRefuse {
				assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
				assert.Equal(t, reasonDegraded, r.header.Get(ReasonHeader))
				assert.NotEmpty(t, r.header.Get("Retry-After"))
				assert.Equal(t, http.StatusServiceUnavailable, ready.status, "%s", ready)
				return
			}
			require.Equal(t, http.StatusOK, r.status, "a new session is admitted against the local slice: %s", r)
			assert.Contains(t, string(ready.body), "degraded", "%s", ready)
			got, _ := gather(t, f)
			assert.Equal(t, 1.0, got["basin_gateway_replication_degraded_admissions_total"])

			// The store is back: a leader is elected, and the session admitted alone is live there.
			mr2 := miniredis.NewMiniRedis()
			require.NoError(t, mr2.StartAddr(addr))
			defer mr2.Close()
			l2, _ := leaderOf(t, hs)
			waitFor(t, "the degraded admission reported", func() bool {
				st := l2.state()
				for _, s := range st.Sessions {
					if s.ID == "new" {
						return true
					}
				}
				return false
			})
			waitFor(t, "no longer degraded", func() bool { return !f.replication().Degraded })
		})
	}
}

// TestKnownLiveSessionsPassWhileDegraded: every follower keeps a copy of the leader's live set,
// so a live session's call on a replica that never served it still passes when no leader
// answers, where a new session is refused (degraded_admission: refuse).
func TestKnownLiveSessionsPassWhileDegraded(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	hs := startReplicas(t, 3, mr.Addr(), up.URL, ", degraded_admission: "+DegradedRefuse)
	leader, fs := leaderOf(t, hs)
	require.Equal(t, http.StatusOK, fs[0].chat("a", 5, nil).status)
	waitFor(t, "the other follower's copy has a", func() bool { return fs[1].replication().KnownLive == 1 })

	mr.Close()
	waitFor(t, "the leader stepped down", func() bool { return !leader.replication().Leading })
	r := fs[1].chat("a", 5, nil)
	require.Equal(t, http.StatusOK, r.status, "a live session's call passes on a replica that never served it: %s", r)
	assert.True(t, fs[1].replication().Degraded)
	got, _ := gather(t, fs[1])
	assert.Equal(t, 1.0, got["basin_gateway_replication_known_live_passed_total"])
	r = fs[1].chat("new", 5, nil)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "a new session is refused while degraded: %s", r)
	// The old leader's copy is its own table.
	assert.Equal(t, 1, leader.replication().KnownLive)
}

// failingAdmits is the session table with every Admit failing, as when the store stops
// answering while the leader still holds its lease (a write that timed out may yet be applied).
type failingAdmits struct {
	replication.Table
	tried atomic.Int64
}

func (f *failingAdmits) Admit(context.Context, uint64, admission.LiveSession) error {
	f.tried.Add(1)
	return errors.New("i/o timeout")
}

// TestUnpersistedAdmissionStands: a first call a follower asks the leader for is admitted even
// when the leader cannot persist the admission. Undoing it would send the follower to wait for
// a leader change that never comes (and then admit alone against its slice), and could cut a
// session under its client if the write was applied after all. The session is written with the
// leader's next save, so a successor has it.
func TestUnpersistedAdmissionStands(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	tables := make([]*failingAdmits, 2)
	hs := make([]*harness, 2)
	for i := range hs {
		admin := httptest.NewUnstartedServer(nil)
		hs[i] = startPrepared(t, replicaConfig(t, fmt.Sprintf("gw-%d", i), mr.Addr(), admin, up.URL, ""), nil, admin,
			func(g *Gateway) {
				g.repl.(*replication.Replica).WrapTable(func(t replication.Table) replication.Table {
					tables[i] = &failingAdmits{Table: t}
					return tables[i]
				})
			})
	}
	leader, fs := leaderOf(t, hs)
	f := fs[0]

	start := time.Now()
	r := f.chat("a", 5, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Less(t, time.Since(start), time.Second, "admitted at once, not after waiting out a leader change")
	var tried int64
	for _, tb := range tables {
		tried += tb.tried.Load()
	}
	assert.Equal(t, int64(1), tried, "the leader tried to persist the admission")
	v := f.replication()
	assert.False(t, v.Degraded, "%+v", v)
	got, _ := gather(t, f)
	assert.Equal(t, 0.0, got["basin_gateway_replication_degraded_admissions_total"], "admitted by the leader, not alone")
	assert.Equal(t, 1, leader.state().Live)

	// The next save writes it: the successor loads it live.
	waitFor(t, "a saved", func() bool { return mr.Exists("test:gateway:sessions") })
	require.NoError(t, leader.stop())
	next, _ := leaderOf(t, fs)
	assert.Equal(t, 1, next.state().Live, "the successor has the session")
}

// TestReplicaRPCNeedsTheToken: the replicas' protocol is on the admin listener, behind the admin
// token.
func TestReplicaRPCNeedsTheToken(t *testing.T) {
	mr := miniredis.RunT(t)
	hs := startReplicas(t, 1, mr.Addr(), "http://127.0.0.1:1", "")
	leaderOf(t, hs)
	for _, p := range []string{"/admin/replication/arrive", "/admin/replication/report", "/admin/replication/chain"} {
		resp, err := http.Post(hs[0].admin.URL+p, "application/json", strings.NewReader(`{"id":"x"}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, p)
	}
}

// TestResponsesChainAcrossReplicas: a Responses chain that names no session is one session
// whichever replica each of its calls reaches, and stays one across a change of leader: the
// replicas tell the leader of the responses they answer, and ask it for those they did not.
func TestResponsesChainAcrossReplicas(t *testing.T) {
	mr := miniredis.RunT(t)
	up := chainUpstream(t)
	hs := startReplicas(t, 3, mr.Addr(), up.URL, "")
	leader, fs := leaderOf(t, hs)
	r := leader.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":1000000,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	send := func(h *harness, body string) {
		t.Helper()
		r, err := h.do(context.Background(), http.MethodPost, "/v1/responses", nil, body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
	}
	sessions := func(l *harness) []string {
		var ids []string
		for _, s := range l.state().Sessions {
			ids = append(ids, s.ID)
		}
		return ids
	}
	// The answer's link is recorded as its call finishes, after the client has the bytes (as
	// on a single gateway, where the test settles too): wait for the leader to know it.
	linked := func(l *harness, resp string) {
		t.Helper()
		waitFor(t, "the leader knows "+resp, func() bool {
			l.g.mu.Lock()
			defer l.g.mu.Unlock()
			_, ok := l.g.mu.chains[resp]
			return ok
		})
	}
	send(fs[0], `{"model":"m","input":"start"}`) // resp_1, on a follower
	linked(leader, "resp_1")
	send(fs[1], `{"model":"m","input":"go on","previous_response_id":"resp_1"}`) // resp_2, on the other
	linked(leader, "resp_2")
	send(leader, `{"model":"m","input":"and on","previous_response_id":"resp_2"}`) // resp_3, on the leader
	linked(leader, "resp_3")
	send(fs[0], `{"model":"m","input":"more","previous_response_id":"resp_3"}`) // resp_4
	linked(leader, "resp_4")
	first := sessions(leader)
	require.Len(t, first, 1, "four chained calls on three replicas are one session")
	assert.Equal(t, uint64(1), leader.state().Counters.AdmittedAtOnce)

	// A new leader learns the links from its followers: a response the other follower answered
	// (fs[0]: resp_4, fs[1]: resp_2) continues on the new leader, which did not answer it.
	require.NoError(t, leader.stop())
	next, _ := leaderOf(t, fs)
	resp := "resp_2"
	if next == fs[1] {
		resp = "resp_4"
	}
	linked(next, resp)
	send(next, `{"model":"m","input":"and more","previous_response_id":"`+resp+`"}`)
	assert.Equal(t, first, sessions(next), "still one session after the handover")
}

// TestArrivalSurvivesClockSkew: the leader places a follower's held call by how long the
// follower has held it when the follower's clock disagrees with its own, and by the follower's
// timestamp when they agree; a follower that sends no duration is taken within reason.
func TestArrivalSurvivesClockSkew(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	hs := startReplicas(t, 2, mr.Addr(), up.URL, "")
	leader, fs := leaderOf(t, hs)
	require.Equal(t, http.StatusOK, fs[0].chat("a", 5, nil).status) // the budget is full
	now := time.Now()
	for _, tc := range []struct {
		name    string
		arrival time.Time
		held    time.Duration
		want    time.Time
	}{
		{"clocks agree: the timestamp", now.Add(-2500 * time.Millisecond), 2 * time.Second, now.Add(-2500 * time.Millisecond)},
		{"the follower's clock an hour slow: the held time", now.Add(-time.Hour), 3 * time.Second, now.Add(-3 * time.Second)},
		{"an hour fast", now.Add(time.Hour), 3 * time.Second, now.Add(-3 * time.Second)},
		{"no held time: clamped", now.Add(-time.Hour), 0, now.Add(-5*time.Second - 2*time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			id := strings.ReplaceAll(tc.name, " ", "-")
			// A follower's first call as the replicas' protocol carries it.
			body, err := json.Marshal(map[string]any{"replica": "test", "id": id, "prompt_tokens": 5, "arrival": tc.arrival,
				"held_ns": tc.held})
			require.NoError(t, err)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, leader.admin.URL+"/admin/replication/arrive", strings.NewReader(string(body)))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+testToken)
			go func() {
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			var got time.Time
			waitFor(t, "queued at the leader", func() bool {
				for _, q := range leader.state().Queue {
					if q.ID == id {
						got = q.Arrival
						return true
					}
				}
				return false
			})
			assert.WithinDuration(t, tc.want, got, 200*time.Millisecond)
		})
	}
}

// heldPair is a leader on the real clock and a follower on a settable one, on one store, in front
// of an upstream that counts the model calls it is sent, with a budget that admits every session.
type heldPair struct {
	leader, follower *harness
	clock            *testclock.Clock
	sent             *atomic.Int64
}

func startHeldPair(t *testing.T) *heldPair {
	t.Helper()
	mr := miniredis.RunT(t)
	sent := &atomic.Int64{}
	ok := okJSON(100, 10)
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/sessions/") {
			sent.Add(1)
		}
		ok(w, r)
	})
	// The leader first, so that the follower, whose clock stands still, never leads.
	admin := httptest.NewUnstartedServer(nil)
	leader := startOn(t, replicaConfig(t, "gw-0", mr.Addr(), admin, up.URL, ""), nil, admin)
	waitFor(t, "gw-0 leads", func() bool { return leader.replication().Leading })
	clock := testclock.New(time.Now())
	admin = httptest.NewUnstartedServer(nil)
	follower := startOn(t, replicaConfig(t, "gw-1", mr.Addr(), admin, up.URL, ""), clock.Now, admin)
	l, _ := leaderOf(t, []*harness{leader, follower})
	require.Same(t, leader, l)
	r := leader.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":1000000,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	return &heldPair{leader: leader, follower: follower, clock: clock, sent: sent}
}

// holds posts a change of the hold list to h's admin API.
func (p *heldPair) holds(t *testing.T, h *harness, body string) response {
	t.Helper()
	r := h.adminDo(http.MethodPost, "/admin/holds", testToken, body)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	return r
}

// TestFollowerHoldsTheLeadersHolds: replicated, the leader decides holds and every replica
// enforces them. Sessions held through the leader's admin API have their calls held on the
// follower — one the follower had served (it learns the hold from its copy of the live set) and
// one it never saw (the leader passes the call back to it to hold). A held call counts in flight
// at the leader, reaches no upstream, and goes once the leader resumes its session, whichever
// replica the resume was sent to.
func TestFollowerHoldsTheLeadersHolds(t *testing.T) {
	p := startHeldPair(t)
	leader, follower := p.leader, p.follower
	require.Equal(t, http.StatusOK, follower.chat("a", 5, nil).status)
	require.Equal(t, http.StatusOK, leader.chat("b", 5, nil).status)
	follower.settle()
	leader.settle()
	waitFor(t, "the leader sees a's call end", func() bool { st := leader.state(); return st.Live == 2 && st.InCall == 0 })
	require.Equal(t, int64(2), p.sent.Load())

	var res adminapi.HoldResult
	require.NoError(t, json.Unmarshal(p.holds(t, leader, `{"hold":["a","b"],"reason":"test"}`).body, &res))
	assert.Equal(t, 2, res.Added)
	assert.Equal(t, 2, res.HeldSessions)
	waitFor(t, "the follower learns the holds", func() bool { return follower.replication().KnownHeld == 2 })
	assert.True(t, follower.g.core.Held("a"), "a, live on the follower, is held there")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := follower.chatAsync(ctx, "a", 5, nil)
	waitFor(t, "a's call held on the follower", func() bool { return follower.replication().HeldCalls == 1 })
	b := follower.chatAsync(ctx, "b", 5, nil)
	waitFor(t, "b's call held on the follower", func() bool { return follower.replication().HeldCalls == 2 })
	notAnswered(t, a, "before the resume")
	notAnswered(t, b, "before the resume")
	assert.Equal(t, int64(2), p.sent.Load(), "no held call reached the upstream")
	waitFor(t, "the held calls count in flight at the leader", func() bool { return leader.state().InCall == 2 })
	st := follower.state() // forwarded: the leader's
	assert.Equal(t, 2, st.Held)
	assert.Zero(t, st.HeldCalls, "the leader holds none of them itself")
	// The leader holds its own calls of them.
	al := leader.chatAsync(ctx, "a", 5, nil)
	waitFor(t, "a's call held on the leader", func() bool { return leader.state().HeldCalls == 1 })

	// Resumed through the leader: a's calls go on both replicas, b still waits.
	p.holds(t, leader, `{"resume":["a"],"reason":"test"}`)
	r := answered(t, a)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	r = answered(t, al)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	notAnswered(t, b, "b still held")
	assert.Equal(t, 1, follower.replication().HeldCalls)

	// Resumed through the follower, which forwards it to the leader: b goes.
	rr := p.holds(t, follower, `{"resume":["b"],"reason":"test"}`)
	assert.Contains(t, rr.header.Values(ReplicaHeader), "gw-0", "answered by the leader")
	r = answered(t, b)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	follower.settle()
	leader.settle()
	assert.Equal(t, int64(5), p.sent.Load())
	waitFor(t, "the leader sees every call finish", func() bool { st := leader.state(); return st.InCall == 0 && st.Held == 0 })
	v := follower.replication()
	assert.Zero(t, v.HeldCalls)
	assert.Zero(t, v.KnownHeld)
	assert.False(t, follower.g.core.Held("a"))
	assert.False(t, follower.g.core.Held("b"))
}

// TestFollowerReleasesAHeldCallAtTheHoldBound: a follower bounds the calls it holds on its own
// clock, as a gateway alone does: a call waits until it has waited admission.hold_bound, then
// goes; the session stays held, so its next call waits again.
func TestFollowerReleasesAHeldCallAtTheHoldBound(t *testing.T) {
	p := startHeldPair(t)
	leader, follower := p.leader, p.follower
	require.Equal(t, http.StatusOK, follower.chat("a", 5, nil).status)
	follower.settle()
	p.holds(t, leader, `{"hold":["a"],"reason":"test"}`)
	waitFor(t, "the follower learns the hold", func() bool { return follower.g.core.Held("a") })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := follower.chatAsync(ctx, "a", 5, nil)
	waitFor(t, "a's call held on the follower", func() bool { return follower.replication().HeldCalls == 1 })
	p.clock.Advance(admission.DefaultHoldBound - time.Second)
	follower.g.expire()
	notAnswered(t, a, "a second before the bound")
	p.clock.Advance(time.Second)
	follower.g.expire()
	r := answered(t, a)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	follower.settle()
	assert.Equal(t, int64(2), p.sent.Load())
	_, hist := gather(t, follower)
	assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="hold_bound"}`])
	assert.Equal(t, 1, leader.state().Held, "the session stays held")

	// Still held: its next call waits again, and leaves nothing in flight when its client gives up.
	ctx2, cancel2 := context.WithCancel(context.Background())
	a = follower.chatAsync(ctx2, "a", 5, nil)
	waitFor(t, "a's next call held", func() bool { return follower.replication().HeldCalls == 1 })
	waitFor(t, "counted in flight at the leader", func() bool { return leader.state().InCall == 1 })
	cancel2()
	<-a
	waitFor(t, "the abandoned call finished at the leader", func() bool { return leader.state().InCall == 0 })
	assert.Zero(t, follower.replication().HeldCalls)
}

// TestHoldsOutliveTheLeader: the hold list is in the table before POST /admin/holds is answered,
// so the next leader holds the same sessions — those it had served and those it had not — and
// its followers hold their calls.
func TestHoldsOutliveTheLeader(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(100, 10))
	hs := startReplicas(t, 3, mr.Addr(), up.URL, "")
	leader, fs := leaderOf(t, hs)
	r := leader.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":1000000,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	require.Equal(t, http.StatusOK, leader.chat("a", 5, nil).status)
	require.Equal(t, http.StatusOK, fs[0].chat("b", 5, nil).status)
	waitFor(t, "the leader sees both", func() bool { st := leader.state(); return st.Live == 2 && st.InCall == 0 })
	r = leader.adminDo(http.MethodPost, "/admin/holds", testToken, `{"hold":["a","b"],"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)

	require.NoError(t, leader.stop())
	newLeader, rest := leaderOf(t, fs)
	st := newLeader.state()
	assert.Equal(t, 2, st.Live)
	assert.Equal(t, 2, st.Held, "the new leader holds what the old one held")
	assert.True(t, newLeader.g.core.Held("a"), "a, which it never served, from the table")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := rest[0].chatAsync(ctx, "a", 5, nil)
	waitFor(t, "a's call held on the follower", func() bool { return rest[0].replication().HeldCalls == 1 })
	notAnswered(t, a, "held after the handover")
}

// TestGracefulLeaderReleasesOnce: a leader that shuts down saves the table and releases its
// lease once — no warning that the lease was not held (it used to release it twice: its
// campaign on stopping, then itself) — and a follower leads well within a lease, with the
// session the leader admitted.
func TestGracefulLeaderReleasesOnce(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	hs := startReplicas(t, 2, mr.Addr(), up.URL, "")
	leader, fs := leaderOf(t, hs)
	require.Equal(t, http.StatusOK, leader.chat("a", 5, nil).status)

	require.NoError(t, leader.stop())
	stopped := time.Now()
	out := leader.log.String()
	assert.NotContains(t, out, "lease not held", "the lease is released once")
	assert.NotContains(t, out, "level=WARN msg=\"releasing", "%s", out)
	assert.NotContains(t, out, "release on stop failed", "%s", out)
	assert.NotContains(t, out, "renewal failed", "stopping is not a failure of the store: %s", out)
	assert.Contains(t, out, "released the lease", "the campaign released it")

	waitFor(t, "the follower leads", func() bool { return fs[0].replication().Leading })
	assert.Less(t, time.Since(stopped), time.Duration(fs[0].cfg.Store.LeaseTTL), "handed over at once, not at the lease's end")
	assert.Equal(t, 1, fs[0].state().Live, "the last save carried the table")
}

// TestADuplicateReplicaIDIsRefusedAtStart: replicas left with the same replica_id (the default,
// the host name, on one host) used to stay degraded, each taking the leader's announcement for
// its own and admitting against its own slice. A second process under a running replica's id
// does not start: its error names replication.replica_id and the running one's advertise URL.
func TestADuplicateReplicaIDIsRefusedAtStart(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	first := startReplicas(t, 1, mr.Addr(), up.URL, "")[0]
	leaderOf(t, []*harness{first})

	admin := httptest.NewUnstartedServer(nil)
	cfg := replicaConfig(t, "gw-0", mr.Addr(), admin, up.URL, "")
	g, err := New(Options{Config: cfg, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = g.Run(ctx)
	require.Error(t, err, "the second gw-0 must not run")
	assert.ErrorContains(t, err, `replication.replica_id "gw-0" is already used by the running replica advertised at `+first.cfg.Replication.AdvertiseURL)
	assert.NoError(t, ctx.Err(), "refused at once, not at the end of the test's patience")
	assert.True(t, first.replication().Leading, "the running replica goes on")

	// The package's Run, as `basin gateway` runs it, fails before it listens.
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	err = Run(ctx, Options{Config: cfg, Registerer: prometheus.NewRegistry()})
	assert.ErrorContains(t, err, "replication.replica_id")
}

// TestReplicasSeenCountsRunningReplicas: a replica that stops leaves the replicas seen at once,
// so the others' local-slice divisor counts only replicas that run.
func TestReplicasSeenCountsRunningReplicas(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	hs := startReplicas(t, 3, mr.Addr(), up.URL, "")
	leaderOf(t, hs)
	waitFor(t, "three replicas seen", func() bool { return hs[0].replication().ReplicasSeen == 3 })
	require.NoError(t, hs[2].stop())
	waitFor(t, "two replicas seen once one stopped", func() bool {
		return hs[0].replication().ReplicasSeen == 2 && hs[1].replication().ReplicasSeen == 2
	})
}

// TestFollowersLearnANewLeaderAtOnce: a new leader tells the replicas it knows that it leads, so
// they follow it within milliseconds of its announcement, not at their next once-a-second look
// at the store. Measured over three handovers: each follower's delay from the moment the new
// leader leads to the moment it names it.
func TestFollowersLearnANewLeaderAtOnce(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(1000, 10))
	hs := startReplicas(t, 5, mr.Addr(), up.URL, "")
	live := hs
	var delays []time.Duration
	for range 3 {
		leader, _ := leaderOf(t, live)
		require.NoError(t, leader.stop())
		live = slices.DeleteFunc(slices.Clone(live), func(h *harness) bool { return h == leader })
		var next *harness
		var at time.Time
		waitFor(t, "a new leader", func() bool {
			for _, h := range live {
				if v := h.replication(); v.Leading {
					next, at = h, time.Now()
					return true
				}
			}
			return false
		})
		id := next.replication().ReplicaID
		for _, h := range live {
			if h == next {
				continue
			}
			waitFor(t, "the follower names the new leader", func() bool { return h.replication().Leader == id })
			delays = append(delays, time.Since(at))
		}
	}
	t.Logf("followers named the new leader %v after it led", delays)
	assert.Less(t, slices.Max(delays), 300*time.Millisecond, "at once, not at the next tick of a second: %v", delays)
}
