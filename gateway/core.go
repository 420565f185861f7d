package gateway

import (
	"time"

	"github.com/basin-dev/basin/gateway/admission"
)

// core is the admission core as the gateway drives it. Alone, and on the admission leader, it is
// the core itself. On a follower in replicated mode, the calls of the sessions it serves are
// also reported to the leader: Begin, Finish and End here tell the replicator, which queues a
// report, so every call path of the gateway keeps the leader's working set without knowing
// about replicas. Code that must not report (applying the leader's own answers) calls the
// embedded Core.
type core struct {
	*admission.Core
	repl callReporter
}

// Begin begins a call of a live session.
func (c core) Begin(now time.Time, id string, promptEstimate int64) bool {
	if !c.Core.Begin(now, id, promptEstimate) {
		return false
	}
	c.repl.ReportBegin(id, promptEstimate)
	return true
}

// BeginCall begins a call of a live session, held or not. A held call is reported begun too:
// it counts in flight at the leader as here, so the session does not idle out there while its
// call waits on this replica.
func (c core) BeginCall(now time.Time, id string, promptEstimate int64) admission.CallVerdict {
	v := c.Core.BeginCall(now, id, promptEstimate)
	if v != admission.CallNotLive {
		c.repl.ReportBegin(id, promptEstimate)
	}
	return v
}

// Abandon takes back a held call whose client gave up; the leader, told it began, is told it
// finished (with no tokens, which keeps the session's context).
func (c core) Abandon(now time.Time, id string) bool {
	if !c.Core.Abandon(now, id) {
		return false
	}
	c.repl.ReportFinish(id, 0)
	return true
}

// Finish finishes a call of a live session.
func (c core) Finish(now time.Time, id string, contextTokens int64) []admission.Event {
	evs := c.Core.Finish(now, id, contextTokens)
	c.repl.ReportFinish(id, contextTokens)
	return evs
}

// End ends a live session.
func (c core) End(now time.Time, id string) []admission.Event {
	evs := c.Core.End(now, id)
	if len(evs) > 0 {
		c.repl.ReportEnd(id)
	}
	return evs
}
