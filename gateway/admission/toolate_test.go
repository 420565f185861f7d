package admission

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The core takes its times as arguments; these tests read them from the synctest bubble's clock,
// which advances only when every goroutine in the bubble sleeps, so the waits are exact.

// A newcomer that would start past its start deadline is refused at once with the estimate, and a
// queued session that reaches it is refused then; both keep their places for a retry, which gets
// a fresh deadline.
func TestStartDeadlineRefusesWhatCannotMakeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := core(t, Options{Budget: 100, StartDeadline: 5 * time.Minute})
		require.Equal(t, Admitted, c.Arrive(time.Now(), req("a", 90, 0)).Verdict)
		time.Sleep(5 * time.Minute)
		// One admission in five minutes: the head of the queue waits about five minutes (not
		// past the deadline), the next about ten.
		d := c.Arrive(time.Now(), req("b", 30, 0))
		require.Equal(t, Queued, d.Verdict, "at the head: %v", d)
		d = c.Arrive(time.Now(), req("c", 30, 0))
		require.Equal(t, TooLate, d.Verdict, "second in the queue")
		assert.Equal(t, 10*time.Minute, d.RetryAfter)
		assert.False(t, c.Queued("c"), "a refused newcomer is not queued")
		assert.Equal(t, uint64(1), c.Snapshot(time.Now(), false).Counters.TooLate)

		time.Sleep(5*time.Minute - time.Second)
		assert.Empty(t, c.ExpireQueued(time.Now()), "b's deadline is a second away")
		time.Sleep(time.Second)
		evs := c.ExpireQueued(time.Now())
		require.Len(t, evs, 1)
		assert.Equal(t, Event{Kind: EventTooLate, ID: "b", At: time.Now(), Reason: "too_late", Waited: 5 * time.Minute}, evs[0])
		assert.False(t, c.Queued("b"))
		assert.Equal(t, uint64(2), c.Snapshot(time.Now(), false).Counters.TooLate)
		check(t, c)

		// b asks again: its place back (the same priority), and a new deadline from now.
		d = c.Arrive(time.Now(), req("b", 30, 0))
		require.Equal(t, Queued, d.Verdict, "%v", d)
		time.Sleep(4 * time.Minute)
		assert.Empty(t, c.ExpireQueued(time.Now()), "the retry's deadline runs from the retry")
		// a ends: b fits and is admitted, never refused.
		evs = c.End(time.Now(), "a")
		assert.Equal(t, EventAdmitted, evs[len(evs)-1].Kind)
		assert.True(t, c.Live("b"))
		check(t, c)
	})
}

func TestStartDeadlineOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := core(t, Options{Budget: 100})
		require.Equal(t, Admitted, c.Arrive(time.Now(), req("a", 90, 0)).Verdict)
		time.Sleep(5 * time.Minute)
		for _, id := range []string{"b", "c", "d"} {
			require.Equal(t, Queued, c.Arrive(time.Now(), req(id, 30, 0)).Verdict, id)
		}
		time.Sleep(time.Hour)
		assert.Empty(t, c.ExpireQueued(time.Now()))
		assert.Zero(t, c.Snapshot(time.Now(), false).Counters.TooLate)
	})
}

// A held call goes at the hold bound, to the second.
func TestHoldBoundOnTheBubblesClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := core(t, Options{Budget: 600})
		require.Equal(t, Admitted, c.Arrive(time.Now(), req("a", 100, 0)).Verdict)
		c.Finish(time.Now(), "a", 100)
		require.Equal(t, 1, c.Hold(time.Now(), []string{"a"}))
		time.Sleep(time.Minute)
		require.Equal(t, CallHeld, c.BeginCall(time.Now(), "a", 150))
		next, ok := c.NextHoldExpiry()
		require.True(t, ok)
		assert.Equal(t, time.Now().Add(DefaultHoldBound), next)
		time.Sleep(DefaultHoldBound - time.Second)
		assert.Empty(t, c.ExpireHolds(time.Now()))
		time.Sleep(time.Second)
		evs := c.ExpireHolds(time.Now())
		require.Len(t, evs, 1)
		assert.Equal(t, Event{Kind: EventResumed, ID: "a", At: time.Now(), Reason: ResumeReasonBound, Waited: DefaultHoldBound}, evs[0])
		assert.True(t, c.Held("a"), "released at the bound, still on the hold list: its next call waits again")
		assert.Equal(t, uint64(1), c.Snapshot(time.Now(), false).Counters.HoldBoundReleases)
	})
}
