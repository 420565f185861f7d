package daemon

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/basin-dev/basin/daemon/statuspage"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/httpjson"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/remediate/alerts"
	"github.com/basin-dev/basin/scaler"
)

// maxPauseBody bounds POST /api/v1/pause bodies.
const maxPauseBody = 64 << 10

// maxPause is the longest pause the API grants: a forgotten pause must not switch basin off for
// good.
const maxPause = 24 * time.Hour

// Handler serves /metrics, /healthz, /readyz and the API. Reading (status, events) is open on the
// listen address, which is loopback by default; every call that changes something needs the token.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.gather, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", d.serveReady)
	mux.HandleFunc("GET /api/v1/status", d.serveStatus)
	mux.HandleFunc("GET /api/v1/events", d.serveEvents)
	mux.HandleFunc("GET /api/v1/history", d.serveHistory)
	mux.HandleFunc("GET /api/v1/curve", d.serveCurve)
	page := statuspage.Handler()
	mux.Handle("GET /{$}", page)
	mux.Handle("GET /static/", page)
	mux.HandleFunc("POST /api/v1/pause", d.authed(d.servePause))
	mux.Handle(alerts.Path, d.rcv) // its own auth: token or basic
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, "", fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return mux
}

func (d *Daemon) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(d.token)) != 1 {
			d.authRefused(r)
			w.Header().Set("WWW-Authenticate", `Bearer realm="basin daemon"`)
			writeErr(w, http.StatusUnauthorized, "", "this endpoint needs the daemon's token: Authorization: Bearer <token>")
			return
		}
		h(w, r)
	}
}

// authLogEvery is how often refused calls to the control API are logged: the first at once, then
// one line a minute at most with the count refused meanwhile, so a misconfigured client (or a
// scanner) is seen without flooding the log.
const authLogEvery = time.Minute

// authRefused logs a refused control-API call, at most once per authLogEvery with the count held
// back. The token itself is never logged, right or wrong.
func (d *Daemon) authRefused(r *http.Request) {
	if ok, held := d.authFailures.Allow(d.clock.Now()); ok {
		d.log.Warn("control API: refused a call without the daemon's token", "method", r.Method, "path", r.URL.Path,
			"remote", r.RemoteAddr, "has_bearer", strings.HasPrefix(r.Header.Get("Authorization"), "Bearer "),
			"refused_since_last_line", held)
	}
}

func (d *Daemon) serveReady(w http.ResponseWriter, _ *http.Request) {
	d.mu.Lock()
	ready := d.mu.ready
	d.mu.Unlock()
	if !ready {
		writeErr(w, http.StatusServiceUnavailable, "", "not ready: no step completed yet")
		return
	}
	// Ready means "watching": a daemon that cannot see the deployment or reach the gateway is up
	// (/healthz) but does not do its job, and an orchestrator or a check must be able to tell.
	if unseen := d.unseenNow(); len(unseen) > 0 {
		writeErr(w, http.StatusServiceUnavailable, "", "not ready: "+blindMessage(unseen))
		return
	}
	_, _ = io.WriteString(w, "ready\n")
}

// Status is GET /api/v1/status.
type Status struct {
	Deployment string    `json:"deployment"`
	Now        time.Time `json:"now"`
	DryRun     bool      `json:"dry_run"`
	// Blind is true while the daemon cannot see something it needs — a detector signal that is
	// not fresh, or the gateway's admin API — and Unseen lists what. The detector then holds its
	// last state (assessment.state is not a reading) and basin takes no action on it.
	Blind      bool                  `json:"blind"`
	Unseen     []string              `json:"unseen,omitempty"`
	Assessment detector.Assessment   `json:"assessment"`
	Policy     remediate.PolicyState `json:"policy"`
	// ReferenceBudget is the B_ref the policy uses (PolicyState.Reference): computed from the
	// capacity the policy holds, not from the latest reading, so that the status shows the number
	// the budget's bounds and the incident cut are fractions of.
	ReferenceBudget int64              `json:"reference_budget_tokens"`
	LastPlan        *remediate.Plan    `json:"last_plan,omitempty"`
	Paused          *PauseView         `json:"paused,omitempty"`
	Lending         LendingView        `json:"lending"`
	Capacity        CapacityView       `json:"capacity"`
	Alerts          alerts.Incident    `json:"alerts"`
	Gateway         *GatewayStatus     `json:"gateway,omitempty"`
	StepError       string             `json:"step_error,omitempty"`
	Pending         []remediate.Record `json:"pending_actions,omitempty"`
	// Role, Term, Instance, RoleSince and RoleReason say this daemon's part with a store (all
	// absent without one): acting or standby, the lease's term it acts under (while standby: the
	// last term it held or won, absent while it has held none — terms start at 1, and a 0 would
	// read as a term), its name in the lease, and when and why its role last changed.
	Role       string    `json:"role,omitempty"`
	Term       uint64    `json:"term,omitempty"`
	Instance   string    `json:"instance,omitempty"`
	RoleSince  time.Time `json:"role_since,omitzero"`
	RoleReason string    `json:"role_reason,omitempty"`
}

// CapacityView is the sizing of the last step and, with scaling, what basin asked for.
type CapacityView struct {
	// Need is what the deployment needs in instances of each role (nil while it cannot be
	// sized: Error says why).
	Need  *CapacityNeed `json:"need,omitempty"`
	Error string        `json:"error,omitempty"`
	// Scaling is configured: Asked is what it last asked for, per role.
	Scaling bool                `json:"scaling"`
	Asked   map[scaler.Role]int `json:"asked,omitempty"`
	// DecidedOnly marks asks a dry run decided and never applied.
	DecidedOnly bool `json:"decided_only,omitempty"`
}

// CapacityNeed is scaler.Need as the status shows it.
type CapacityNeed struct {
	Prefill        int      `json:"prefill"`
	Decode         int      `json:"decode"`
	ServingPrefill int      `json:"serving_prefill"`
	ServingDecode  int      `json:"serving_decode"`
	ForArrivals    bool     `json:"for_arrivals"`
	Population     float64  `json:"population_sessions,omitempty"`
	Binding        string   `json:"binding,omitempty"`
	Reasons        []string `json:"reasons"`
}

// PauseView is an active pause.
type PauseView struct {
	Until  time.Time `json:"until"`
	Reason string    `json:"reason"`
}

// LendingView is the lending switch.
type LendingView struct {
	Configured bool      `json:"configured"`
	Enabled    bool      `json:"enabled"`
	Since      time.Time `json:"since,omitzero"`
	// DecidedOnly marks a switch a dry run decided and never applied.
	DecidedOnly bool `json:"decided_only,omitempty"`
}

// GatewayStatus is what the daemon last read of the gateway.
type GatewayStatus struct {
	Budget          int64 `json:"budget_tokens"`
	ReferenceBudget int64 `json:"reference_budget_tokens"`
	Reserved        int64 `json:"reserved_tokens"`
	Live            int   `json:"live_sessions"`
	Queued          int   `json:"queued_sessions"`
	// CountOnly: the gateway admits every session and only counts (admission.count_only); it has
	// no budget until basin sets one.
	CountOnly bool   `json:"count_only,omitempty"`
	Error     string `json:"error,omitempty"`
}

// StatusNow assembles the status.
func (d *Daemon) StatusNow() Status {
	now := d.clock.Now()
	d.mu.Lock()
	s := Status{Deployment: d.cfg.Deployment, Now: now, DryRun: d.cfg.DryRun, Assessment: d.mu.shown, Policy: d.mu.policy,
		StepError: d.mu.stepErr}
	if d.mu.lastPlan.Seq > 0 {
		p := d.mu.lastPlan
		s.LastPlan = &p
	}
	if n := d.mu.need; d.mu.ready && d.mu.needErr == "" {
		s.Capacity.Need = &CapacityNeed{Prefill: n.Prefill, Decode: n.Decode, ServingPrefill: n.ServingPrefill,
			ServingDecode: n.ServingDecode, ForArrivals: n.ForArrivals, Population: n.Population, Binding: n.Binding, Reasons: n.Reasons}
	}
	s.Capacity.Error = d.mu.needErr
	if v := d.mu.gateway; v != nil {
		s.Gateway = &GatewayStatus{Budget: v.Budget, ReferenceBudget: v.ReferenceBudget, Reserved: v.Reserved, Live: v.Live,
			Queued: len(v.Queue), CountOnly: v.CountOnly}
	} else if d.mu.gatewayErr != "" {
		s.Gateway = &GatewayStatus{Error: d.mu.gatewayErr}
	}
	d.mu.Unlock()
	s.ReferenceBudget = s.Policy.Reference
	if paused, until, why := d.exec.Paused(now); paused {
		s.Paused = &PauseView{Until: until, Reason: why}
	}
	en, since := d.lend.State()
	s.Lending = LendingView{Configured: d.lendBE != nil, Enabled: en, Since: since, DecidedOnly: d.cfg.DryRun && d.lendBE != nil}
	if d.scale != nil {
		s.Capacity.Scaling, s.Capacity.DecidedOnly = true, d.cfg.DryRun
		for r, st := range d.scale.State() {
			if st.Asked > 0 {
				if s.Capacity.Asked == nil {
					s.Capacity.Asked = map[scaler.Role]int{}
				}
				s.Capacity.Asked[r] = st.Asked
			}
		}
	}
	s.Alerts = d.rcv.Incident()
	s.Pending = d.audit.Pending()
	s.Unseen = d.unseenNow()
	s.Blind = len(s.Unseen) > 0
	if d.ha != nil {
		s.Role, s.Term, s.RoleSince, s.RoleReason = d.role()
		s.Instance = d.ha.instance
		if s.Role == RoleStandby {
			// What a standby holds open are intents whose outcome the store refused it: the acting
			// daemon's to reconcile, not this one's pending actions.
			s.Pending = nil
		}
	}
	return s
}

func (d *Daemon) serveStatus(w http.ResponseWriter, _ *http.Request) {
	httpjson.WriteIndent(w, http.StatusOK, d.StatusNow())
}

// serveEvents lists the audit log, newest last; ?limit=N (default 100, at most 10000).
func (d *Daemon) serveEvents(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeErr(w, http.StatusBadRequest, "limit", fmt.Sprintf("limit: %q, want an integer in [1, 10000]", v))
			return
		}
		limit = n
	}
	httpjson.WriteIndent(w, http.StatusOK, map[string]any{"events": d.audit.Records(limit)})
}

type pauseRequest struct {
	Minutes *float64 `json:"minutes"`
	Reason  string   `json:"reason"`
}

// servePause is POST /api/v1/pause {minutes, reason}: no action for that long (0 resumes).
func (d *Daemon) servePause(w http.ResponseWriter, r *http.Request) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPauseBody))
	dec.DisallowUnknownFields()
	var req pauseRequest
	if err := dec.Decode(&req); err != nil {
		param, msg := bodyError(err, pauseFields)
		writeErr(w, http.StatusBadRequest, param, msg)
		return
	}
	switch {
	case req.Minutes == nil:
		writeErr(w, http.StatusBadRequest, "minutes", "minutes: required (0 resumes)")
		return
	case *req.Minutes < 0 || *req.Minutes > maxPause.Minutes():
		writeErr(w, http.StatusBadRequest, "minutes", fmt.Sprintf("minutes: %v outside [0, %v]", *req.Minutes, maxPause.Minutes()))
		return
	case strings.TrimSpace(req.Reason) == "":
		writeErr(w, http.StatusBadRequest, "reason", "reason: required, say why basin is paused")
		return
	}
	if _, acting := d.actingTerm(); !acting {
		writeErr(w, http.StatusConflict, "", "this daemon is standby: pause the acting daemon (GET /api/v1/status says which role each has)")
		return
	}
	now := d.clock.Now()
	until := now.Add(time.Duration(*req.Minutes * float64(time.Minute)))
	d.loop.Lock() // save reads the loop's state
	err := d.exec.Pause(now, until, req.Reason)
	if err == nil {
		if err := d.save(); err != nil {
			d.log.Error("saving state after a pause", "err", err)
		}
	}
	d.loop.Unlock()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "", "recording the pause: "+err.Error())
		return
	}
	d.log.Info("pause", "until", until, "reason", req.Reason)
	paused, u, why := d.exec.Paused(now)
	httpjson.WriteIndent(w, http.StatusOK, map[string]any{"paused": paused, "until": u, "reason": why})
}

// pauseFields is what each field of POST /api/v1/pause takes, for error messages.
var pauseFields = map[string]string{
	"minutes": "a number of minutes (0 resumes), like 30",
	"reason":  `a string saying why, like "deploying the new model"`,
}

// pauseShape is the body POST /api/v1/pause takes.
const pauseShape = `{"minutes": N, "reason": "..."}`

// bodyError turns a JSON decoding error into the field it concerns and a message naming it in the
// API's terms — never Go's type and struct names, which mean nothing to a caller.
func bodyError(err error, fields map[string]string) (param, msg string) {
	var (
		mbe *http.MaxBytesError
		ute *json.UnmarshalTypeError
		se  *json.SyntaxError
	)
	switch {
	case errors.As(err, &mbe):
		return "", fmt.Sprintf("body: larger than %d bytes", mbe.Limit)
	case errors.Is(err, io.EOF):
		return "", "body: empty, want " + pauseShape
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "", "body: JSON cut short, want " + pauseShape
	case errors.As(err, &se):
		return "", fmt.Sprintf("body: not JSON at byte %d (%v), want %s", se.Offset, se, pauseShape)
	case errors.As(err, &ute) && ute.Field == "":
		return "", fmt.Sprintf("body: got a JSON %s, want %s", ute.Value, pauseShape)
	case errors.As(err, &ute):
		want := fields[ute.Field]
		if want == "" {
			want = "another type"
		}
		return ute.Field, fmt.Sprintf("field %q: got a JSON %s, want %s", ute.Field, ute.Value, want)
	}
	// encoding/json's unknown-field error has no type of its own: `json: unknown field "x"`.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "", fmt.Sprintf("field %s: unknown, want %s", name, pauseShape)
	}
	return "", "body: " + err.Error()
}

// writeErr answers status with basin's JSON error shape, naming the request field at fault
// (param, "" for none).
func writeErr(w http.ResponseWriter, status int, param, msg string) {
	httpjson.Write(w, status, httpjson.NewError(httpjson.TypeFor(status), "", param, msg))
}
