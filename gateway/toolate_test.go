package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A first call that cannot start within admission.start_deadline is refused at once, retryable,
// with the wait estimate as Retry-After (bounded); one that has queued that long is refused then.
// Session s is live from the clock's start: one admission, so the queue's head waits about as
// long as the clock has run, the next one about twice that.
func TestStartDeadlineRefusesEarlyAndRetryably(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHold(t, func(c *Config) {
			c.Admission.BudgetTokens = 1
			c.Admission.StartDeadline = Duration(90 * time.Second)
			c.MaxQueueWait = Duration(10 * time.Minute)
		})
		advance(time.Minute)

		waiting := h.chatAsync(context.Background(), "waiting", 5, nil)
		h.waitQueued(1)
		r := h.chat("late", 5, nil)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
		assert.Equal(t, reasonTooLate, r.header.Get(ReasonHeader))
		assert.Equal(t, "true", r.header.Get(ShouldRetryHeader))
		ra, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err)
		assert.Equal(t, int(MaxRetryAfter.Seconds()), ra, "a two-minute estimate, bounded")
		assert.Equal(t, reasonTooLate, errorOf(t, r).Code)
		assert.Len(t, h.state().Queue, 1, "the refused newcomer did not queue")

		advance(90*time.Second - time.Second)
		pendingNow(t, waiting, "a second before its deadline")
		advance(time.Second)
		r = answeredNow(t, waiting)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
		assert.Equal(t, reasonTooLate, r.header.Get(ReasonHeader))
		assert.Empty(t, h.state().Queue)
		assert.Equal(t, uint64(2), h.state().Counters.TooLate)
		assert.Equal(t, 2.0, testutil.ToFloat64(h.g.metrics.refusals.WithLabelValues("503", reasonTooLate)))
	})
}

// TestFollowersFirstCallRefusedAtTheStartDeadline: replicated, a first call sent to a follower
// queues in the leader's core; at admission.start_deadline the leader refuses it, and the
// follower relays the refusal (503 too_late, retryable) to its client.
func TestFollowersFirstCallRefusedAtTheStartDeadline(t *testing.T) {
	mr := miniredis.RunT(t)
	up := newFakeUpstream(t, okJSON(100, 10))
	hs := make([]*harness, 2)
	for i := range hs {
		admin := httptest.NewUnstartedServer(nil)
		cfg := replicaConfig(t, fmt.Sprintf("gw-%d", i), mr.Addr(), admin, up.URL, "")
		cfg.Admission.StartDeadline = Duration(2 * time.Second)
		cfg.MaxQueueWait = Duration(time.Minute)
		hs[i] = startOn(t, cfg, nil, admin)
	}
	leader, fs := leaderOf(t, hs)
	follower := fs[0]
	// One token of budget: a live session keeps every newcomer queued.
	require.Equal(t, http.StatusOK, leader.chat("a", 5, nil).status)

	start := time.Now()
	late := follower.chatAsync(context.Background(), "b", 5, nil)
	leader.waitQueued(1)
	var r response
	select {
	case r = <-late:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower's queued first call was not refused at its start deadline")
	}
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "refused at the deadline, not before")
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
	assert.Equal(t, reasonTooLate, r.header.Get(ReasonHeader))
	assert.Equal(t, "true", r.header.Get(ShouldRetryHeader))
	assert.Empty(t, leader.state().Queue)
	assert.Equal(t, uint64(1), leader.state().Counters.TooLate)
}
