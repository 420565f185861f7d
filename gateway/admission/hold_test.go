package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// live admits sessions a, b, c (contexts 100, 200, 300) under a budget of 600.
func liveThree(t *testing.T, o Options) *Core {
	t.Helper()
	o.Budget = 600
	c := core(t, o)
	for i, id := range []string{"a", "b", "c"} {
		d := c.Arrive(at(float64(i)), req(id, int64(100*(i+1)), 0))
		require.Equal(t, Admitted, d.Verdict, id)
		c.Finish(at(float64(i)+0.5), id, int64(100*(i+1)))
	}
	return c
}

func TestHoldWaitsAndResumes(t *testing.T) {
	c := liveThree(t, Options{})
	assert.Equal(t, 2, c.Hold(at(10), []string{"b", "c", "nope", "b"}), "unknown and repeated ids are skipped")
	check(t, c)

	assert.Equal(t, CallPass, c.BeginCall(at(11), "a", 150), "a session not held passes")
	assert.Equal(t, CallHeld, c.BeginCall(at(12), "b", 250), "a held session's call waits")
	assert.Equal(t, CallNotLive, c.BeginCall(at(12), "x", 10))
	assert.Equal(t, CallPass, c.BeginCall(at(13), "b", 250), "a second call while one waits passes")
	check(t, c)

	s := c.Snapshot(at(20), true)
	assert.Equal(t, 2, s.Held)
	assert.Equal(t, int64(250+300), s.HeldTokens, "held contexts follow their calls' prompts")
	assert.Equal(t, 1, s.HeldCalls)
	assert.InDelta(t, 8, s.OldestHeldCallSeconds, 1e-9)
	assert.Equal(t, int64(150+250+300), s.WorkingSet, "held contexts stay in the working set")
	held := map[string]bool{}
	for _, l := range s.Sessions {
		held[l.ID] = l.Held
	}
	assert.Equal(t, map[string]bool{"a": false, "b": true, "c": true}, held)

	evs := c.Resume(at(30), []string{"b", "a"})
	require.Len(t, evs, 1, "only b had a call waiting; a was not held")
	assert.Equal(t, Event{Kind: EventResumed, ID: "b", At: at(30), Reason: ResumeReasonResumed, Waited: 18 * time.Second}, evs[0])
	assert.False(t, c.Held("b"))
	assert.True(t, c.Held("c"))
	assert.Empty(t, c.Resume(at(31), []string{"c"}), "c had no call waiting: nothing to release")
	check(t, c)
	cnt := c.Snapshot(at(32), false).Counters
	assert.Equal(t, Counters{Arrivals: 3, AdmittedAtOnce: 3, Held: 2, Resumed: 2, CallsHeld: 1}, cnt)
}

// Held sessions stay in the admission test: a hold reorders who runs among the admitted, it does
// not admit more (the population would grow by what is held, and the trap with it).
func TestHeldSessionsStayInTheAdmissionTest(t *testing.T) {
	for _, hold := range []bool{false, true} {
		c := liveThree(t, Options{})
		if hold {
			c.Hold(at(5), []string{"c"})
		}
		d := c.Arrive(at(6), req("d", 200, 0))
		assert.Equal(t, Queued, d.Verdict, "held %t: 100+200+300 + 200 is over 600", hold)
		check(t, c)
	}
}

func TestHoldBound(t *testing.T) {
	c := liveThree(t, Options{HoldBound: time.Minute})
	c.Hold(at(10), []string{"a", "b"})
	require.Equal(t, CallHeld, c.BeginCall(at(10), "a", 100))
	require.Equal(t, CallHeld, c.BeginCall(at(40), "b", 200))
	next, ok := c.NextHoldExpiry()
	require.True(t, ok)
	assert.Equal(t, at(70), next)

	assert.Empty(t, c.ExpireHolds(at(69.9)))
	evs := c.ExpireHolds(at(70))
	require.Len(t, evs, 1)
	assert.Equal(t, Event{Kind: EventResumed, ID: "a", At: at(70), Reason: ResumeReasonBound, Waited: time.Minute}, evs[0])
	assert.True(t, c.Held("a"), "a call released at the bound leaves its session held")
	next, _ = c.NextHoldExpiry()
	assert.Equal(t, at(100), next)
	evs = c.ExpireHolds(at(100))
	require.Len(t, evs, 1)
	assert.Equal(t, "b", evs[0].ID)
	_, ok = c.NextHoldExpiry()
	assert.False(t, ok)

	c.Finish(at(101), "a", 120)
	assert.Equal(t, CallHeld, c.BeginCall(at(110), "a", 130), "its next call waits again")
	assert.Equal(t, uint64(2), c.Snapshot(at(111), false).Counters.HoldBoundReleases)
	check(t, c)
}

func TestHeldSessionEndsAndExpiry(t *testing.T) {
	c := liveThree(t, Options{IdleTimeout: time.Minute})
	c.Hold(at(10), []string{"a", "b"})
	require.Equal(t, CallHeld, c.BeginCall(at(10), "a", 100))
	evs := c.End(at(20), "a")
	require.NotEmpty(t, evs)
	assert.Equal(t, Event{Kind: EventResumed, ID: "a", At: at(20), Reason: ResumeReasonEnded, Waited: 10 * time.Second}, evs[0],
		"the waiting call is let go before the end is reported")
	check(t, c)

	// b is held but idle (no call): it expires as any idle session; c too.
	evs = c.Expire(at(200))
	assert.ElementsMatch(t, []string{"b", "c"}, ids(evs, EventEnded))
	s := c.Snapshot(at(200), false)
	assert.Zero(t, s.Held)
	assert.Zero(t, s.HeldTokens)
	check(t, c)
}

// A waiting call counts in flight: its session does not expire idle while its call waits.
func TestWaitingCallIsNotIdle(t *testing.T) {
	c := liveThree(t, Options{IdleTimeout: time.Minute, HoldBound: time.Hour})
	c.Hold(at(10), []string{"a"})
	require.Equal(t, CallHeld, c.BeginCall(at(10), "a", 100))
	assert.NotContains(t, ids(c.Expire(at(300)), EventEnded), "a")
	assert.True(t, c.Live("a"))
}

func TestHeldSurvivesExportRestore(t *testing.T) {
	c := liveThree(t, Options{})
	c.Hold(at(10), []string{"b"})
	st := c.Export(at(11))
	r := core(t, Options{Budget: 600})
	require.NoError(t, r.Restore(at(12), st))
	assert.True(t, r.Held("b"))
	assert.False(t, r.Held("a"))
	assert.Equal(t, CallHeld, r.BeginCall(at(13), "b", 200), "a restored held session's next call still waits")
	check(t, r)
}

func TestHoldBoundValidated(t *testing.T) {
	err := Options{Budget: 1, HoldBound: -time.Second}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "hold_bound")
}

func TestAbandonedWaitingCall(t *testing.T) {
	c := liveThree(t, Options{IdleTimeout: time.Minute})
	c.Hold(at(10), []string{"a"})
	require.Equal(t, CallHeld, c.BeginCall(at(10), "a", 100))
	assert.True(t, c.Abandon(at(20), "a"))
	assert.False(t, c.Abandon(at(21), "a"), "nothing waits any more")
	s := c.Snapshot(at(22), false)
	assert.Zero(t, s.HeldCalls)
	assert.Equal(t, 1, s.Held, "the session stays held")
	assert.Empty(t, c.ExpireHolds(at(1000)), "no bound release for a call that is gone")
	assert.Contains(t, ids(c.Expire(at(81)), EventEnded), "a", "nothing in flight: it idles out from the abandon")
	check(t, c)

	// A client that gave up without Abandon (its gateway only finished the call): the session's
	// idle end does not leave a waiting call behind in the count.
	c = liveThree(t, Options{IdleTimeout: time.Minute})
	c.Hold(at(10), []string{"b"})
	require.Equal(t, CallHeld, c.BeginCall(at(10), "b", 200))
	c.Finish(at(11), "b", 0)
	assert.Contains(t, ids(c.Expire(at(80)), EventEnded), "b")
	assert.Zero(t, c.Snapshot(at(80), false).HeldCalls)
	check(t, c)
}

// The live log carries the hold list, so that a follower's copy of the live set knows which
// sessions the leader holds: a hold and a resume are changes of a live session, and the set
// taken whole lists the held ones.
func TestLiveLogCarriesTheHoldList(t *testing.T) {
	c := liveThree(t, Options{LiveLog: 100})
	_, from, ok := c.LiveSince(0)
	require.True(t, ok)
	c.Hold(at(10), []string{"b", "c"})
	c.Resume(at(11), []string{"c"})
	c.End(at(12), "b")
	ch, _, ok := c.LiveSince(from)
	require.True(t, ok)
	assert.Equal(t, []LiveChange{{ID: "b", Live: true, Held: true}, {ID: "c", Live: true, Held: true},
		{ID: "c", Live: true}, {ID: "b"}}, ch, "an end says nothing of the hold list")

	c.Hold(at(13), []string{"a"})
	ids, held, last := c.LiveSet()
	assert.ElementsMatch(t, []string{"a", "c"}, ids)
	assert.Equal(t, []string{"a"}, held)
	_, want := c.LiveIDs()
	assert.Equal(t, want, last)
	check(t, c)
}

// Merge takes a session new to the core as held when the merged state holds it (a new leader
// loading its predecessor's table, a follower taking in a held session), and leaves the hold list
// of the sessions it already has alone. A merged held session counts as held (its context out of
// the admission test) and its next call waits.
func TestMergeKeepsTheHoldList(t *testing.T) {
	c := liveThree(t, Options{LiveLog: 100})
	c.Hold(at(5), []string{"a"})
	_, from, _ := c.LiveSince(0)
	evs, err := c.Merge(at(6), State{Live: []LiveSession{
		{ID: "a", Context: 100},             // live here and held: stays held
		{ID: "b", Context: 200, Held: true}, // live here, not held: stays as it is
		{ID: "m", Admitted: at(1), LastDone: at(1), Context: 50, Held: true},
	}})
	require.NoError(t, err)
	assert.Empty(t, evs)
	assert.True(t, c.Held("a"))
	assert.False(t, c.Held("b"))
	assert.True(t, c.Held("m"))
	s := c.Snapshot(at(6), false)
	assert.Equal(t, 2, s.Held)
	assert.Equal(t, int64(100+50), s.HeldTokens)
	ch, _, ok := c.LiveSince(from)
	require.True(t, ok)
	assert.Equal(t, []LiveChange{{ID: "m", Live: true, Held: true}}, ch)
	assert.Equal(t, CallHeld, c.BeginCall(at(7), "m", 60))
	check(t, c)
}
