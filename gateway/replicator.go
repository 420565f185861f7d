package gateway

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/replication"
	"github.com/basin-dev/basin/internal/httpjson"
)

// replicator is how far a gateway's admission reaches beyond its own process. Alone (single)
// its own core decides every admission and nothing is told to anyone. Replicated
// (replication.Replica, docs/scaling.md), one replica elected through the store runs the
// deployment's core and the others follow it: they ask it to admit first calls, report their
// calls to it, and forward the admin API to it. The gateway asks its replicator at every point
// where the two differ, and never which one it has.
type replicator interface {
	callReporter

	// Claim takes this gateway's place among the replicas before it serves: an error stops
	// the start.
	Claim(ctx context.Context) error
	// Run does the background work until ctx is done, and gives this gateway's part up as it
	// returns.
	Run(ctx context.Context)
	// Fatal delivers the error this gateway cannot go on with; nil when there can be none.
	Fatal() <-chan error

	// Rounds is how many times admit sends a call round again before it gives up.
	Rounds() int
	// Deciding reports whether this gateway's own core may admit new sessions now.
	Deciding() bool
	// Leads reports whether this gateway's core is the deployment's: its admission series are
	// the deployment's to export.
	Leads() bool
	// SessionArrival is the arrival a new session is queued with, given when its call reached
	// the gateway; zero for the core's own clock.
	SessionArrival(callArrival time.Time) time.Time
	// AdmitRemote has a call of a session the local core does not know admitted elsewhere, if
	// anywhere: Local leaves it to the local core; Admitted lets it go, or wait where adopt
	// held it; Answered means the client has its answer.
	AdmitRemote(w http.ResponseWriter, r *http.Request, c replication.Call, adopt replication.AdoptFunc) replication.Outcome
	// Degraded says why new sessions cannot be decided where they should be ("" when they
	// can), and how soon that may change: the Retry-After of a refusal meanwhile.
	Degraded() (why string, retryAfter time.Duration)
	// NotLeader answers a first call another replica asked this one to admit, which it cannot.
	NotLeader(w http.ResponseWriter)
	// Queued records that the local core queued session id with its arrival.
	Queued(id string, arrival time.Time)
	// Admitted records that the local core admitted session id (g.mu held).
	Admitted(id string)
	// PersistAdmission makes the admission of session id durable before its first call goes.
	PersistAdmission(ctx context.Context, id string)
	// SessionEnded records that session id ended in the local core (g.mu held).
	SessionEnded(id string)
	// PickUpstream chooses a new session's upstream among n.
	PickUpstream(id string, n int) int

	// LookupChain finds the session a response this gateway does not know belongs to.
	LookupChain(ctx context.Context, responseID string) (session string, context int64, ok bool)
	// ReportChain records that session continues as a call naming responseID.
	ReportChain(session, responseID string, context int64)

	// Routes adds the replicator's own admin endpoints.
	Routes(mux *http.ServeMux)
	// AdminRequest sees every authorized admin request first: it answers it (forwarded to the
	// leader, when forward allows) and reports true, or leaves it to the gateway.
	AdminRequest(w http.ResponseWriter, r *http.Request, forward bool) bool
	// View is the replication part of /admin/state; nil alone.
	View() *adminapi.ReplicationView
	// SaveNow makes an admin change durable before it is answered.
	SaveNow(what string)
}

// callReporter hears of the calls the local core begins and finishes and the sessions it ends
// (core).
type callReporter interface {
	ReportBegin(id string, promptEstimate int64)
	ReportFinish(id string, contextTokens int64)
	ReportEnd(id string)
}

// single is a gateway alone: its core is the deployment's, it tells nobody of its calls, and
// new sessions are spread round-robin.
type single struct {
	rr atomic.Uint64 // round-robin position for new sessions
}

// singleRounds: a session can become live (or end) between admit's checks; in practice the
// second round decides.
const singleRounds = 4

func (*single) Claim(context.Context) error                                { return nil }
func (*single) Run(context.Context)                                        {}
func (*single) Fatal() <-chan error                                        { return nil }
func (*single) Rounds() int                                                { return singleRounds }
func (*single) Deciding() bool                                             { return true }
func (*single) Leads() bool                                                { return true }
func (*single) SessionArrival(time.Time) time.Time                         { return time.Time{} }
func (*single) Degraded() (string, time.Duration)                          { return "", 0 }
func (*single) Queued(string, time.Time)                                   {}
func (*single) Admitted(string)                                            {}
func (*single) PersistAdmission(context.Context, string)                   {}
func (*single) SessionEnded(string)                                        {}
func (*single) ReportBegin(string, int64)                                  {}
func (*single) ReportFinish(string, int64)                                 {}
func (*single) ReportEnd(string)                                           {}
func (*single) ReportChain(string, string, int64)                          {}
func (*single) Routes(*http.ServeMux)                                      {}
func (*single) View() *adminapi.ReplicationView                            { return nil }
func (*single) SaveNow(string)                                             {}
func (*single) AdminRequest(http.ResponseWriter, *http.Request, bool) bool { return false }

func (*single) AdmitRemote(http.ResponseWriter, *http.Request, replication.Call, replication.AdoptFunc) replication.Outcome {
	return replication.Local
}

func (*single) LookupChain(context.Context, string) (string, int64, bool) { return "", 0, false }

// NotLeader is never asked alone: no other gateway sends it first calls.
func (*single) NotLeader(w http.ResponseWriter) {
	httpjson.WriteError(w, http.StatusMisdirectedRequest, "server_error", "not_leader", "",
		"this gateway runs alone: it admits no other gateway's calls")
}

// PickUpstream is round robin.
func (s *single) PickUpstream(_ string, n int) int {
	return int((s.rr.Add(1) - 1) % uint64(n))
}
