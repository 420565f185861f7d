package gateway

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
)

// queueB makes session a live and b queued, b's waiter registered as admit does.
func queueB(t *testing.T, g *Gateway) *waiter {
	t.Helper()
	now := g.now()
	require.Equal(t, admission.Admitted, g.core.Arrive(now, admission.Request{ID: "a", FirstPrompt: 10}).Verdict)
	g.mu.Lock()
	d := g.core.Arrive(now, admission.Request{ID: "b", FirstPrompt: 10})
	require.Equal(t, admission.Queued, d.Verdict)
	wt := &waiter{ch: make(chan waitMsg, 1)}
	g.mu.waiters["b"] = append(g.mu.waiters["b"], wt)
	g.mu.Unlock()
	return wt
}

// TestAWaiterGivingUpAsItIsAdmittedGetsTheAdmission runs in a bubble: leave waits for an
// admission on its way, however long its delivery takes short of lostEventWait.
func TestAWaiterGivingUpAsItIsAdmittedGetsTheAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startInBubble(t, newMemNet(), baseConfig(t, []string{"http://upstream.test"}, func(c *Config) { c.Admission.BudgetTokens = 1 }))
		g := h.g
		wt := queueB(t, g)

		// a ends: the core admits b, but the event is not delivered yet when b's wait runs out.
		evs := g.core.End(g.now(), "a")
		require.True(t, g.core.Live("b"))
		type result struct {
			msg waitMsg
			got bool
		}
		left := make(chan result, 1)
		go func() {
			m, got, _ := g.leave("b", wt)
			left <- result{m, got}
		}()
		time.Sleep(lostEventWait - time.Second)
		synctest.Wait()
		select {
		case r := <-left:
			t.Fatalf("leave returned before the admission was delivered: %+v", r)
		default:
		}
		g.deliver(evs)
		synctest.Wait()
		select {
		case r := <-left:
			assert.True(t, r.got)
			assert.Equal(t, admission.EventAdmitted, r.msg.ev.Kind)
			assert.True(t, r.msg.owner)
		default:
			t.Fatal("the admission was lost")
		}
		assert.True(t, g.core.Live("b"))
	})
}

func TestAnAdmissionWithNobodyWaitingGivesTheBudgetBack(t *testing.T) {
	h := start(t, baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
	g := h.g
	queueB(t, g)
	g.mu.Lock()
	delete(g.mu.waiters, "b") // its client vanished without a trace
	g.mu.Unlock()
	g.deliver(g.core.End(g.now(), "a"))
	assert.False(t, g.core.Live("b"), "nobody will send b's call: it must not hold budget")
	assert.Zero(t, g.core.Snapshot(g.now(), false).Reserved)
}

func TestSeveralCallsOfOneQueuedSession(t *testing.T) {
	h := start(t, baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
	g := h.g
	first := queueB(t, g)
	g.mu.Lock()
	d := g.core.Arrive(g.now(), admission.Request{ID: "b", FirstPrompt: 10})
	require.Equal(t, admission.Queued, d.Verdict, "a second call of a queued session waits with it")
	second := &waiter{ch: make(chan waitMsg, 1)}
	g.mu.waiters["b"] = append(g.mu.waiters["b"], second)
	g.mu.Unlock()

	// The second call gives up: the session keeps its place for the first.
	_, got, _ := g.leave("b", second)
	assert.False(t, got)
	assert.Equal(t, 1, g.core.QueueLen())

	g.deliver(g.core.End(g.now(), "a"))
	select {
	case m := <-first.ch:
		assert.Equal(t, admission.EventAdmitted, m.ev.Kind)
		assert.True(t, m.owner)
	case <-time.After(3 * time.Second):
		t.Fatal("the first call was not admitted")
	}
}
