package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/basin-dev/basin/internal/httpjson"
)

// Responses chains in replicated mode. A call that names no session but continues a response
// (previous_response_id) joins the session of that response; with replicas, the response may
// have been answered by another one. So every replica tells the leader of the responses it
// answers (a chain op in its report, sent at once), and a replica that does not know a response
// asks the leader (one RPC, only for a call that names no session). A new leader learns the
// links again from its followers' first reports. While no leader answers, a call continuing a
// response this replica did not answer is keyed by that response id, as a single gateway keys
// one it does not know after a restart: the rest of its chain still stays together.

// chainRequest asks the leader for the session of a response.
type chainRequest struct {
	Response string `json:"response"`
}

// chainAnswer is the leader's answer: the session and its context, when it knows the response.
type chainAnswer struct {
	Known   bool   `json:"known"`
	Session string `json:"session,omitempty"`
	Context int64  `json:"context_tokens,omitempty"`
}

// ReportChain tells the leader, when this replica follows, that session continues as a call
// naming responseID, and sends the report now: the agent's next call may reach another replica
// as soon as it has the response.
func (r *Replica) ReportChain(session, responseID string, context int64) {
	if _, ok := r.isLeading(); ok {
		return
	}
	r.mu.Lock()
	r.mu.ops = append(r.mu.ops, reportOp{Op: repChain, ID: session, Response: responseID, Tokens: context})
	r.mu.Unlock()
	select {
	case r.flush <- struct{}{}:
	default:
	}
}

// LookupChain asks the leader for the session of a response this replica does not know.
func (r *Replica) LookupChain(ctx context.Context, responseID string) (string, int64, bool) {
	if _, ok := r.isLeading(); ok {
		return "", 0, false // the leader's own map was asked already
	}
	li, _, ok := r.currentLeader()
	if !ok {
		return "", 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	var ans chainAnswer
	start := time.Now()
	_, err := r.post(ctx, li.AdminURL+chainPath, chainRequest{Response: responseID}, &ans)
	r.metrics.rpc.WithLabelValues("chain").Observe(time.Since(start).Seconds())
	if err != nil {
		r.metrics.rpcErrors.WithLabelValues("chain").Inc()
		r.log.Debug("looking a response up at the leader", "response", responseID, "err", err)
		return "", 0, false
	}
	if !ans.Known || ans.Session == "" {
		return "", 0, false
	}
	return ans.Session, ans.Context, true
}

// serveChain is the leader's side of LookupChain.
func (r *Replica) serveChain(w http.ResponseWriter, req *http.Request) {
	if _, ok := r.isLeading(); !ok {
		r.NotLeader(w)
		return
	}
	var in chainRequest
	if err := json.NewDecoder(io.LimitReader(req.Body, 64<<10)).Decode(&in); err != nil || in.Response == "" {
		httpjson.WriteError(w, http.StatusBadRequest, "invalid_request_error", "bad_request", "response",
			fmt.Sprintf("chain: want a JSON body with response: %v", err))
		return
	}
	session, tokens, ok := r.host.ChainLink(in.Response)
	httpjson.Write(w, http.StatusOK, chainAnswer{Known: ok, Session: session, Context: tokens})
}
