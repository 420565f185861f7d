package gateway

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/admission/inproc"
	"github.com/basin-dev/basin/gateway/replication"
	"github.com/basin-dev/basin/internal/httpjson"
	"github.com/basin-dev/basin/internal/secret"
)

// maxAdminBody bounds admin request bodies.
const maxAdminBody = 1 << 20

// adminRoutes is the admin listener: the admin API behind the bearer token, /metrics and
// /healthz open.
func (g *Gateway) adminRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/state", g.serveState)
	mux.HandleFunc("PUT /admin/budget", g.serveBudget)
	mux.HandleFunc("POST /admin/shed", g.serveShed)
	mux.HandleFunc("POST /admin/holds", g.serveHolds)
	mux.HandleFunc("PUT /admin/affinity", g.serveAffinity)
	mux.HandleFunc("PUT /admin/daemon-term", g.serveDaemonTerm)
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.gatherer, promhttp.HandlerOpts{}))
	// The deployment's admission series alone, from whichever replica leads: what the basin
	// daemon's collector reads through one Service address when the gateway is replicated
	// (each replica's own /metrics has them on the leader only, for Prometheus to sum).
	admissionOnly := prometheus.NewRegistry()
	admissionOnly.MustRegister(admission.NewCollector(g.core.Core, g.now, g.affinity.Load))
	mux.Handle("GET "+AdmissionMetricsPath, promhttp.HandlerFor(admissionOnly, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", g.serveReady)
	g.repl.Routes(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.URL.Path == "/admin" || strings.HasPrefix(r.URL.Path, "/admin/")) && !g.authorized(r) {
			g.metrics.authFailures.Inc()
			if ok, held := g.authLog.Allow(g.now()); ok {
				why := "no bearer token"
				if _, has := secret.Bearer(r.Header.Get("Authorization")); has {
					why = "wrong token"
				}
				g.log.Warn("admin API: refused a request without the admin token", "remote", r.RemoteAddr,
					"method", r.Method, "path", r.URL.Path, "why", why, "more_since_last_logged", held)
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="basin gateway admin"`)
			httpjson.WriteError(w, http.StatusUnauthorized, "authentication_error", "unauthorized", "",
				"the admin API needs the admin token: Authorization: Bearer <token>")
			return
		}
		forward := r.URL.Path == AdmissionMetricsPath ||
			strings.HasPrefix(r.URL.Path, "/admin/") && !strings.HasPrefix(r.URL.Path, replication.AdminPath)
		if g.repl.AdminRequest(w, r, forward) {
			return
		}
		if r.Method != http.MethodGet && strings.HasPrefix(r.URL.Path, "/admin/") && !strings.HasPrefix(r.URL.Path, replication.AdminPath) &&
			!g.checkDaemonTerm(w, r) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// authorized checks the bearer token in constant time.
func (g *Gateway) authorized(r *http.Request) bool {
	tok, ok := secret.Bearer(r.Header.Get("Authorization"))
	return ok && subtle.ConstantTimeCompare([]byte(tok), g.token) == 1
}

// serveState answers GET /admin/state: everything, or with ?queue_tail=N only the N
// lowest-priority queued sessions and no live-session listing (a controller polling a large
// deployment every few seconds needs no more). ?sessions=true adds the live sessions to a
// queue_tail answer: a hold policy chooses among them, and the listing grows with the live
// sessions, not with the queue.
func (g *Gateway) serveState(w http.ResponseWriter, r *http.Request) {
	now := g.now()
	q := r.URL.Query()
	snap := func() admission.Snapshot { return g.core.Snapshot(now, true) }
	if v := q.Get("queue_tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 10_000 {
			badField(w, "queue_tail", fmt.Sprintf("queue_tail: %q, want an integer in [0, 10000]", v))
			return
		}
		snap = func() admission.Snapshot { return g.core.SnapshotTail(now, n) }
	}
	if v := q.Get("sessions"); v != "" {
		list, err := strconv.ParseBool(v)
		if err != nil {
			badField(w, "sessions", fmt.Sprintf("sessions: %q, want true or false", v))
			return
		}
		tail := snap
		snap = func() admission.Snapshot {
			s := tail()
			switch {
			case !list:
				s.Sessions = nil
			case s.Sessions == nil:
				s.Sessions = g.liveSessions(now)
			}
			return s
		}
	}
	v := inproc.StateOf(snap())
	v.Now, v.Affinity = now, adminapi.AffinityView{Enabled: g.affinity.Load(), Header: g.cfg.Affinity.Header}
	g.mu.Lock()
	counts := slices.Clone(g.mu.perUpstream)
	g.mu.Unlock()
	for i, u := range g.upstreams {
		v.Upstreams = append(v.Upstreams, adminapi.UpstreamView{URL: u.url.Redacted(), Sessions: counts[i]})
	}
	v.Replication = g.repl.View()
	v.DaemonTerm = g.daemonTerm.Load()
	v.DeploymentSpeed = g.deploymentSpeed()
	httpjson.Write(w, http.StatusOK, v)
}

func (g *Gateway) serveBudget(w http.ResponseWriter, r *http.Request) {
	var req adminapi.BudgetRequest
	if !decodeAdmin(w, r, &req) {
		return
	}
	if err := req.Validate(); err != nil {
		badRequest(w, err)
		return
	}
	var ref int64
	if req.ReferenceTokens != nil {
		ref = *req.ReferenceTokens
	}
	now := g.now()
	g.mu.Lock()
	before := g.core.Snapshot(now, false)
	evs, err := g.core.SetBudget(now, *req.Tokens, ref)
	if err != nil {
		g.mu.Unlock()
		badField(w, "tokens", err.Error())
		return
	}
	after := g.core.Snapshot(now, false)
	if g.journal != nil {
		g.journal.add(journalRecord{Op: opBudget, At: now, Budget: &after.Budget, ReferenceBudget: &after.ReferenceBudget,
			CountOnly: &after.CountOnly})
	}
	g.deliverLocked(evs)
	g.mu.Unlock()
	g.syncAdminChange("budget")
	after = g.core.Snapshot(now, false) // with the admissions the change caused
	res := inproc.BudgetResult(before, after, evs, req.ReferenceTokens != nil)
	g.log.Info("budget changed", "reason", req.Reason,
		"budget_tokens", fmt.Sprintf("%d → %d", before.Budget, after.Budget),
		"reference_budget_tokens", fmt.Sprintf("%d → %d", before.ReferenceBudget, after.ReferenceBudget),
		"count_only", fmt.Sprintf("%t → %t", before.CountOnly, after.CountOnly),
		"admitted_from_queue", len(res.Admitted), "effect", res.Effect)
	httpjson.Write(w, http.StatusOK, res)
}

func (g *Gateway) serveShed(w http.ResponseWriter, r *http.Request) {
	var req adminapi.ShedRequest
	if !decodeAdmin(w, r, &req) {
		return
	}
	if err := req.Validate(); err != nil {
		badRequest(w, err)
		return
	}
	count := 0
	if req.Count != nil {
		count = *req.Count
	}
	now := g.now()
	before := g.core.QueueLen()
	// Shed and deliver under g.mu: a waiter whose queue wait ends in between would find its
	// session gone from the queue and no event yet, and answer a queue timeout for a session
	// the books count as shed (waiters leave under g.mu: leave).
	g.mu.Lock()
	evs := g.core.Shed(now, count, req.SessionIDs, req.Reason)
	g.deliverLocked(evs)
	g.mu.Unlock()
	res := inproc.ShedResult(evs)
	g.log.Info("sessions shed", "reason", req.Reason, "sessions", res.Shed,
		"queued", fmt.Sprintf("%d → %d", before, g.core.QueueLen()), "admitted_from_queue", len(res.Admitted))
	httpjson.Write(w, http.StatusOK, res)
}

func (g *Gateway) serveAffinity(w http.ResponseWriter, r *http.Request) {
	var req adminapi.AffinityRequest
	if !decodeAdmin(w, r, &req) {
		return
	}
	switch {
	case req.Enabled == nil:
		badField(w, "enabled", "enabled: required, true or false")
		return
	case strings.TrimSpace(req.Reason) == "":
		badField(w, "reason", "reason: required, say why affinity is switched")
		return
	}
	g.mu.Lock()
	before := g.affinity.Swap(*req.Enabled)
	if g.journal != nil {
		g.journal.add(journalRecord{Op: opAffinity, At: g.now(), Affinity: req.Enabled})
	}
	g.mu.Unlock()
	g.syncAdminChange("affinity")
	g.log.Info("affinity switched", "reason", req.Reason, "enabled", fmt.Sprintf("%t → %t", before, *req.Enabled),
		"header", g.cfg.Affinity.Header)
	httpjson.Write(w, http.StatusOK, adminapi.AffinityResult{
		Before: adminapi.AffinityView{Enabled: before, Header: g.cfg.Affinity.Header},
		After:  adminapi.AffinityView{Enabled: *req.Enabled, Header: g.cfg.Affinity.Header}})
}

// syncAdminChange makes an admin change durable before it is answered. A journal that cannot be
// written leaves the change in effect (it is saved with the next state file) and is logged.
func (g *Gateway) syncAdminChange(what string) {
	g.repl.SaveNow(what)
	if g.journal == nil {
		return
	}
	if err := g.journal.sync(); err != nil {
		g.log.Error("journaling an admin change; it is kept with the next state save", "change", what, "err", err)
	}
}

// decodeAdmin reads one JSON object with no unknown fields, answering 400 naming the field
// otherwise.
func decodeAdmin(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, e := dec.Token(); !errors.Is(e, io.EOF) {
			badField(w, "", "body: want one JSON object, found more after it")
			return false
		}
		return true
	}
	var (
		te  *json.UnmarshalTypeError
		se  *json.SyntaxError
		mbe *http.MaxBytesError
	)
	switch {
	case errors.As(err, &te) && te.Field != "":
		badField(w, te.Field, fmt.Sprintf("%s: must be %s, got JSON %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		badField(w, field, fmt.Sprintf("%s: unknown field", field))
	case errors.As(err, &se):
		badField(w, "", fmt.Sprintf("body: invalid JSON at byte %d: %v", se.Offset, err))
	case errors.As(err, &mbe):
		badField(w, "", fmt.Sprintf("body: larger than %d bytes", mbe.Limit))
	case errors.Is(err, io.EOF):
		badField(w, "", "body: empty, want a JSON object")
	default:
		badField(w, "", "body: "+err.Error())
	}
	return false
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int64", "int32":
		return "an integer"
	case "float64":
		return "a number"
	case "slice":
		return "an array"
	case "struct", "map", "ptr":
		return "an object"
	}
	return "of another type"
}

func badField(w http.ResponseWriter, param, msg string) {
	httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", param, msg)
}

// badRequest answers a request its Validate refused (an *adminapi.RequestError) 400, naming the
// field.
func badRequest(w http.ResponseWriter, err error) {
	var re *adminapi.RequestError
	if errors.As(err, &re) {
		badField(w, re.Param, re.Message)
		return
	}
	badField(w, "", err.Error())
}

// AdmissionMetricsPath serves the admission core's basin_gateway_* series alone, in the
// Prometheus text format, open like /metrics. Alone, it is the gateway's; replicated, every
// replica answers with the leader's.
const AdmissionMetricsPath = "/metrics/admission"

// DaemonTermHeader carries the acting basin daemon's term (its lease's epoch) on its admin
// writes. A daemon deposed by a successor — paused, partitioned, not yet aware — still sends
// its old term; the gateway refuses it, so two daemons never both steer the budget.
const DaemonTermHeader = "Basin-Daemon-Term"

// checkDaemonTerm admits an admin write whose Basin-Daemon-Term is at least the highest seen
// (and raises it), refuses a lower one 409 stale_daemon_term, and lets a write without the
// header through: an operator's change, or a daemon without a store.
func (g *Gateway) checkDaemonTerm(w http.ResponseWriter, r *http.Request) bool {
	v := r.Header.Get(DaemonTermHeader)
	if v == "" {
		return true
	}
	term, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "bad_request", DaemonTermHeader,
			fmt.Sprintf("header %s: want a decimal term, got %q", DaemonTermHeader, v))
		return false
	}
	if cur := g.daemonTerm.Load(); term < cur {
		g.log.Warn("refused an admin write from a deposed daemon", "path", r.URL.Path, "term", term, "current_term", cur)
		httpjson.WriteError(w, http.StatusConflict, "invalid_request_error", reasonStaleTerm, DaemonTermHeader,
			fmt.Sprintf("stale daemon term %d: this gateway has accepted term %d from a later daemon", term, cur))
		return false
	}
	if g.raiseDaemonTerm(term) {
		g.log.Info("a new daemon term", "term", term)
		// Replicated, the table is the state (no state file goes with a store).
		g.repl.SaveNow("daemon term")
		if g.journal != nil {
			if err := g.saveState(); err != nil {
				g.log.Error("saving the daemon term", "err", err)
			}
		}
	}
	return true
}

// serveDaemonTerm answers PUT /admin/daemon-term, a daemon's claim of its term as it takes
// over: checkDaemonTerm has raised the gateway's term (or refused a stale one) before this runs,
// so from now on a deposed daemon's late write is refused, not only after its successor's first
// action. The write changes nothing else.
func (g *Gateway) serveDaemonTerm(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(DaemonTermHeader) == "" {
		httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "bad_request", DaemonTermHeader,
			fmt.Sprintf("header %s: required: the term a daemon claims", DaemonTermHeader))
		return
	}
	httpjson.Write(w, http.StatusOK, adminapi.DaemonTerm{DaemonTerm: g.daemonTerm.Load()})
}

// raiseDaemonTerm keeps the highest term seen; it reports whether t raised it.
func (g *Gateway) raiseDaemonTerm(t uint64) bool {
	for {
		cur := g.daemonTerm.Load()
		if t <= cur {
			return false
		}
		if g.daemonTerm.CompareAndSwap(cur, t) {
			return true
		}
	}
}
