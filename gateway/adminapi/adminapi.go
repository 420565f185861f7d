// Package adminapi holds the wire types of the gateway's admin API (/admin/state, /admin/budget,
// /admin/shed, /admin/affinity, /admin/holds): what the gateway serves, what its Go client sends
// and what the daemon reads. They live apart from the proxy so that a program speaking the API — the daemon, a
// test, an operator's tool — does not import the whole gateway for a few structs, and so that each
// request and answer is defined once for both ends.
//
// These types are the contract, not the admission core's own structs: the core may grow or
// rename what it keeps without changing what the API promises. The one conversion from the core's
// snapshot is gateway/admission/inproc.StateOf, used by the gateway's handler and by the
// in-process implementation alike. The package imports nothing of basin's.
package adminapi

import (
	"fmt"
	"strings"
	"time"
)

// StateView is what GET /admin/state returns: the admission state with its queue, and the
// gateway's routing. The admission fields come first, in the order the API has always sent them.
type StateView struct {
	// Mode is the admission mode: "current" (a live session counts its current context) or
	// "peak" (its predicted peak).
	Mode string `json:"mode"`
	// CountOnly: every session is admitted at once until a budget is set; Budget and
	// ReferenceBudget are 0 until then unless configured.
	CountOnly       bool  `json:"count_only"`
	Budget          int64 `json:"budget_tokens"`
	ReferenceBudget int64 `json:"reference_budget_tokens"`
	// Reserved and WorkingSet are the demands and the contexts of the live sessions that are not
	// dormant; Live counts those sessions (the dormant ones are reported apart, below).
	Reserved   int64 `json:"reserved_tokens"`
	WorkingSet int64 `json:"working_set_tokens"`
	Engaged    bool  `json:"engaged"`
	Live       int   `json:"live_sessions"`
	// InCall counts the live sessions with a model call in flight (the rest are running tools or
	// thinking): the served fraction of the paper's risk rule is InCall ÷ Live.
	InCall int `json:"sessions_in_call"`
	// Queued is how many sessions wait (the Queue listing may be only its tail, ?queue_tail=N);
	// OldestWaitSeconds is how long the longest-waiting of them has waited.
	Queued            int     `json:"queued_sessions"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	// Stale is how many of them have gone stale: they queue behind the fresh ones, newest first.
	Stale int `json:"stale_sessions"`
	// Held is how many live sessions are on the hold list, HeldTokens their contexts (part of
	// WorkingSet, out of the admission test), HeldCalls how many of their calls wait now and
	// OldestHeldCallSeconds how long the longest of those has waited.
	Held                  int     `json:"held_sessions"`
	HeldTokens            int64   `json:"held_tokens"`
	HeldCalls             int     `json:"held_calls"`
	OldestHeldCallSeconds float64 `json:"oldest_held_call_seconds"`
	// Dormant is how many live sessions are dormant (idle long past the workload's tool time),
	// DormantTokens their contexts: out of WorkingSet, Reserved and Live, still admitted (a call
	// wakes one). DormantAfterSeconds is the idleness that makes a session dormant now, ToolGaps
	// how many tool gaps it was learnt from.
	Dormant             int     `json:"dormant_sessions"`
	DormantTokens       int64   `json:"dormant_tokens"`
	DormantAfterSeconds float64 `json:"dormant_after_seconds"`
	ToolGaps            int     `json:"tool_gaps"`
	// Sessions lists the live sessions ([] when none) when asked for; nil (null in JSON) when
	// not listed.
	Sessions []LiveSession   `json:"sessions"`
	Queue    []QueuedSession `json:"queue"`
	Counters Counters        `json:"counters"`

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

// LiveSession is one live session as GET /admin/state lists it.
type LiveSession struct {
	ID            string    `json:"id"`
	Tenant        string    `json:"tenant,omitempty"`
	Arrival       time.Time `json:"arrival"`
	Admitted      time.Time `json:"admitted"`
	LastDone      time.Time `json:"last_done"`
	Context       int64     `json:"context_tokens"`
	Peak          int64     `json:"peak_tokens"`
	PredictedPeak int64     `json:"predicted_peak_tokens"`
	// Priority is the session's fixed priority (smaller first), as it queued: a hold policy
	// holds the lowest and resumes the highest first.
	Priority time.Time `json:"priority,omitzero"`
	// Held: on the hold list; its next call waits.
	Held bool `json:"held,omitempty"`
	// HeldCallSeconds is how long its held call has waited, when one waits.
	HeldCallSeconds float64 `json:"held_call_seconds,omitempty"`
	// Dormant: idle long past the workload's tool time, its context out of the working set until
	// it calls again.
	Dormant bool `json:"dormant,omitempty"`
}

// QueuedSession is one entry of the queue.
type QueuedSession struct {
	ID       string    `json:"id"`
	Tenant   string    `json:"tenant,omitempty"`
	Arrival  time.Time `json:"arrival"`
	Priority time.Time `json:"priority"`
	// WaitedSeconds is how long it has been queued, from its (original) arrival.
	WaitedSeconds float64 `json:"waited_seconds"`
	Demand        int64   `json:"demand_tokens"`
}

// Counters count admission's decisions since the gateway started.
type Counters struct {
	Arrivals          uint64 `json:"arrivals"`
	AdmittedAtOnce    uint64 `json:"admitted_at_once"`
	AdmittedFromQueue uint64 `json:"admitted_from_queue"`
	Queued            uint64 `json:"queued"`
	OverQuota         uint64 `json:"over_quota"`
	Refused           uint64 `json:"refused"`
	Shed              uint64 `json:"shed"`
	Cancelled         uint64 `json:"cancelled"`
	Ended             uint64 `json:"ended"`
	// Staled counts queued sessions that went stale.
	Staled uint64 `json:"staled"`
	// TooLate counts sessions refused for their start deadline, at arrival or in the queue.
	TooLate uint64 `json:"too_late"`
	// Held counts sessions put on the hold list, Resumed those taken off it, CallsHeld the
	// calls that waited and HoldBoundReleases those that went at the hold bound.
	Held              uint64 `json:"held"`
	Resumed           uint64 `json:"resumed"`
	CallsHeld         uint64 `json:"calls_held"`
	HoldBoundReleases uint64 `json:"hold_bound_releases"`
	// Dormant counts live sessions that went dormant, Woken the dormant ones that called again.
	Dormant uint64 `json:"dormant"`
	Woken   uint64 `json:"woken"`
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

// RequestError is a request the admin API refuses as invalid (400 invalid_request_error): Param
// names the field at fault ("tokens", "session_ids[2]"), Message says what is wrong with it. The
// gateway answers it, the in-process implementation returns it, and the Go client finds it in
// the gateway's answer, so every implementation refuses the same requests in the same words.
type RequestError struct {
	Param   string
	Message string
}

// Error is the message, which already names the field.
func (e *RequestError) Error() string { return e.Message }

func invalid(param, format string, a ...any) *RequestError {
	return &RequestError{Param: param, Message: fmt.Sprintf(format, a...)}
}

// Validate is the one check of a budget change, wherever it is applied (the gateway's handler,
// the in-process implementation): a request it passes, the admission core accepts.
func (r BudgetRequest) Validate() error {
	switch {
	case r.Tokens == nil:
		return invalid("tokens", "tokens: required, the new budget in tokens")
	case *r.Tokens <= 0:
		return invalid("tokens", "tokens: must be > 0, got %d", *r.Tokens)
	case r.ReferenceTokens != nil && *r.ReferenceTokens <= 0:
		return invalid("reference_tokens", "reference_tokens: must be > 0, got %d", *r.ReferenceTokens)
	case strings.TrimSpace(r.Reason) == "":
		return invalid("reason", "reason: required, say why the budget changes")
	}
	return nil
}

// Validate checks a shed: exactly one of Count (positive) and SessionIDs (not empty, no empty
// id), and a reason.
func (r ShedRequest) Validate() error {
	switch {
	case r.Count == nil && r.SessionIDs == nil:
		return invalid("count", "count or session_ids: one is required")
	case r.Count != nil && r.SessionIDs != nil:
		return invalid("session_ids", "count and session_ids: give one, not both")
	case r.Count != nil && *r.Count <= 0:
		return invalid("count", "count: must be > 0, got %d", *r.Count)
	case r.SessionIDs != nil && len(r.SessionIDs) == 0:
		return invalid("session_ids", "session_ids: must not be empty")
	case strings.TrimSpace(r.Reason) == "":
		return invalid("reason", "reason: required, say why sessions are shed")
	}
	for i, id := range r.SessionIDs {
		if id == "" {
			return invalid(fmt.Sprintf("session_ids[%d]", i), "session_ids[%d]: empty", i)
		}
	}
	return nil
}

// Validate checks a hold change: at least one id, none empty, none in both lists, and a reason.
func (r HoldRequest) Validate() error {
	if len(r.Hold) == 0 && len(r.Resume) == 0 {
		return invalid("hold", "hold or resume: at least one session id is required")
	}
	holding := make(map[string]bool, len(r.Hold))
	for i, id := range r.Hold {
		if strings.TrimSpace(id) == "" {
			return invalid(fmt.Sprintf("hold[%d]", i), "hold[%d]: empty session id", i)
		}
		holding[id] = true
	}
	for i, id := range r.Resume {
		switch {
		case strings.TrimSpace(id) == "":
			return invalid(fmt.Sprintf("resume[%d]", i), "resume[%d]: empty session id", i)
		case holding[id]:
			return invalid(fmt.Sprintf("resume[%d]", i), "resume[%d]: %q is also in hold; give each session one change", i, id)
		}
	}
	if strings.TrimSpace(r.Reason) == "" {
		return invalid("reason", "reason: required, say why sessions are held or resumed")
	}
	return nil
}
