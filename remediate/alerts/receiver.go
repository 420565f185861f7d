package alerts

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basin-dev/basin/internal/httpjson"
	"github.com/basin-dev/basin/internal/secret"
)

// Path is where the daemon mounts the Receiver; basin's webhook_config url points here.
const Path = "/api/v1/alerts"

// sweepEvery is how often Run looks for expired alerts: expiry is minutes away, a second late
// is nothing.
const sweepEvery = time.Second

// Receiver is the Alertmanager webhook: an http.Handler for POST with the payload, and the
// incident mode that follows from the alerts posted. Its methods are safe for concurrent use.
type Receiver struct {
	opts       Options
	log        *slog.Logger
	metrics    *metrics
	token      *[sha256.Size]byte // digest of Options.Token; nil when not set
	basic      *[2][sha256.Size]byte
	challenges []string // WWW-Authenticate values
	running    atomic.Bool

	mu struct {
		sync.Mutex
		t     *tracker
		since time.Time // when incident mode turned on; zero while off
		// pending are switches of incident mode not yet passed to OnChange, oldest first;
		// delivering is set while one goroutine passes them on, which keeps them in order.
		pending    []Incident
		delivering bool
	}
}

// New checks opts and returns a Receiver with no active alert.
func New(opts Options) (*Receiver, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("alerts receiver options: %w", err)
	}
	opts = opts.withDefaults()
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("alerts receiver: %w", err)
	}
	r := &Receiver{opts: opts, log: opts.Logger, metrics: m}
	// Credentials are kept only as SHA-256 digests: comparing digests of equal length is constant
	// time whatever the length of the guess, where comparing the secrets would leak their length.
	if opts.Token != "" {
		d := sha256.Sum256([]byte(opts.Token))
		r.token = &d
		r.challenges = append(r.challenges, `Bearer realm="basin alerts webhook"`)
	}
	if opts.BasicUser != "" {
		r.basic = &[2][sha256.Size]byte{sha256.Sum256([]byte(opts.BasicUser)), sha256.Sum256([]byte(opts.BasicPassword))}
		r.challenges = append(r.challenges, `Basic realm="basin alerts webhook", charset="UTF-8"`)
	}
	r.mu.t = newTracker(opts.Matchers, opts.MaxAge)
	return r, nil
}

// Run sweeps expired alerts every second until ctx is done, so that incident mode ends when the
// last alert expires even if nothing is posted or asked. It returns nil when ctx is done.
func (r *Receiver) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("alerts receiver: Run is already running")
	}
	defer r.running.Store(false)
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			r.sweep()
		}
	}
}

// Incident returns incident mode as of now (expired alerts dropped first).
func (r *Receiver) Incident() Incident {
	now := r.opts.Now()
	r.mu.Lock()
	expired := r.sweepLocked(now)
	inc := r.incidentLocked()
	r.mu.Unlock()
	r.logExpired(expired)
	r.deliver()
	return inc
}

// State returns what Restore needs to carry the tracked alerts across a restart.
func (r *Receiver) State() State {
	now := r.opts.Now()
	r.mu.Lock()
	expired := r.sweepLocked(now)
	s := State{Since: r.mu.since, Active: r.mu.t.alerts(), Resolved: r.mu.t.resolvedList()}
	r.mu.Unlock()
	r.logExpired(expired)
	r.deliver()
	return s
}

// Restore replaces the tracked alerts with s, typically read back at start. Alerts that expired
// meanwhile are dropped, and so are alerts no matcher selects any more; OnChange is called if
// incident mode switches. A State that is inconsistent is refused whole, naming the entry.
func (r *Receiver) Restore(s State) error {
	now := r.opts.Now()
	r.mu.Lock()
	was := len(r.mu.t.active) > 0
	if err := r.mu.t.restore(s); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("restore alerts state: %w", err)
	}
	expired := r.mu.t.sweep(now)
	if len(r.mu.t.active) > 0 && !s.Since.IsZero() {
		r.mu.since = s.Since
	}
	r.settleLocked(now, was)
	n := len(r.mu.t.active)
	r.mu.Unlock()
	r.log.Info("alerts state restored", "active", n, "expired_while_down", len(expired))
	r.deliver()
	return nil
}

// ServeHTTP takes one webhook notification: 200 {"status":"ok","active":N,"incident":bool} once
// its alerts are recorded; 401 without valid credentials, 405 for a method other than POST and
// 400 for a body that is not a valid version 4 payload, each with a JSON error and each changing
// nothing.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	// Credentials come first: an unauthenticated caller learns nothing and costs no body read.
	if !r.authorized(req) {
		r.metrics.requests.WithLabelValues(resultUnauthorized).Inc()
		r.log.Debug("alerts webhook: request refused, missing or wrong credentials", "remote", req.RemoteAddr)
		for _, c := range r.challenges {
			w.Header().Add("WWW-Authenticate", c)
		}
		httpjson.WriteError(w, http.StatusUnauthorized, "authentication_error", "unauthorized", "", r.authHint())
		return
	}
	if req.Method != http.MethodPost {
		r.metrics.requests.WithLabelValues(resultMethodNotAllowed).Inc()
		w.Header().Set("Allow", http.MethodPost)
		httpjson.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
			fmt.Sprintf("method %s: the Alertmanager webhook takes POST", req.Method))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.opts.MaxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			r.reject(w, resultTooLarge, badBody("larger than %d bytes; lower max_alerts in the webhook_config or raise MaxBody", mbe.Limit))
			return
		}
		r.reject(w, resultBadRequest, badBody("reading: %v", err))
		return
	}
	msg, fe := decode(body)
	if fe != nil {
		r.reject(w, resultBadRequest, fe)
		return
	}
	if msg.TruncatedAlerts > 0 {
		r.log.Warn("alerts webhook: Alertmanager left alerts out of the notification (max_alerts); they are not tracked",
			"truncated_alerts", msg.TruncatedAlerts, "group_key", msg.GroupKey)
	}
	active, incident := r.apply(msg)
	r.metrics.requests.WithLabelValues(resultOK).Inc()
	httpjson.Write(w, http.StatusOK, okBody{Status: "ok", Active: active, Incident: incident})
}

// okBody is the answer to an accepted notification.
type okBody struct {
	Status   string `json:"status"`
	Active   int    `json:"active"`
	Incident bool   `json:"incident"`
}

// apply records the alerts of a checked message and returns the number of active alerts and
// whether incident mode is on.
func (r *Receiver) apply(msg *message) (int, bool) {
	now := r.opts.Now()
	var ignored [3]int // not matching, stale, duplicate
	r.mu.Lock()
	was := len(r.mu.t.active) > 0
	expired := r.mu.t.sweep(now)
	for i := range msg.Alerts {
		switch r.mu.t.apply(now, &msg.Alerts[i]) {
		case notMatched:
			ignored[0]++
		case stale:
			ignored[1]++
		case duplicate:
			ignored[2]++
		}
	}
	r.metrics.expired.Add(float64(len(expired)))
	r.settleLocked(now, was)
	n := len(r.mu.t.active)
	r.mu.Unlock()

	for _, a := range msg.Alerts {
		r.metrics.alerts.WithLabelValues(a.Status).Inc()
	}
	for i, reason := range []string{reasonNotMatching, reasonStale, reasonDuplicate} {
		r.metrics.ignored.WithLabelValues(reason).Add(float64(ignored[i]))
	}
	r.logExpired(expired)
	r.deliver()
	return n, n > 0
}

func (r *Receiver) sweep() {
	now := r.opts.Now()
	r.mu.Lock()
	expired := r.sweepLocked(now)
	r.mu.Unlock()
	r.logExpired(expired)
	r.deliver()
}

// sweepLocked drops expired alerts and settles the consequences.
func (r *Receiver) sweepLocked(now time.Time) []ActiveAlert {
	was := len(r.mu.t.active) > 0
	expired := r.mu.t.sweep(now)
	r.metrics.expired.Add(float64(len(expired)))
	r.settleLocked(now, was)
	return expired
}

// settleLocked brings the gauges and Since up to date after the tracker changed, and queues the
// incident for OnChange if incident mode switched.
func (r *Receiver) settleLocked(now time.Time, was bool) {
	n := len(r.mu.t.active)
	r.metrics.active.Set(float64(n))
	is := n > 0
	if !is {
		r.mu.since = time.Time{}
		r.metrics.incident.Set(0)
	} else {
		if r.mu.since.IsZero() {
			r.mu.since = now
		}
		r.metrics.incident.Set(1)
	}
	if is != was {
		r.mu.pending = append(r.mu.pending, r.incidentLocked())
	}
}

func (r *Receiver) incidentLocked() Incident {
	return Incident{Active: len(r.mu.t.active) > 0, Since: r.mu.since, Alerts: r.mu.t.alerts()}
}

// deliver passes the queued switches to OnChange, oldest first, outside the lock. One goroutine
// delivers at a time; a switch queued meanwhile (even by OnChange itself) is delivered by it
// before it returns, so none is lost or reordered.
func (r *Receiver) deliver() {
	r.mu.Lock()
	if r.mu.delivering || len(r.mu.pending) == 0 {
		r.mu.Unlock()
		return
	}
	r.mu.delivering = true
	finished := false
	defer func() {
		if !finished { // OnChange panicked: let the next caller deliver the rest
			r.mu.Lock()
			r.mu.delivering = false
			r.mu.Unlock()
		}
	}()
	for len(r.mu.pending) > 0 {
		inc := r.mu.pending[0]
		r.mu.pending = r.mu.pending[1:]
		r.mu.Unlock()
		r.announce(inc)
		r.mu.Lock()
	}
	r.mu.pending = nil
	r.mu.delivering = false
	finished = true
	r.mu.Unlock()
}

func (r *Receiver) announce(inc Incident) {
	if inc.Active {
		names := make([]string, len(inc.Alerts))
		for i, a := range inc.Alerts {
			names[i] = a.Name
		}
		r.log.Warn("incident mode on", "alerts", names)
	} else {
		r.log.Info("incident mode off: every matching alert resolved or expired")
	}
	if r.opts.OnChange != nil {
		r.opts.OnChange(inc)
	}
}

func (r *Receiver) logExpired(expired []ActiveAlert) {
	for _, a := range expired {
		r.log.Warn("alerts webhook: alert expired without a resolve or a repeat; check the route's repeat_interval against MaxAge",
			"alertname", a.Name, "fingerprint", a.Fingerprint, "starts_at", a.StartsAt, "max_age", r.opts.MaxAge)
	}
}

// reject answers 400 naming the field, and logs it: Alertmanager does not retry a 4xx, so the
// log is where the notification's loss shows.
func (r *Receiver) reject(w http.ResponseWriter, result string, fe *fieldError) {
	r.metrics.requests.WithLabelValues(result).Inc()
	r.log.Warn("alerts webhook: payload rejected", "field", fe.Field, "error", fe.Msg)
	httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", fe.Field, fe.Msg)
}

// authorized checks the bearer token or the basic credentials in constant time.
func (r *Receiver) authorized(req *http.Request) bool {
	if r.token != nil {
		if tok, ok := secret.Bearer(req.Header.Get("Authorization")); ok {
			d := sha256.Sum256([]byte(tok))
			return subtle.ConstantTimeCompare(d[:], r.token[:]) == 1
		}
	}
	if r.basic != nil {
		if u, p, ok := req.BasicAuth(); ok {
			du, dp := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
			// Both compared, no short cut, so the time does not tell which one was wrong.
			return subtle.ConstantTimeCompare(du[:], r.basic[0][:])&subtle.ConstantTimeCompare(dp[:], r.basic[1][:]) == 1
		}
	}
	return false
}

func (r *Receiver) authHint() string {
	switch {
	case r.token != nil && r.basic != nil:
		return "the alerts webhook needs credentials: Authorization: Bearer <token>, or HTTP basic auth"
	case r.token != nil:
		return "the alerts webhook needs credentials: Authorization: Bearer <token>"
	}
	return "the alerts webhook needs credentials: HTTP basic auth"
}
