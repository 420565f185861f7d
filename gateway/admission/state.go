package admission

import (
	"fmt"
	"sort"
	"time"
)

// QueuedSession is one entry of the queue as the admin API shows it.
type QueuedSession struct {
	ID       string    `json:"id"`
	Tenant   string    `json:"tenant,omitempty"`
	Arrival  time.Time `json:"arrival"`
	Priority time.Time `json:"priority"`
	// WaitedSeconds is how long it has been queued, from its (original) arrival.
	WaitedSeconds float64 `json:"waited_seconds"`
	Demand        int64   `json:"demand_tokens"`
}

// Snapshot is the state of the core at one instant.
type Snapshot struct {
	Mode Mode `json:"mode"`
	// CountOnly: every session is admitted at once until a budget is set (Options.CountOnly);
	// Budget and ReferenceBudget are 0 until then unless configured.
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
	// Queued is how many sessions wait (the Queue listing may be partial, see SnapshotTail);
	// OldestWaitSeconds is how long the longest-waiting of them has waited.
	Queued            int     `json:"queued_sessions"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	// Stale is how many of them have gone stale (Options.StaleAfter): they queue behind the
	// fresh ones, newest first.
	Stale int `json:"stale_sessions"`
	// Held is how many live sessions are on the hold list, HeldTokens their contexts (part of
	// WorkingSet, out of the admission test), HeldCalls how many of their calls wait now and
	// OldestHeldCallSeconds how long the longest of those has waited.
	Held                  int     `json:"held_sessions"`
	HeldTokens            int64   `json:"held_tokens"`
	HeldCalls             int     `json:"held_calls"`
	OldestHeldCallSeconds float64 `json:"oldest_held_call_seconds"`
	// Dormant is how many live sessions are dormant (idle long past the workload's tool time,
	// see dormant.go), DormantTokens their contexts: out of WorkingSet, Reserved and Live, still
	// admitted (a call wakes one). DormantAfterSeconds is the idleness that makes a session
	// dormant now (the idle timeout until the core has seen enough tool gaps), ToolGaps how
	// many gaps it was learnt from.
	Dormant             int     `json:"dormant_sessions"`
	DormantTokens       int64   `json:"dormant_tokens"`
	DormantAfterSeconds float64 `json:"dormant_after_seconds"`
	ToolGaps            int     `json:"tool_gaps"`
	// Sessions lists the live sessions ([] when none) with the full listing; nil (null in JSON)
	// when not listed (SnapshotTail, or Snapshot without the queue).
	Sessions []LiveSession   `json:"sessions"`
	Queue    []QueuedSession `json:"queue"`
	Counters Counters        `json:"counters"`
}

// Snapshot copies the state; with queue false it skips the O(queue) listing.
func (c *Core) Snapshot(now time.Time, queue bool) Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snapshotLocked(now)
	if queue {
		s.Sessions = c.liveLocked(now)
		s.Queue = c.queueLocked(now, c.mu.queue.Len())
	}
	return s
}

// SnapshotTail is the state with only the tail lowest-priority queued sessions listed (best first,
// like Snapshot's) and no live sessions: what a controller needs to shed, at a cost that does not
// grow with a 100,000-session queue's listing.
func (c *Core) SnapshotTail(now time.Time, tail int) Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snapshotLocked(now)
	s.Queue = c.queueLocked(now, max(0, tail))
	return s
}

func (c *Core) snapshotLocked(now time.Time) Snapshot {
	s := Snapshot{Mode: c.mu.o.Mode, CountOnly: c.mu.o.CountOnly, Budget: c.mu.o.Budget, ReferenceBudget: c.mu.o.ReferenceBudget,
		Reserved: c.mu.reserved, WorkingSet: c.mu.workingSet, Live: c.activeLocked(), InCall: c.inCallLocked(),
		Engaged: !c.mu.o.CountOnly && (c.mu.workingSet > c.mu.o.ReferenceBudget || c.mu.queue.Len() > 0), Counters: c.mu.counters,
		Queued: c.mu.queue.Len(), Stale: c.mu.stale, Queue: []QueuedSession{},
		Held: c.mu.nHeld, HeldTokens: c.mu.heldCtx, HeldCalls: c.mu.waiting,
		Dormant: c.mu.nDormant, DormantTokens: c.mu.dormantCtx, DormantAfterSeconds: c.dormantAfterLocked().Seconds(),
		ToolGaps: len(c.mu.gaps.sorted)}
	for _, q := range c.mu.queue.Items() {
		s.OldestWaitSeconds = max(s.OldestWaitSeconds, now.Sub(q.arrival).Seconds())
	}
	if c.mu.waiting > 0 {
		for _, l := range c.mu.live {
			if !l.waitSince.IsZero() {
				s.OldestHeldCallSeconds = max(s.OldestHeldCallSeconds, now.Sub(l.waitSince).Seconds())
			}
		}
	}
	return s
}

// queueLocked lists the last n queued sessions in priority order (best first).
func (c *Core) queueLocked(now time.Time, n int) []QueuedSession {
	items := append([]*session(nil), c.mu.queue.Items()...)
	sort.Slice(items, func(i, j int) bool { return less(items[i], items[j]) })
	items = items[max(0, len(items)-n):]
	out := make([]QueuedSession, 0, len(items))
	for _, q := range items {
		out = append(out, QueuedSession{ID: q.id, Tenant: q.tenant, Arrival: q.arrival, Priority: q.priority,
			WaitedSeconds: now.Sub(q.arrival).Seconds(), Demand: c.demandLocked(q)})
	}
	return out
}

// QueueLen is the number of queued sessions (cheap, for metrics).
func (c *Core) QueueLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.queue.Len()
}

// LiveSession is a live session as persisted across restarts.
type LiveSession struct {
	ID            string    `json:"id"`
	Tenant        string    `json:"tenant,omitempty"`
	Arrival       time.Time `json:"arrival"`
	Admitted      time.Time `json:"admitted"`
	LastDone      time.Time `json:"last_done"`
	Context       int64     `json:"context_tokens"`
	Peak          int64     `json:"peak_tokens"`
	PredictedPeak int64     `json:"predicted_peak_tokens"`
	// Priority is the session's fixed priority (smaller first), as it queued: the hold policy
	// holds the lowest and resumes the highest first.
	Priority time.Time `json:"priority,omitzero"`
	// Held: on the hold list (hold.go); kept across restarts, so a held session's next call
	// still waits.
	Held bool `json:"held,omitempty"`
	// HeldCallSeconds is how long its held call has waited, when one waits (listings only:
	// the call does not outlive the process).
	HeldCallSeconds float64 `json:"held_call_seconds,omitempty"`
	// Dormant: idle long past the workload's tool time (dormant.go), its context out of the
	// working set and its demand out of the admission test until it calls again; kept across
	// restarts, so a restarted gateway does not count it back.
	Dormant bool `json:"dormant,omitempty"`
}

// State is what survives a restart: the live-session table (so sessions in flight are not
// treated as new) and the remembered retries and sheds. Queued sessions are not kept: their
// clients' connections died with the process, and their retries keep their place through the
// retry memory.
type State struct {
	// CountOnly: no budget had been set (Options.CountOnly).
	CountOnly       bool                 `json:"count_only,omitempty"`
	Budget          int64                `json:"budget_tokens"`
	ReferenceBudget int64                `json:"reference_budget_tokens"`
	Live            []LiveSession        `json:"live"`
	Retry           map[string]time.Time `json:"retry_arrivals,omitempty"`
	Shed            map[string]time.Time `json:"shed_until,omitempty"`
}

// Export returns the state to persist. Queued sessions become retry memories, so a client that
// retries after a restart keeps its place in time.
func (c *Core) Export(now time.Time) State {
	c.mu.Lock()
	st := State{CountOnly: c.mu.o.CountOnly, Budget: c.mu.o.Budget, ReferenceBudget: c.mu.o.ReferenceBudget, Retry: map[string]time.Time{},
		Shed: map[string]time.Time{}}
	st.Live = make([]LiveSession, 0, len(c.mu.live))
	for _, s := range c.mu.live {
		st.Live = append(st.Live, liveSessionOf(s))
	}
	for id, m := range c.mu.retry {
		if now.Before(m.until) {
			st.Retry[id] = m.arrival
		}
	}
	for _, s := range c.mu.queue.Items() {
		st.Retry[s.id] = s.arrival
	}
	for id, until := range c.mu.shed {
		if now.Before(until) {
			st.Shed[id] = until
		}
	}
	c.mu.Unlock()
	// Sorted after the lock: a replicated leader exports its table every second, and sorting
	// 100,000 sessions under it would hold admissions up for tens of milliseconds.
	sort.Slice(st.Live, func(i, j int) bool { return st.Live[i].ID < st.Live[j].ID })
	return st
}

// LiveSession returns one live session as Export would persist it, so that the gateway can
// journal an admission the moment it happens instead of waiting for the next periodic Export.
func (c *Core) LiveSession(id string) (LiveSession, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	if !ok {
		return LiveSession{}, false
	}
	return liveSessionOf(s), true
}

// LiveSessionAt is LiveSession with how long the session's held call has waited at now, for
// listings (a hold policy resumes the longest-waiting first).
func (c *Core) LiveSessionAt(now time.Time, id string) (LiveSession, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	if !ok {
		return LiveSession{}, false
	}
	ls := liveSessionOf(s)
	if !s.waitSince.IsZero() {
		ls.HeldCallSeconds = now.Sub(s.waitSince).Seconds()
	}
	return ls, true
}

func liveSessionOf(s *session) LiveSession {
	return LiveSession{ID: s.id, Tenant: s.tenant, Arrival: s.arrival, Admitted: s.admitted,
		LastDone: s.lastDone, Context: s.context, Peak: s.peak, PredictedPeak: s.predicted, Priority: s.priority, Held: s.held,
		Dormant: s.dormant}
}

// liveLocked lists the live sessions by id, with how long their held calls have waited.
func (c *Core) liveLocked(now time.Time) []LiveSession {
	out := make([]LiveSession, 0, len(c.mu.live))
	for _, s := range c.mu.live {
		ls := liveSessionOf(s)
		if !s.waitSince.IsZero() {
			ls.HeldCallSeconds = now.Sub(s.waitSince).Seconds()
		}
		out = append(out, ls)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Restore loads a persisted state into an empty core. Restored sessions count as idle since
// their last recorded call, so ones whose clients never come back expire as usual.
func (c *Core) Restore(now time.Time, st State) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.mu.live) > 0 || c.mu.queue.Len() > 0 {
		return fmt.Errorf("restore: core already has sessions")
	}
	c.adoptBudgetLocked(st)
	if st.CountOnly {
		// Saved before any budget was set: still none, and the budgets it had configured.
		c.mu.o.Budget, c.mu.o.ReferenceBudget = max(0, st.Budget), max(0, st.ReferenceBudget)
	}
	for i, ls := range st.Live {
		if err := checkLive(i, ls); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if _, dup := c.mu.live[ls.ID]; dup {
			return fmt.Errorf("restore: live[%d].id: %q twice", i, ls.ID)
		}
		c.makeLiveLocked(now, c.newSessionLocked(ls.ID), ls)
	}
	for id, a := range st.Retry {
		c.mu.retry[id] = memo{arrival: a, until: now.Add(c.mu.o.RetryMemory)}
	}
	for id, until := range st.Shed {
		if now.Before(until) {
			c.mu.shed[id] = until
		}
	}
	return nil
}

// checkLive refuses a persisted live session that no core exports: no id, or a negative token
// count. i is its index in State.Live, for the message.
func checkLive(i int, ls LiveSession) error {
	if ls.ID == "" {
		return fmt.Errorf("live[%d].id: empty", i)
	}
	if ls.Context < 0 || ls.Peak < 0 || ls.PredictedPeak < 0 {
		return fmt.Errorf("live[%d] (%s): negative token count", i, ls.ID)
	}
	return nil
}

// adoptBudgetLocked takes the budget st carries, if it carries one: count-only (no budget set
// yet), or a budget set at runtime (the daemon's), which outlives the configured one, count-only
// included. A state with neither leaves the core's budget as it is.
func (c *Core) adoptBudgetLocked(st State) {
	switch {
	case st.CountOnly:
		c.mu.o.CountOnly = true
	case st.Budget > 0:
		c.mu.o.CountOnly = false
		c.mu.o.Budget = st.Budget
		if st.ReferenceBudget > 0 {
			c.mu.o.ReferenceBudget = st.ReferenceBudget
		}
	}
}

// newSessionLocked is a session the core has not seen, next in the order sessions came to it.
func (c *Core) newSessionLocked(id string) *session {
	c.mu.seq++
	return &session{id: id, seq: c.mu.seq, heapIndex: -1}
}

// makeLiveLocked makes s live as ls describes it, without an admission decision here: the one
// accounting rule for a session restored after a restart and for one merged from another
// replica's table, so both count alike. s is new, or was queued here and has left the queue.
// It takes ls's times and token counts (its peak at least its context) and its priority anew,
// counts its context in the working set and its demand in the reserved tokens and its tenant's
// sessions, and puts it on the hold list or makes it dormant as ls says (held when it says both,
// which no core exports: a held session is never dormant).
func (c *Core) makeLiveLocked(now time.Time, s *session, ls LiveSession) {
	s.tenant, s.arrival, s.admitted, s.lastDone = ls.Tenant, ls.Arrival, ls.Admitted, ls.LastDone
	s.context, s.peak, s.predicted = ls.Context, max(ls.Peak, ls.Context), ls.PredictedPeak
	s.queued, s.stale = false, false
	s.priority = c.priority(s.arrival, s.predicted)
	s.demandCache = c.demandLocked(s)
	c.mu.live[s.id] = s
	c.mu.workingSet += s.context
	c.mu.reserved += s.demandCache
	c.mu.tenants[s.tenant]++
	switch {
	case ls.Held:
		c.holdLocked(now, s)
	case ls.Dormant && s.inFlight == 0:
		c.sleepLocked(s) // it went dormant elsewhere (or before a restart), counted there
	}
	c.noteLocked(s.id, true, s.held)
}

func (c *Core) inCallLocked() int {
	n := 0
	for _, s := range c.mu.live {
		if s.inFlight > 0 {
			n++
		}
	}
	return n
}

// Merge takes another replica's view into the core, for replicated mode: a new admission leader
// merges the table its predecessor persisted, and a replica that reconnects reports the
// sessions it admitted or served while the leader could not be reached, and a follower takes
// in a session the leader admitted or knows live. Sessions live in st but not here become live
// as they are — already admitted, so never checked against the budget (sessions are never
// cut), and held if st holds them; a session queued here leaves the queue with an
// EventAdmitted, since its admission happened elsewhere. Sessions live in both keep this core's
// calls in flight, its hold list, and the larger context and later last call. A budget in st (Budget > 0, or CountOnly) replaces
// this core's; retry and shed memories are added. Merging can only add load, so it admits no
// one from the queue beyond the sessions it makes live.
func (c *Core) Merge(now time.Time, st State) ([]Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, ls := range st.Live {
		if err := checkLive(i, ls); err != nil {
			return nil, fmt.Errorf("merge: %w", err)
		}
	}
	c.adoptBudgetLocked(st)
	var evs []Event
	for _, ls := range st.Live {
		if s, ok := c.mu.live[ls.ID]; ok {
			c.mergeLiveLocked(s, ls)
			continue
		}
		s, queued := c.mu.queued[ls.ID]
		if queued {
			evs = append(evs, c.admittedElsewhereLocked(now, s))
		} else {
			s = c.newSessionLocked(ls.ID)
		}
		c.makeLiveLocked(now, s, ls)
		delete(c.mu.retry, s.id)
	}
	c.mergeMemoriesLocked(now, st)
	return evs, nil
}

// mergeLiveLocked takes another replica's view ls of a session live here too: the larger
// context, the larger peak and the later last call; a later call there wakes it if it is dormant
// here and was not there. Its calls in flight and hold stay this core's.
func (c *Core) mergeLiveLocked(s *session, ls LiveSession) {
	if ls.Context > s.context {
		c.setContextLocked(s, ls.Context)
	}
	s.peak = max(s.peak, ls.Peak)
	if ls.LastDone.After(s.lastDone) {
		s.lastDone = ls.LastDone
		if s.dormant && !ls.Dormant {
			c.wakeLocked(s) // it called elsewhere since
		}
	}
}

// admittedElsewhereLocked takes s, queued here but admitted by another replica, off the queue:
// its waiting call is sent as the session's first, as admitLocked counts it, and the event tells
// its waiter so.
func (c *Core) admittedElsewhereLocked(now time.Time, s *session) Event {
	c.removeQueuedLocked(s)
	s.inFlight = 1
	c.mu.counters.AdmittedFromQueue++
	return Event{Kind: EventAdmitted, ID: s.id, At: now, Waited: now.Sub(s.arrival)}
}

// mergeMemoriesLocked adds st's retry and shed memories: the earlier arrival of a retry (none for
// a session live here), the later end of a shed.
func (c *Core) mergeMemoriesLocked(now time.Time, st State) {
	for id, a := range st.Retry {
		if _, live := c.mu.live[id]; live {
			continue
		}
		if m, ok := c.mu.retry[id]; !ok || a.Before(m.arrival) {
			c.mu.retry[id] = memo{arrival: a, until: now.Add(c.mu.o.RetryMemory)}
		}
	}
	for id, until := range st.Shed {
		if now.Before(until) && until.After(c.mu.shed[id]) {
			c.mu.shed[id] = until
		}
	}
}
