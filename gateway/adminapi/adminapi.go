// Package adminapi holds the wire types of the gateway's admin API (/admin/state, /admin/budget,
// /admin/shed, /admin/affinity, /admin/holds): what the gateway serves, what its Go client sends
// and what the daemon reads. They live apart from the proxy so that a program speaking the API — the daemon, a
// test, an operator's tool — does not import the whole gateway for a few structs, and so that each
// request and answer is defined once for both ends.
package adminapi

import (
	"time"

	"github.com/basin-dev/basin/gateway/admission"
)

// StateView is what GET /admin/state returns: the admission core's snapshot with its queue, and
// the gateway's routing.
type StateView struct {
	admission.Snapshot
	Now       time.Time      `json:"now"`
	Affinity  AffinityView   `json:"affinity"`
	Upstreams []UpstreamView `json:"upstreams"`
	// Replication is the answering replica's view of replicated mode; absent on a gateway
	// without a store. Followers forward /admin/state to the leader, so it is the leader's.
	Replication *ReplicationView `json:"replication,omitempty"`
	// DaemonTerm is the highest Basin-Daemon-Term an admin write carried (0: none yet); a write
	// with a lower one is refused 409 stale_daemon_term.
	DaemonTerm uint64 `json:"daemon_term,omitempty"`
	// DeploymentSpeed is the speed a simulated upstream announces (X-Basin-Sim-Speed: its
	// seconds per wall second), which the idle timeout is divided by; absent for real engines.
	DeploymentSpeed float64 `json:"deployment_speed,omitempty"`
}

// ReplicationView is one replica's state in replicated mode: GET /admin/replication on any
// replica (never forwarded), and within GET /admin/state (the leader's).
type ReplicationView struct {
	ReplicaID string `json:"replica_id"`
	// Leading: this replica is the admission leader, in Epoch.
	Leading bool   `json:"leading"`
	Epoch   uint64 `json:"epoch,omitempty"`
	// Leader and LeaderEpoch are the leader as this replica knows it ("" / 0: none known).
	Leader      string `json:"leader"`
	LeaderEpoch uint64 `json:"leader_epoch"`
	// Degraded: this replica cannot reach the leader or the store, and why; live sessions'
	// calls pass, new sessions follow DegradedAdmission (local_slice or refuse).
	Degraded          bool   `json:"degraded"`
	DegradedReason    string `json:"degraded_reason,omitempty"`
	DegradedAdmission string `json:"degraded_admission"`
	// ReplicasSeen counts the replicas with a recent heartbeat in the store.
	ReplicasSeen int `json:"replicas_seen"`
	// PendingReports counts call events waiting to be sent to the leader.
	PendingReports int `json:"pending_reports"`
	// KnownLive counts the sessions in this follower's copy of the leader's live set, whose
	// calls pass while no leader answers; KnownEpoch is the leader epoch the copy is from.
	KnownLive  int    `json:"known_live_sessions"`
	KnownEpoch uint64 `json:"known_epoch,omitempty"`
	// KnownHeld counts the sessions of that copy on the leader's hold list, and HeldCalls the
	// calls of held sessions this replica holds now: /admin/state, forwarded to the leader,
	// counts only the leader's own.
	KnownHeld int `json:"known_held_sessions"`
	HeldCalls int `json:"held_calls"`
}

// AffinityView is the sticky decode routing switch.
type AffinityView struct {
	Enabled bool   `json:"enabled"`
	Header  string `json:"header"`
}

// UpstreamView is one upstream and how many live sessions are routed to it.
type UpstreamView struct {
	URL      string `json:"url"`
	Sessions int    `json:"sessions"`
}

// DaemonTerm answers PUT /admin/daemon-term: the highest daemon term the gateway has accepted.
type DaemonTerm struct {
	DaemonTerm uint64 `json:"daemon_term"`
}

// BudgetRequest is the body of PUT /admin/budget. Tokens is a pointer so that a missing value is
// refused naming the field rather than read as zero; a nil ReferenceTokens leaves the reference
// budget as it is.
type BudgetRequest struct {
	Tokens          *int64 `json:"tokens"`
	ReferenceTokens *int64 `json:"reference_tokens,omitempty"`
	Reason          string `json:"reason"`
}

// Budget is the admission budget at one instant.
type Budget struct {
	// BudgetTokens is B, what the live sessions' demands may add up to once admission engages.
	BudgetTokens int64 `json:"budget_tokens"`
	// ReferenceBudgetTokens is the working set past which admission engages.
	ReferenceBudgetTokens int64 `json:"reference_budget_tokens"`
	// CountOnly: no budget was set yet and every session was admitted (the gateway's
	// admission.count_only); a budget change always ends it.
	CountOnly bool `json:"count_only"`
}

// BudgetResult is what PUT /admin/budget returns: the budget before and after, the queued sessions
// a looser budget admitted at once, and what took effect, said plainly — a budget binds only once
// the working set passes the reference budget, so a budget set under an out-of-reach reference
// changes nothing yet, and the answer says so rather than nothing.
type BudgetResult struct {
	Before   Budget   `json:"before"`
	After    Budget   `json:"after"`
	Admitted []string `json:"admitted"`
	// Engaged: admission is holding new sessions back now (the working set is over the reference
	// budget, or sessions are queued).
	Engaged bool `json:"engaged"`
	// WorkingSetTokens is the working set when the budget changed.
	WorkingSetTokens int64 `json:"working_set_tokens"`
	// Effect says in a sentence what the change does now, and why not when it does nothing yet.
	Effect string `json:"effect"`
}

// ShedRequest is the body of POST /admin/shed: exactly one of Count and SessionIDs. A JSON null or
// a missing field leaves SessionIDs nil (not given), which the gateway tells apart from an empty
// list (given, and refused).
type ShedRequest struct {
	Count      *int     `json:"count,omitempty"`
	SessionIDs []string `json:"session_ids"`
	Reason     string   `json:"reason"`
}

// ShedResult is what a shed did: the sessions refused (their calls got 529), and the ones admitted
// because the shed sessions no longer stood ahead of them in the queue.
type ShedResult struct {
	Shed     []string `json:"shed"`
	Admitted []string `json:"admitted"`
}

// AffinityRequest is the body of PUT /admin/affinity.
type AffinityRequest struct {
	Enabled *bool  `json:"enabled"`
	Reason  string `json:"reason"`
}

// AffinityResult is what PUT /admin/affinity returns: the switch before and after.
type AffinityResult struct {
	Before AffinityView `json:"before"`
	After  AffinityView `json:"after"`
}

// HoldRequest is the body of POST /admin/holds: live sessions to put on the hold list (their next
// calls wait at the gateway) and sessions to take off it (a call of theirs that waits goes at
// once). At least one id is required in all, and an id may not be in both lists: the gateway
// applies Hold before Resume, so such an id would be held and resumed in one breath.
type HoldRequest struct {
	Hold   []string `json:"hold"`
	Resume []string `json:"resume"`
	Reason string   `json:"reason"`
}

// HoldResult is what POST /admin/holds did and the hold list it left. Unknown, ended and already
// held ids in Hold, and ids not held in Resume, are skipped, so Added and Resumed may be smaller
// than the lists sent: a controller that acts twice on the same ids changes nothing the second
// time.
type HoldResult struct {
	// Added is how many sessions were put on the hold list, Resumed how many were taken off it.
	Added   int `json:"added"`
	Resumed int `json:"resumed"`
	// Released lists the sessions whose waiting calls the resume let go ([] when none).
	Released []string `json:"released"`
	// HeldSessions, HeldTokens and HeldCalls are the hold list after the change: the sessions on
	// it, their contexts and how many of their calls wait now.
	HeldSessions int   `json:"held_sessions"`
	HeldTokens   int64 `json:"held_tokens"`
	HeldCalls    int   `json:"held_calls"`
}
