package sessionstore

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/lease"
	"github.com/basin-dev/basin/test/testclock"
)

const testPrefix = "basin:test:gateway"

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// cluster is a miniredis store with the gateway lease's campaigns on it.
type cluster struct {
	t      *testing.T
	m      *miniredis.Miniredis
	client *redis.Client
	clock  *testclock.Clock
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	return &cluster{t: t, m: m, client: client, clock: testclock.New(t0)}
}

// leader returns a campaign of owner that has taken the lease, and its term. A lease still
// held by another is taken over by moving the store's time past its TTL.
func (cl *cluster) leader(owner string) (*lease.Campaign, uint64) {
	cl.t.Helper()
	c, err := lease.New(cl.client, lease.Options{Prefix: testPrefix, Owner: owner, TTL: 9 * time.Second,
		Now: cl.clock.Now, Registerer: prometheus.NewRegistry()})
	require.NoError(cl.t, err)
	c.Step(cl.t.Context())
	if _, ok := c.Leader(); !ok {
		cl.m.FastForward(10 * time.Second)
		c.Step(cl.t.Context())
	}
	epoch, ok := c.Leader()
	require.True(cl.t, ok, "%s takes the lease", owner)
	return c, epoch
}

// store returns a Store writing through f, with its own registry.
func (cl *cluster) store(f Fencer, o Options) (*Store, *prometheus.Registry) {
	cl.t.Helper()
	reg := prometheus.NewRegistry()
	o.Prefix, o.Registerer, o.Now = testPrefix, reg, cl.clock.Now
	s, err := New(cl.client, f, o)
	require.NoError(cl.t, err)
	return s, reg
}

// table reads the sessions hash as stored.
func (cl *cluster) table() map[string]string {
	cl.t.Helper()
	out, err := cl.client.HGetAll(cl.t.Context(), testPrefix+":sessions").Result()
	require.NoError(cl.t, err)
	return out
}

func writes(s *Store, op string) int {
	return int(testutil.ToFloat64(s.metrics.writes.WithLabelValues(op)))
}

func session(i int) admission.LiveSession {
	a := t0.Add(time.Duration(i) * time.Millisecond)
	return admission.LiveSession{ID: fmt.Sprintf("s%06d", i), Tenant: fmt.Sprintf("t%d", i%7), Arrival: a,
		Admitted: a.Add(1500 * time.Microsecond), LastDone: a.Add(time.Minute + 7*time.Nanosecond),
		Context: int64(1000 + i), Peak: int64(2000 + i), PredictedPeak: int64(3000 + i)}
}

// state is n live sessions and a few memories, as an export would give them.
func state(n int) admission.State {
	st := admission.State{Budget: 900_000, ReferenceBudget: 1_000_000,
		Retry: map[string]time.Time{"q1": t0.Add(-time.Minute), "q2": t0.Add(-time.Second)},
		Shed:  map[string]time.Time{"x1": t0.Add(5 * time.Minute)}}
	for i := range n {
		st.Live = append(st.Live, session(i))
	}
	return st
}

func boolp(b bool) *bool { return &b }

func TestSaveLoadRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		st    admission.State
		meta  Meta
		chunk int
	}{
		{name: "empty", st: admission.State{Retry: map[string]time.Time{}, Shed: map[string]time.Time{}}},
		{name: "count-only, no memories", st: admission.State{CountOnly: true, Live: state(3).Live,
			Retry: map[string]time.Time{}, Shed: map[string]time.Time{}}},
		{name: "sessions, memories, term and affinity", st: state(40), meta: Meta{DaemonTerm: 7, Affinity: boolp(false)}},
		{name: "more sessions than a chunk", st: state(1234), meta: Meta{DaemonTerm: 1, Affinity: boolp(true)}, chunk: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := newCluster(t)
			c, epoch := cl.leader("a")
			s, _ := cl.store(c, Options{Chunk: tc.chunk})
			require.NoError(t, s.Save(t.Context(), epoch, tc.st, tc.meta))

			fresh, _ := cl.store(c, Options{})
			st, m, err := fresh.Load(t.Context())
			require.NoError(t, err)
			want := tc.st
			if want.Live == nil {
				want.Live = []admission.LiveSession{}
			}
			assert.Equal(t, want, st)
			wantMeta := tc.meta
			wantMeta.CountOnly, wantMeta.Budget, wantMeta.ReferenceBudget = tc.st.CountOnly, tc.st.Budget, tc.st.ReferenceBudget
			assert.Equal(t, wantMeta, m)
			assert.Equal(t, float64(len(tc.st.Live)), testutil.ToFloat64(fresh.metrics.sessions))
		})
	}
}

// The meta's copies of the budget are the State's: Save cannot store two different budgets.
func TestSaveTakesTheBudgetFromTheState(t *testing.T) {
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	s, _ := cl.store(c, Options{})
	st := state(1)
	require.NoError(t, s.Save(t.Context(), epoch, st, Meta{Budget: 1, ReferenceBudget: 2, CountOnly: true, DaemonTerm: 3}))
	got, m, err := s.Load(t.Context())
	require.NoError(t, err)
	assert.Equal(t, Meta{Budget: st.Budget, ReferenceBudget: st.ReferenceBudget, DaemonTerm: 3}, m)
	assert.Equal(t, st.Budget, got.Budget)
	assert.False(t, got.CountOnly)
}

// After a first Save, a Save writes only what changed: one script call for a few sessions out
// of 1200, none when nothing changed. A session the test overwrote behind the store's back
// stays overwritten, which shows it was not rewritten.
func TestSaveWritesOnlyTheDiff(t *testing.T) {
	const n = 1200
	for _, tc := range []struct {
		name      string
		change    func(st *admission.State, m *Meta)
		wantCalls int
	}{
		{name: "nothing changed", change: func(*admission.State, *Meta) {}, wantCalls: 0},
		{name: "three sessions grew", change: func(st *admission.State, _ *Meta) {
			for _, i := range []int{5, 600, 1100} {
				st.Live[i].Context += 10
				st.Live[i].LastDone = st.Live[i].LastDone.Add(time.Second)
			}
		}, wantCalls: 1},
		{name: "two ended, one new", change: func(st *admission.State, _ *Meta) {
			st.Live = append(st.Live[:10], st.Live[12:]...)
			st.Live = append(st.Live, session(n+1))
		}, wantCalls: 1},
		{name: "only the daemon's term", change: func(_ *admission.State, m *Meta) { m.DaemonTerm++ }, wantCalls: 1},
		{name: "only a retry memory", change: func(st *admission.State, _ *Meta) { st.Retry["q3"] = t0 }, wantCalls: 1},
		{name: "a time in another location, same instant", change: func(st *admission.State, _ *Meta) {
			st.Live[3].Arrival = st.Live[3].Arrival.In(time.FixedZone("CET", 3600))
			st.Shed["x1"] = st.Shed["x1"].In(time.FixedZone("CET", 3600))
		}, wantCalls: 0},
		{name: "1200 changed: three chunks", change: func(st *admission.State, _ *Meta) {
			for i := range st.Live {
				st.Live[i].Peak++
			}
		}, wantCalls: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			cl := newCluster(t)
			c, epoch := cl.leader("a")
			s, _ := cl.store(c, Options{})
			st, m := state(n), Meta{DaemonTerm: 4}
			require.NoError(t, s.Save(ctx, epoch, st, m))
			require.Equal(t, 3, writes(s, opSave), "the first save writes 1200 sessions in three chunks")
			const tampered = "s000900"
			cl.m.HSet(testPrefix+":sessions", tampered, "written behind the store's back")

			next := state(n)
			next.Live = append([]admission.LiveSession(nil), next.Live...)
			tc.change(&next, &m)
			require.NoError(t, s.Save(ctx, epoch, next, m))
			assert.Equal(t, 3+tc.wantCalls, writes(s, opSave))

			got, gotMeta, err := s.Load(ctx)
			if tc.name == "1200 changed: three chunks" {
				require.NoError(t, err, "the tampered session was rewritten")
			} else {
				require.ErrorContains(t, err, `field "`+tampered+`"`, "the tampered session was not rewritten")
				for _, ls := range next.Live {
					if ls.ID == tampered {
						cl.m.HSet(testPrefix+":sessions", tampered, cl.mustJSON(ls))
					}
				}
				got, gotMeta, err = s.Load(ctx)
				require.NoError(t, err)
			}
			sortLive(next.Live)
			assert.Equal(t, len(next.Live), len(got.Live))
			for i := range next.Live {
				assert.True(t, sameSession(&next.Live[i], &got.Live[i]), "session %s", next.Live[i].ID)
			}
			assert.True(t, sameTimes(next.Retry, got.Retry))
			assert.True(t, sameTimes(next.Shed, got.Shed))
			assert.Equal(t, m.DaemonTerm, gotMeta.DaemonTerm)
		})
	}
}

func sortLive(ls []admission.LiveSession) {
	for i := 1; i < len(ls); i++ {
		for j := i; j > 0 && ls[j].ID < ls[j-1].ID; j-- {
			ls[j], ls[j-1] = ls[j-1], ls[j]
		}
	}
}

func (cl *cluster) mustJSON(ls admission.LiveSession) string {
	cl.t.Helper()
	v, err := json.Marshal(ls)
	require.NoError(cl.t, err)
	return string(v)
}

// A new leader's first Save without a Load (or after an error) rewrites everything and
// deletes the sessions a previous leader left that the new state lacks.
func TestFirstSaveRewritesAndDeletesStrays(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	cl.m.HSet(testPrefix+":sessions", "stray-1", "{}", "stray-2", "not even json", "s000001", "stale")
	cl.m.HSet(testPrefix+":admission", "meta", "stale", "retry", "stale", "shed", "stale")
	c, epoch := cl.leader("a")
	rec := recording(c)
	s, _ := cl.store(rec, Options{Chunk: 2})
	st := state(3)
	require.NoError(t, s.Save(ctx, epoch, st, Meta{}))
	assert.Equal(t, 3, writes(s, opSave), "3 sets and 2 deletions in chunks of 2")
	require.Len(t, rec.calls, 3)
	for i, call := range rec.calls {
		n := 0
		for _, cmd := range call {
			switch {
			case cmd.Keys[0] != testPrefix+":sessions":
			case cmd.Name == "HSET":
				n += len(cmd.Args) / 2
			case cmd.Name == "HDEL":
				n += len(cmd.Args)
			}
		}
		assert.LessOrEqual(t, n, 2, "call %d carries %d sessions", i, n)
	}
	table := cl.table()
	assert.Len(t, table, 3)
	assert.NotContains(t, table, "stray-1")
	got, _, err := s.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, st, got)
}

// Ended sessions are deleted from the store by the next Save, and only they.
func TestSaveDeletesEndedSessions(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	s, _ := cl.store(c, Options{})
	st := state(10)
	require.NoError(t, s.Save(ctx, epoch, st, Meta{}))
	st.Live = append(append([]admission.LiveSession(nil), st.Live[:2]...), st.Live[5:]...)
	require.NoError(t, s.Save(ctx, epoch, st, Meta{}))
	table := cl.table()
	assert.Len(t, table, 7)
	for _, id := range []string{"s000002", "s000003", "s000004"} {
		assert.NotContains(t, table, id)
	}
	st.Live = nil
	require.NoError(t, s.Save(ctx, epoch, st, Meta{}))
	assert.Empty(t, cl.table())
}

func TestSaveRefusesABadState(t *testing.T) {
	for _, tc := range []struct {
		name string
		live []admission.LiveSession
		want string
	}{
		{name: "empty id", live: []admission.LiveSession{session(1), {}}, want: "live[1].id: empty"},
		{name: "duplicate id", live: []admission.LiveSession{session(1), session(2), session(1)}, want: `live[2].id: "s000001" twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := newCluster(t)
			c, epoch := cl.leader("a")
			s, _ := cl.store(c, Options{})
			err := s.Save(t.Context(), epoch, admission.State{Live: tc.live}, Meta{})
			require.ErrorContains(t, err, tc.want)
			assert.Empty(t, cl.table(), "nothing written")
		})
	}
}

// A leader whose term another campaign took cannot save: the store is left as the successor
// wrote it, and when the old leader wins a later term its first Save rewrites everything.
func TestFencedSaveWritesNothingAndForgetsTheBase(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	a, ea := cl.leader("a")
	sa, _ := cl.store(a, Options{Chunk: 4})
	st := state(10)
	require.NoError(t, sa.Save(ctx, ea, st, Meta{DaemonTerm: 1}))

	b, eb := cl.leader("b")
	require.Greater(t, eb, ea)
	before := cl.table()
	beforeAdm := cl.m.HGet(testPrefix+":admission", "meta")

	changed := state(12)
	changed.Live[0].Context = 99_999
	err := sa.Save(ctx, ea, changed, Meta{DaemonTerm: 2})
	require.ErrorIs(t, err, lease.ErrFenced)
	fe, ok := err.(*lease.FencedError)
	require.True(t, ok, "the fenced error is returned as is, got %T", err)
	assert.Equal(t, lease.FencedError{Epoch: ea, Current: eb}, *fe)
	assert.Equal(t, before, cl.table(), "the fenced save wrote nothing")
	assert.Equal(t, beforeAdm, cl.m.HGet(testPrefix+":admission", "meta"))
	assert.Nil(t, sa.base, "the diff base is forgotten")
	assert.Zero(t, testutil.ToFloat64(sa.metrics.errors.WithLabelValues(opSave)), "fenced is not a store error")

	err = sa.Admit(ctx, ea, session(50))
	require.ErrorIs(t, err, lease.ErrFenced, "a fenced admission is refused too")
	assert.NotContains(t, cl.table(), session(50).ID)

	// b leads and writes; a takes the lease back later: its Save rewrites the whole table.
	sb, _ := cl.store(b, Options{})
	require.NoError(t, sb.Save(ctx, eb, state(3), Meta{}))
	require.NoError(t, b.Release(ctx))
	a2, ea2 := cl.leader("a")
	require.Greater(t, ea2, eb)
	sa.fencer = a2
	n := writes(sa, opSave)
	require.NoError(t, sa.Save(ctx, ea2, changed, Meta{DaemonTerm: 2}))
	assert.Equal(t, 3, writes(sa, opSave)-n, "12 sessions in chunks of 4: all rewritten")
	got, m, err := sa.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, changed, got)
	assert.Equal(t, uint64(2), m.DaemonTerm)
}

// failingFencer fails one call, as a timed-out call would, after writing it or without.
type failingFencer struct {
	f       Fencer
	mu      sync.Mutex
	calls   int
	failOn  int // 1-based
	applied bool
}

func (f *failingFencer) Write(ctx context.Context, epoch uint64, cmds ...lease.Cmd) ([]any, error) {
	f.mu.Lock()
	f.calls++
	fail := f.calls == f.failOn
	f.mu.Unlock()
	if !fail {
		return f.f.Write(ctx, epoch, cmds...)
	}
	if f.applied {
		if _, err := f.f.Write(ctx, epoch, cmds...); err != nil {
			return nil, err
		}
	}
	return nil, context.DeadlineExceeded
}

// A Save that failed part-way, in the same term, is followed by a full rewrite: the diff base
// cannot say which calls landed.
func TestFailedSaveForgetsTheBase(t *testing.T) {
	for _, applied := range []bool{false, true} {
		t.Run(fmt.Sprintf("failed call applied=%v", applied), func(t *testing.T) {
			ctx := t.Context()
			cl := newCluster(t)
			c, epoch := cl.leader("a")
			f := &failingFencer{f: c, failOn: 3, applied: applied}
			s, _ := cl.store(f, Options{Chunk: 2, SaveParallelism: 1})
			st := state(4)
			require.NoError(t, s.Save(ctx, epoch, st, Meta{}))
			require.Equal(t, 2, f.calls)

			changed := state(4)
			for i := range changed.Live {
				changed.Live[i].Context += 5
			}
			err := s.Save(ctx, epoch, changed, Meta{})
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Equal(t, 1.0, testutil.ToFloat64(s.metrics.errors.WithLabelValues(opSave)))
			require.NoError(t, s.Save(ctx, epoch, changed, Meta{}))
			got, _, err := s.Load(ctx)
			require.NoError(t, err)
			assert.Equal(t, changed, got)
		})
	}
}

// hookClient runs a hook before listing the sessions, as if a caller acted just then.
type hookClient struct {
	*redis.Client
	beforeHKeys func()
}

func (c *hookClient) HKeys(ctx context.Context, key string) *redis.StringSliceCmd {
	if c.beforeHKeys != nil {
		c.beforeHKeys()
	}
	return c.Client.HKeys(ctx, key)
}

// A full rewrite lists the stored sessions to delete strays; one admitted while it lists is not
// a stray, though the state being saved predates it.
func TestFullSaveKeepsASessionAdmittedWhileListing(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	hc := &hookClient{Client: cl.client}
	s, err := New(hc, c, Options{Prefix: testPrefix, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	hc.beforeHKeys = func() { require.NoError(t, s.Admit(ctx, epoch, session(9))) }
	require.NoError(t, s.Save(ctx, epoch, state(2), Meta{}))
	assert.Contains(t, cl.table(), session(9).ID, "the admission is not undone")
	hc.beforeHKeys = nil
	require.NoError(t, s.Save(ctx, epoch, state(2), Meta{})) // it ended meanwhile
	assert.NotContains(t, cl.table(), session(9).ID)
}

// A fenced group commit forgets the diff base too, even one read by Load (which holds for any
// term): the next Save rewrites what the successor wrote in between.
func TestFencedAdmitForgetsALoadedBase(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	a, ea := cl.leader("a")
	sa, _ := cl.store(a, Options{})
	_, _, err := sa.Load(ctx)
	require.NoError(t, err)

	b, eb := cl.leader("b")
	sb, _ := cl.store(b, Options{})
	require.NoError(t, sb.Save(ctx, eb, state(3), Meta{}))
	require.ErrorIs(t, sa.Admit(ctx, ea, session(7)), lease.ErrFenced)

	require.NoError(t, b.Release(ctx))
	a2, ea2 := cl.leader("a")
	sa.fencer = a2
	st := state(1)
	require.NoError(t, sa.Save(ctx, ea2, st, Meta{}))
	got, _, err := sa.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, st, got, "the successor's sessions are deleted")
}

// A Save in another term than the base's rewrites everything, even without an error seen:
// another leader may have written in between.
func TestSaveInANewTermRewritesEverything(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	a, ea := cl.leader("a")
	s, _ := cl.store(a, Options{})
	require.NoError(t, s.Save(ctx, ea, state(5), Meta{}))
	cl.m.HSet(testPrefix+":sessions", "s000001", "overwritten in between", "left-by-another", "{}")
	require.NoError(t, a.Release(ctx))
	a2, ea2 := cl.leader("a")
	s.fencer = a2
	require.NoError(t, s.Save(ctx, ea2, state(5), Meta{}))
	got, _, err := s.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, state(5), got)
}

// gatedFencer holds the first write until the test opens the gate, so that every caller has
// queued behind it.
type gatedFencer struct {
	f     Fencer
	gate  chan struct{}
	once  sync.Once
	held  chan struct{}
	mu    sync.Mutex
	calls [][]lease.Cmd
}

func (g *gatedFencer) Write(ctx context.Context, epoch uint64, cmds ...lease.Cmd) ([]any, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.held)
		<-g.gate
	}
	g.mu.Lock()
	g.calls = append(g.calls, cmds)
	g.mu.Unlock()
	return g.f.Write(ctx, epoch, cmds...)
}

// recording is a fencer that records every call and holds none.
func recording(f Fencer) *gatedFencer {
	g := &gatedFencer{f: f, gate: make(chan struct{}), held: make(chan struct{})}
	close(g.gate)
	return g
}

func (s *Store) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.mu.queue {
		n += len(b.ops)
	}
	return n
}

// Admits arriving while a write is in flight share the next write: N callers, 1 + ⌈(N−1)/chunk⌉
// script calls, every session durable when its Admit returns.
func TestAdmitGroupCommit(t *testing.T) {
	for _, tc := range []struct {
		n, chunk, wantCalls int
	}{
		{n: 1, wantCalls: 1},
		{n: 200, wantCalls: 2},
		{n: 200, chunk: 50, wantCalls: 1 + 4},
	} {
		t.Run(fmt.Sprintf("n=%d chunk=%d", tc.n, tc.chunk), func(t *testing.T) {
			ctx := t.Context()
			cl := newCluster(t)
			c, epoch := cl.leader("a")
			g := &gatedFencer{f: c, gate: make(chan struct{}), held: make(chan struct{})}
			s, _ := cl.store(g, Options{Chunk: tc.chunk})

			errs := make(chan error, tc.n)
			var durable sync.Map
			admit := func(i int) {
				err := s.Admit(ctx, epoch, session(i))
				if err == nil {
					// Durable when Admit returns: the session is in the store already.
					v, herr := cl.client.HGet(ctx, testPrefix+":sessions", session(i).ID).Result()
					if herr == nil && v != "" {
						durable.Store(i, true)
					}
				}
				errs <- err
			}
			go admit(0)
			<-g.held
			for i := 1; i < tc.n; i++ {
				go admit(i)
			}
			require.Eventually(t, func() bool { return s.queued() == tc.n-1 }, 5*time.Second, time.Millisecond)
			close(g.gate)
			for range tc.n {
				require.NoError(t, <-errs)
			}
			assert.Equal(t, tc.wantCalls, writes(s, opCommit))
			assert.Len(t, g.calls, tc.wantCalls)
			assert.Len(t, cl.table(), tc.n)
			count := 0
			durable.Range(func(any, any) bool { count++; return true })
			assert.Equal(t, tc.n, count, "every session was in the store when its Admit returned")
		})
	}
}

// A caller that stops waiting does not cancel the write it shares: its admission still lands.
func TestAdmitCallerGivesUpTheWriteGoesOn(t *testing.T) {
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	g := &gatedFencer{f: c, gate: make(chan struct{}), held: make(chan struct{})}
	s, _ := cl.store(g, Options{})
	first := make(chan error, 1)
	go func() { first <- s.Admit(t.Context(), epoch, session(0)) }()
	<-g.held
	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- s.Admit(ctx, epoch, session(1)) }()
	require.Eventually(t, func() bool { return s.queued() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)
	close(g.gate)
	require.NoError(t, <-first)
	require.Eventually(t, func() bool { _, ok := cl.table()[session(1).ID]; return ok }, 5*time.Second, time.Millisecond,
		"the abandoned admission is written all the same")
}

// The first caller of a burst writes the batch itself: its ctx ending neither cancels that write
// nor the next one, which the callers queued behind it share.
func TestAdmitWriterGivesUpTheWritesGoOn(t *testing.T) {
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	g := &gatedFencer{f: c, gate: make(chan struct{}), held: make(chan struct{})}
	s, _ := cl.store(g, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() { first <- s.Admit(ctx, epoch, session(0)) }()
	<-g.held
	second := make(chan error, 1)
	go func() { second <- s.Admit(t.Context(), epoch, session(1)) }()
	require.Eventually(t, func() bool { return s.queued() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	close(g.gate)
	require.NoError(t, <-first, "its own write was not cancelled")
	require.NoError(t, <-second)
	assert.Len(t, cl.table(), 2)
}

// End deletes at once; the Admits and Ends queued during a write share the next one, sets and
// deletions in one script call.
func TestEndSharesTheGroupCommit(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	g := &gatedFencer{f: c, gate: make(chan struct{}), held: make(chan struct{})}
	s, _ := cl.store(g, Options{})
	done := make(chan error, 4)
	go func() { done <- s.Admit(ctx, epoch, session(0)) }()
	<-g.held
	go func() { done <- s.Admit(ctx, epoch, session(1)) }()
	go func() { done <- s.End(ctx, epoch, session(0).ID, session(5).ID) }()
	go func() { done <- s.Admit(ctx, epoch, session(2)) }()
	require.Eventually(t, func() bool { return s.queued() == 4 }, 5*time.Second, time.Millisecond)
	close(g.gate)
	for range 4 {
		require.NoError(t, <-done)
	}
	assert.ElementsMatch(t, []string{session(1).ID, session(2).ID}, keysOf(cl.table()))
	require.Len(t, g.calls, 2)
	var names []string
	for _, c := range g.calls[1] {
		names = append(names, c.Name)
	}
	assert.Contains(t, names, "HSET")
	assert.Contains(t, names, "HDEL")
	require.ErrorContains(t, s.End(ctx, epoch, ""), "ids[0]: empty")
	require.ErrorContains(t, s.Admit(ctx, epoch, admission.LiveSession{}), "session id is empty")
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A Save whose state was exported before an Admit or End that completed first does not undo
// it; the Save after settles those sessions from its own state.
func TestSaveLeavesGroupCommitsToTheNextSave(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	s, _ := cl.store(c, Options{})
	st := state(4)
	require.NoError(t, s.Save(ctx, epoch, st, Meta{}))

	// s000001 ends and a session with the same id is admitted again; s000002 ends; s000003
	// grows, then ends, and End is called. The export for the next Save came before all that.
	stale := state(4)
	stale.Live = append([]admission.LiveSession{}, st.Live[0], st.Live[3])
	stale.Live[1].Context += 100 // s000003 grew before it ended
	again := session(1)
	again.Context = 77
	require.NoError(t, s.Admit(ctx, epoch, again))
	require.NoError(t, s.End(ctx, epoch, session(3).ID))
	require.NoError(t, s.Save(ctx, epoch, stale, Meta{}))
	table := cl.table()
	assert.Equal(t, cl.mustJSON(again), table[again.ID], "the re-admission stays")
	assert.NotContains(t, table, session(3).ID, "the ended session is not resurrected")
	assert.NotContains(t, table, session(2).ID, "an untouched ended session is deleted")

	// The next export has the re-admitted session and lacks s000003: written as exported.
	fresh := state(4)
	fresh.Live = []admission.LiveSession{st.Live[0], again}
	fresh.Live[1].Context = 78
	require.NoError(t, s.Save(ctx, epoch, fresh, Meta{}))
	got, _, err := s.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, fresh, got)

	// A session admitted and ended between two Saves, absent from both exports, is gone.
	require.NoError(t, s.Admit(ctx, epoch, session(9)))
	require.NoError(t, s.End(ctx, epoch, session(9).ID))
	require.NoError(t, s.Admit(ctx, epoch, session(8)))
	require.NoError(t, s.Save(ctx, epoch, fresh, Meta{})) // exported before session 8
	assert.Contains(t, cl.table(), session(8).ID)
	require.NoError(t, s.Save(ctx, epoch, fresh, Meta{})) // session 8 ended meanwhile
	got, _, err = s.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, fresh, got)
}

func TestLoadNamesTheCorruptField(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sessions []string
		adm      []string
		want     string
	}{
		{name: "session not JSON", sessions: []string{"s1", `{"id":"s1"}`, "s2", `{"id":"s2","context_tokens":"many"}`},
			want: `load basin:test:gateway:sessions field "s2": json: cannot unmarshal`},
		{name: "session under another id", sessions: []string{"s1", `{"id":"s9"}`},
			want: `load basin:test:gateway:sessions field "s1": the session's id is "s9"`},
		{name: "meta", adm: []string{"meta", `{"budget_tokens":`}, want: `load basin:test:gateway:admission field "meta"`},
		{name: "retry", adm: []string{"retry", `{"q1":"yesterday"}`}, want: `load basin:test:gateway:admission field "retry"`},
		{name: "shed", adm: []string{"shed", `[]`}, want: `load basin:test:gateway:admission field "shed"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := newCluster(t)
			if len(tc.sessions) > 0 {
				cl.m.HSet(testPrefix+":sessions", tc.sessions...)
			}
			if len(tc.adm) > 0 {
				cl.m.HSet(testPrefix+":admission", tc.adm...)
			}
			c, _ := cl.leader("a")
			s, _ := cl.store(c, Options{})
			_, _, err := s.Load(t.Context())
			require.ErrorContains(t, err, tc.want)
			assert.Equal(t, 1.0, testutil.ToFloat64(s.metrics.errors.WithLabelValues(opLoad)))
		})
	}
}

// Unknown fields, as a newer gateway may write, do not stop a leader from loading.
func TestLoadIgnoresUnknownFields(t *testing.T) {
	cl := newCluster(t)
	cl.m.HSet(testPrefix+":sessions", "s1", `{"id":"s1","context_tokens":5,"from_the_future":true}`)
	cl.m.HSet(testPrefix+":admission", "meta", `{"daemon_term":3,"new_knob":1}`, "another", "x")
	c, _ := cl.leader("a")
	s, _ := cl.store(c, Options{})
	st, m, err := s.Load(t.Context())
	require.NoError(t, err)
	require.Len(t, st.Live, 1)
	assert.Equal(t, int64(5), st.Live[0].Context)
	assert.Equal(t, uint64(3), m.DaemonTerm)
}

func TestLeaderRoundTrip(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	a, ea := cl.leader("a")
	s, _ := cl.store(a, Options{})
	_, err := s.Leader(ctx)
	require.ErrorIs(t, err, ErrNoLeader)

	li := LeaderInfo{ReplicaID: "gw-0", Epoch: ea, AdminURL: "http://gw-0:8081"}
	require.NoError(t, s.SetLeader(ctx, ea, li))
	got, err := s.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, li, got)
	assert.JSONEq(t, fmt.Sprintf(`{"replica_id":"gw-0","epoch":%d,"admin_url":"http://gw-0:8081"}`, ea),
		mustGet(t, cl.m, testPrefix+":leader"))

	b, eb := cl.leader("b")
	sb, _ := cl.store(b, Options{})
	require.NoError(t, sb.SetLeader(ctx, eb, LeaderInfo{ReplicaID: "gw-1", Epoch: eb}))
	require.ErrorIs(t, s.SetLeader(ctx, ea, li), lease.ErrFenced, "the old leader cannot announce itself again")
	got, err = s.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "gw-1", got.ReplicaID)

	require.NoError(t, cl.m.Set(testPrefix+":leader", "garbage"))
	_, err = s.Leader(ctx)
	require.ErrorContains(t, err, "leader basin:test:gateway:leader")
}

func mustGet(t *testing.T, m *miniredis.Miniredis, key string) string {
	t.Helper()
	v, err := m.Get(key)
	require.NoError(t, err)
	return v
}

func TestHeartbeatAndReplicas(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	c, _ := cl.leader("a")
	s, _ := cl.store(c, Options{})
	rp := func(id string) Replica {
		return Replica{ID: id, Instance: "i-" + id, AdvertiseURL: "http://" + id + ":8081"}
	}
	require.NoError(t, s.Heartbeat(ctx, rp("gw-a"), t0))
	require.NoError(t, s.Heartbeat(ctx, rp("gw-b"), t0.Add(30*time.Minute)))
	require.NoError(t, s.Heartbeat(ctx, rp("gw-c"), t0.Add(40*time.Minute)))
	require.NoError(t, s.Heartbeat(ctx, rp("gw-b"), t0.Add(50*time.Minute)))

	for _, tc := range []struct {
		since time.Time
		want  []string
	}{
		{since: t0, want: []string{"gw-a", "gw-b", "gw-c"}},
		{since: t0.Add(time.Millisecond), want: []string{"gw-b", "gw-c"}},
		{since: t0.Add(45 * time.Minute), want: []string{"gw-b"}},
		{since: t0.Add(51 * time.Minute), want: nil},
	} {
		got, err := s.Replicas(ctx, tc.since)
		require.NoError(t, err)
		assert.Equal(t, tc.want, nilIfEmpty(got), "since %v", tc.since.Sub(t0))
	}
	urls, err := s.ReplicaURLs(ctx, t0.Add(35*time.Minute))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"gw-b": "http://gw-b:8081", "gw-c": "http://gw-c:8081"}, urls)

	// gw-c's heartbeat at 61 min drops gw-a's, more than an hour old, and its claim.
	require.NoError(t, s.Heartbeat(ctx, rp("gw-c"), t0.Add(61*time.Minute)))
	members, err := cl.m.ZMembers(testPrefix + ":replicas")
	require.NoError(t, err)
	assert.Equal(t, []string{"gw-b", "gw-c"}, members)
	claimed, err := cl.m.HKeys(testPrefix + ":replica_ids")
	require.NoError(t, err)
	assert.Equal(t, []string{"gw-b", "gw-c"}, claimed)
	assert.Equal(t, 5, writes(s, opHeartbeat))
	require.ErrorContains(t, s.Heartbeat(ctx, Replica{Instance: "x"}, t0), "replica id is empty")
	require.ErrorContains(t, s.Heartbeat(ctx, Replica{ID: "gw-d"}, t0), "instance")

	// A replica that leaves is no longer seen, and its id is free.
	require.NoError(t, s.Leave(ctx, rp("gw-c")))
	got, err := s.Replicas(ctx, t0.Add(45*time.Minute))
	require.NoError(t, err)
	assert.Equal(t, []string{"gw-b"}, got)
}

// TestAReplicaIDIsOneProcesss: a second process heartbeating under a running replica's id is
// refused, with the first one's advertise URL; the same replica restarted (same advertise URL)
// takes its id over at once; an id whose process stopped heartbeating is free after
// ReplicaFresh; a process cannot leave with another's claim.
func TestAReplicaIDIsOneProcesss(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	c, _ := cl.leader("a")
	s, _ := cl.store(c, Options{})
	first := Replica{ID: "host-a", Instance: "one", AdvertiseURL: "http://10.0.0.1:8081"}
	second := Replica{ID: "host-a", Instance: "two", AdvertiseURL: "http://10.0.0.1:8091"}
	require.NoError(t, s.Heartbeat(ctx, first, t0))

	err := s.Heartbeat(ctx, second, t0.Add(time.Second))
	var inUse *ReplicaIDInUseError
	require.ErrorAs(t, err, &inUse)
	assert.Equal(t, "http://10.0.0.1:8081", inUse.Other.AdvertiseURL)
	assert.Equal(t, "one", inUse.Other.Instance)
	assert.True(t, inUse.LastSeen.Equal(t0), "%v", inUse.LastSeen)
	assert.ErrorContains(t, err, `replica id "host-a" is in use by another running replica, advertised at http://10.0.0.1:8081`)
	require.NoError(t, s.Heartbeat(ctx, first, t0.Add(2*time.Second)), "the first keeps its id")
	require.NoError(t, s.Leave(ctx, second), "not its claim: nothing happens")
	require.ErrorAs(t, s.Heartbeat(ctx, second, t0.Add(3*time.Second)), &inUse)

	restarted := first
	restarted.Instance = "one-again"
	require.NoError(t, s.Heartbeat(ctx, restarted, t0.Add(3*time.Second)), "the same replica restarted")

	require.NoError(t, s.Heartbeat(ctx, second, t0.Add(3*time.Second+ReplicaFresh+time.Millisecond)),
		"an id not heard of for ReplicaFresh is free")
	require.NoError(t, s.Leave(ctx, second))
	require.NoError(t, s.Heartbeat(ctx, first, t0.Add(ReplicaFresh)), "free at once after a clean leave")
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// sameSession must compare every field of LiveSession: a field it missed would never be saved
// when only it changed.
func TestSameSessionCoversEveryField(t *testing.T) {
	base := session(1)
	v := reflect.ValueOf(base)
	for i := range v.NumField() {
		f := v.Type().Field(i)
		t.Run(f.Name, func(t *testing.T) {
			changed := base
			cv := reflect.ValueOf(&changed).Elem().Field(i)
			switch x := cv.Interface().(type) {
			case string:
				cv.SetString(x + "x")
			case int64:
				cv.SetInt(x + 1)
			case time.Time:
				cv.Set(reflect.ValueOf(x.Add(time.Nanosecond)))
			case bool:
				cv.SetBool(!x)
			case float64:
				cv.SetFloat(x + 1)
			default:
				t.Fatalf("field %s of type %s: teach sameSession and this test about it", f.Name, f.Type)
			}
			assert.False(t, sameSession(&base, &changed), "a change of %s goes unnoticed", f.Name)
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{name: "defaults", o: Options{Prefix: "basin:gateway"}},
		{name: "no prefix", o: Options{}, want: "Prefix: required"},
		{name: "space in prefix", o: Options{Prefix: "basin gateway"}, want: "Prefix: no whitespace"},
		{name: "long prefix", o: Options{Prefix: strings.Repeat("p", 300)}, want: "Prefix: at most 256 bytes"},
		{name: "chunk too big", o: Options{Prefix: "p", Chunk: 501}, want: "Chunk: must be 1 to 500, got 501"},
		{name: "negative chunk", o: Options{Prefix: "p", Chunk: -1}, want: "Chunk: must be 1 to 500, got -1"},
		{name: "negative timeout", o: Options{Prefix: "p", WriteTimeout: -time.Second}, want: "WriteTimeout: must be ≥ 0"},
		{name: "parallelism", o: Options{Prefix: "p", SaveParallelism: -2}, want: "SaveParallelism: must be ≥ 1, got -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			_, err = New(idleClient(t), &gatedFencer{}, tc.o)
			require.ErrorContains(t, err, "sessionstore options: "+tc.want)
		})
	}
	_, err := New(nil, &gatedFencer{}, Options{Prefix: "p"})
	require.ErrorContains(t, err, "client is nil")
	_, err = New(idleClient(t), nil, Options{Prefix: "p"})
	require.ErrorContains(t, err, "fencer is nil")
}

// idleClient is a client of no server, closed when the test ends: a client starts goroutines
// of its own whether or not it is used.
func idleClient(t *testing.T) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestQueuedArrivalsOutliveTheLeader: a session queued at the leader keeps its arrival for a
// successor that loads the table before the next Save; a Save that covers it deletes the entry.
func TestQueuedArrivalsOutliveTheLeader(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	c, epoch := cl.leader("a")
	s, _ := cl.store(c, Options{})
	st := state(2)
	require.NoError(t, s.Save(ctx, epoch, st, Meta{}))
	arrival := t0.Add(3 * time.Second)
	require.NoError(t, s.Queue(ctx, epoch, "waiting", arrival))
	require.NoError(t, s.Queue(ctx, epoch, "q1", t0.Add(-2*time.Minute)), "an earlier arrival than the saved memory")
	require.NoError(t, s.Queue(ctx, epoch, session(0).ID, t0), "live meanwhile: no memory")

	// A successor that loads now.
	s2, _ := cl.store(c, Options{})
	got, _, err := s2.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, arrival, got.Retry["waiting"].UTC())
	assert.Equal(t, t0.Add(-2*time.Minute), got.Retry["q1"].UTC(), "the earlier arrival wins")
	assert.NotContains(t, got.Retry, session(0).ID)

	// A Save whose state covers them deletes the entries; one it does not cover stays.
	st.Retry["waiting"] = arrival
	require.NoError(t, s.Queue(ctx, epoch, "later", t0.Add(4*time.Second)))
	require.NoError(t, s.Save(ctx, epoch, st, Meta{}))
	left, err := cl.client.HKeys(ctx, testPrefix+":queued").Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"later"}, left)

	require.NoError(t, cl.client.HSet(ctx, testPrefix+":queued", "bad", "yesterday").Err())
	_, _, err = s2.Load(ctx)
	assert.ErrorContains(t, err, `field "bad"`)
	require.ErrorContains(t, s.Queue(ctx, epoch, "", t0), "session id is empty")
}
