package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/httpjson"
	"github.com/basin-dev/basin/sim"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/chat/completions", allow(s.serveGenerate(chatEndpoint), http.MethodPost))
	mux.Handle("/v1/completions", allow(s.serveGenerate(completionEndpoint), http.MethodPost))
	mux.Handle("/v1/responses", allow(s.serveGenerate(agentcall.Responses), http.MethodPost))
	mux.Handle("/v1/messages", allow(s.serveGenerate(agentcall.Messages), http.MethodPost))
	mux.Handle("/v1/models", allow(s.serveModels, http.MethodGet))
	mux.Handle("/v1/sessions/{id}/end", allow(s.serveEndSession, http.MethodPost))
	mux.Handle("/metrics", allow(s.serveMetricsIndex, http.MethodGet))
	mux.Handle("/metrics/{instance}", allow(s.serveMetrics, http.MethodGet))
	mux.Handle("/admin/lending", allow(s.serveLending, http.MethodGet, http.MethodPut, http.MethodPost))
	mux.Handle("/admin/lending/decision", allow(s.serveLendingDecision, http.MethodPost))
	mux.Handle("/admin/state", allow(s.serveState, http.MethodGet))
	mux.Handle("/healthz", allow(serveHealth, http.MethodGet))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found",
			message: fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path)})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(SpeedHeader, s.speedHeader)
		mux.ServeHTTP(w, r)
	})
}

// allow answers 405 with an Allow header to methods other than those listed (HEAD comes with GET).
func allow(h http.HandlerFunc, methods ...string) http.Handler {
	if slices.Contains(methods, http.MethodGet) {
		methods = append(methods, http.MethodHead)
	}
	allowed := strings.Join(methods, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(methods, r.Method) {
			w.Header().Set("Allow", allowed)
			writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error",
				code: "method_not_allowed", message: fmt.Sprintf("%s: method %s not allowed (allowed: %s)", r.URL.Path, r.Method, allowed)})
			return
		}
		h(w, r)
	})
}

func serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	httpjson.Write(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: s.o.ModelName, Object: "model", Created: s.wallStart.Unix(), OwnedBy: "basin"}}})
}

// serveEndSession ends a session: the client says its task is done, so its prefix leaves the
// working set now rather than at the idle timeout. A call in flight is aborted.
func (s *Server) serveEndSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	s.advanceLocked(s.virtualNow())
	ok := s.endLocked("session/" + id)
	s.mu.Unlock()
	if !ok {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "id",
			code: "session_not_found", message: fmt.Sprintf("session id %q: no such live session", id)})
		return
	}
	s.kick()
	s.o.Logger.Debug("session ended by request", "session", id)
	httpjson.Write(w, http.StatusOK, struct {
		Ended bool `json:"ended"`
	}{true})
}

func (s *Server) serveMetricsIndex(w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	for _, name := range s.instances {
		fmt.Fprintf(&b, "/metrics/%s\n", name)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("instance")
	h, ok := s.metrics[name]
	if !ok {
		http.Error(w, fmt.Sprintf("unknown instance %q (known: %s)", name, strings.Join(s.instances, ", ")),
			http.StatusNotFound)
		return
	}
	h.ServeHTTP(w, r)
}

// lendingState is the JSON of /admin/lending.
type lendingState struct {
	Enabled     bool    `json:"enabled"`
	MaxFraction float64 `json:"max_fraction"`
}

func toLending(l sim.LendingState) lendingState {
	return lendingState{Enabled: l.Enabled, MaxFraction: l.MaxFraction}
}

// serveLending reads (GET) or switches (PUT, POST) KV lending, as basin's lender does through the
// simulator backend.
func (s *Server) serveLending(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		s.mu.Lock()
		s.advanceLocked(s.virtualNow())
		l := s.mu.sim.Lending()
		s.mu.Unlock()
		httpjson.Write(w, http.StatusOK, toLending(l))
		return
	}
	body, apiErr := readBody(w, r, s.o.MaxBodyBytes)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	var req struct {
		Enabled     *bool    `json:"enabled"`
		MaxFraction *float64 `json:"max_fraction"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, decodeError(err))
		return
	}
	if dec.More() {
		writeError(w, invalid("", "request body: invalid JSON: more than one value"))
		return
	}
	if req.Enabled == nil {
		writeError(w, invalid("enabled", "enabled: required (true or false)"))
		return
	}
	if f := req.MaxFraction; f != nil && !(*f >= 0 && *f <= 1) {
		writeError(w, invalid("max_fraction", "max_fraction: must be in [0, 1], got %v", *f))
		return
	}
	httpjson.Write(w, http.StatusOK, toLending(s.setLending(*req.Enabled, req.MaxFraction)))
}

// setLending switches the simulator's lending, keeping the max fraction unless one is given.
func (s *Server) setLending(enabled bool, maxFraction *float64) sim.LendingState {
	s.mu.Lock()
	s.advanceLocked(s.virtualNow())
	frac := s.mu.sim.Lending().MaxFraction
	if maxFraction != nil {
		frac = *maxFraction
	}
	s.mu.sim.SetLending(enabled, frac)
	l, now := s.mu.sim.Lending(), s.mu.sim.Now()
	s.mu.Unlock()
	s.kick()
	s.o.Logger.Info("lending switched", "enabled", l.Enabled, "max_fraction", l.MaxFraction, "virtual_now", now)
	return l
}

// serveLendingDecision is POST /admin/lending/decision: the simulator as a receiver of the basin
// lender's http backend, which posts each decision as its versioned JSON payload (lender/README.md).
// The simulator's switch is global, so the decision's per-instance grants collapse to its
// max_fraction, as the lender's sim backend does in process.
func (s *Server) serveLendingDecision(w http.ResponseWriter, r *http.Request) {
	body, apiErr := readBody(w, r, s.o.MaxBodyBytes)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	// The payload's documented fields this receiver needs; the rest (grants, reasons, times) are
	// for receivers that can use them.
	var d struct {
		Version     int      `json:"version"`
		Enabled     *bool    `json:"enabled"`
		MaxFraction *float64 `json:"max_fraction"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		writeError(w, decodeError(err))
		return
	}
	switch {
	case d.Version != 1:
		writeError(w, invalid("version", "version: want 1, got %d", d.Version))
		return
	case d.Enabled == nil:
		writeError(w, invalid("enabled", "enabled: required (true or false)"))
		return
	case d.MaxFraction != nil && !(*d.MaxFraction >= 0 && *d.MaxFraction <= 1):
		writeError(w, invalid("max_fraction", "max_fraction: must be in [0, 1], got %v", *d.MaxFraction))
		return
	}
	httpjson.Write(w, http.StatusOK, toLending(s.setLending(*d.Enabled, d.MaxFraction)))
}

// state is the JSON of /admin/state: the simulator's ground truth now.
type state struct {
	NowSeconds          float64      `json:"now_seconds"`
	Speed               float64      `json:"speed"`
	LiveSessions        int          `json:"live_sessions"`
	HeldSessions        int          `json:"held_sessions"`
	ExternalSessions    int          `json:"external_sessions"`
	ExternalCalls       int          `json:"external_calls_in_flight"`
	WorkingSetTokens    int64        `json:"working_set_tokens"`
	CacheCapacityTokens int64        `json:"cache_capacity_tokens"`
	CallsCompleted      int64        `json:"calls_completed"`
	Lending             lendingState `json:"lending"`
}

func (s *Server) serveState(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	s.advanceLocked(s.virtualNow())
	o := s.mu.sim.Observe()
	st := state{
		NowSeconds:          o.Now.Seconds(),
		Speed:               s.o.Speed,
		LiveSessions:        o.LiveSessions,
		HeldSessions:        o.HeldSessions,
		ExternalSessions:    s.mu.sim.ExternalSessions(),
		WorkingSetTokens:    o.WorkingSetTokens,
		CacheCapacityTokens: o.CacheCapacity,
		CallsCompleted:      o.CallsCompleted,
		Lending:             toLending(o.Lending),
	}
	for _, ss := range s.mu.sessions {
		if ss.call != nil {
			st.ExternalCalls++
		}
	}
	s.mu.Unlock()
	httpjson.Write(w, http.StatusOK, st)
}
