package lease

import (
	"context"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunHandsOverAndStepsDownInTime runs two campaigns' loops in a synctest bubble: the store
// is miniredis over in-memory pipes with its TTLs on the bubble's clock, so minutes of renewals,
// a graceful handover and an unreachable store take milliseconds.
func TestRunHandsOverAndStepsDownInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		client := redis.NewClient(&redis.Options{
			Dialer:                func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
			ContextTimeoutEnabled: true,
			MaxRetries:            -1,
			// No hostname to resolve: a DNS lookup's goroutine is shared across bubbles.
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		defer m.Close()
		defer func() { _ = client.Close() }()

		recs := map[string]*recorder{"a": {}, "b": {}}
		camps := map[string]*Campaign{}
		cancels := map[string]context.CancelFunc{}
		done := make(chan struct{}, 2)
		for _, owner := range []string{"a", "b"} {
			c, err := New(client, Options{Prefix: testPrefix, Owner: owner, TTL: 9 * time.Second,
				OnChange: recs[owner].add, Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			camps[owner] = c
			ctx, cancel := context.WithCancel(t.Context())
			cancels[owner] = cancel
			go func() {
				assert.NoError(t, c.Run(ctx))
				done <- struct{}{}
			}()
		}
		leaders := func() (names []string, epoch uint64) {
			for name, c := range camps {
				if e, ok := c.Leader(); ok {
					names, epoch = append(names, name), e
				}
			}
			return names, epoch
		}

		time.Sleep(time.Millisecond)
		synctest.Wait()
		names, epoch := leaders()
		require.Len(t, names, 1, "exactly one of two campaigners leads")
		assert.Equal(t, uint64(1), epoch)
		first := names[0]
		second := map[string]string{"a": "b", "b": "a"}[first]

		time.Sleep(time.Minute) // 20 renewals
		synctest.Wait()
		names, epoch = leaders()
		assert.Equal(t, []string{first}, names, "renewals keep the lease")
		assert.Equal(t, uint64(1), epoch)

		// Stopping the leader releases the lease: the other takes it at its next attempt, not
		// after the TTL.
		stopped := time.Now()
		cancels[first]()
		<-done
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		names, epoch = leaders()
		require.Equal(t, []string{second}, names)
		assert.Equal(t, uint64(2), epoch)
		took := recs[second].all()[0]
		assert.LessOrEqual(t, took.At.Sub(stopped), 3*time.Second)

		// The store stops answering: the leader steps down TTL − Margin (7.2 s) after its last
		// renewal, before the store can lapse the lease (9 s).
		m.SetError("LOADING Redis is loading the dataset in memory")
		unreachable := time.Now()
		time.Sleep(8 * time.Second)
		synctest.Wait()
		names, _ = leaders()
		assert.Empty(t, names)
		changes := recs[second].all()
		require.Len(t, changes, 2)
		lost := changes[1]
		assert.False(t, lost.Leader)
		assert.Contains(t, lost.Reason, "no successful renewal since")
		assert.LessOrEqual(t, lost.At.Sub(unreachable), 7200*time.Millisecond)
		assert.Greater(t, lost.At.Sub(unreachable), 4200*time.Millisecond, "not before its deadline")

		// The store is back: once the old lease lapses the campaign takes it again, a new term.
		m.SetError("")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		names, epoch = leaders()
		assert.Equal(t, []string{second}, names)
		assert.Equal(t, uint64(3), epoch)

		cancels[second]()
		<-done
		assert.False(t, m.Exists(testPrefix+":lease"), "Run releases the lease on return")
	})
}
