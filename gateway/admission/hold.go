package admission

import (
	"sort"
	"time"
)

// Holding admitted sessions' next calls.
//
// Closing the door (a tighter budget) does nothing for a deployment already trapped: the live
// population is what keeps the working set past the knee, and it drains only as fast as trapped
// calls complete. A hold acts on that population without cutting anyone: a held session stays
// live and admitted, but its next call waits at the gateway (the open request is the wait) until
// the session is resumed or the call has waited Options.HoldBound. Meanwhile its prefix ages out
// of the engine's cache and the sessions still running have the cache to themselves: their
// working set is under the knee, they hit, finish and free room, and the held sessions come back
// a few at a time, each paying one recompute.
//
// Which sessions to hold and when to resume them is remediate's decision (one policy for the
// daemon and the simulator); the core only keeps the hold list, holds the calls and releases
// them. A held session's context and demand stay in the admission test: holding reorders who
// runs among the sessions already admitted, and must not make room for newcomers, or the
// population grows by what is held — measured: a daemon acting from the start on the Basin
// paper's 1P1D spike let 72 sessions live (W/C 3.2) and collapsed the run it otherwise saves.
// Its context stays in the working set the gateway reports (the Basin paper's W), and the held
// part is reported beside it.

// DefaultHoldBound is how long a held call may wait before it passes anyway: well under the
// 10-minute request timeout of the OpenAI and Anthropic SDKs (and Claude Code's default), and
// under the 5-minute stream idle timeout of the Codex CLI, so a held call never costs an agent
// its request.
const DefaultHoldBound = 4 * time.Minute

// CallVerdict is what BeginCall says of a live session's call.
type CallVerdict int

// Call verdicts.
const (
	// CallNotLive: the session is not live (a new session's first call goes through Arrive).
	CallNotLive CallVerdict = iota
	// CallPass: send the call now.
	CallPass
	// CallHeld: the session is held; hold the call until an EventResumed for it.
	CallHeld
)

func (v CallVerdict) String() string {
	switch v {
	case CallPass:
		return "pass"
	case CallHeld:
		return "held"
	}
	return "not_live"
}

// Reasons an EventResumed carries.
const (
	// ResumeReasonResumed: the session was taken off the hold list.
	ResumeReasonResumed = "resumed"
	// ResumeReasonBound: the call waited Options.HoldBound; it passes, the session stays held.
	ResumeReasonBound = "hold_bound"
	// ResumeReasonEnded: the session ended while its call waited (an explicit end): the call
	// is no longer a held session's.
	ResumeReasonEnded = "ended"
)

// BeginCall records that a live session sent a call, as Begin does, and says whether the call
// passes or waits: a held session's call waits (CallHeld) until Resume, the hold bound
// (ExpireHolds) or the session's end releases it with an EventResumed. A waiting call counts as in
// flight, so the session does not expire idle while it waits.
func (c *Core) BeginCall(now time.Time, id string, promptEstimate int64) CallVerdict {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	if !ok {
		return CallNotLive
	}
	c.beginLocked(now, s, promptEstimate)
	if !s.held || !s.waitSince.IsZero() {
		// A second call while one already waits (a client that retried) passes: holding it too
		// would only double what the session asks of the engine when both go.
		return CallPass
	}
	s.waitSince = now
	if c.mu.waiting == 0 || now.Add(c.mu.o.HoldBound).Before(c.mu.holdCheck) {
		c.mu.holdCheck = now.Add(c.mu.o.HoldBound)
	}
	c.mu.waiting++
	c.mu.counters.CallsHeld++
	return CallHeld
}

// Hold puts live sessions on the hold list (unknown, ended, dormant and already held ids are
// skipped) and returns how many it added. Their calls in flight finish; their next calls wait. A
// dormant session is not held: its context is already out of the working set, and if it calls
// again it is active, and the policy may hold it then (dormant.go).
func (c *Core) Hold(now time.Time, ids []string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range ids {
		s, ok := c.mu.live[id]
		if !ok || s.held || s.dormant {
			continue
		}
		c.holdLocked(now, s)
		c.noteLocked(s.id, true, true)
		c.mu.counters.Held++
		n++
	}
	return n
}

// holdLocked puts a live session on the hold list. Its context is counted apart for the reports;
// it stays in the admission test (see above).
func (c *Core) holdLocked(now time.Time, s *session) {
	s.held = true
	s.heldSince = now
	c.mu.heldCtx += s.context
	c.mu.nHeld++
}

// Resume takes sessions off the hold list (ids not held are skipped). A resumed session's waiting
// call is released (EventResumed). Its demand never left the admission test, so resuming it
// admits nobody new.
func (c *Core) Resume(now time.Time, ids []string) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var evs []Event
	for _, id := range ids {
		s, ok := c.mu.live[id]
		if !ok || !s.held {
			continue
		}
		c.unholdLocked(s)
		c.noteLocked(s.id, true, false)
		c.mu.counters.Resumed++
		if e, ok := c.releaseLocked(now, s, ResumeReasonResumed); ok {
			evs = append(evs, e)
		}
	}
	return evs
}

// ExpireHolds releases the waiting calls that have waited HoldBound (EventResumed with
// ResumeReasonBound); their sessions stay held, so their next calls wait again.
func (c *Core) ExpireHolds(now time.Time) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	// holdCheck is no later than the first waiting call's bound, so most calls (the simulator
	// asks after every event) return here without a walk of the live sessions.
	if c.mu.waiting == 0 || now.Before(c.mu.holdCheck) {
		return nil
	}
	var evs []Event
	var next time.Time
	for _, s := range c.mu.live {
		if s.waitSince.IsZero() {
			continue
		}
		if due := s.waitSince.Add(c.mu.o.HoldBound); now.Before(due) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			continue
		}
		e, _ := c.releaseLocked(now, s, ResumeReasonBound)
		c.mu.counters.HoldBoundReleases++
		evs = append(evs, e)
	}
	c.mu.holdCheck = next
	sort.Slice(evs, func(i, j int) bool { return evs[i].ID < evs[j].ID })
	return evs
}

// NextHoldExpiry is when the longest-waiting held call reaches the bound; false when no call
// waits.
func (c *Core) NextHoldExpiry() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, s := range c.mu.live {
		if !s.waitSince.IsZero() && (first.IsZero() || s.waitSince.Before(first)) {
			first = s.waitSince
		}
	}
	if first.IsZero() {
		return time.Time{}, false
	}
	return first.Add(c.mu.o.HoldBound), true
}

// releaseLocked lets a session's waiting call go; false when none waits.
func (c *Core) releaseLocked(now time.Time, s *session, reason string) (Event, bool) {
	if s.waitSince.IsZero() {
		return Event{}, false
	}
	waited := now.Sub(s.waitSince)
	s.waitSince = time.Time{}
	c.mu.waiting--
	c.mu.heldWait += waited
	return Event{Kind: EventResumed, ID: s.id, At: now, Reason: reason, Waited: waited}, true
}

// unholdLocked takes a session off the hold list: its context and demand count again.
func (c *Core) unholdLocked(s *session) {
	s.held = false
	s.heldSince = time.Time{}
	c.mu.heldCtx -= s.context
	c.mu.nHeld--
}

// Held reports whether a session is on the hold list.
func (c *Core) Held(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	return ok && s.held
}

// Abandon takes back a waiting call whose client gave up (or a gateway that stops answering
// it): the call leaves the count of waiting calls and of calls in flight, with no event, and the
// session stays on the hold list. It reports whether a call was waiting.
func (c *Core) Abandon(now time.Time, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	if !ok || s.waitSince.IsZero() {
		return false
	}
	c.releaseLocked(now, s, "")
	if s.inFlight > 0 {
		s.inFlight--
	}
	s.lastDone = now
	return true
}
