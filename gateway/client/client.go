// Package client is a Go client for the admin API of `basin gateway`: it reads the gateway's
// admission state and changes the budget, sheds queued sessions, holds and resumes live sessions'
// calls and switches sticky decode routing. basin's daemon acts on a gateway only through it: it
// implements remediate.Admission, the contract the in-process admission of the simulator
// (gateway/admission/inproc) implements too.
//
// The gateway stays the authority on what a valid request is: the client checks its own options
// up front but sends every call as given, and a refusal comes back as an *APIError carrying the
// gateway's status, message and the offending field (Param), ready for errors.As. Every other
// failure is wrapped with the operation it interrupted ("set budget: ..."). A 400 for an invalid
// request unwraps to the *adminapi.RequestError that adminapi's Validate methods return. The
// admin token is sent only in the Authorization header and never appears in an error or a
// printed value.
package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// DefaultTimeout bounds each call when Options.Timeout is zero. Admin calls are small and the
// gateway answers them from memory, so a call that takes longer means the gateway is stuck or
// unreachable, and the daemon is better off seeing that quickly than waiting on it.
const DefaultTimeout = 5 * time.Second

// Bounds on the response bodies read. A state with every session of a busy deployment listed
// runs to a few megabytes; anything past these is not the gateway talking, and reading it whole
// would let a misconfigured BaseURL exhaust the daemon's memory.
const (
	maxResponseBytes = 16 << 20
	maxErrorBytes    = 64 << 10
)

// Options configure a Client. BaseURL and Token are required.
type Options struct {
	// BaseURL is the gateway's admin listener (admin_listen), e.g. http://127.0.0.1:8081. A path
	// is kept as a prefix, for a gateway behind a reverse proxy.
	BaseURL string
	// Token is the admin bearer token (the gateway's admin_token_file or
	// BASIN_GATEWAY_ADMIN_TOKEN). Surrounding whitespace is dropped, as the gateway drops it
	// when it reads the token, so a token read from a file with its newline still matches. It is
	// left out of JSON and String, so that logging the options cannot leak it.
	Token string `json:"-"`
	// HTTPClient sends the calls; when nil, a client on the default transport that does not
	// follow redirects (see New).
	HTTPClient *http.Client
	// Timeout bounds each call, on top of the caller's context (DefaultTimeout when zero).
	Timeout time.Duration
	// QueueTail, when positive, asks State for only that many lowest-priority queued sessions and
	// no live-session listing (GET /admin/state?queue_tail=N): what a controller needs, at a cost
	// that does not grow with the deployment. 0 lists everything.
	QueueTail int
	// Sessions, with QueueTail, lists the live sessions too (GET /admin/state?...&sessions=true):
	// what a hold policy chooses among, at a cost that grows with the live sessions, not the
	// queue. Without QueueTail they are always listed.
	Sessions bool
}

// String describes the options without the token, so that logging them cannot leak it.
func (o Options) String() string {
	tok := "unset"
	if o.Token != "" {
		tok = "set"
	}
	return fmt.Sprintf("{BaseURL:%s Token:%s Timeout:%s}", o.BaseURL, tok, o.Timeout)
}

// Client calls one gateway's admin API. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	token     string
	http      *http.Client
	timeout   time.Duration
	queueTail int
	sessions  bool
}

// New checks o and returns a Client, failing with every bad field named. It makes no call: a
// gateway that is down at start is reported by the first call, not by New.
//
// The default HTTP client refuses redirects: a redirect to another host would drop the token
// (net/http strips Authorization across hosts) and a redirected PUT or POST would be replayed
// somewhere the operator did not configure; the 3xx comes back as an *APIError instead.
func New(o Options) (*Client, error) {
	var errs []error
	base, err := url.Parse(o.BaseURL)
	switch {
	case o.BaseURL == "":
		errs = append(errs, errors.New("BaseURL: required, the gateway's admin listener, e.g. http://127.0.0.1:8081"))
	case err != nil:
		errs = append(errs, fmt.Errorf("BaseURL: %w", err))
	case base.Scheme != "http" && base.Scheme != "https":
		errs = append(errs, fmt.Errorf("BaseURL: want an http or https URL, got %q", o.BaseURL))
	case base.Host == "":
		errs = append(errs, fmt.Errorf("BaseURL: no host in %q", o.BaseURL))
	case base.User != nil:
		errs = append(errs, errors.New("BaseURL: must not carry credentials; the admin token goes in Token"))
	case base.RawQuery != "" || base.Fragment != "":
		errs = append(errs, fmt.Errorf("BaseURL: must not have a query or fragment, got %q", o.BaseURL))
	}
	tok := strings.TrimSpace(o.Token)
	switch {
	case tok == "":
		errs = append(errs, errors.New("Token: required, the gateway's admin token"))
	case strings.ContainsFunc(tok, unicode.IsControl):
		// Never echo the token, not even a bad one.
		errs = append(errs, errors.New("Token: contains control characters"))
	}
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout: must be ≥ 0, got %s", o.Timeout))
	}
	if o.QueueTail < 0 || o.QueueTail > 10_000 {
		errs = append(errs, fmt.Errorf("QueueTail: must be in [0, 10000], got %d", o.QueueTail))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("gateway client: %w", errors.Join(errs...))
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	return &Client{base: base, token: tok, http: hc, timeout: timeout, queueTail: o.QueueTail, sessions: o.Sessions}, nil
}

// String names the gateway without the token (fmt would otherwise print unexported fields).
func (c *Client) String() string { return "gateway admin client for " + c.base.Redacted() }

// APIError is the gateway refusing a call: any answer outside 2xx. Message, Type, Code and Param
// come from the gateway's OpenAI-style error body; Param names the request field at fault
// ("tokens", "session_ids[2]"), empty when the fault is not one field's.
type APIError struct {
	Status  int
	Message string
	Type    string
	Code    string
	Param   string
	// Reason is the gateway's machine-readable reason for the refusal: the body's "reason"
	// (inside the error object or beside it), else the x-basin-reason header, else Code.
	// ReasonStaleDaemonTerm on a 409 is ErrStaleTerm.
	Reason string
}

// TermHeader carries the acting daemon's term on admin writes (replicated mode): the gateway
// refuses a write whose term is lower than the highest it has accepted, so that a daemon that
// lost its lease and does not know it yet cannot undo its successor's decisions.
const TermHeader = "Basin-Daemon-Term"

// ReasonStaleDaemonTerm is the reason of the gateway's 409 to a write whose term is stale.
const ReasonStaleDaemonTerm = "stale_daemon_term"

// ErrStaleTerm is what errors.Is finds in a write the gateway refused because a daemon with a
// higher term has written since: the caller has been superseded and must stop acting.
var ErrStaleTerm = errors.New("gateway refused a stale daemon term")

// Is makes errors.Is(err, ErrStaleTerm) true for the gateway's 409 with ReasonStaleDaemonTerm.
func (e *APIError) Is(target error) bool {
	return target == ErrStaleTerm && e.Status == http.StatusConflict && e.Reason == ReasonStaleDaemonTerm
}

// Unwrap gives the gateway's refusal of an invalid request as the *adminapi.RequestError every
// implementation of the admission contract returns for it, so that errors.As finds the field
// whichever implementation answered; nil for any other answer.
func (e *APIError) Unwrap() error {
	if e.Status != http.StatusBadRequest || e.Type != "invalid_request_error" {
		return nil
	}
	return &adminapi.RequestError{Param: e.Param, Message: e.Message}
}

// termKey is the context key of WithTerm.
type termKey struct{}

// WithTerm returns a context whose admin writes carry term in TermHeader. Term 0 (and a context
// never given one) sends no header, as a daemon without a store writes. It is per call rather
// than a client option because the term belongs to the step that decided the write: a daemon
// that lost its term mid-step and won a later one must not lend the new term to the old
// step's writes.
func WithTerm(ctx context.Context, term uint64) context.Context {
	return context.WithValue(ctx, termKey{}, term)
}

// TermFrom is the term WithTerm put in ctx (0 when none).
func TermFrom(ctx context.Context) uint64 {
	t, _ := ctx.Value(termKey{}).(uint64)
	return t
}

// Error gives the status and the gateway's own words, which already name the field.
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = "no message"
	}
	return fmt.Sprintf("gateway answered %d %s: %s", e.Status, http.StatusText(e.Status), msg)
}

// State reads the gateway's admission snapshot with its queue, live sessions, affinity switch and
// upstreams.
func (c *Client) State(ctx context.Context) (adminapi.StateView, error) {
	var v adminapi.StateView
	path := "state"
	if c.queueTail > 0 {
		path = fmt.Sprintf("state?queue_tail=%d", c.queueTail)
		if c.sessions {
			path += "&sessions=true"
		}
	}
	if err := c.do(ctx, "state", http.MethodGet, path, nil, &v); err != nil {
		return adminapi.StateView{}, err
	}
	return v, nil
}

// StateSessions is State with the live sessions listed even when the client asks for the queue's
// tail only (GET /admin/state?queue_tail=N&sessions=true): what a hold policy chooses among, at a
// cost that grows with the live sessions, so a daemon asks for it only while it may hold.
func (c *Client) StateSessions(ctx context.Context) (adminapi.StateView, error) {
	var v adminapi.StateView
	path := "state?sessions=true"
	if c.queueTail > 0 {
		path = fmt.Sprintf("state?queue_tail=%d&sessions=true", c.queueTail)
	}
	if err := c.do(ctx, "state", http.MethodGet, path, nil, &v); err != nil {
		return adminapi.StateView{}, err
	}
	return v, nil
}

// SetBudget sets the budget (PUT /admin/budget): r.Tokens, and r.ReferenceTokens when given (nil
// leaves the reference budget as it is). The reason is logged by the gateway and is required.
func (c *Client) SetBudget(ctx context.Context, r adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	var res adminapi.BudgetResult
	if err := c.do(ctx, "set budget", http.MethodPut, "budget", r, &res); err != nil {
		return adminapi.BudgetResult{}, err
	}
	return res, nil
}

// Shed refuses queued sessions (POST /admin/shed): exactly r.SessionIDs when not nil, else the
// r.Count of lowest priority. Give one of them: the gateway refuses both or neither. Live
// sessions are never shed; unknown ids are skipped, so the result says which were.
func (c *Client) Shed(ctx context.Context, r adminapi.ShedRequest) (adminapi.ShedResult, error) {
	var res adminapi.ShedResult
	if err := c.do(ctx, "shed", http.MethodPost, "shed", r, &res); err != nil {
		return adminapi.ShedResult{}, err
	}
	return res, nil
}

// Hold changes the gateway's hold list (POST /admin/holds): the live sessions in r.Hold have
// their next calls wait at the gateway, the sessions in r.Resume are taken off the list and a call
// of theirs that waits goes at once. Unknown, ended and already held ids are skipped, so applying
// the same change twice is harmless. The answer says how many sessions were held and resumed,
// the calls released, and the hold list after the change.
func (c *Client) Hold(ctx context.Context, r adminapi.HoldRequest) (adminapi.HoldResult, error) {
	var res adminapi.HoldResult
	if err := c.do(ctx, "hold", http.MethodPost, "holds", r, &res); err != nil {
		return adminapi.HoldResult{}, err
	}
	return res, nil
}

// SetAffinity switches sticky decode routing (the gateway setting its routing-key header to the
// session id on upstream calls).
func (c *Client) SetAffinity(ctx context.Context, enabled bool, reason string) error {
	return c.do(ctx, "set affinity", http.MethodPut, "affinity", adminapi.AffinityRequest{Enabled: &enabled, Reason: reason}, nil)
}

// ClaimTerm tells the gateway of the term in ctx (WithTerm) as a daemon takes over, so that a
// deposed daemon's late write is refused from now on rather than after this one's first action.
// A stale term is ErrStaleTerm, as on any write. It returns the gateway's term.
func (c *Client) ClaimTerm(ctx context.Context) (uint64, error) {
	if TermFrom(ctx) == 0 {
		return 0, errors.New("claim term: no term in the context (WithTerm)")
	}
	var r adminapi.DaemonTerm
	if err := c.do(ctx, "claim term", http.MethodPut, "daemon-term", nil, &r); err != nil {
		return 0, err
	}
	return r.DaemonTerm, nil
}

// do makes one call to /admin/<path> and decodes a 2xx answer into out (when not nil). Every error
// is prefixed with op.
func (c *Client) do(ctx context.Context, op, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s: encoding the request: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	path, query, _ := strings.Cut(path, "?")
	u := c.base.JoinPath("admin", path)
	u.RawQuery = query
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if term := TermFrom(ctx); term != 0 && method != http.MethodGet {
		req.Header.Set(TermHeader, strconv.FormatUint(term, 10))
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// net/http's errors name the URL, which holds no credentials (New refuses them).
		return fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s: %w", op, c.apiError(resp))
	}
	b, err := readLimited(resp.Body, maxResponseBytes)
	if err != nil {
		return fmt.Errorf("%s: reading the response: %w", op, err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s: decoding the response: %w", op, err)
	}
	return nil
}

// apiError turns a refusal into an *APIError. A body that is not the gateway's JSON (a proxy's
// error page, say) still gives a message: its start, as text.
func (c *Client) apiError(resp *http.Response) *APIError {
	e := &APIError{Status: resp.StatusCode}
	b, err := readLimited(resp.Body, maxErrorBytes)
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
			Param   *string `json:"param"`
			Reason  string  `json:"reason"`
		} `json:"error"`
		Reason string `json:"reason"`
	}
	if err == nil && json.Unmarshal(b, &body) == nil && body.Error.Message != "" {
		e.Message, e.Type = body.Error.Message, body.Error.Type
		if body.Error.Code != nil {
			e.Code = *body.Error.Code
		}
		if body.Error.Param != nil {
			e.Param = *body.Error.Param
		}
		e.Reason = cmp.Or(body.Error.Reason, body.Reason)
	} else {
		msg := strings.TrimSpace(string(b))
		if len(msg) > 200 {
			msg = strings.ToValidUTF8(msg[:200], "") + "…"
		}
		if loc := resp.Header.Get("Location"); loc != "" && resp.StatusCode >= 300 && resp.StatusCode < 400 {
			msg = "redirected to " + loc
		}
		e.Message = msg
	}
	e.Reason = cmp.Or(e.Reason, resp.Header.Get("x-basin-reason"), e.Code)
	// Whatever answered might echo the request; the token must not travel on in the error.
	e.Message = strings.ReplaceAll(e.Message, c.token, "[token]")
	return e
}

// readLimited reads r whole, failing rather than truncating past limit bytes.
func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("response larger than %d bytes", limit)
	}
	return b, nil
}
