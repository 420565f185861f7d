package gateway

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/admission/inproc"
	"github.com/basin-dev/basin/internal/agentcall"
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
// A held call that asks for a stream is kept alive where its protocol allows: once it has waited
// heldKeepAliveEvery on the injected clock, the sweep pokes it and it sends status 200, the
// event-stream headers and a keep-alive (an SSE comment for the OpenAI APIs, which their SDKs'
// parsers skip; Anthropic's own ping event for Messages), and another every interval after, so
// that proxies and load balancers between the agent and the gateway that cut idle connections do
// not cut it. Once the status is sent the answer cannot send its own (earlyStream): a 2xx event
// stream is passed on as it comes, anything else becomes one error event in the stream. A call
// that does not stream has no such way to say it is alive, and waits silently as before.
//
// Replicated, the leader decides and every replica enforces. POST /admin/holds changes the
// leader's hold list (a follower forwards it, as every admin request); the leader's live log
// carries each hold and resume to the followers with the answers to their reports, and each
// follower holds its own calls of the sessions the leader holds (package replication, through
// replicaHost.Hold), on its own clock for the bound. A follower's waiting call is reported to
// the leader as begun, so the session counts in flight there too and does not idle out; a
// resume reaches the follower with its next report's answer (within report_interval, and a
// second at most).

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

// heldKeepAliveEvery is how long a held streamed call waits before its stream begins with a
// keep-alive, and how often another follows. Not sooner: a call released within it is answered
// with the upstream's own status and headers, as if it had never been held. Well under the idle
// timeouts of common load balancers and proxies (60 s).
const heldKeepAliveEvery = 10 * time.Second

// The keep-alives: an SSE comment, which every SSE parser skips (the OpenAI SDKs' included), and
// for Anthropic Messages the ping event that API itself sends in its streams.
var (
	sseKeepAlive  = []byte(": keep-alive\n\n")
	anthropicPing = []byte("event: ping\ndata: {\"type\": \"ping\"}\n\n")
)

// beginCall begins a live session's call in the core. On CallHeld the call's waiter is
// registered under g.mu with the verdict, so no release can be delivered before it is there.
func (g *Gateway) beginCall(now time.Time, c *call) (admission.CallVerdict, *waiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.forwarded {
		// A follower's call asking the leader (serveArrive) is not held here, where its wait
		// would hold the RPC: the answer carries the session's hold, and the follower holds it.
		if g.core.Begin(now, c.id, c.req.Prompt) {
			return admission.CallPass, nil
		}
		return admission.CallNotLive, nil
	}
	v := g.core.BeginCall(now, c.id, c.req.Prompt)
	if v != admission.CallHeld {
		return v, nil
	}
	return v, g.heldWaiterLocked(now, c)
}

// heldWaiterLocked registers the waiter of a call the core just held (g.mu held).
func (g *Gateway) heldWaiterLocked(now time.Time, c *call) *waiter {
	wt := &waiter{ch: make(chan waitMsg, 1), anonymous: c.anonymous}
	if c.req.Stream {
		wt.ping, wt.nextPing = make(chan struct{}, 1), now.Add(heldKeepAliveEvery)
	}
	g.mu.held[c.id] = append(g.mu.held[c.id], wt)
	g.log.Debug("call held", "session", c.id, "tenant", c.tenant)
	return wt
}

// waitHeld holds a call until its release, the client going away or the gateway stopping; since
// is when it began to wait, on the injected clock. A streamed call's keep-alives are written
// meanwhile; once the first is, c.early is the writer every answer goes through.
func (g *Gateway) waitHeld(w http.ResponseWriter, r *http.Request, c *call, wt *waiter, since time.Time) heldResult {
	var msg waitMsg
	why := ""
wait:
	for {
		select {
		case msg = <-wt.ch:
			break wait
		case <-wt.ping: // nil, never ready, for a call that does not stream
			g.keepAlive(w, c)
		case <-r.Context().Done():
			why = reasonClientGone
			break wait
		case <-g.stopping:
			why = reasonShuttingDown
			break wait
		}
	}
	if c.early != nil {
		w = c.early // a refusal at shutdown becomes an error event in the stream
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

// expireHolds releases the held calls that have waited the hold bound, and pokes the streamed
// ones still waiting whose keep-alive is due. Under g.mu, like every other release of a live
// session's call (a resume), so that a release is delivered before the session's next call can
// be held and take its place on the waiting list.
func (g *Gateway) expireHolds(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deliverLocked(g.core.ExpireHolds(now))
	for _, ws := range g.mu.held {
		for _, wt := range ws {
			if wt.ping == nil || now.Before(wt.nextPing) {
				continue
			}
			// From now, not from when it was due: a clock that jumped (a suspended host)
			// sends one keep-alive, not a burst.
			wt.nextPing = now.Add(heldKeepAliveEvery)
			select {
			case wt.ping <- struct{}{}:
			default: // the last poke is not written yet: one is enough
			}
		}
	}
}

// keepAlive writes a held streamed call's keep-alive, beginning its stream first: status 200
// and the event-stream headers, after which c.early stands for the client's writer.
func (g *Gateway) keepAlive(w http.ResponseWriter, c *call) {
	if c.early == nil {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		c.early = &earlyStream{w: w, api: c.req.Shape, header: http.Header{}, log: g.log.With("session", c.id)}
		g.log.Debug("held stream begun with keep-alives", "session", c.id, "api", c.req.Shape)
	}
	ka := sseKeepAlive
	if c.req.Shape == agentcall.Messages {
		ka = anthropicPing
	}
	// A failed write is a client gone: its request context ends the wait.
	if _, err := c.early.w.Write(ka); err == nil {
		_ = http.NewResponseController(c.early.w).Flush()
	}
}

// Bounds on what an earlyStream keeps of an answer it cannot pass on, and quotes of it.
const (
	maxKeptAnswer = 64 << 10
	maxQuoted     = 1 << 10
)

// earlyStream is the writer of a held streamed call whose status (200) and event-stream headers
// went out with its first keep-alive. What answers the call afterwards — the upstream through
// the proxy, or the gateway's own refusal — can no longer send its status or headers, so it
// writes here instead: a 2xx event stream passes through as it comes (the proxy's flushes
// included); anything else is kept, bounded, and finish writes it as one error event in the
// call's protocol, so that the client sees an error, never an empty stream that looks complete.
// The observer the proxy writes to sits in front, so the call is accounted for by the answer's
// own status.
type earlyStream struct {
	w      http.ResponseWriter // the client's
	api    endpoint
	header http.Header // what the answer set: never sent
	status int         // the answer's status, 0 until it is written
	pass   bool        // a 2xx event stream: its bytes go to the client
	kept   []byte      // anything else's body, up to maxKeptAnswer
	done   bool
	log    *slog.Logger
}

// Header implements http.ResponseWriter: the answer's headers, which stay here.
func (e *earlyStream) Header() http.Header { return e.header }

// WriteHeader implements http.ResponseWriter: it decides whether the answer can pass.
func (e *earlyStream) WriteHeader(code int) {
	if code < 200 || e.status != 0 {
		return // informational, or a second status, which a server would drop too
	}
	e.status = code
	e.pass = code < 300 && bodyMode(e.header) == observeSSE // not compressed, an event stream
}

// Write implements http.ResponseWriter.
func (e *earlyStream) Write(p []byte) (int, error) {
	if e.status == 0 {
		e.WriteHeader(http.StatusOK)
	}
	if e.pass {
		return e.w.Write(p)
	}
	if room := maxKeptAnswer - len(e.kept); room > 0 {
		e.kept = append(e.kept, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

// FlushError lets http.ResponseController flush an answer that passes; nothing else has been
// sent to flush.
func (e *earlyStream) FlushError() error {
	if !e.pass {
		return nil
	}
	return http.NewResponseController(e.w).Flush()
}

// finish writes the error event for an answer that could not pass. An answer never written is
// a client gone (or a stream broken off): there is nothing to say.
func (e *earlyStream) finish() {
	if e.done || e.pass || e.status == 0 {
		e.done = true
		return
	}
	e.done = true
	ev := e.errorEvent()
	e.log.Debug("held stream answered with an error event", "status", e.status, "event", string(ev))
	if _, err := e.w.Write(ev); err == nil {
		_ = http.NewResponseController(e.w).Flush()
	}
}

// errorEvent is the answer kept as an error event of the call's protocol: for the OpenAI APIs a
// data line holding {"error": {...}}, which their SDKs raise as an APIError; for Anthropic
// Messages its error event. The gateway's own refusal (it sets ReasonHeader) is quoted as it is;
// an upstream's error says it was the upstream's, with its status.
func (e *earlyStream) errorEvent() []byte {
	d := readErrorBody(e.kept)
	switch {
	case e.status < 300:
		ct := e.header.Get("Content-Type")
		if ce := e.header.Get("Content-Encoding"); ce != "" {
			ct += ", Content-Encoding " + ce
		}
		d = errorDetail{code: reasonUpstreamError, message: fmt.Sprintf("the upstream answered the streamed call %d with %q, "+
			"not an event stream, which the gateway cannot pass on once the call's stream has begun with keep-alives "+
			"while it was held", e.status, ct)}
	case e.header.Get(ReasonHeader) == "":
		if d.message == "" {
			d.message = http.StatusText(e.status)
		}
		d.message = fmt.Sprintf("the upstream answered %d after the call was held: %s", e.status, d.message)
		if d.code == "" {
			d.code = reasonUpstreamError
		}
	}
	var b []byte
	if e.api == agentcall.Messages {
		typ := d.typ
		if !d.anthropic || typ == "" {
			typ = anthropicErrorType(e.status)
		}
		b, _ = json.Marshal(anthropicError{Type: "error", Error: anthropicErrorDetail{Type: typ, Message: d.message}})
		return fmt.Appendf(nil, "event: error\ndata: %s\n\n", b)
	}
	typ := d.typ
	if typ == "" {
		typ = httpjson.TypeFor(e.status)
		if e.status < 300 {
			typ = "server_error"
		}
	}
	b, _ = json.Marshal(httpjson.NewError(typ, d.code, "", d.message))
	return fmt.Appendf(nil, "data: %s\n\n", b)
}

// errorDetail is what an error body says. anthropic: it was Anthropic's shape, whose type is
// one of that API's.
type errorDetail struct {
	typ, code, message string
	anthropic          bool
}

// readErrorBody reads an error body of the shapes engines answer: OpenAI's {"error": {"message",
// "type", "code"}}, Anthropic's {"type": "error", "error": {"type", "message"}}, {"error":
// "text"}, or a top-level message (vLLM's, TGI's); else it quotes the body's text.
func readErrorBody(b []byte) errorDetail {
	var v struct {
		Type    string          `json:"type"`
		Message string          `json:"message"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &v) == nil {
		var inner struct {
			Type    string          `json:"type"`
			Message string          `json:"message"`
			Code    json.RawMessage `json:"code"`
		}
		var text string
		switch {
		case json.Unmarshal(v.Error, &inner) == nil && inner.Message != "":
			d := errorDetail{typ: inner.Type, message: inner.Message, anthropic: v.Type == "error"}
			_ = json.Unmarshal(inner.Code, &d.code) // a string code only
			return d
		case json.Unmarshal(v.Error, &text) == nil && text != "":
			return errorDetail{message: quote(text)}
		case v.Message != "":
			return errorDetail{typ: v.Type, message: v.Message}
		}
	}
	return errorDetail{message: quote(string(b))}
}

// quote is a body's text as an error message: trimmed, valid UTF-8, at most maxQuoted bytes.
func quote(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxQuoted {
		cut := maxQuoted
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// serveHolds answers POST /admin/holds: it puts sessions on the hold list, takes others off it,
// releasing their waiting calls, and answers with the hold list as it left it.
func (g *Gateway) serveHolds(w http.ResponseWriter, r *http.Request) {
	var req adminapi.HoldRequest
	if !decodeAdmin(w, r, &req) {
		return
	}
	if err := req.Validate(); err != nil {
		badRequest(w, err)
		return
	}
	now := g.now()
	// Under g.mu, so that two changes of the hold list do not interleave and the counts read
	// after are this change's.
	g.mu.Lock()
	before := g.core.Snapshot(now, false).Counters
	added := g.core.Hold(now, req.Hold)
	evs := g.core.Resume(now, req.Resume)
	res := inproc.HoldResult(added, evs, before, g.core.Snapshot(now, false))
	g.deliverLocked(evs)
	g.mu.Unlock()
	// Replicated, on the leader (a follower forwarded the request): the hold list is in the
	// table before the answer, so a successor keeps it.
	g.repl.SaveNow("holds")
	g.log.Info("hold list changed", "reason", req.Reason, "held", res.Added, "resumed", res.Resumed,
		"released_calls", len(res.Released), "held_sessions", res.HeldSessions, "held_tokens", res.HeldTokens,
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
