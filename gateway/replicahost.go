package gateway

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/replication"
)

// newReplica builds this gateway's part in replicated mode from its configuration: the replica
// drives the gateway's admission core itself, and asks the gateway (replicaHost) for the rest.
func newReplica(g *Gateway, o Options, reg prometheus.Registerer) (*replication.Replica, error) {
	return replication.New(replication.Options{
		Store:             g.cfg.Store,
		ReplicaID:         g.cfg.Replication.ReplicaID,
		AdvertiseURL:      g.cfg.Replication.AdvertiseURL,
		ReportInterval:    time.Duration(g.cfg.Replication.ReportInterval),
		DegradedAdmission: g.cfg.Replication.DegradedAdmission,
		Admission:         g.cfg.admissionOptions(),
		MaxQueueWait:      time.Duration(g.cfg.MaxQueueWait),
		MaxBodyBytes:      g.cfg.MaxBodyBytes,
		Token:             g.token,
		Transport:         newTransport(),
		Core:              g.core.Core,
		Host:              replicaHost{g},
		Logger:            g.log,
		Registerer:        reg,
		Now:               g.now,
		Getenv:            o.Getenv,
	})
}

// replicaHost is what a replica asks of the gateway: the calls waiting here, the Responses
// chains answered here, and the settings kept beside the session table.
type replicaHost struct{ g *Gateway }

// Deliver implements replication.Host.
func (h replicaHost) Deliver(evs []admission.Event) { h.g.deliver(evs) }

// AskAgain implements replication.Host: the waiting calls of sessions taken out of the local
// queue each go round admission again, as a call of a session that went live meanwhile would.
func (h replicaHost) AskAgain(ids []string) {
	g := h.g
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range ids {
		ws := g.mu.waiters[id]
		delete(g.mu.waiters, id)
		for _, w := range ws {
			w.ch <- waitMsg{ev: admission.Event{Kind: admission.EventAdmitted, ID: id, At: now}}
		}
	}
}

// Admit implements replication.Host: a follower's first call is admitted on the leader as a call
// reaching the leader itself is.
func (h replicaHost) Admit(w http.ResponseWriter, r *http.Request, rc replication.Call) (admitted, first bool) {
	c := &call{id: rc.ID, tenant: rc.Tenant, arrival: rc.Arrival, anonymous: rc.Anonymous, forwarded: rc.Forwarded, req: rc.Req}
	admitted = h.g.admit(w, r, c)
	return admitted, c.first
}

// Hold implements replication.Host, under g.mu as every change of the hold list.
func (h replicaHost) Hold(hold, resume []string) int {
	g := h.g
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	n := g.core.Core.Hold(now, hold)
	g.deliverLocked(g.core.Core.Resume(now, resume))
	return n
}

// ChainLink implements replication.Host.
func (h replicaHost) ChainLink(responseID string) (string, int64, bool) {
	g := h.g
	g.mu.Lock()
	defer g.mu.Unlock()
	l, ok := g.mu.chains[responseID]
	return l.session, l.context, ok
}

// LinkChain implements replication.Host.
func (h replicaHost) LinkChain(session, responseID string, context int64) {
	h.g.linkChain(session, responseID, context)
}

// ChainLinks implements replication.Host.
func (h replicaHost) ChainLinks() []replication.ChainLink { return h.g.chainLinks() }

// Settings implements replication.Host.
func (h replicaHost) Settings() (affinity bool, daemonTerm uint64) {
	return h.g.affinity.Load(), h.g.daemonTerm.Load()
}

// RestoreSettings implements replication.Host.
func (h replicaHost) RestoreSettings(affinity *bool, daemonTerm uint64) {
	h.g.raiseDaemonTerm(daemonTerm)
	if affinity != nil {
		h.g.affinity.Store(*affinity)
	}
}

// adopt puts a session the leader admitted (or knows live) into the local core and begins c in
// it (replication.AdoptFunc); a session the leader holds has c held here, on the waiter
// returned.
func (g *Gateway) adopt(c *call, ls admission.LiveSession) (*waiter, error) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	evs, err := g.core.Merge(now, admission.State{Live: []admission.LiveSession{ls}})
	held := false
	if c.first {
		// Admitted for this very call: a hold acts on sessions already running, never on the
		// call that starts one.
		g.core.Core.Begin(now, c.id, c.req.Prompt)
	} else if g.core.Core.BeginCall(now, c.id, c.req.Prompt) == admission.CallHeld {
		held = true
	}
	var wt *waiter
	if held {
		wt = g.heldWaiterLocked(now, c)
	}
	if _, ok := g.mu.sessions[c.id]; !ok {
		g.addSessionLocked(c.id, &sessionInfo{upstream: g.pickUpstream(c.id)})
	}
	g.deliverLocked(evs)
	return wt, err
}

// remote is c as a replica asks the leader to admit it.
func (c *call) remote() replication.Call {
	return replication.Call{ID: c.id, Tenant: c.tenant, Anonymous: c.anonymous, Forwarded: c.forwarded, Arrival: c.arrival, Req: c.req}
}
