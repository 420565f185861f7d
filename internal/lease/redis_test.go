package lease

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// redisServer is a real redis-server (the Debian package) on its own port and directory, with
// an append-only file.
type redisServer struct {
	tb    testing.TB
	bin   string
	dir   string
	addr  string
	fsync string // appendfsync: always, everysec
	cmd   *exec.Cmd
}

// startRedis starts redis-server with appendfsync set to fsync, skipping the test when it is not installed, except under CI
// (CI set), where .ci/run installs it and a missing server is a failure.
func startRedis(tb testing.TB, fsync string) *redisServer {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("redis-server not on PATH under CI: .ci/run must install the Debian package redis-server")
		}
		tb.Skip("redis-server not on PATH: install the Debian package redis-server to run the store integration tests")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	addr := l.Addr().String()
	require.NoError(tb, l.Close())
	s := &redisServer{tb: tb, bin: bin, dir: tb.TempDir(), addr: addr, fsync: fsync}
	s.start()
	tb.Cleanup(s.kill)
	return s
}

func (s *redisServer) start() {
	s.tb.Helper()
	_, port, err := net.SplitHostPort(s.addr)
	require.NoError(s.tb, err)
	log, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(s.tb, err)
	defer func() { _ = log.Close() }()
	s.cmd = exec.Command(s.bin, "--port", port, "--bind", "127.0.0.1", "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", s.fsync, "--save", "", "--daemonize", "no")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	require.NoError(s.tb, s.cmd.Start())

	probe := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer func() { _ = probe.Close() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := probe.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.tb.Fatalf("redis-server on %s not ready in 5 s: %v\n%s", s.addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the server: no shutdown, no final fsync.
func (s *redisServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

func (s *redisServer) client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: s.addr, ContextTimeoutEnabled: true,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

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
	srv := startRedis(t, "always") // the epoch must survive a SIGKILL
	client := srv.client(t)
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
	srv.kill()
	srv.start()
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
	srv := startRedis(b, fsync)
	client := srv.client(b)
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
