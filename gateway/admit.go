package gateway

import (
	"fmt"
	"net/http"
	"time"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/replication"
)

// waiter is a queued call waiting for its session's admission. It receives at most one message,
// so the channel's one slot never blocks the dispatcher.
type waiter struct {
	ch chan waitMsg
	// anonymous: a one-call session, ended with its call, which the journal need not keep.
	anonymous bool
	// ping is set for a held call that asks for a stream: the one-second sweep (expireHolds)
	// pokes it whenever a keep-alive is due, and the call's own goroutine writes it, as only
	// that goroutine may write to the client. nextPing is when the next one is due (g.mu).
	ping     chan struct{}
	nextPing time.Time
}

// waitMsg is an event for a waiting call. owner is set for the one call the admission was for
// (the core counts it in flight); other calls of the same session begin as ordinary calls.
type waitMsg struct {
	ev    admission.Event
	owner bool
}

// lostEventWait bounds the wait for an admission known to be on its way to a waiter (see leave).
const lostEventWait = 10 * time.Second

// admit lets a call through: at once for a live session (once released, for a held one), else
// through the admission core. It reports whether to proxy the call; when it does not, it has answered the client (unless the
// client is gone).
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, c *call) bool {
	// A few rounds, because a session can become live (or end) between the checks; in practice
	// the second round decides. Replicated, every change of leader and every end of a degraded
	// spell sends a held call round again, so it gets more.
	for range g.repl.Rounds() {
		now := g.now()
		// A held session's call waits here (hold.go), on every replica.
		v, hw := g.beginCall(now, c)
		if v == admission.CallNotLive && !g.isStopping() {
			adopt := func(ls admission.LiveSession, first bool) (bool, error) {
				c.first = first
				var err error
				hw, err = g.adopt(c, ls)
				return hw != nil, err
			}
			switch g.repl.AdmitRemote(w, r, c.remote(), adopt) {
			case replication.Admitted:
				v = admission.CallPass
				if hw != nil {
					v = admission.CallHeld // live at the leader, which holds it
				}
			case replication.Answered:
				return false
			}
		}
		switch v {
		case admission.CallPass:
			return true
		case admission.CallHeld:
			res := g.waitHeld(w, r, c, hw, now)
			if c.early != nil {
				// The stream has begun with keep-alives: whatever answers the call from here
				// on, a refusal included, is written into it.
				w = c.early
			}
			switch res {
			case heldPass:
				return true
			case heldRetry:
				continue
			default:
				return false
			}
		}
		if g.isStopping() {
			g.refuseStopping(w, c)
			return false
		}
		if why, retryAfter := g.repl.Degraded(); why != "" && g.cfg.Replication.DegradedAdmission == DegradedRefuse {
			g.refuse(w, refusal{api: c.req.Shape, status: http.StatusServiceUnavailable, reason: reasonDegraded,
				typ: "server_error", retryAfter: retryAfter,
				message: "this gateway replica cannot reach its admission leader (" + why + "); retry shortly"})
			return false
		}
		peak := g.pred.PredictPeak(c.req.Task, c.req.TaskChars, int(min(c.req.Prompt, 1<<31-1)))
		g.mu.Lock()
		// Replicated, a session's arrival is its call's arrival at the deployment, whichever
		// replica holds the call and however often the leader changes while it waits.
		ar := admission.Request{ID: c.id, Tenant: c.tenant, FirstPrompt: c.req.Prompt, PredictedPeak: peak,
			Arrival: g.repl.SessionArrival(c.arrival)}
		d := g.core.Arrive(now, ar)
		var wt *waiter
		if d.Verdict == admission.Admitted && d.Reason != admission.ReasonLive {
			g.admittedLocked(c.id, !c.anonymous)
		}
		if d.Verdict == admission.Queued {
			// Registered under the same lock as the decision, so no event for it can slip past.
			wt = &waiter{ch: make(chan waitMsg, 1), anonymous: c.anonymous}
			g.mu.waiters[c.id] = append(g.mu.waiters[c.id], wt)
		}
		g.deliverLocked(d.Events)
		g.mu.Unlock()

		switch d.Verdict {
		case admission.Admitted:
			if d.Reason == admission.ReasonLive {
				continue // another call admitted the session meanwhile: begin as a live call
			}
			c.first = true
			g.log.Debug("session admitted", "session", c.id, "tenant", c.tenant, "prompt_tokens", c.req.Prompt,
				"predicted_peak_tokens", peak)
			return true
		case admission.OverQuota:
			g.refuse(w, refusal{api: c.req.Shape, status: http.StatusTooManyRequests, reason: reasonTenantQuota, typ: "rate_limit_exceeded",
				retryAfter: d.RetryAfter,
				message:    "this tenant has as many sessions live or queued as its quota allows; retry when one of them ends"})
			return false
		case admission.Refused:
			g.refuseShed(w, c.req.Shape, d.RetryAfter)
			return false
		case admission.TooLate:
			g.refuseTooLate(w, c.req.Shape, d.RetryAfter)
			return false
		case admission.Queued:
			g.repl.Queued(c.id, d.Arrival)
			g.log.Info("session queued", "session", c.id, "tenant", c.tenant, "priority", d.Priority,
				"arrival", d.Arrival, "predicted_peak_tokens", peak)
			switch g.wait(w, r, c, wt) {
			case waitAdmitted:
				c.first = true
				return true
			case waitRetry:
				continue
			default:
				return false
			}
		}
	}
	g.refuseShuttingDown(w, c.req.Shape) // not reached unless sessions flap between live and ended
	return false
}

func (g *Gateway) refuseShed(w http.ResponseWriter, api endpoint, retryAfter time.Duration) {
	g.refuse(w, refusal{api: api, status: 529, reason: reasonShed, typ: "server_error", retryAfter: retryAfter,
		message: "capacity is short: this session was shed to keep the deployment's working set within its cache; " +
			"retrying soon will not help"})
}

// refuseTooLate answers a first call that cannot start within admission.start_deadline: at once,
// retryable, with the wait estimate as Retry-After (bounded by MaxRetryAfter in refuse). A retry
// keeps the session's place in the queue.
func (g *Gateway) refuseTooLate(w http.ResponseWriter, api endpoint, retryAfter time.Duration) {
	g.refuse(w, refusal{api: api, status: http.StatusServiceUnavailable, reason: reasonTooLate, typ: "server_error",
		retryAfter: retryAfter,
		message: fmt.Sprintf("the deployment is at its session budget and this session's first call would not start within %s "+
			"(admission.start_deadline); retry after the time in Retry-After: a retry with the same session id keeps its place",
			time.Duration(g.cfg.Admission.StartDeadline))})
}

func (g *Gateway) refuseShuttingDown(w http.ResponseWriter, api endpoint) {
	g.refuse(w, refusal{api: api, status: http.StatusServiceUnavailable, reason: reasonShuttingDown, typ: "server_error",
		message: "the gateway is shutting down; retry shortly"})
}

// refuseStopping answers a call the gateway will not admit because it is shutting down; a
// follower's first call held here on the leader is sent to ask the next leader instead.
func (g *Gateway) refuseStopping(w http.ResponseWriter, c *call) {
	if c.forwarded {
		g.repl.NotLeader(w)
		return
	}
	g.refuseShuttingDown(w, c.req.Shape)
}

// waitResult is how a queued call's wait ended.
type waitResult int

const (
	waitDone     waitResult = iota // answered (or the client is gone)
	waitAdmitted                   // the session was admitted for this call
	waitRetry                      // the session is live: begin the call as a live one
)

// wait holds a queued call until its session is admitted or shed, the queue wait runs out, the
// client goes away or the gateway shuts down.
func (g *Gateway) wait(w http.ResponseWriter, r *http.Request, c *call, wt *waiter) waitResult {
	timer := time.NewTimer(time.Duration(g.cfg.MaxQueueWait))
	defer timer.Stop()
	var msg waitMsg
	why := ""
	select {
	case msg = <-wt.ch:
	case <-timer.C:
		why = reasonQueueTimeout
	case <-r.Context().Done():
		why = "client_gone"
	case <-g.stopping:
		why = reasonShuttingDown
	}
	if why != "" {
		m, got, retryAfter := g.leave(c.id, wt)
		if !got {
			switch why {
			case reasonQueueTimeout:
				g.refuse(w, refusal{api: c.req.Shape, status: http.StatusServiceUnavailable, reason: reasonQueueTimeout, typ: "server_error",
					retryAfter: retryAfter,
					message: fmt.Sprintf("the deployment is at its session budget and this session was not admitted within %s; "+
						"retry after the time in Retry-After: a retry with the same session id keeps its place in the queue",
						time.Duration(g.cfg.MaxQueueWait))})
			case reasonShuttingDown:
				g.refuseStopping(w, c)
			default:
				g.log.Debug("queued client went away", "session", c.id)
			}
			return waitDone
		}
		msg = m // the event won the race against the timeout
	}
	switch msg.ev.Kind {
	case admission.EventShed:
		// Shed just now: refused for the whole shed memory (the gateway leaves it at the
		// core's default).
		g.refuseShed(w, c.req.Shape, admission.DefaultShedMemory)
		return waitDone
	case admission.EventTooLate:
		g.refuseTooLate(w, c.req.Shape, g.core.RetryAfter(g.now(), c.id))
		return waitDone
	case admission.EventAdmitted:
		if !msg.owner {
			return waitRetry
		}
		if r.Context().Err() != nil {
			// Admitted as the client left: the session never starts, so its budget goes back.
			g.deliver(g.core.End(g.now(), c.id))
			return waitDone
		}
		return waitAdmitted
	}
	return waitDone
}

// leave takes a waiter out of the queue. If an event reached it first, that is returned (got).
// Otherwise the session leaves the core's queue — unless other calls of the same session still
// wait — and retryAfter is the core's estimate just before. A session the core admitted while
// the waiter was giving up has its event on the way (every core call's events are delivered):
// leave waits for it, so the admission is not lost.
func (g *Gateway) leave(id string, wt *waiter) (msg waitMsg, got bool, retryAfter time.Duration) {
	g.mu.Lock()
	select {
	case m := <-wt.ch:
		g.mu.Unlock()
		return m, true, 0
	default:
	}
	ws := g.mu.waiters[id]
	for i, o := range ws {
		if o == wt {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	now := g.now()
	retryAfter = g.core.RetryAfter(now, id)
	if len(ws) > 0 {
		g.mu.waiters[id] = ws // the others keep the session's place
		g.mu.Unlock()
		return msg, false, retryAfter
	}
	delete(g.mu.waiters, id)
	evs := g.core.Cancel(now, id)
	if !g.core.Live(id) {
		g.deliverLocked(evs)
		g.mu.Unlock()
		return msg, false, retryAfter
	}
	g.mu.waiters[id] = []*waiter{wt}
	g.deliverLocked(evs)
	g.mu.Unlock()
	select {
	case m := <-wt.ch:
		return m, true, 0
	case <-time.After(lostEventWait):
		g.log.Error("admission event did not arrive; ending the session", "session", id)
		g.mu.Lock()
		delete(g.mu.waiters, id)
		g.mu.Unlock()
		g.deliver(g.core.End(g.now(), id))
		return msg, false, retryAfter
	}
}

// admittedLocked books a session the core just admitted (g.mu held): its upstream is chosen
// now, and, when journal is set and the gateway keeps a state file, its admission is journaled,
// so that it outlives a crash before the next state save. The caller syncs the journal before
// forwarding the session's first call.
func (g *Gateway) admittedLocked(id string, journal bool) {
	si := &sessionInfo{upstream: g.pickUpstream(id)}
	g.addSessionLocked(id, si)
	g.repl.Admitted(id)
	if !journal || g.journal == nil {
		return
	}
	ls, ok := g.core.LiveSession(id)
	if !ok {
		return // ended already; nothing to keep
	}
	si.journaled = true
	g.journal.add(journalRecord{Op: opAdmit, At: ls.Admitted, Session: &ls,
		Upstream: g.upstreams[si.upstream].url.String()})
}

// deliver hands the core's events to their waiters and bookkeeping.
func (g *Gateway) deliver(evs []admission.Event) {
	if len(evs) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deliverLocked(evs)
}

// deliverLocked delivers events with g.mu held; events they cause are delivered too.
func (g *Gateway) deliverLocked(evs []admission.Event) {
	for len(evs) > 0 {
		ev := evs[0]
		evs = evs[1:]
		switch ev.Kind {
		case admission.EventAdmitted:
			ws := g.mu.waiters[ev.ID]
			delete(g.mu.waiters, ev.ID)
			if !g.repl.Deciding() {
				// A replica that neither leads nor is degraded does not admit: this core's
				// queue drained on a stale budget (a leader resumed after its lease lapsed, an
				// end that arrived as it stepped down). The session goes back and its calls ask
				// the leader.
				evs = append(evs, g.core.Core.End(g.now(), ev.ID)...)
				for _, w := range ws {
					w.ch <- waitMsg{ev: admission.Event{Kind: admission.EventAdmitted, ID: ev.ID, At: ev.At}}
				}
				continue
			}
			g.metrics.queueWait.Observe(ev.Waited.Seconds())
			if len(ws) == 0 {
				// Nobody is there to send the call: give the budget back.
				g.log.Warn("admitted session has no waiting call; ending it", "session", ev.ID)
				evs = append(evs, g.core.End(g.now(), ev.ID)...)
				continue
			}
			g.admittedLocked(ev.ID, !ws[0].anonymous)
			g.log.Debug("session admitted from the queue", "session", ev.ID, "waited", ev.Waited)
			for i, w := range ws {
				w.ch <- waitMsg{ev: ev, owner: i == 0}
			}
		case admission.EventResumed:
			g.releaseHeldLocked(ev)
		case admission.EventShed, admission.EventTooLate:
			ws := g.mu.waiters[ev.ID]
			delete(g.mu.waiters, ev.ID)
			for _, w := range ws {
				w.ch <- waitMsg{ev: ev}
			}
		case admission.EventEnded:
			g.repl.SessionEnded(ev.ID)
			if g.fallback != nil {
				g.fallback.Observe(ev.Peak)
			}
			g.metrics.peak.Observe(float64(ev.Peak))
			if !g.core.Live(ev.ID) {
				if si, ok := g.mu.sessions[ev.ID]; ok && si.journaled && g.journal != nil {
					g.journal.add(journalRecord{Op: opEnd, At: ev.At, ID: ev.ID})
				}
				g.dropSessionLocked(ev.ID)
			}
			g.log.Debug("session ended", "session", ev.ID, "reason", ev.Reason, "peak_tokens", ev.Peak)
		}
	}
}
