package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/httpjson"
)

// routes is the OpenAI-compatible listener.
func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", g.serveCall(chatEndpoint))
	mux.HandleFunc("POST /v1/completions", g.serveCall(completionEndpoint))
	mux.HandleFunc("POST /v1/responses", g.serveCall(agentcall.Responses))
	mux.HandleFunc("POST /v1/messages", g.serveCall(agentcall.Messages))
	mux.HandleFunc("POST /v1/sessions/{id}/end", g.serveEndSession)
	mux.HandleFunc("/", g.servePassThrough)
	return mux
}

// callKey keys the call being proxied in its request context, for the proxy's Rewrite.
type callKey struct{}

// call is one model call on its way through the gateway.
type call struct {
	id       string
	tenant   string
	arrival  time.Time
	req      agentcall.Call
	endAfter bool // x-session-end, or a one-call session
	// chained: a Responses call the server keeps (store not false), so that a later call can
	// continue it by its response id.
	chained   bool
	first     bool // this call started the session (admitted it)
	anonymous bool
	// forwarded: a follower's first call, admitted here on the leader for it (replicated mode).
	forwarded bool
	// client is the client's request context: the upstream call's may end sooner
	// (upstream_timeout).
	client context.Context
	// early is set once a held streamed call's status and stream headers went out with its
	// first keep-alive (hold.go): the answer is written into that stream.
	early *earlyStream
}

// newProxy is the reverse proxy to one upstream: it flushes every write (FlushInterval -1), so
// streamed events reach the client as they arrive, and sets the routing key when affinity is on.
func (g *Gateway) newProxy(target *url.URL) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			if c, ok := pr.In.Context().Value(callKey{}).(*call); ok && g.affinity.Load() {
				pr.Out.Header.Set(g.cfg.Affinity.Header, routingKey(c.id))
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			g.noteSpeed(resp.Header)
			return nil
		},
		Transport:     g.transport,
		FlushInterval: -1,
		ErrorHandler:  g.proxyError,
		ErrorLog:      slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
}

// routingKey is the session id as a header value. An id from a request body may hold characters
// no header may carry (a newline in metadata.session_id); Go's client would refuse to send it and
// the call would fail as if the upstream were down. Such an id is replaced by a stable hash of
// it, so its calls still stick to one decode instance.
func routingKey(id string) string {
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			sum := sha256.Sum256([]byte(id))
			return "h-" + hex.EncodeToString(sum[:12])
		}
	}
	return id
}

// proxyError answers a call the upstream did not: 504 when upstream_timeout ran out, else 502,
// unless the client is gone.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	client := r.Context()
	var api endpoint
	if c, ok := r.Context().Value(callKey{}).(*call); ok {
		api = c.req.Shape
		if c.client != nil {
			client = c.client
		}
	}
	if client.Err() != nil {
		return // the client went away: nobody to answer
	}
	if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		g.log.Warn("upstream call timed out", "path", r.URL.Path, "upstream_timeout", time.Duration(g.cfg.UpstreamTimeout))
		g.refuse(w, refusal{api: api, status: http.StatusGatewayTimeout, reason: reasonUpstreamTimeout, typ: "server_error",
			message: fmt.Sprintf("the upstream did not answer within %v (upstream_timeout)", time.Duration(g.cfg.UpstreamTimeout))})
		return
	}
	g.log.Warn("upstream request failed", "path", r.URL.Path, "err", err)
	g.refuse(w, refusal{api: api, status: http.StatusBadGateway, reason: reasonUpstreamError, typ: "server_error",
		message: "the gateway could not reach the upstream: " + err.Error()})
}

// serveCall handles a model call of any API served (chat, completions, Responses, Messages): identify its session, admit it (or hold it in the
// queue, or refuse it), proxy it and account for what the response says.
func (g *Gateway) serveCall(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.calls.enter()
		defer g.calls.exit()
		arrival := g.now()
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				g.refuse(w, refusal{api: ep, status: http.StatusRequestEntityTooLarge, reason: reasonBodyTooLarge,
					typ: "invalid_request_error", message: fmt.Sprintf("request body is larger than %d bytes (max_body_bytes)", mbe.Limit)})
			}
			return // else the client is gone
		}
		c := &call{arrival: arrival, req: parseCall(ep, body), tenant: g.tenant(r.Header)}
		if c.endAfter, err = sessionEnd(r.Header); err != nil {
			g.refuse(w, refusal{api: ep, status: http.StatusBadRequest, reason: reasonBadRequest, typ: "invalid_request_error",
				param: "x-session-end", message: fmt.Sprintf("x-session-end: header must be true or false, got %q", r.Header.Get("x-session-end"))})
			return
		}
		var source string
		c.id, source = g.sessionIDSource(r.Header, c.req)
		if ep == agentcall.Responses {
			named := c.id != ""
			g.chain(r.Context(), c)
			if !named && c.id != "" {
				source = "previous_response_id"
			}
		}
		if err := checkSessionID(c.id, source); err != nil {
			g.refuse(w, refusal{api: ep, status: http.StatusBadRequest, reason: reasonBadRequest, typ: "invalid_request_error",
				param: source, message: err.Error()})
			return
		}
		if c.id == "" {
			if g.cfg.RejectAnonymous {
				g.refuse(w, refusal{api: ep, status: http.StatusBadRequest, reason: reasonNoSession, typ: "invalid_request_error",
					message: fmt.Sprintf("no session id: this gateway admits whole agent sessions and rejects anonymous calls; "+
						"send one of the headers %v, or metadata.session_id, prompt_cache_key or user (Anthropic: metadata.user_id) in the body", g.cfg.SessionHeaders)})
				return
			}
			c.id, c.anonymous, c.endAfter = anonymousID(), true, true
		}
		admitted := g.admit(w, r, c)
		if c.early != nil {
			// Deferred, so that an answer the stream cannot carry as itself (an upstream error,
			// a refusal) becomes an error event even when the proxy breaks off with a panic.
			w = c.early
			defer c.early.finish()
		}
		if !admitted {
			return
		}
		if c.first && !c.anonymous {
			g.repl.PersistAdmission(r.Context(), c.id)
		}
		if c.first && g.journal != nil {
			// The admission is durable before the call leaves: a crash from here on cannot make
			// the session's next call look new.
			if err := g.journal.sync(); err != nil {
				if ok, held := g.errLog.Allow(g.now()); ok {
					g.log.Error("journaling an admission; the session is not durable until the next state save",
						"session", c.id, "err", err, "more_since_last_logged", held)
				}
			}
		}
		g.forward(w, r, c, body)
	}
}

// forward proxies an admitted call and accounts for it.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, c *call, body []byte) {
	si, index, gap := g.startCall(c)
	up := g.upstreams[si.upstream]
	c.client = r.Context()
	ctx := r.Context()
	if t := time.Duration(g.cfg.UpstreamTimeout); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	out := r.WithContext(context.WithValue(ctx, callKey{}, c))
	if c.early != nil {
		// The stream's headers are sent: a compressed answer could not say so any more.
		out.Header = out.Header.Clone()
		out.Header.Del("Accept-Encoding")
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	obs := newObserver(w, g.now)
	obs.api = c.req.Shape
	if c.chained {
		// A streamed answer's id comes in its first event: the link is kept from then on (with
		// the prompt as its context until the answer is complete), so a call continuing it on
		// another replica finds it however soon its client sends it.
		obs.onID = func(id string) { g.chained(c.id, id, c.req.Prompt) }
	}

	aborted := serveProxy(up.proxy, obs, out)
	if aborted {
		// Re-raised once the call is accounted for, so the server cuts the client's connection:
		// a stream broken upstream must not look complete.
		defer panic(http.ErrAbortHandler)
	}

	end := g.now()
	obs.finish()
	prompt, output := c.req.Prompt, tokensOf(obs.outChars)
	if obs.usage != nil && obs.usage.prompt() > 0 {
		prompt = obs.usage.prompt()
	}
	if obs.usage != nil {
		output = obs.usage.output()
	}
	ok := obs.status >= 200 && obs.status < 300
	if ok && c.chained && obs.responseID != "" {
		g.chained(c.id, obs.responseID, prompt+output)
	}
	var evs []admission.Event
	if ok {
		evs = g.core.Finish(end, c.id, prompt+output)
	} else {
		// Keep the estimate: the client will resend this prompt.
		evs = g.core.Finish(end, c.id, 0)
		if c.first {
			// The session never started upstream: holding its budget until it idles out would
			// leak it. A retry is a new arrival.
			evs = append(evs, g.core.End(end, c.id)...)
		}
	}
	if c.endAfter {
		evs = append(evs, g.core.End(end, c.id)...)
	}
	g.deliver(evs)
	g.endCall(si, end)
	if c.first && !obs.firstByte.IsZero() {
		g.metrics.firstCallWait.Observe(obs.firstByte.Sub(c.arrival).Seconds())
	}
	if g.rec != nil {
		if !ok {
			output = 0
		}
		if err := g.rec.record(si, c, index, gap, end, prompt, output); err != nil {
			g.log.Error("recording a call", "err", err)
		}
	}
	g.log.Debug("call done", "session", c.id, "status", obs.status, "first", c.first, "prompt_tokens", prompt,
		"output_tokens", output, "usage", obs.usage != nil, "bytes", obs.bytes)
}

// serveProxy runs the reverse proxy, catching the http.ErrAbortHandler panic it raises when a
// response breaks off after its headers (upstream failure or client gone mid-stream), so that
// the call is still accounted for; aborted tells the caller to raise it again.
func serveProxy(p *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) (aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			aborted = true
		}
	}()
	p.ServeHTTP(w, r)
	return false
}

// servePassThrough proxies anything that is not a model call (/v1/models, unknown paths) as it
// is: to the session's upstream when a session header names a known session, else round-robin.
func (g *Gateway) servePassThrough(w http.ResponseWriter, r *http.Request) {
	i := -1
	id := g.headerSessionID(r.Header)
	if id != "" {
		g.mu.Lock()
		if si, ok := g.mu.sessions[id]; ok {
			i = si.upstream
		}
		g.mu.Unlock()
	}
	if i < 0 {
		i = g.pickUpstream(id)
	}
	if r.ContentLength > 0 && r.ContentLength <= g.cfg.MaxBodyBytes {
		// Proxying the server's own request body races with the response: once the response
		// headers are written the server closes that body, and the transport, which reads it once
		// more after the declared length, then drops the upstream connection mid-response. A
		// buffered body is not closed under it (model calls are buffered anyway, to be read).
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the client is gone
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	g.upstreams[i].proxy.ServeHTTP(w, r)
}

// EndAnswer is what POST /v1/sessions/{id}/end returns: the session ended at the gateway, and
// what its upstream said when the call was passed on, so that the engine side (SGLang's model
// gateway, `basin sim serve`) can drop the session's state too.
type EndAnswer struct {
	Ended    bool        `json:"ended"`
	Upstream UpstreamEnd `json:"upstream"`
}

// UpstreamEnd is the upstream's part of a session end.
type UpstreamEnd struct {
	// Ended: the upstream answered 2xx.
	Ended bool `json:"ended"`
	// Status is its HTTP status, 0 when it could not be reached.
	Status int `json:"status,omitempty"`
	// Message says why it did not end there, when it did not.
	Message string `json:"message,omitempty"`
}

// endTimeout bounds passing a session end on when upstream_timeout is not set.
const endTimeout = 10 * time.Second

// serveEndSession ends a live session now (POST /v1/sessions/{id}/end) and passes the call on to
// the session's upstream. The gateway's end does not wait for the upstream's: the session's budget
// is freed first; an upstream without the endpoint (404) or unreachable leaves the session ended
// at the gateway, and the answer says so.
func (g *Gateway) serveEndSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := checkSessionID(id, "id"); err != nil {
		g.refuse(w, refusal{status: http.StatusBadRequest, reason: reasonBadRequest, typ: "invalid_request_error",
			param: "id", message: err.Error()})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		g.refuse(w, refusal{status: http.StatusRequestEntityTooLarge, reason: reasonBodyTooLarge, typ: "invalid_request_error",
			message: fmt.Sprintf("session end body larger than %d bytes", maxAdminBody)})
		return
	}
	g.mu.Lock()
	upstream := -1
	if si, ok := g.mu.sessions[id]; ok {
		upstream = si.upstream
	}
	g.mu.Unlock()
	evs := g.core.End(g.now(), id)
	if len(evs) == 0 {
		httpjson.WriteError(w, http.StatusNotFound, "invalid_request_error", "session_not_found", "",
			fmt.Sprintf("session %q is not live", id))
		return
	}
	g.deliver(evs)
	if upstream < 0 {
		upstream = g.pickUpstream(id)
	}
	ans := EndAnswer{Ended: true, Upstream: g.endUpstream(r, id, upstream, body)}
	g.log.Debug("session ended by request", "session", id, "upstream_status", ans.Upstream.Status,
		"upstream_ended", ans.Upstream.Ended)
	httpjson.Write(w, http.StatusOK, ans)
}

// endUpstream passes a session end on to the upstream, with the client's headers (its API key)
// and, when affinity is on, the routing key, so that it reaches the decode worker that holds the
// session.
func (g *Gateway) endUpstream(r *http.Request, id string, i int, body []byte) UpstreamEnd {
	u := g.upstreams[i].url
	// The id is one path segment, escaped as such (an id may hold a slash).
	raw := strings.TrimSuffix(u.EscapedPath(), "/") + "/v1/sessions/" + url.PathEscape(id) + "/end"
	target := *u
	target.RawPath = raw
	target.Path, _ = url.PathUnescape(raw) // valid: built from escaped parts
	timeout := time.Duration(g.cfg.UpstreamTimeout)
	if timeout <= 0 {
		timeout = endTimeout
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return UpstreamEnd{Message: "the session ended at the gateway only: " + err.Error()}
	}
	for k, vs := range r.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length":
			continue
		}
		req.Header[k] = vs
	}
	if g.affinity.Load() {
		req.Header.Set(g.cfg.Affinity.Header, routingKey(id))
	}
	resp, err := g.transport.RoundTrip(req)
	if err != nil {
		g.log.Warn("passing a session end upstream failed", "session", id, "upstream", u.Redacted(), "err", err)
		return UpstreamEnd{Message: fmt.Sprintf("the upstream %s could not be reached (%v): the session ended at the gateway only",
			u.Redacted(), err)}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	out := UpstreamEnd{Status: resp.StatusCode, Ended: resp.StatusCode >= 200 && resp.StatusCode < 300}
	switch {
	case out.Ended:
	case resp.StatusCode == http.StatusNotFound:
		out.Message = "the upstream answered 404 (it does not know the session, or has no session end endpoint): " +
			"the session ended at the gateway only"
	default:
		out.Message = fmt.Sprintf("the upstream answered %d: the session ended at the gateway only", resp.StatusCode)
	}
	return out
}

// sessionInfo is what the gateway keeps beside the core about a live session: where its calls
// go and what its trace rows need.
type sessionInfo struct {
	upstream int
	// journaled: the session's admission is in the journal or the state file, so its end is
	// journaled too.
	journaled bool
	// responses are the ids of the session's Responses calls a later call may continue
	// (previous_response_id), forgotten with the session.
	responses []string
	// trace state
	traceID     string
	traceTenant string
	taskChars   int
	calls       int
	lastEnd     time.Time
}

// startCall finds (or makes) the session's routing and trace state and numbers the call; gap is
// the time since the session's previous call ended.
func (g *Gateway) startCall(c *call) (si *sessionInfo, index int, gap time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	si, ok := g.mu.sessions[c.id]
	if !ok {
		si = &sessionInfo{upstream: g.pickUpstream(c.id)}
		if g.core.Live(c.id) { // else it ended meanwhile (admin end): keep nothing for it
			g.addSessionLocked(c.id, si)
		}
	}
	if si.traceID == "" && g.rec != nil {
		si.traceID, si.traceTenant = g.rec.sessionID(c.id), g.rec.tenant(c.tenant)
		si.taskChars = c.req.TaskChars
	}
	index = si.calls
	si.calls++
	if index > 0 && !si.lastEnd.IsZero() {
		gap = max(0, c.arrival.Sub(si.lastEnd))
	}
	return si, index, gap
}

func (g *Gateway) endCall(si *sessionInfo, end time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if end.After(si.lastEnd) {
		si.lastEnd = end
	}
}

// pickUpstream chooses a new session's upstream: round robin alone; replicated, the same for a
// session on every replica.
func (g *Gateway) pickUpstream(id string) int { return g.repl.PickUpstream(id, len(g.upstreams)) }
