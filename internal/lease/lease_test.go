package lease

import (
	"context"
	"log/slog"
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

	"github.com/basin-dev/basin/test/testclock"
)

const testPrefix = "basin:test:admission"

// recorder keeps a campaign's changes of leadership.
type recorder struct {
	mu      sync.Mutex
	changes []Change
}

func (r *recorder) add(ch Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, ch)
}

func (r *recorder) all() []Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Change(nil), r.changes...)
}

// cluster is a miniredis store and a clock the test moves, for campaigns stepped by hand. The
// store's TTLs follow the clock (FastForward in advance).
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
	return &cluster{t: t, m: m, client: client, clock: testclock.New(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))}
}

// advance moves the campaigns' clock and the store's TTLs together.
func (cl *cluster) advance(d time.Duration) {
	cl.clock.Advance(d)
	cl.m.FastForward(d)
}

func (cl *cluster) campaign(owner string, rec *recorder, reg prometheus.Registerer) *Campaign {
	cl.t.Helper()
	o := Options{Prefix: testPrefix, Owner: owner, TTL: 9 * time.Second, Now: cl.clock.Now, Registerer: reg}
	if rec != nil {
		o.OnChange = rec.add
	}
	c, err := New(cl.client, o)
	require.NoError(cl.t, err)
	return c
}

func TestAcquireRenewAndTakeoverIncrementsEpoch(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	var ra, rb recorder
	reg := prometheus.NewRegistry()
	a := cl.campaign("a", &ra, reg)
	b := cl.campaign("b", &rb, nil)

	a.Step(ctx)
	ea, ok := a.Leader()
	require.True(t, ok, "a takes the free lease")
	assert.Equal(t, uint64(1), ea)
	b.Step(ctx)
	_, ok = b.Leader()
	assert.False(t, ok, "b cannot take a held lease")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.leader))

	// a renews every RenewInterval (3 s) for longer than the TTL: the lease never lapses.
	for range 5 {
		cl.advance(3 * time.Second)
		a.Step(ctx)
		b.Step(ctx)
	}
	ea2, ok := a.Leader()
	assert.True(t, ok)
	assert.Equal(t, ea, ea2, "renewal keeps the term")
	_, ok = b.Leader()
	assert.False(t, ok)
	assert.Equal(t, 9*time.Second, cl.m.TTL(testPrefix+":lease"), "renewal restores the full TTL")

	// a stops renewing. At TTL − Margin (7.2 s) it no longer calls itself leader; after the TTL
	// the store frees the lease and b takes it with a higher epoch.
	cl.advance(7200 * time.Millisecond)
	_, ok = a.Leader()
	assert.False(t, ok, "a is past its deadline")
	b.Step(ctx)
	_, ok = b.Leader()
	assert.False(t, ok, "the store still holds a's lease before its TTL")
	cl.advance(1800 * time.Millisecond)
	b.Step(ctx)
	eb, ok := b.Leader()
	require.True(t, ok, "b takes the lapsed lease")
	assert.Equal(t, uint64(2), eb)
	a.Step(ctx)
	_, ok = a.Leader()
	assert.False(t, ok)

	require.Len(t, ra.all(), 2)
	assert.Equal(t, Change{Leader: true, Epoch: 1, At: ra.all()[0].At, Reason: "took the free lease"}, ra.all()[0])
	lost := ra.all()[1]
	assert.False(t, lost.Leader)
	assert.Equal(t, uint64(1), lost.Epoch)
	assert.Contains(t, lost.Reason, "no successful renewal since")
	require.Len(t, rb.all(), 1)
	assert.True(t, rb.all()[0].Leader)
	assert.Equal(t, 0.0, testutil.ToFloat64(a.metrics.leader))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.changes.WithLabelValues("follower")))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.epoch))
}

// A leader whose clock lagged (or that was paused while its deadline passed in real time)
// still believes it leads: its renewal and its writes are refused by the store.
func TestStaleOwnerRenewalAndWritesRefused(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	var ra recorder
	a := cl.campaign("a", &ra, nil)
	b := cl.campaign("b", nil, nil)
	a.Step(ctx)
	ea, ok := a.Leader()
	require.True(t, ok)
	_, err := a.Write(ctx, ea, Cmd{Name: "HSET", Keys: []string{"basin:test:session:s1"}, Args: []any{"by", "a"}})
	require.NoError(t, err)

	cl.m.FastForward(10 * time.Second) // the store's time only: a's clock did not move
	b.Step(ctx)
	eb, ok := b.Leader()
	require.True(t, ok)
	require.Greater(t, eb, ea)
	_, ok = a.Leader()
	require.True(t, ok, "a has not noticed yet")

	_, err = a.Write(ctx, ea, Cmd{Name: "HSET", Keys: []string{"basin:test:session:s1"}, Args: []any{"by", "a again"}})
	require.ErrorIs(t, err, ErrFenced)
	var fe *FencedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, FencedError{Epoch: ea, Current: eb}, *fe)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.fenced))

	out, err := b.Write(ctx, eb,
		Cmd{Name: "HSET", Keys: []string{"basin:test:session:s1"}, Args: []any{"by", "b", "tokens", 1200}},
		Cmd{Name: "HGET", Keys: []string{"basin:test:session:s1"}, Args: []any{"missing"}},
		Cmd{Name: "XADD", Keys: []string{"basin:test:audit"}, Args: []any{"*", "intent", "cut"}})
	require.NoError(t, err)
	require.Len(t, out, 3)
	assert.Equal(t, int64(1), out[0], "one field added, one updated")
	assert.Nil(t, out[1], "a nil reply stays nil")
	assert.Contains(t, out[2], "-", "XADD returns the entry id")
	assert.Equal(t, "b", cl.m.HGet("basin:test:session:s1", "by"), "the fenced write of a did not land")

	a.Step(ctx) // renew: the store names b at a later epoch
	_, ok = a.Leader()
	assert.False(t, ok)
	changes := ra.all()
	require.Len(t, changes, 2)
	assert.False(t, changes[1].Leader)
	assert.Equal(t, `renewal refused: the store has owner "b" at epoch 2`, changes[1].Reason)
	eb2, ok := b.Leader()
	assert.True(t, ok)
	assert.Equal(t, eb, eb2)
}

// The same owner id in two processes (a restart that reused it) is told apart by the epoch.
func TestRenewalChecksTheEpochNotOnlyTheOwner(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	old := cl.campaign("pod-0", nil, nil)
	old.Step(ctx)
	eo, ok := old.Leader()
	require.True(t, ok)
	cl.m.FastForward(10 * time.Second)
	restarted := cl.campaign("pod-0", nil, prometheus.NewRegistry())
	restarted.Step(ctx)
	er, ok := restarted.Leader()
	require.True(t, ok)
	require.Greater(t, er, eo)

	old.Step(ctx)
	_, ok = old.Leader()
	assert.False(t, ok, "the old term's renewal is refused although the owner id matches")
	assert.Equal(t, 9*time.Second, cl.m.TTL(testPrefix+":lease"))
	err := old.Release(ctx)
	require.ErrorIs(t, err, ErrNotOwner)
	assert.True(t, cl.m.Exists(testPrefix+":lease"), "the old term cannot release the new one")
}

func TestReleaseOnlyByTheOwner(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	var ra recorder
	a := cl.campaign("a", &ra, nil)
	b := cl.campaign("b", nil, nil)
	a.Step(ctx)
	b.Step(ctx)

	err := b.Release(ctx)
	require.ErrorIs(t, err, ErrNotOwner)
	assert.Contains(t, err.Error(), `owner "a" at epoch 1`)
	owner, err := cl.m.Get(testPrefix + ":lease")
	require.NoError(t, err)
	assert.Equal(t, "a", owner)

	require.NoError(t, a.Release(ctx))
	assert.False(t, cl.m.Exists(testPrefix+":lease"))
	_, ok := a.Leader()
	assert.False(t, ok)
	require.Len(t, ra.all(), 2)
	assert.Equal(t, "released the lease", ra.all()[1].Reason)

	b.Step(ctx) // no TTL to wait for
	eb, ok := b.Leader()
	require.True(t, ok)
	assert.Equal(t, uint64(2), eb)
}

// A store restored without its epoch key (an old snapshot) must not issue a term the
// campaigners already saw: a fenced write of that old term would pass again.
func TestEpochNeverBelowWhatWasSeen(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	a := cl.campaign("a", nil, nil)
	for range 3 { // three terms: take, release, take again
		a.Step(ctx)
		require.NoError(t, a.Release(ctx))
	}
	cl.m.FlushAll()
	a.Step(ctx)
	e, ok := a.Leader()
	require.True(t, ok)
	assert.Equal(t, uint64(4), e)
}

func TestStoreErrorsSurfaceWrapped(t *testing.T) {
	ctx := t.Context()
	cl := newCluster(t)
	var ra recorder
	a := cl.campaign("a", &ra, nil)
	a.Step(ctx)
	ea, ok := a.Leader()
	require.True(t, ok)

	cl.m.SetError("LOADING Redis is loading the dataset in memory")
	_, err := a.Write(ctx, ea, Cmd{Name: "SET", Keys: []string{"k"}, Args: []any{"v"}})
	require.Error(t, err)
	var rerr redis.Error
	require.ErrorAs(t, err, &rerr, "the store's error is wrapped, not replaced")
	assert.Contains(t, err.Error(), "lease: fenced write at epoch 1 (1 commands): LOADING")
	assert.NotErrorIs(t, err, ErrFenced)

	err = a.Release(ctx)
	require.ErrorAs(t, err, &rerr)
	assert.Contains(t, err.Error(), "lease: release "+testPrefix+":lease: LOADING")

	// Renewals that fail keep the leader until its deadline, then it steps down.
	cl.advance(3 * time.Second)
	a.Step(ctx)
	_, ok = a.Leader()
	assert.True(t, ok, "one failed renewal is retried, not a step-down")
	cl.advance(3 * time.Second)
	a.Step(ctx)
	cl.advance(1200 * time.Millisecond) // 7.2 s = TTL − Margin since the last renewal
	a.Step(ctx)
	_, ok = a.Leader()
	assert.False(t, ok)
	assert.Equal(t, 2.0, testutil.ToFloat64(a.metrics.errors.WithLabelValues("renew")))
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.errors.WithLabelValues("write")))
	require.Len(t, ra.all(), 2)
	assert.Contains(t, ra.all()[1].Reason, "no successful renewal since 2026-12-03T12:00:00Z")

	b := cl.campaign("b", nil, prometheus.NewRegistry())
	b.Step(ctx)
	_, ok = b.Leader()
	assert.False(t, ok)
	assert.Equal(t, 1.0, testutil.ToFloat64(b.metrics.errors.WithLabelValues("acquire")))
}

func TestWriteRejectsACommandWithoutName(t *testing.T) {
	cl := newCluster(t)
	a := cl.campaign("a", nil, nil)
	_, err := a.Write(t.Context(), 1, Cmd{Name: "SET", Keys: []string{"k"}, Args: []any{"v"}}, Cmd{Keys: []string{"k"}})
	require.EqualError(t, err, "lease: fenced write: command 1: Name is empty")
}

func TestOptionsValidate(t *testing.T) {
	ok := Options{Prefix: "basin:prod:admission", Owner: "gw-0"}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string // a substring of the error; empty for none
	}{
		{"defaults", func(*Options) {}, ""},
		{"explicit", func(o *Options) { o.TTL, o.RenewInterval, o.Margin = 15*time.Second, 5*time.Second, 2*time.Second }, ""},
		{"cluster hash tag", func(o *Options) { o.Prefix = "{basin:prod}:admission" }, ""},
		{"no prefix", func(o *Options) { o.Prefix = "" }, "Prefix: required"},
		{"prefix with space", func(o *Options) { o.Prefix = "basin prod" }, "Prefix: no whitespace"},
		{"prefix with newline", func(o *Options) { o.Prefix = "basin\nprod" }, "Prefix: no whitespace"},
		{"prefix too long", func(o *Options) { o.Prefix = strings.Repeat("x", 257) }, "Prefix: at most 256 bytes"},
		{"no owner", func(o *Options) { o.Owner = " " }, "Owner: required"},
		{"negative TTL", func(o *Options) { o.TTL = -time.Second }, "TTL: must be > 0"},
		{"TTL below a millisecond", func(o *Options) { o.TTL = 1500 * time.Microsecond }, "TTL: must be whole milliseconds"},
		{"renew at half the TTL", func(o *Options) { o.TTL, o.RenewInterval = 10*time.Second, 5*time.Second }, "RenewInterval: must be > 0 and less than TTL/2 (5s), got 5s"},
		{"negative renew", func(o *Options) { o.RenewInterval = -time.Second }, "RenewInterval"},
		{"margin leaves no renewal", func(o *Options) { o.TTL, o.RenewInterval, o.Margin = 9*time.Second, 3*time.Second, 7*time.Second }, "Margin: must be ≥ 0 and at most TTL − RenewInterval (6s), got 7s"},
		{"negative margin", func(o *Options) { o.Margin = -time.Millisecond }, "Margin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			err := o.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			_, err = New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), o)
			assert.ErrorContains(t, err, tc.want, "New refuses what Validate refuses")
		})
	}
	t.Run("several at once", func(t *testing.T) {
		err := Options{}.Validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "Prefix: required")
		assert.Contains(t, err.Error(), "Owner: required")
	})
	t.Run("defaults", func(t *testing.T) {
		o := ok.withDefaults()
		assert.Equal(t, DefaultTTL, o.TTL)
		assert.Equal(t, DefaultTTL/3, o.RenewInterval)
		assert.Equal(t, DefaultTTL/5, o.Margin)
	})
	t.Run("nil client", func(t *testing.T) {
		_, err := New(nil, ok)
		assert.EqualError(t, err, "lease: client is nil")
	})
	t.Run("metrics registered twice", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		o := ok
		o.Registerer = reg
		_, err := New(client, o)
		require.NoError(t, err)
		_, err = New(client, o)
		assert.ErrorContains(t, err, "lease basin:prod:admission: register metrics")
	})
}

// TestStoppingIsNotAStoreFailure: a step cut short because its campaign is stopping (its context
// cancelled) is neither counted nor logged as a failed renewal or acquisition — a graceful
// shutdown used to warn "renewal failed" — and the leader stays leader until it releases.
func TestStoppingIsNotAStoreFailure(t *testing.T) {
	cl := newCluster(t)
	var logs strings.Builder
	o := Options{Prefix: testPrefix, Owner: "a", TTL: 9 * time.Second, Now: cl.clock.Now,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	a, err := New(cl.client, o)
	require.NoError(t, err)
	o.Owner = "b"
	b, err := New(cl.client, o)
	require.NoError(t, err)
	a.Step(t.Context())
	_, ok := a.Leader()
	require.True(t, ok)

	stopped, cancel := context.WithCancel(t.Context())
	cancel()
	a.Step(stopped) // a renewal
	b.Step(stopped) // an acquisition
	_, ok = a.Leader()
	assert.True(t, ok, "still leader until its deadline or its release")
	assert.Equal(t, 0.0, testutil.ToFloat64(a.metrics.errors.WithLabelValues("renew")))
	assert.Equal(t, 0.0, testutil.ToFloat64(b.metrics.errors.WithLabelValues("acquire")))
	assert.NotContains(t, logs.String(), "failed", "%s", logs.String())
}
