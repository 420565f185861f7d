package daemon

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/lease"
	"github.com/basin-dev/basin/remediate"
)

// realRedis starts a redis-server (the Debian package) on a free port and returns its address;
// the test is skipped without one, except under CI, where .ci/run installs it.
func realRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not on PATH under CI: .ci/run must install the Debian package redis-server")
		}
		t.Skip("redis-server not on PATH: install the Debian package redis-server to run the store integration tests")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--dir", t.TempDir(), "--save", "", "--appendonly", "no")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	probe := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer probe.Close()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if probe.Ping(context.Background()).Err() == nil {
			return addr
		}
		require.True(t, time.Now().Before(deadline), "redis-server on %s not ready in 5 s", addr)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRealRedisSharedAuditAndState: the daemon's fenced writes — XADD to the audit stream and
// SET of the shared state, in the lease's fence script — run on a real Redis, and are refused
// once another campaigner has taken a later term: the daemon then steps down.
func TestRealRedisSharedAuditAndState(t *testing.T) {
	addr := realRedis(t)
	e := newEnv(t, fmt.Sprintf("store:\n  url: redis://%s/0\ninstance: a\n", addr))
	d := e.daemon()
	t.Cleanup(func() { _ = d.Close() })
	ctx := context.Background()
	d.ha.camp.Step(ctx)
	e.step(d)
	require.Equal(t, RoleActing, d.StatusNow().Role)

	now := d.clock.Now()
	require.NoError(t, d.exec.Pause(now, now.Add(time.Minute), "real redis"))
	require.NoError(t, d.save())
	recs, err := auditStream{d: d, key: d.cfg.Store.Prefix + ":daemon:audit"}.Load(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, recs)
	assert.Equal(t, "pause", recs[len(recs)-1].Kind)
	p, found, err := d.loadShared(ctx)
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "real redis", p.PauseReason)

	// Another campaigner takes the next term (the lease lost in the store): a's writes are fenced.
	require.NoError(t, d.ha.client.Del(ctx, d.cfg.Store.Prefix+":daemon:lease").Err())
	other, err := lease.New(d.ha.client, lease.Options{Prefix: d.cfg.Store.Prefix + ":daemon", Owner: "b"})
	require.NoError(t, err)
	other.Step(ctx)
	_, ok := other.Leader()
	require.True(t, ok)
	err = d.exec.Pause(now, now, "resume")
	require.ErrorIs(t, err, remediate.ErrSuperseded)
	require.ErrorIs(t, err, lease.ErrFenced)
	s := d.StatusNow()
	assert.Equal(t, RoleStandby, s.Role)
	assert.Contains(t, s.RoleReason, "fenced")
}
