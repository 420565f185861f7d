package lease

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/redistest"
)

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRealRedisTakeoverFencingAndRestart is the lease against a real redis-server: a leader
// that stops renewing for three TTLs (as a SIGSTOPped process would) is replaced by a higher
// epoch, its writes are refused and it reports the step-down when it resumes; a SIGKILLed
// server restarted from its append-only file keeps the epoch and the campaign goes on.
func TestRealRedisTakeoverFencingAndRestart(t *testing.T) {
	srv := redistest.Start(t, "always") // the epoch must survive a SIGKILL
	client := srv.Client(t)
	ctx := t.Context()
	const ttl = 1500 * time.Millisecond
	opts := func(owner string, rec *recorder) Options {
		return Options{Prefix: testPrefix, Owner: owner, TTL: ttl, OnChange: rec.add, Registerer: prometheus.NewRegistry()}
	}
	var ra, rb recorder
	a, err := New(client, opts("a", &ra))
	require.NoError(t, err)
	b, err := New(client, opts("b", &rb))
	require.NoError(t, err)

	a.Step(ctx) // a is stepped by hand, so the test can pause it
	ea, ok := a.Leader()
	require.True(t, ok)
	_, err = a.Write(ctx, ea, Cmd{Name: "HSET", Keys: []string{"basin:test:session:s1"}, Args: []any{"by", "a"}})
	require.NoError(t, err)

	bctx, stopB := context.WithCancel(ctx)
	bdone := make(chan error, 1)
	go func() { bdone <- b.Run(bctx) }()
	defer func() { stopB(); <-bdone }()

	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) {
		a.Step(ctx)
		_, aok := a.Leader()
		_, bok := b.Leader()
		require.True(t, aok && !bok, "a renews and keeps the lease; b waits")
	}

	// a pauses for three TTLs.
	paused := time.Now()
	var eb uint64
	waitFor(t, 3*ttl, "b takes over the lapsed lease", func() bool {
		eb, ok = b.Leader()
		return ok
	})
	assert.Greater(t, eb, ea, "the takeover starts a later term")
	assert.GreaterOrEqual(t, time.Since(paused), ttl-ttl/3-ttl/20, "not before a's lease could lapse")
	time.Sleep(3*ttl - time.Since(paused))

	// a resumes: its write of the old term is refused by the store before it even looks.
	_, err = a.Write(ctx, ea, Cmd{Name: "HSET", Keys: []string{"basin:test:session:s1"}, Args: []any{"by", "a after the pause"}})
	var fe *FencedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, FencedError{Epoch: ea, Current: eb}, *fe)
	_, ok = a.Leader()
	assert.False(t, ok)
	a.Step(ctx)
	changes := ra.all()
	require.Len(t, changes, 2)
	assert.False(t, changes[1].Leader)
	assert.Equal(t, ea, changes[1].Epoch)
	assert.Contains(t, changes[1].Reason, "no successful renewal since")
	_, err = b.Write(ctx, eb, Cmd{Name: "HSET", Keys: []string{"basin:test:session:s1"}, Args: []any{"by", "b"}})
	require.NoError(t, err)
	by, err := client.HGet(ctx, "basin:test:session:s1", "by").Result()
	require.NoError(t, err)
	assert.Equal(t, "b", by)

	// SIGKILL the store and restart it from its append-only file in the same directory.
	srv.Kill()
	srv.Restart()
	stored, err := client.Get(ctx, testPrefix+":epoch").Uint64()
	require.NoError(t, err, "the epoch survives the restart")
	assert.GreaterOrEqual(t, stored, eb, "the epoch did not go backwards")
	by, err = client.HGet(ctx, "basin:test:session:s1", "by").Result()
	require.NoError(t, err)
	assert.Equal(t, "b", by, "the fenced write survives the restart")

	var leader *Campaign
	var el uint64
	waitFor(t, 3*ttl, "a campaign leads again after the restart", func() bool {
		a.Step(ctx)
		for _, c := range []*Campaign{a, b} {
			if e, ok := c.Leader(); ok {
				leader, el = c, e
				return true
			}
		}
		return false
	})
	assert.GreaterOrEqual(t, el, eb)
	_, err = leader.Write(ctx, el, Cmd{Name: "XADD", Keys: []string{"basin:test:audit"}, Args: []any{"*", "after", "restart"}})
	require.NoError(t, err)
	_, err = a.Write(ctx, ea, Cmd{Name: "DEL", Keys: []string{"basin:test:session:s1"}})
	require.ErrorIs(t, err, ErrFenced, "the old term stays fenced after the restart")
}

// BenchmarkRealRedis measures a renewal and a fenced HSET against a real redis-server on
// loopback, next to a plain HSET for what the fencing script adds, with the append-only file
// fsynced on every write (always: a write waits for the disk) and once a second (everysec: the
// round trip itself).
func BenchmarkRealRedis(b *testing.B) {
	for _, fsync := range []string{"always", "everysec"} {
		b.Run("appendfsync="+fsync, func(b *testing.B) { benchmarkRedis(b, fsync) })
	}
}

func benchmarkRedis(b *testing.B, fsync string) {
	srv := redistest.Start(b, fsync)
	client := srv.Client(b)
	ctx := context.Background()
	c, err := New(client, Options{Prefix: testPrefix, Owner: "bench", TTL: time.Minute})
	require.NoError(b, err)
	c.Step(ctx)
	epoch, ok := c.Leader()
	require.True(b, ok)
	hset := Cmd{Name: "HSET", Keys: []string{"basin:test:session:s1"}, Args: []any{"tokens", 48213, "state", "live"}}

	b.Run("renew", func(b *testing.B) {
		for b.Loop() {
			c.Step(ctx)
		}
		if _, ok := c.Leader(); !ok {
			b.Fatal("lost the lease while renewing")
		}
	})
	b.Run("fenced-hset", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Write(ctx, epoch, hset); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("plain-hset", func(b *testing.B) {
		for b.Loop() {
			if err := client.HSet(ctx, hset.Keys[0], hset.Args...).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
