package sessionstore

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/lease"
	"github.com/basin-dev/basin/test/redistest"
)

// startRedis starts a real redis-server (test/redistest) with an append-only file fsynced
// as fsync says, and returns a client of it sized for the benchmarks' parallel callers.
func startRedis(tb testing.TB, fsync string) *redis.Client {
	tb.Helper()
	srv := redistest.Start(tb, fsync)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolSize: 64})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// realLeader is a campaign that has taken the gateway lease on client, and a Store on it.
func realLeader(tb testing.TB, client *redis.Client, o Options) (*lease.Campaign, *Store, uint64) {
	tb.Helper()
	c, err := lease.New(client, lease.Options{Prefix: testPrefix, Owner: "bench", TTL: time.Minute, Registerer: prometheus.NewRegistry()})
	require.NoError(tb, err)
	c.Step(context.Background())
	epoch, ok := c.Leader()
	require.True(tb, ok)
	o.Prefix = testPrefix
	s, err := New(client, c, o)
	require.NoError(tb, err)
	return c, s, epoch
}

// churn changes the context of n sessions of st, starting at the k-th n-block, as a save
// period of a busy leader would.
func churn(st *admission.State, k, n int) {
	start := (k * n) % len(st.Live)
	for i := start; i < start+n && i < len(st.Live); i++ {
		st.Live[i].Context++
		st.Live[i].LastDone = st.Live[i].LastDone.Add(time.Second)
	}
}

// TestRealRedisSaveLoad20k is a leader's table of 20,000 sessions through a real redis-server:
// a full save, a save of 1% changed and 100 ended, and a new leader's Load of the result.
func TestRealRedisSaveLoad20k(t *testing.T) {
	client := startRedis(t, "everysec")
	ctx := t.Context()
	_, s, epoch := realLeader(t, client, Options{})
	st := state(20_000)
	meta := Meta{DaemonTerm: 12, Affinity: boolp(true)}

	start := time.Now()
	require.NoError(t, s.Save(ctx, epoch, st, meta))
	full := time.Since(start)
	assert.Equal(t, 40.0, float64(writes(s, opSave)), "20,000 sessions in 40 calls of 500")
	logStat := func(what, cmd string) {
		stats, err := client.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		for line := range strings.Lines(stats) {
			if strings.HasPrefix(line, "cmdstat_"+cmd+":") {
				t.Logf("the store's time %s: %s", what, strings.TrimSpace(line))
			}
		}
	}
	logStat("per script call of 500 sessions", "evalsha")

	churn(&st, 3, 200)
	st.Live = append(st.Live[:100], st.Live[200:]...)
	start = time.Now()
	require.NoError(t, s.Save(ctx, epoch, st, meta))
	diff := time.Since(start)
	assert.Equal(t, 41.0, float64(writes(s, opSave)), "200 changed and 100 ended: one call")

	other, err := New(client, &gatedFencer{}, Options{Prefix: testPrefix})
	require.NoError(t, err)
	start = time.Now()
	got, m, err := other.Load(ctx)
	load := time.Since(start)
	require.NoError(t, err)
	logStat("per HSCAN step of Load (the store serves no one else meanwhile)", "hscan")
	require.Len(t, got.Live, len(st.Live))
	for i := range st.Live {
		require.True(t, sameSession(&st.Live[i], &got.Live[i]), "session %s", st.Live[i].ID)
	}
	assert.True(t, sameTimes(st.Retry, got.Retry))
	assert.Equal(t, meta.DaemonTerm, m.DaemonTerm)
	assert.Equal(t, st.Budget, m.Budget)
	t.Logf("20,000 sessions: full save %v, save of 300 changes %v, load %v", full, diff, load)
}

// BenchmarkRealRedisSave is a leader's periodic Save of 100,000 live sessions of which 1%
// changed since the last, against a real redis-server on loopback; "full" is the rewrite a new
// term starts with.
func BenchmarkRealRedisSave(b *testing.B) {
	for _, fsync := range []string{"everysec", "always"} {
		b.Run("appendfsync="+fsync, func(b *testing.B) {
			client := startRedis(b, fsync)
			ctx := context.Background()
			_, s, epoch := realLeader(b, client, Options{})
			st := state(100_000)
			require.NoError(b, s.Save(ctx, epoch, st, Meta{}))

			b.Run("1%-changed", func(b *testing.B) {
				k := 0
				n0 := writes(s, opSave)
				for b.Loop() {
					k++
					churn(&st, k, 1000)
					if err := s.Save(ctx, epoch, st, Meta{}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(writes(s, opSave)-n0)/float64(k), "calls/op")
			})
			b.Run("full", func(b *testing.B) {
				for b.Loop() {
					s.saveMu.Lock()
					s.base = nil
					s.saveMu.Unlock()
					if err := s.Save(ctx, epoch, st, Meta{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkRealRedisAdmit is admissions made durable by 64 concurrent callers against a real
// redis-server on loopback: group-committed through Admit, and, for comparison, one fenced
// HSET each (what Admit would cost without the group commit); "alone" is one caller at a time,
// where the group commit must cost no more than the round trip ("alone-one-write").
func BenchmarkRealRedisAdmit(b *testing.B) {
	for _, fsync := range []string{"everysec", "always"} {
		b.Run("appendfsync="+fsync, func(b *testing.B) {
			client := startRedis(b, fsync)
			c, s, epoch := realLeader(b, client, Options{})
			var next atomic.Int64
			b.Run("group-commit", func(b *testing.B) {
				n0 := writes(s, opCommit)
				b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					for pb.Next() {
						if err := s.Admit(ctx, epoch, session(int(next.Add(1)))); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(writes(s, opCommit)-n0)/float64(b.N), "calls/op")
			})
			b.Run("alone", func(b *testing.B) {
				ctx := context.Background()
				for b.Loop() {
					if err := s.Admit(ctx, epoch, session(int(next.Add(1)))); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("alone-one-write", func(b *testing.B) {
				ctx := context.Background()
				for b.Loop() {
					ls := session(int(next.Add(1)))
					v, err := json.Marshal(ls)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.Write(ctx, epoch, lease.Cmd{Name: "HSET", Keys: []string{s.keys.sessions}, Args: []any{ls.ID, string(v)}}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("one-write-each", func(b *testing.B) {
				b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					for pb.Next() {
						ls := session(int(next.Add(1)))
						v, err := json.Marshal(ls)
						if err != nil {
							b.Error(err)
							return
						}
						if _, err := c.Write(ctx, epoch, lease.Cmd{Name: "HSET", Keys: []string{s.keys.sessions}, Args: []any{ls.ID, string(v)}}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		})
	}
}

// BenchmarkRealRedisLoad is a new leader reading a table of 100,000 sessions from a real
// redis-server on loopback: what a handover costs before the new leader admits.
func BenchmarkRealRedisLoad(b *testing.B) {
	client := startRedis(b, "everysec")
	ctx := context.Background()
	_, s, epoch := realLeader(b, client, Options{})
	st := state(100_000)
	require.NoError(b, s.Save(ctx, epoch, st, Meta{}))
	for b.Loop() {
		got, _, err := s.Load(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(got.Live) != len(st.Live) {
			b.Fatalf("loaded %d sessions, want %d", len(got.Live), len(st.Live))
		}
	}
}
