package replication

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/sessionstore"
	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/httpjson"
)

// The replicas' protocol, on the admin listener behind the admin token (every replica has the
// same one): a follower asks the leader to admit a session's first call, and reports its calls'
// begin and finish in batches. Plain JSON over HTTP: one round trip per new session, and one per
// report_interval per replica.
const (
	arrivePath = "/admin/replication/arrive"
	reportPath = "/admin/replication/report"
	chainPath  = "/admin/replication/chain"
	// leaderPath is a new leader's word to the replicas it knows that it leads: each reads the
	// store's announcement at once instead of at its next tick.
	leaderPath = "/admin/replication/leader"
	// AdminPath is this replica's own view of replicated mode (never forwarded), and begins
	// every path of the replicas' protocol: the admin requests a follower answers itself.
	AdminPath = "/admin/replication"
)

// arriveRequest is a first call a follower asks the leader to admit.
type arriveRequest struct {
	Replica   string          `json:"replica"`
	ID        string          `json:"id"`
	Tenant    string          `json:"tenant,omitempty"`
	Anonymous bool            `json:"anonymous,omitempty"`
	Shape     agentcall.Shape `json:"shape"`
	Prompt    int64           `json:"prompt_tokens"`
	Task      string          `json:"task,omitempty"`
	TaskChars int             `json:"task_chars,omitempty"`
	// Arrival is when the call reached the follower: a call held there while the leader
	// changed keeps its place in time at the next leader.
	Arrival time.Time `json:"arrival"`
	// Held is how long the follower has held the call, on its monotonic clock: the leader
	// takes now − Held as the arrival, which no skew between the replicas' clocks moves.
	Held time.Duration `json:"held_ns,omitempty"`
}

// arriveAnswer is the leader's answer: admitted (the session, live in the leader's core with
// this call counted in flight), or the refusal the client gets, written by the leader in the
// client's API format.
type arriveAnswer struct {
	Admitted bool                   `json:"admitted"`
	First    bool                   `json:"first,omitempty"`
	Session  *admission.LiveSession `json:"session,omitempty"`
	Status   int                    `json:"status,omitempty"`
	Header   http.Header            `json:"header,omitempty"`
	Body     []byte                 `json:"body,omitempty"`
}

// reportOp is one call event a follower reports.
type reportOp struct {
	Op     string `json:"op"` // begin, finish, end, chain
	ID     string `json:"id"`
	Tokens int64  `json:"tokens,omitempty"`
	// Response is a chain op's response id: the session ID continues as a call naming it as
	// its previous_response_id, with Tokens of context.
	Response string `json:"response,omitempty"`
	// At is when an end happened: the leader refuses to take the session as live from a
	// report of a session admitted before it (endedAt).
	At time.Time `json:"at,omitzero"`
}

const (
	repBegin  = "begin"
	repFinish = "finish"
	repEnd    = "end"
	repChain  = "chain"
)

// reportRequest is a follower's batch: its calls' events since the last report and the sessions
// no leader has acknowledged — those it admitted alone while degraded.
type reportRequest struct {
	Replica  string                  `json:"replica"`
	Ops      []reportOp              `json:"ops,omitempty"`
	Sessions []admission.LiveSession `json:"sessions,omitempty"`
	// Known is how far this replica's copy of the leader's live set goes.
	Known livePosition `json:"known"`
}

// livePosition is a point in a leader's live log: its epoch and the number of its last change.
type livePosition struct {
	Epoch uint64 `json:"epoch,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
}

// liveUpdate brings a follower's copy of the live set to the leader's position To: the changes
// since the follower's position, or, with Whole, the set itself in Live and the held sessions
// among it in Held (Changes empty).
type liveUpdate struct {
	To      livePosition           `json:"to"`
	Whole   bool                   `json:"whole,omitempty"`
	Live    []string               `json:"live,omitempty"`
	Held    []string               `json:"held,omitempty"`
	Changes []admission.LiveChange `json:"changes,omitempty"`
}

// reportAnswer: the sessions reported that the leader does not know as live (ended there, idle),
// which the follower ends too, and the leader's budget for the degraded slice.
type reportAnswer struct {
	Epoch   uint64     `json:"epoch"`
	Unknown []string   `json:"unknown,omitempty"`
	View    LeaderView `json:"view"`
	Live    liveUpdate `json:"live"`
}

// Outcome is how a follower's attempt to admit a call through the leader ended.
type Outcome int

const (
	// Local: this replica decides, with its own core: it leads, or it is degraded.
	Local Outcome = iota
	// Admitted: admitted by the leader (or live at the last contact with it), and adopted
	// into the local core: the call may go, or wait for its session's release where adopt
	// held it.
	Admitted
	// Answered: the client has its answer (a refusal), or is gone.
	Answered
)

// AdoptFunc puts a session the leader admitted (or knows live) into the gateway's core and
// begins the call in it. The leader counted the call already, so nothing is reported for its
// begin. first says the leader admitted the session for this very call: a hold acts on sessions
// already running, never on the call that starts one. held says the call waits for its
// session's release, as it would have on the leader, which passed it on for this replica to
// hold. An error taking the session in is returned for the replica to log; the call is begun
// all the same.
type AdoptFunc func(ls admission.LiveSession, first bool) (held bool, err error)

// AdmitRemote asks the leader to admit c's session when this replica follows, and adopts the
// session it answers with. A session the leader admitted earlier and holds comes back admitted
// and held: adopt holds its call here.
func (r *Replica) AdmitRemote(w http.ResponseWriter, req *http.Request, c Call, adopt AdoptFunc) Outcome {
	if _, ok := r.isLeading(); ok {
		return Local
	}
	if c.Forwarded {
		// Asked as the leader, which this replica no longer is: the follower asks again.
		r.NotLeader(w)
		return Answered
	}
	// asked is the epoch of a leader that said it no longer leads; the store names the next
	// one within a lease of that answer (a handover takes one at most), so the wait for it is
	// two leases from the answer, not from the call's arrival: a call the old leader held for
	// a long time still gets its turn at the next one, with its place in time.
	var asked uint64
	var deadline time.Time
	for {
		li, gone, ok := r.currentLeader()
		if ok && li.Epoch == asked {
			// The leader we asked said it is not (or no longer) the leader: wait for the store
			// to name the next one.
			if time.Now().After(deadline) {
				ok = false
			} else {
				select {
				case <-gone:
				case <-time.After(r.opTimeout / 10):
					r.refreshLeader(req.Context())
				case <-req.Context().Done():
					return Answered
				}
				continue
			}
		}
		if !ok {
			return r.decideHere(c, adopt, "no admission leader known")
		}
		ans, status, err := r.arrive(req.Context(), gone, li.AdminURL, c)
		switch {
		case req.Context().Err() != nil:
			return Answered // the client left; the leader cancels its wait
		case errors.Is(err, errLeaderChanged):
			continue
		case status == http.StatusMisdirectedRequest:
			if asked != li.Epoch {
				asked, deadline = li.Epoch, time.Now().Add(2*r.leaseTTL)
			}
			r.refreshLeader(req.Context())
			continue
		case err != nil:
			r.metrics.rpcErrors.WithLabelValues("arrive").Inc()
			return r.decideHere(c, adopt, fmt.Sprintf("admission leader %s unreachable: %v", li.ReplicaID, err))
		}
		r.answeredByLeader()
		if !ans.Admitted {
			relay(w, ans)
			return Answered
		}
		r.adopt(adopt, *ans.Session, ans.First)
		return Admitted
	}
}

// decideHere is a follower's first call when no leader can decide: the replica is degraded,
// and the call passes if its session was live at the leader at the last contact, or is decided
// by the local core.
func (r *Replica) decideHere(c Call, adopt AdoptFunc, why string) Outcome {
	r.setDegraded(why)
	if r.passKnown(c, adopt) {
		return Admitted
	}
	return Local
}

var errLeaderChanged = errors.New("the admission leader changed")

// maxClockSkew is how far a follower's clock may be from the leader's for its timestamps to be
// taken as they are: replicas on NTP-synchronised hosts agree to milliseconds.
const maxClockSkew = time.Second

// arrive is the RPC: held by the leader while the session is queued (up to its
// max_queue_wait), cut short when this replica learns of a new leader.
func (r *Replica) arrive(ctx context.Context, gone <-chan struct{}, base string, c Call) (arriveAnswer, int, error) {
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	go func() {
		select {
		case <-gone:
			cancelCause(errLeaderChanged)
		case <-ctx.Done():
		}
	}()
	tctx, cancel := context.WithTimeout(ctx, r.cfg.MaxQueueWait+10*r.opTimeout)
	defer cancel()
	body := arriveRequest{Replica: r.id, ID: c.ID, Tenant: c.Tenant, Anonymous: c.Anonymous, Shape: c.Req.Shape,
		Prompt: c.Req.Prompt, Task: c.Req.Task, TaskChars: c.Req.TaskChars, Arrival: c.Arrival, Held: time.Since(c.Arrival)}
	var ans arriveAnswer
	start := time.Now()
	status, err := r.post(tctx, base+arrivePath, body, &ans)
	r.metrics.rpc.WithLabelValues("arrive").Observe(time.Since(start).Seconds())
	if err != nil && errors.Is(context.Cause(ctx), errLeaderChanged) {
		return ans, 0, errLeaderChanged
	}
	if err == nil && ans.Admitted && ans.Session == nil {
		err = errors.New("admitted without the session")
	}
	return ans, status, err
}

// post sends one JSON request to a replica's admin listener and decodes a 200 answer. Other
// answers return their status and an error.
func (r *Replica) post(ctx context.Context, u string, in, out any) (int, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+string(r.cfg.Token))
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("%s answered %d: %s", req.URL.Path, resp.StatusCode, bytes.TrimSpace(data[:min(len(data), 200)]))
	}
	if err := json.Unmarshal(data, out); err != nil {
		return resp.StatusCode, fmt.Errorf("%s: reading the answer: %w", req.URL.Path, err)
	}
	return resp.StatusCode, nil
}

// refreshLeader reads the leader from the store now, not at the next tick.
func (r *Replica) refreshLeader(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	if li, err := r.table.Leader(ctx); err == nil {
		r.setLeader(li)
	}
}

// adopt has the gateway take in a session the leader admitted (or knows live) and begin the
// call in it; it reports whether the call is held.
func (r *Replica) adopt(adopt AdoptFunc, ls admission.LiveSession, first bool) bool {
	held, err := adopt(ls, first)
	if err != nil {
		r.log.Error("the leader's session", "session", ls.ID, "err", err)
	}
	return held
}

// relay writes the leader's refusal to the client as the leader wrote it.
func relay(w http.ResponseWriter, ans arriveAnswer) {
	for k, vs := range ans.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(ans.Status)
	_, _ = w.Write(ans.Body)
}

// NotLeader answers a replica that asked the wrong one.
func (r *Replica) NotLeader(w http.ResponseWriter) {
	httpjson.WriteError(w, http.StatusMisdirectedRequest, "server_error", "not_leader", "",
		fmt.Sprintf("replica %s is not the admission leader; ask the one the store names", r.id))
}

// serveArrive is the leader's side of a follower's first call: the same admission as a call
// reaching the leader itself, its refusal captured for the follower to relay.
func (r *Replica) serveArrive(w http.ResponseWriter, req *http.Request) {
	epoch, ok := r.isLeading()
	if !ok {
		r.NotLeader(w)
		return
	}
	var in arriveRequest
	if err := json.NewDecoder(io.LimitReader(req.Body, r.cfg.MaxBodyBytes)).Decode(&in); err != nil || in.ID == "" {
		httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "bad_request", "",
			fmt.Sprintf("arrive: want a JSON body with id: %v", err))
		return
	}
	// The call's place in time, however many leaders it waited through. The follower's own
	// timestamp while its clock agrees with this one to within maxClockSkew (so every leader
	// sees the same instant); else how long it has held the call, on its monotonic clock, which
	// no skew moves. A follower that sends no duration gives its timestamp alone, taken within
	// reason: its skew cannot put a session ahead of sessions that arrived well before it.
	now := r.now()
	arrival := in.Arrival
	if in.Held > 0 {
		byHeld := now.Add(-min(in.Held, admission.DefaultRetryMemory))
		if d := arrival.Sub(byHeld); d < -maxClockSkew || d > maxClockSkew {
			arrival = byHeld
		}
	} else if oldest := now.Add(-r.cfg.MaxQueueWait - 2*r.leaseTTL); arrival.Before(oldest) {
		arrival = oldest
	} else if arrival.After(now) {
		arrival = now
	}
	c := Call{ID: in.ID, Tenant: in.Tenant, Arrival: arrival, Anonymous: in.Anonymous, Forwarded: true,
		Req: agentcall.Call{Shape: in.Shape, Prompt: max(1, in.Prompt), Task: in.Task, TaskChars: in.TaskChars}}
	rec := &capture{header: http.Header{}}
	admitted, first := r.host.Admit(rec, req, c)
	if !admitted {
		switch rec.status {
		case 0:
			return // the follower's client left
		case http.StatusMisdirectedRequest:
			r.NotLeader(w) // stopped leading while it waited: the follower asks the next leader
			return
		}
		httpjson.Write(w, http.StatusOK, arriveAnswer{Status: rec.status, Header: rec.header, Body: rec.body.Bytes()})
		return
	}
	ls, live := r.core.LiveSession(c.ID)
	if !live {
		// Ended between its admission and now (an admin end): the follower's client retries.
		r.NotLeader(w)
		return
	}
	if first && !in.Anonymous {
		// A write that timed out may still have been applied: a stopped store runs what waits
		// in its sockets when it resumes. So a failed persist does not undo the admission (an
		// end here could reach the next leader after the table it loaded has the session live,
		// and cut it under its client): the session stays admitted, as a first call on this
		// replica does, and is written with the next save or reported to the next leader.
		_ = r.persistAdmit(req.Context(), epoch, ls)
	}
	httpjson.Write(w, http.StatusOK, arriveAnswer{Admitted: true, First: first, Session: &ls})
}

// PersistAdmission makes the admission of a session admitted here for a call of this replica's
// own durable before the call goes upstream, when this replica leads. On failure the session
// is reported to the next leader.
func (r *Replica) PersistAdmission(ctx context.Context, id string) {
	epoch, ok := r.isLeading()
	if !ok {
		return
	}
	if ls, live := r.core.LiveSession(id); live {
		_ = r.persistAdmit(ctx, epoch, ls)
	}
}

// persistAdmit makes a new session durable in the table before its first call goes upstream.
func (r *Replica) persistAdmit(ctx context.Context, epoch uint64, ls admission.LiveSession) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opTimeout)
	defer cancel()
	err := r.table.Admit(ctx, epoch, ls)
	if err != nil {
		r.log.Error("persisting an admission", "session", ls.ID, "err", err)
		r.admittedAlone(ls.ID) // reported to the next leader reached
	}
	return err
}

// capture is the ResponseWriter a follower's first call is admitted with on the leader.
type capture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }
func (c *capture) WriteHeader(s int) {
	if c.status == 0 {
		c.status = s
	}
}
func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(b)
}

// serveReport is the leader's side of a follower's batch.
func (r *Replica) serveReport(w http.ResponseWriter, req *http.Request) {
	epoch, ok := r.isLeading()
	if !ok {
		r.NotLeader(w)
		return
	}
	var in reportRequest
	if err := json.NewDecoder(io.LimitReader(req.Body, 256<<20)).Decode(&in); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "bad_request", "", fmt.Sprintf("report: %v", err))
		return
	}
	now := r.now()
	var evs []admission.Event
	// Ends first: a session this report both ends and carries as admitted alone is not merged.
	for _, op := range in.Ops {
		if op.Op == repEnd {
			r.endedAt(op.ID, cmp.Or(op.At, now))
		}
	}
	if sessions := r.notEnded(in.Sessions); len(sessions) > 0 {
		merged, err := r.core.Merge(now, admission.State{Live: sessions})
		if err != nil {
			httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "bad_request", "sessions", err.Error())
			return
		}
		evs = append(evs, merged...)
		r.log.Info("sessions reported by a replica", "from", in.Replica, "sessions", len(sessions),
			"ended_here_already", len(in.Sessions)-len(sessions))
	}
	ans := reportAnswer{Epoch: epoch}
	for _, op := range in.Ops {
		switch op.Op {
		case repBegin:
			if !r.core.Begin(now, op.ID, op.Tokens) {
				ans.Unknown = append(ans.Unknown, op.ID)
			}
		case repFinish:
			evs = append(evs, r.core.Finish(now, op.ID, op.Tokens)...)
		case repEnd:
			evs = append(evs, r.core.End(now, op.ID)...)
		case repChain:
			r.host.LinkChain(op.ID, op.Response, op.Tokens)
		}
	}
	r.host.Deliver(evs)
	ans.Live = r.liveUpdate(epoch, in.Known)
	snap := r.core.Snapshot(now, false)
	r.mu.Lock()
	seen := r.mu.seen
	r.mu.Unlock()
	ans.View = LeaderView{CountOnly: snap.CountOnly, Budget: snap.Budget, ReferenceBudget: snap.ReferenceBudget,
		Reserved: snap.Reserved, Replicas: seen}
	httpjson.Write(w, http.StatusOK, ans)
}

// liveUpdate is what brings a follower at position from to this leader's live set.
func (r *Replica) liveUpdate(epoch uint64, from livePosition) liveUpdate {
	core := r.core
	if from.Epoch == epoch {
		if changes, last, ok := core.LiveSince(from.Seq); ok {
			return liveUpdate{To: livePosition{Epoch: epoch, Seq: last}, Changes: changes}
		}
	}
	ids, held, last := core.LiveSet()
	return liveUpdate{To: livePosition{Epoch: epoch, Seq: last}, Whole: true, Live: ids, Held: held}
}

// ReportBegin queues a call's begin for the leader, when this replica follows.
func (r *Replica) ReportBegin(id string, promptEstimate int64) {
	r.report(repBegin, id, promptEstimate)
}

// ReportFinish queues a call's finish, with the session's context after it.
func (r *Replica) ReportFinish(id string, contextTokens int64) {
	r.report(repFinish, id, contextTokens)
}

// ReportEnd queues a session's end, and has it sent at once.
func (r *Replica) ReportEnd(id string) { r.report(repEnd, id, 0) }

// report queues one call event for the leader, when this replica follows.
func (r *Replica) report(op, id string, tokens int64) {
	if _, ok := r.isLeading(); ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.mu.ops) >= maxPendingOps {
		r.mu.ops = r.mu.ops[len(r.mu.ops)/2:]
		r.mu.synced = 0 // what was dropped is resent whole
	}
	rop := reportOp{Op: op, ID: id, Tokens: tokens}
	if op == repEnd {
		rop.At = r.now()
	}
	r.mu.ops = append(r.mu.ops, rop)
	if op == repEnd {
		select {
		case r.flush <- struct{}{}:
		default:
		}
	}
}

// admittedAlone records a session no leader knows of: admitted here while degraded, or whose
// admission could not be persisted. Every report carries it to the leader until one answers.
func (r *Replica) admittedAlone(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.alone[id] = struct{}{}
}

// reportLoop sends the batches.
func (r *Replica) reportLoop(ctx context.Context) {
	tick := time.NewTicker(r.cfg.ReportInterval)
	defer tick.Stop()
	idle := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-r.flush:
		}
		r.mu.Lock()
		quiet := len(r.mu.ops) == 0 && len(r.mu.alone) == 0 && r.mu.synced == r.mu.leader.Epoch
		r.mu.Unlock()
		// With nothing to say, a report a second keeps the view of the budget fresh.
		if idle++; quiet && time.Duration(idle)*r.cfg.ReportInterval < replicaTick {
			continue
		}
		idle = 0
		r.sendReport(ctx)
	}
}

// sendReport sends what is pending to the leader.
func (r *Replica) sendReport(ctx context.Context) {
	if _, ok := r.isLeading(); ok {
		return
	}
	li, _, ok := r.currentLeader()
	if !ok {
		return
	}
	r.mu.Lock()
	ops := r.mu.ops
	r.mu.ops = nil
	newLeader := r.mu.synced != li.Epoch
	known := r.mu.known.at
	sent := make([]string, 0, len(r.mu.alone))
	for id := range r.mu.alone {
		sent = append(sent, id)
	}
	r.mu.Unlock()
	if newLeader {
		// A leader that did not hear of this replica's chains (a new one, or one that lost
		// reports) learns them again: the links of the sessions live here.
		for _, l := range r.host.ChainLinks() {
			ops = append(ops, reportOp{Op: repChain, ID: l.Session, Response: l.Response, Tokens: l.Context})
		}
	}
	var sessions []admission.LiveSession
	for _, id := range sent {
		if ls, live := r.core.LiveSession(id); live {
			sessions = append(sessions, ls)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 10*r.opTimeout)
	defer cancel()
	var ans reportAnswer
	start := time.Now()
	status, err := r.post(rctx, li.AdminURL+reportPath, reportRequest{Replica: r.id, Ops: ops, Sessions: sessions, Known: known}, &ans)
	r.metrics.rpc.WithLabelValues("report").Observe(time.Since(start).Seconds())
	if err != nil {
		r.metrics.rpcErrors.WithLabelValues("report").Inc()
		// Ends and finishes are sent again (applying one twice changes nothing); begins are
		// not, since the leader may have counted them before the answer was lost. Live
		// sessions, and their chains' links, go whole to whichever leader answers next.
		var again []reportOp
		for _, op := range ops {
			if op.Op != repBegin && op.Op != repChain {
				again = append(again, op)
			}
		}
		r.mu.Lock()
		r.mu.ops = append(again, r.mu.ops...)
		if len(r.mu.ops) > maxPendingOps {
			r.mu.ops = r.mu.ops[len(r.mu.ops)-maxPendingOps:]
		}
		r.mu.synced = 0
		r.mu.Unlock()
		if status == http.StatusMisdirectedRequest {
			r.refreshLeader(ctx)
			return
		}
		if ctx.Err() == nil {
			r.setDegraded(fmt.Sprintf("admission leader %s unreachable: %v", li.ReplicaID, err))
		}
		return
	}
	r.mu.Lock()
	r.mu.synced = ans.Epoch
	r.mu.view = ans.View
	for _, id := range sent {
		delete(r.mu.alone, id) // the leader has them now
	}
	if ans.View.Replicas > 0 {
		r.mu.seen = max(r.mu.seen, ans.View.Replicas)
	}
	changed, all := r.mu.known.apply(known, ans.Live)
	r.mu.Unlock()
	r.answeredByLeader()
	now := r.now()
	for _, id := range ans.Unknown {
		r.host.Deliver(r.core.End(now, id))
	}
	r.followHolds(changed, all)
}

// AdminRequest names this replica on every admin answer and, when forward allows, sends the
// request to the leader.
func (r *Replica) AdminRequest(w http.ResponseWriter, req *http.Request, forward bool) bool {
	w.Header().Set(ReplicaHeader, r.id)
	return forward && r.forwardAdmin(w, req)
}

// Routes adds the replicas' protocol and this replica's own view to the admin listener.
func (r *Replica) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+AdminPath, func(w http.ResponseWriter, _ *http.Request) {
		httpjson.Write(w, http.StatusOK, r.View())
	})
	mux.HandleFunc("POST "+arrivePath, r.serveArrive)
	mux.HandleFunc("POST "+reportPath, r.serveReport)
	mux.HandleFunc("POST "+chainPath, r.serveChain)
	mux.HandleFunc("POST "+leaderPath, r.serveLeader)
}

// forwardAdmin sends an admin request to the leader when this replica follows; it reports
// whether it did (or answered that it cannot).
func (r *Replica) forwardAdmin(w http.ResponseWriter, req *http.Request) bool {
	if _, ok := r.isLeading(); ok {
		return false
	}
	if req.Header.Get(ForwardedByHeader) != "" {
		r.NotLeader(w)
		return true
	}
	li, _, ok := r.currentLeader()
	if !ok {
		httpjson.WriteError(w, http.StatusServiceUnavailable, "server_error", "no_admission_leader", "",
			fmt.Sprintf("replica %s follows and no admission leader is known (%s); retry shortly", r.id, r.degradedReason()))
		return true
	}
	target, err := url.Parse(li.AdminURL)
	if err != nil {
		httpjson.WriteError(w, http.StatusBadGateway, "server_error", "bad_leader_url", "", err.Error())
		return true
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set(ForwardedByHeader, r.id)
		},
		Transport: r.http.Transport,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			httpjson.WriteError(w, http.StatusBadGateway, "server_error", "leader_unreachable", "",
				fmt.Sprintf("forwarding to the admission leader %s: %v", li.ReplicaID, err))
		},
	}
	rp.ServeHTTP(w, req)
	return true
}

// View is this replica's own state of replicated mode.
func (r *Replica) View() *adminapi.ReplicationView {
	epoch, leading := r.isLeading()
	heldCalls := r.core.Snapshot(r.now(), false).HeldCalls
	r.mu.Lock()
	defer r.mu.Unlock()
	v := &adminapi.ReplicationView{ReplicaID: r.id, Leading: leading, Epoch: epoch, Leader: r.mu.leader.ReplicaID,
		LeaderEpoch: r.mu.leader.Epoch, Degraded: r.mu.degraded != "", DegradedReason: r.mu.degraded,
		DegradedAdmission: r.cfg.DegradedAdmission, ReplicasSeen: r.mu.seen, PendingReports: len(r.mu.ops),
		KnownLive: len(r.mu.known.ids), KnownEpoch: r.mu.known.at.Epoch, KnownHeld: len(r.mu.known.held),
		HeldCalls: heldCalls}
	if leading {
		v.Leader, v.LeaderEpoch = r.id, epoch
	}
	return v
}

// PickUpstream chooses a new session's upstream by a hash of the session id, so that every
// replica sends a session's calls to the same upstream without asking.
func (r *Replica) PickUpstream(id string, n int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum64() % uint64(n))
}

// Degraded is why this replica is degraded ("" when it is not), and the Retry-After of a
// refusal meanwhile: a new leader is in place within a lease.
func (r *Replica) Degraded() (string, time.Duration) {
	return r.degradedReason(), r.leaseTTL
}

// announce tells every other replica seen that this one leads in epoch, once the store says so:
// each reads the announcement at once (serveLeader) instead of at its next once-a-second tick,
// so a follower's first calls go to the new leader, and its reports resume, without waiting. The
// tick stays the fallback for a replica the word does not reach.
func (r *Replica) announce(ctx context.Context, epoch uint64) {
	actx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	urls, err := r.table.ReplicaURLs(actx, r.now().Add(-replicaSeenWithin))
	if err != nil {
		r.log.Warn("listing the replicas to tell of the new leader; they learn it at their next tick", "err", err)
		return
	}
	for id, u := range urls {
		if id == r.id {
			continue
		}
		go func() {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opTimeout)
			defer cancel()
			var ans struct{}
			if _, err := r.post(pctx, u+leaderPath, sessionstore.LeaderInfo{ReplicaID: r.id, Epoch: epoch, AdminURL: r.advertise}, &ans); err != nil {
				r.log.Debug("telling a replica of the new leader; it learns it at its next tick", "replica", id, "err", err)
			}
		}()
	}
}

// serveLeader is a new leader's word that it leads: the announcement is read from the store, the
// truth, rather than taken from the request.
func (r *Replica) serveLeader(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, 1<<16))
	if _, ok := r.isLeading(); !ok {
		r.refreshLeader(req.Context())
	}
	httpjson.Write(w, http.StatusOK, struct{}{})
}
