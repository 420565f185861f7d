package gateway

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/httpjson"
)

// Holding the calls of held sessions (a gateway alone).
//
// The admission core keeps the hold list and says of each call of a live session whether it
// passes or waits (admission.Core.BeginCall); the gateway does the waiting. A held call's open
// request is the wait: no answer is sent until an EventResumed for its session is delivered —
// the session was resumed (POST /admin/holds), the call waited the hold bound (Run's sweep calls
// ExpireHolds on the injected clock every second) or the session ended — or until the client
// gives up or the gateway stops. A released call is proxied as any call of a live session; the
// core counted it in flight when it began to wait, so the session does not expire idle under it.
//
// Replicated, holds are not enforced: a follower's calls do not ask the leader whether they
// pass, so POST /admin/holds is refused rather than shrinking the admission test for sessions
// whose calls would go on running.

// heldResult is how a held call's wait ended.
type heldResult int

const (
	heldDone  heldResult = iota // answered (or the client is gone); the call is finished in the core
	heldPass                    // released: proxy it as a live session's call
	heldRetry                   // the session ended while the call waited: begin it again
)

// reasonClientGone labels a held call whose client gave up (metrics and logs only: nobody is
// left to answer).
const reasonClientGone = "client_gone"

// beginCall begins a live session's call in the core. On CallHeld the call's waiter is
// registered under g.mu with the verdict, so no release can be delivered before it is there.
func (g *Gateway) beginCall(now time.Time, c *call) (admission.CallVerdict, *waiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v := g.core.BeginCall(now, c.id, c.req.Prompt)
	if v != admission.CallHeld {
		return v, nil
	}
	wt := &waiter{ch: make(chan waitMsg, 1), anonymous: c.anonymous}
	g.mu.held[c.id] = append(g.mu.held[c.id], wt)
	g.log.Debug("call held", "session", c.id, "tenant", c.tenant)
	return v, wt
}

// waitHeld holds a call until its release, the client going away or the gateway stopping; since
// is when it began to wait, on the injected clock.
func (g *Gateway) waitHeld(w http.ResponseWriter, r *http.Request, c *call, wt *waiter, since time.Time) heldResult {
	var msg waitMsg
	why := ""
	select {
	case msg = <-wt.ch:
	case <-r.Context().Done():
		why = reasonClientGone
	case <-g.stopping:
		why = reasonShuttingDown
	}
	abandoned := false
	if why != "" {
		g.mu.Lock()
		select {
		case msg = <-wt.ch:
			why = "" // released as it gave up: the release wins, as for a queued call
		default:
			g.dropHeldLocked(c.id, wt)
			// The core stops counting the call as waiting and in flight, so a retry is held
			// afresh and the session idles out if its client never comes back. False: the core
			// released it a moment ago and the release has not reached this call yet.
			abandoned = g.core.Abandon(g.now(), c.id)
		}
		g.mu.Unlock()
	}
	if why == "" && msg.ev.Reason == admission.ResumeReasonEnded {
		// Not a held session's call any more, nor a live one's: it is a new session's first
		// call, and goes through admission like one. The core counted nothing for it since.
		g.metrics.heldWait.WithLabelValues(msg.ev.Reason).Observe(msg.ev.Waited.Seconds())
		return heldRetry
	}
	if why == "" && r.Context().Err() != nil {
		why = reasonClientGone // released as the client left: nothing to send
	}
	if why != "" {
		now := g.now()
		if !abandoned {
			// Released by the core but not sent: BeginCall counted the call in flight, and it
			// is finished here, so the session is idle again and expires as usual.
			g.deliver(g.core.Finish(now, c.id, 0))
		}
		g.metrics.heldWait.WithLabelValues(why).Observe(max(0, now.Sub(since)).Seconds())
		if why == reasonShuttingDown {
			g.refuseStopping(w, c)
		} else {
			g.log.Debug("held client went away", "session", c.id)
		}
		return heldDone
	}
	g.metrics.heldWait.WithLabelValues(msg.ev.Reason).Observe(msg.ev.Waited.Seconds())
	g.log.Debug("held call released", "session", c.id, "reason", msg.ev.Reason, "waited", msg.ev.Waited)
	return heldPass
}

// releaseHeldLocked hands an EventResumed to its session's waiting call (g.mu held). A release
// with nobody waiting is one whose client left as it was released (waitHeld finishes it).
func (g *Gateway) releaseHeldLocked(ev admission.Event) {
	ws := g.mu.held[ev.ID]
	if len(ws) == 0 {
		g.log.Debug("held call released with nobody waiting", "session", ev.ID, "reason", ev.Reason)
		return
	}
	if len(ws) == 1 {
		delete(g.mu.held, ev.ID)
	} else {
		g.mu.held[ev.ID] = ws[1:]
	}
	ws[0].ch <- waitMsg{ev: ev}
}

// dropHeldLocked takes a held call's waiter off the list (g.mu held), its client gone.
func (g *Gateway) dropHeldLocked(id string, wt *waiter) {
	ws := g.mu.held[id]
	for i, o := range ws {
		if o == wt {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(g.mu.held, id)
		return
	}
	g.mu.held[id] = ws
}

// expireHolds releases the held calls that have waited the hold bound. Under g.mu, like every
// other release of a live session's call (a resume), so that a release is delivered before the
// session's next call can be held and take its place on the waiting list.
func (g *Gateway) expireHolds(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deliverLocked(g.core.ExpireHolds(now))
}

// serveHolds answers POST /admin/holds: it puts sessions on the hold list, takes others off it,
// releasing their waiting calls, and answers with the hold list as it left it.
func (g *Gateway) serveHolds(w http.ResponseWriter, r *http.Request) {
	var req adminapi.HoldRequest
	if !decodeAdmin(w, r, &req) {
		return
	}
	if len(req.Hold) == 0 && len(req.Resume) == 0 {
		badField(w, "hold", "hold or resume: at least one session id is required")
		return
	}
	holding := make(map[string]bool, len(req.Hold))
	for i, id := range req.Hold {
		if strings.TrimSpace(id) == "" {
			badField(w, fmt.Sprintf("hold[%d]", i), fmt.Sprintf("hold[%d]: empty session id", i))
			return
		}
		holding[id] = true
	}
	for i, id := range req.Resume {
		switch {
		case strings.TrimSpace(id) == "":
			badField(w, fmt.Sprintf("resume[%d]", i), fmt.Sprintf("resume[%d]: empty session id", i))
			return
		case holding[id]:
			badField(w, fmt.Sprintf("resume[%d]", i), fmt.Sprintf("resume[%d]: %q is also in hold; give each session one change", i, id))
			return
		}
	}
	if strings.TrimSpace(req.Reason) == "" {
		badField(w, "reason", "reason: required, say why sessions are held or resumed")
		return
	}
	if g.repl != nil {
		httpjson.WriteError(w, http.StatusNotImplemented, "invalid_request_error", "not_implemented", "",
			"holds are not enforced on a replicated gateway: its followers' calls do not ask the leader whether they pass")
		return
	}
	now := g.now()
	// Under g.mu, so that two changes of the hold list do not interleave and the counts read
	// after are this change's.
	g.mu.Lock()
	before := g.core.Snapshot(now, false).Counters
	added := g.core.Hold(now, req.Hold)
	evs := g.core.Resume(now, req.Resume)
	after := g.core.Snapshot(now, false)
	released := []string{}
	for _, e := range evs {
		if e.Kind == admission.EventResumed {
			released = append(released, e.ID)
		}
	}
	g.deliverLocked(evs)
	g.mu.Unlock()
	res := adminapi.HoldResult{Added: added, Resumed: int(after.Counters.Resumed - before.Resumed), Released: released,
		HeldSessions: after.Held, HeldTokens: after.HeldTokens, HeldCalls: after.HeldCalls}
	g.log.Info("hold list changed", "reason", req.Reason, "held", res.Added, "resumed", res.Resumed,
		"released_calls", len(released), "held_sessions", res.HeldSessions, "held_tokens", res.HeldTokens,
		"held_calls", res.HeldCalls)
	httpjson.Write(w, http.StatusOK, res)
}

// liveSessions lists the live sessions by id, one at a time from the core rather than with the
// queue's listing (Snapshot lists both under one lock): a session that ends meanwhile is left
// out, so the list may be a moment younger than the counts beside it.
func (g *Gateway) liveSessions(now time.Time) []admission.LiveSession {
	ids, _ := g.core.LiveIDs()
	slices.Sort(ids)
	out := make([]admission.LiveSession, 0, len(ids))
	for _, id := range ids {
		if ls, ok := g.core.LiveSessionAt(now, id); ok {
			out = append(out, ls)
		}
	}
	return out
}
