package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// Defaults of Options.
const (
	DefaultSessionHeader  = "x-session-id"
	DefaultModel          = "basin-sim"
	DefaultJitterFraction = 0.2
	DefaultRetryBudget    = 5
	// DefaultMaxRetryWait bounds a session's total waiting on Retry-After, in wall time.
	DefaultMaxRetryWait = 2 * time.Minute
	DefaultMaxSessions  = 10_000
	// DefaultRetryAfter is the wait after a 503 or 429 without a usable Retry-After.
	DefaultRetryAfter = time.Second
	// DefaultProgressEvery is how often Options.Progress hears from a run, in wall time.
	DefaultProgressEvery = time.Second
)

// Options configure a load run. The zero value of every field but Target and Scenario has a
// default.
type Options struct {
	// Target is the endpoint's base URL (http or https); calls go to the API's path under it
	// (Target/v1/chat/completions, /v1/responses, /v1/messages).
	// A trailing "/v1" is dropped, since OpenAI clients' base URLs usually carry it.
	Target string
	// API is the API the calls speak: agentcall.Chat (the default when zero), agentcall.Responses
	// or agentcall.Messages (ParseAPI reads their names).
	API agentcall.Shape
	// Scenario supplies the arrival streams, seed, duration, measurement window and SLO.
	Scenario *scenario.Scenario
	// Speed is virtual seconds per wall second (1 when zero). Against `basin sim serve` it must be
	// the server's speed, or tool pauses and arrivals are compressed differently from the engine.
	Speed float64
	// Model is the request's model field (DefaultModel when empty).
	Model string
	// RunID prefixes session ids (<run id>-<n>); random when empty, so that a second run against
	// the same server does not extend the first one's sessions. Letters, digits, '.', '_', '-'.
	RunID string
	// SessionHeader carries the session id (DefaultSessionHeader when empty).
	SessionHeader string
	// APIKey, when set, is sent as Authorization: Bearer <key>.
	APIKey string
	// NoStream sends "stream": false; streaming (with stream_options.include_usage) is the
	// default because only a stream shows the time to first token.
	NoStream bool
	// StopAtEOS leaves out "ignore_eos": true, SGLang's and vLLM's sampling parameter (and basin
	// sim serve's) that makes the engine generate exactly max_tokens, the output length the
	// scenario drew: sent by default, as the engines' own benchmarks do, so the run's contexts
	// grow as the scenario says. Set it for an endpoint that refuses unknown fields.
	StopAtEOS bool
	// JitterFraction is the largest extra fraction of Retry-After waited, drawn uniformly
	// (DefaultJitterFraction when zero, none when negative; at most 1).
	JitterFraction float64
	// RetryBudget is how many refused calls a session retries in all (DefaultRetryBudget when
	// zero, none when negative).
	RetryBudget int
	// MaxRetryWait bounds the wall time a session spends waiting on Retry-After
	// (DefaultMaxRetryWait when zero); a wait that would pass it rejects the session instead.
	MaxRetryWait time.Duration
	// Reject429Terminal makes 429 (over quota) reject the session instead of deferring it.
	Reject429Terminal bool
	// Unloaded is a session's duration alone on the deployment, in virtual time, for the goodput
	// deadline (SLO.Slowdown × Unloaded). Without it good and goodput are reported as null. It is
	// called from Run's goroutine only, after the sessions are done.
	Unloaded func(sim.SessionSpec) time.Duration
	// PerSession adds every session's record to the report.
	PerSession bool
	// HTTPClient sends the calls. When nil, Run uses a client of its own and closes its idle
	// connections before returning. It should have no overall Timeout: a call lasts as long as the
	// engine takes.
	HTTPClient *http.Client
	// MaxSessions is a safety cap (DefaultMaxSessions when zero): a scenario that offers more
	// sessions fails at start instead of being cut short silently.
	MaxSessions int
	// Progress, when set, is told how the run is going about every ProgressEvery of wall time,
	// from a goroutine of its own, and once more when the run ends. It must not block.
	Progress func(Progress)
	// ProgressEvery is how often Progress is called (DefaultProgressEvery when zero).
	ProgressEvery time.Duration
	// Logger receives the run's progress (discarded when nil).
	Logger *slog.Logger
	// Now is the wall clock (time.Now when nil); it is called from several goroutines.
	Now func() time.Time
	// Sleep waits d of wall time or until ctx is done, returning ctx's error then (a timer when
	// nil); it is called from several goroutines. Every wait of a run — arrivals, tool pauses,
	// Retry-After, KillAt — goes through it.
	Sleep func(ctx context.Context, d time.Duration) error
}

// withDefaults fills zero fields and normalises the rest: the target loses a trailing "/" and
// "/v1", a negative jitter fraction or retry budget means none.
func (o Options) withDefaults() Options {
	o.Target = strings.TrimSuffix(strings.TrimSuffix(o.Target, "/"), "/v1")
	if o.Speed == 0 {
		o.Speed = 1
	}
	if o.API == 0 {
		o.API = agentcall.Chat
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.RunID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
		o.RunID = "lg" + hex.EncodeToString(b[:])
	}
	if o.SessionHeader == "" {
		o.SessionHeader = DefaultSessionHeader
	}
	switch {
	case o.JitterFraction == 0:
		o.JitterFraction = DefaultJitterFraction
	case o.JitterFraction < 0:
		o.JitterFraction = 0
	}
	switch {
	case o.RetryBudget == 0:
		o.RetryBudget = DefaultRetryBudget
	case o.RetryBudget < 0:
		o.RetryBudget = 0
	}
	if o.MaxRetryWait == 0 {
		o.MaxRetryWait = DefaultMaxRetryWait
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = DefaultProgressEvery
	}
	if o.Sleep == nil {
		o.Sleep = Sleep
	}
	return o
}

// Validate reports every option Run refuses, naming each; zero fields stand for their defaults.
func (o Options) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.Target == "" {
		add("target: missing")
	} else if u, err := url.Parse(o.Target); err != nil {
		add("target: %v", err)
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add("target: want an http or https URL with a host, got %q", o.Target)
	} else if u.RawQuery != "" || u.Fragment != "" {
		add("target: must not have a query or fragment, got %q", o.Target)
	}
	o = o.withDefaults()
	if o.Scenario == nil {
		add("scenario: missing")
	}
	if !(o.Speed > 0) || math.IsInf(o.Speed, 0) {
		add("speed: must be a finite number > 0, got %v", o.Speed)
	}
	if _, err := ParseAPI(o.API.String()); err != nil {
		add("api: %v", err)
	}
	if !validID(o.RunID) {
		add("run_id: want 1–64 letters, digits, '.', '_' or '-', got %q", o.RunID)
	}
	if !validToken(o.SessionHeader) {
		add("session_header: not a valid header name: %q", o.SessionHeader)
	}
	if strings.ContainsAny(o.APIKey, "\r\n") {
		add("api_key: must not contain line breaks")
	}
	if !(o.JitterFraction <= 1) {
		add("jitter_fraction: must be ≤ 1 (negative: none), got %v", o.JitterFraction)
	}
	if o.MaxRetryWait < 0 {
		add("max_retry_wait: must be > 0, got %v", o.MaxRetryWait)
	}
	if o.MaxSessions < 0 {
		add("max_sessions: must be > 0, got %d", o.MaxSessions)
	}
	if o.ProgressEvery < 0 {
		add("progress_every: must be > 0, got %v", o.ProgressEvery)
	}
	return errors.Join(errs...)
}

// Sleep waits d or until ctx is done: Options.Sleep's default, for callers that wrap it (the
// demo times each wait).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func validID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

// validToken reports whether s is an HTTP token (RFC 9110 §5.6.2), the syntax of a header name.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}
