// Package admission is the gateway's session-admission core: which agent sessions may start, in
// what order, against a token budget. It has no HTTP in it, so the gateway server and the
// virtual-time simulator harness run the very same decisions.
//
// The rule is the Basin paper's. A session is admitted whole at its first call and is never cut
// for budget afterwards: its later calls always pass. While the working set W (the current
// contexts of all live sessions but the dormant ones, below) is at or under the reference budget,
// every session is admitted at once. Past it, new sessions queue, ordered by a fixed priority p = arrival + peak/r (smaller first:
// small sessions may overtake a little, late ones never jump far ahead), and the head of the queue
// is admitted when its demand fits the budget B next to the demands of the live sessions — in
// "current" mode a demand is a session's current context, in "peak" mode its predicted peak. When
// nothing is live, the head is admitted even over budget, so the service always makes progress.
//
// The size term peak/r can be capped (Options.MaxLead): p = arrival + min(peak/r, MaxLead), so
// age wins once a session has waited MaxLead. A client that stops waiting after a while (the
// gateway answers a queued first call 503 at its max_queue_wait) needs the cap under that wait:
// a prediction is only as good as what it has seen, and the peak predictor of a fresh gateway has
// seen nothing — it calls every session four times its first call until one ends, then the
// quantile of the few peaks it has, which are the short sessions' that ended first. Priorities
// are fixed at arrival, so uncapped, the first sessions kept their know-nothing predictions while
// later ones, larger by their first calls, were called smaller and overtook them for as long as
// they kept arriving: the earliest timed out. The fallback predictor now keeps its know-nothing
// guess as a floor until it has seen predictor.DefaultMinObserved peaks, which fixes that order
// at its cause; the cap (off by default, as the simulator runs) is for clients whose patience is
// shorter than the leads their predictions give: with it, a prediction reorders only the
// sessions that arrive within MaxLead of each other.
//
// One departure from the paper, for sustained overload (arrivals above what the deployment can
// complete, so the backlog only grows): a queued session that has waited Options.StaleAfter goes
// stale — behind every fresh one, the stale ones newest first (the adaptive LIFO of Facebook's
// request queues and CockroachDB's epoch-LIFO, applied to the backlog's old end). In arrival order
// every session would wait as long as the backlog is deep and be admitted too late to finish in
// time; this way fresh sessions wait at most StaleAfter, the capacity goes to sessions that can
// still finish, stale ones get what is left, and the oldest are the lowest priority, the ones the
// shedding rule drops.
//
// A live session idle long past the workload's tool time is dormant (dormant.go): the core learns
// the tool time from the gaps between a session's calls, and a session quiet for twice their 99th
// percentile (at least Options.DormantFloor, at most the idle timeout, and no session at all before
// it has seen enough gaps) leaves the working set and the admission test — its prefix is aging
// out of the engine's cache, and a client that never ends its sessions must not read as a
// trapped deployment — until it calls again, when it is active again without a decision. The idle
// timeout still ends it.
//
// Every mutating method takes the current time and returns the events it caused (sessions
// admitted from the queue, sessions shed); the caller delivers them. Core is safe for concurrent
// use.
package admission

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/basin-dev/basin/internal/indexheap"
)

// Mode says what a session's demand on the budget is.
type Mode string

// Admission modes.
const (
	// ModeCurrent counts a live session's current context (the paper's hardware prototype).
	ModeCurrent Mode = "current"
	// ModePeak counts its predicted peak context, so a session admitted small cannot later grow the
	// working set past the budget.
	ModePeak Mode = "peak"
)

// Options configure a Core. Zero values take the documented defaults; Validate reports the rest.
type Options struct {
	Mode Mode
	// Budget B in tokens: what the live sessions' demands may add up to once admission engages.
	// With CountOnly it may be 0: no budget yet.
	Budget int64
	// CountOnly admits every session at once and only counts (working set, live sessions, the
	// queue stays empty) until SetBudget sets a budget: a gateway deployed ahead of the daemon
	// that will size its budget. It replaces an out-of-reach budget, which admitted everything
	// too but made a later budget below the reference budget silently change nothing.
	CountOnly bool
	// ReferenceBudget: admission engages when the working set exceeds it (0: Budget).
	ReferenceBudget int64
	// TokensPerSecond is r in p = arrival + peak/r (default 30, the paper's).
	TokensPerSecond float64
	// MaxLead caps the size term of the priority: p = arrival + min(peak/r, MaxLead), so a
	// session that has waited MaxLead is ahead of every session that arrives after it, whatever
	// their predicted peaks (0: no cap, the paper's order). A client that gives up waiting after
	// some time (the gateway's max_queue_wait) needs it under that time: uncapped, a 100K-token
	// prediction puts a session 55 minutes behind in time at r = 30, and a prediction that knows
	// nothing yet (the fallback's multiple of the first call, before any session has ended) puts
	// the first sessions of a fresh gateway behind every later one the predictor has learnt to
	// call smaller, until they time out. See the package documentation.
	MaxLead time.Duration
	// ArrivalOrder orders the queue by arrival only (p = arrival), as the paper's hardware
	// prototype did; otherwise the queue is size-aware.
	ArrivalOrder bool
	// TenantQuota caps the live plus queued sessions of a tenant (0: no cap); Quotas overrides it
	// per tenant.
	TenantQuota int
	Quotas      map[string]int
	// RetryMemory is how long a session that gave up waiting keeps its place in time: a retry with
	// the same id within it keeps its original arrival, so its priority does not reset (default
	// 30 min).
	RetryMemory time.Duration
	// ShedMemory is how long a shed session stays refused (default 30 min).
	ShedMemory time.Duration
	// DrainWindow is the window of recent admissions the Retry-After estimate uses (default 5 min).
	DrainWindow time.Duration
	// IdleTimeout ends a live session whose last call finished this long ago (default 10 min).
	IdleTimeout time.Duration
	// DormantFloor is the shortest idleness that makes a live session dormant (default
	// DefaultDormantFloor; negative: no session is ever dormant, each counts until it ends or
	// idles out). Past it, a session is dormant once idle twice the 99th percentile of the tool
	// gaps the core has seen, or the idle timeout before it has seen enough: see dormant.go.
	DormantFloor time.Duration
	// StaleAfter is how long a session may wait before it goes stale: behind every fresh
	// session, the stale ones newest first, each still by size (key peak/r − arrival). Default
	// DefaultStaleAfter; negative: never (the queue keeps the priority order). See the package
	// documentation for why.
	StaleAfter time.Duration
	// LiveLog is how many recent changes of the live set the core keeps for LiveSince (0:
	// none). A replicated gateway keeps them for its followers' copies of the live set.
	LiveLog int
	// HoldBound is the longest a held session's call waits before it passes anyway (default
	// DefaultHoldBound; see hold.go).
	HoldBound time.Duration
	// StartDeadline refuses early what cannot make it (0: off): a newcomer whose estimated
	// wait, at its place in the queue and the recent admission rate, is past it is refused at
	// once (TooLate), and a queued session still waiting that long is refused then (EventTooLate,
	// from ExpireQueued). Either way the client hears within seconds, with the estimate as
	// Retry-After, instead of waiting out a queue it cannot get through in time. A retry keeps
	// its place, as after a cancel. See the package documentation and docs/results.md for what
	// it costs and saves.
	StartDeadline time.Duration
}

// Defaults.
const (
	DefaultTokensPerSecond = 30
	DefaultRetryMemory     = 30 * time.Minute
	DefaultShedMemory      = 30 * time.Minute
	DefaultDrainWindow     = 5 * time.Minute
	DefaultIdleTimeout     = 10 * time.Minute
	// DefaultStaleAfter: chosen in the simulator (docs/simulator.md has the sweep over 3–12
	// minutes): far above the first-call waits of a queue that drains (under a minute in the
	// spike presets), under the Basin paper's 15-minute shedding wait, and under a third of a
	// median Terminal-Bench session's deadline (4 × its unloaded ≈ 6.5 minutes).
	DefaultStaleAfter = 8 * time.Minute
)

// withDefaults fills zero fields.
func (o Options) withDefaults() Options {
	if o.Mode == "" {
		o.Mode = ModeCurrent
	}
	if o.ReferenceBudget == 0 {
		o.ReferenceBudget = o.Budget
	}
	if o.TokensPerSecond == 0 {
		o.TokensPerSecond = DefaultTokensPerSecond
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&o.RetryMemory, DefaultRetryMemory}, {&o.ShedMemory, DefaultShedMemory}, {&o.DrainWindow, DefaultDrainWindow},
		{&o.IdleTimeout, DefaultIdleTimeout}, {&o.StaleAfter, DefaultStaleAfter}, {&o.HoldBound, DefaultHoldBound},
		{&o.DormantFloor, DefaultDormantFloor}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return o
}

// Validate reports every option that cannot configure a Core, naming it; zero fields stand for
// their defaults.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if o.Mode != ModeCurrent && o.Mode != ModePeak {
		errs = append(errs, fmt.Errorf("mode: %q, want current or peak", o.Mode))
	}
	switch {
	case o.CountOnly && o.Budget < 0:
		errs = append(errs, fmt.Errorf("budget_tokens: must be ≥ 0, got %d", o.Budget))
	case !o.CountOnly && o.Budget <= 0:
		errs = append(errs, fmt.Errorf("budget_tokens: must be > 0, got %d", o.Budget))
	}
	if o.ReferenceBudget < 0 {
		errs = append(errs, fmt.Errorf("reference_budget_tokens: must be ≥ 0, got %d", o.ReferenceBudget))
	}
	if !(o.TokensPerSecond > 0) || math.IsInf(o.TokensPerSecond, 0) {
		errs = append(errs, fmt.Errorf("priority_tokens_per_sec: must be > 0, got %v", o.TokensPerSecond))
	}
	if o.MaxLead < 0 {
		errs = append(errs, fmt.Errorf("max_lead: must be ≥ 0 (0: no cap), got %v", o.MaxLead))
	}
	if o.TenantQuota < 0 {
		errs = append(errs, fmt.Errorf("tenant_quota: must be ≥ 0, got %d", o.TenantQuota))
	}
	if o.LiveLog < 0 {
		errs = append(errs, fmt.Errorf("live_log: must be ≥ 0, got %d", o.LiveLog))
	}
	for t, q := range o.Quotas {
		if q < 0 {
			errs = append(errs, fmt.Errorf("quotas[%q]: must be ≥ 0, got %d", t, q))
		}
	}
	for _, d := range []struct {
		v    time.Duration
		name string
	}{{o.RetryMemory, "retry_memory"}, {o.ShedMemory, "shed_memory"}, {o.DrainWindow, "drain_window"}, {o.IdleTimeout, "idle_timeout"},
		{o.HoldBound, "hold_bound"}, {o.StartDeadline, "start_deadline"}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must be > 0, got %v", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}

// Request is a new session's first call as the gateway sees it.
type Request struct {
	ID     string
	Tenant string
	// FirstPrompt is the first call's prompt in tokens (estimated from its size).
	FirstPrompt int64
	// PredictedPeak is the predictor's estimate of the session's peak context.
	PredictedPeak int64
	// Arrival, when set and earlier than now, is when the session's call reached the
	// deployment: a gateway replica holding a queued call while the admission leader changed
	// asks the new leader with it, so the session keeps its place in time. Zero: now.
	Arrival time.Time
}

// Verdict is the answer to an arriving session.
type Verdict int

// Verdicts.
const (
	// Admitted: send the call now.
	Admitted Verdict = iota + 1
	// Queued: hold the call until an EventAdmitted (or give up and Cancel).
	Queued
	// OverQuota: the tenant has too many sessions (HTTP 429).
	OverQuota
	// Refused: the session was shed recently; retrying soon will not help (HTTP 529).
	Refused
	// TooLate: the session's first call cannot start within Options.StartDeadline of its
	// arrival: refused now instead of after the wait, retryable (HTTP 503 with Retry-After).
	TooLate
)

func (v Verdict) String() string {
	switch v {
	case Admitted:
		return "admitted"
	case Queued:
		return "queued"
	case OverQuota:
		return "over_quota"
	case Refused:
		return "shed"
	case TooLate:
		return "too_late"
	}
	return "unknown"
}

// ReasonLive marks a Decision for a session that was already live: its call passes, and nothing
// was admitted.
const ReasonLive = "live"

// Decision is what Arrive returns.
type Decision struct {
	Verdict Verdict
	// Priority is the session's fixed priority (smaller first).
	Priority time.Time
	// Arrival is the session's arrival, the original one for a retry.
	Arrival time.Time
	// RetryAfter is when trying again may help (OverQuota, Refused). For a queued session ask
	// RetryAfter(id) when it is needed: finding a place in a long queue costs a walk of it.
	RetryAfter time.Duration
	// Reason is a short machine-readable reason: ReasonLive for a call of a session already
	// live (not a new admission), else "admitted", "budget", "tenant_quota" or "shed".
	Reason string
	// Events are admissions this arrival caused for others (none today; kept for symmetry).
	Events []Event
}

// EventKind is what happened to a session outside its own call.
type EventKind int

// Events.
const (
	// EventAdmitted: a queued session may send its call.
	EventAdmitted EventKind = iota + 1
	// EventShed: a queued session was dropped; answer 529.
	EventShed
	// EventEnded: a live session ended (explicitly or idle); Peak is its largest context.
	EventEnded
	// EventResumed: a held session's waiting call may go (Reason says why: ResumeReasonResumed,
	// ResumeReasonBound or ResumeReasonEnded); Waited is how long it was held.
	EventResumed
	// EventTooLate: a queued session waited Options.StartDeadline: answer a retryable refusal
	// (503 with Retry-After); Waited is how long it queued.
	EventTooLate
)

// Event is something the caller must deliver.
type Event struct {
	Kind   EventKind
	ID     string
	At     time.Time
	Reason string
	// Peak is the largest context an ended session reached (EventEnded).
	Peak int64
	// Waited is how long an admitted session queued (EventAdmitted), or a held call waited
	// (EventResumed).
	Waited time.Duration
}

type session struct {
	id, tenant  string
	arrival     time.Time
	priority    time.Time
	seq         uint64
	predicted   int64
	context     int64
	peak        int64
	admitted    time.Time
	lastDone    time.Time
	inFlight    int
	queued      bool
	heapIndex   int
	demandCache int64
	// key and tie order the queue (less); keyLocked sets them for the queue's current order.
	key, tie int64
	// stale: waited Options.StaleAfter; it queues behind every fresh session.
	stale bool
	// deadline: when a queued session is refused as too late (Options.StartDeadline; zero: never).
	deadline time.Time
	// held: on the hold list (hold.go) since heldSince; waitSince, when set, is when its
	// waiting call began to wait.
	held                 bool
	heldSince, waitSince time.Time
	// dormant: idle long past the workload's tool time (dormant.go), its context and demand out
	// of the working set and the admission test; finished: a call of it finished here, so the
	// gap to its next call is a tool gap.
	dormant, finished bool
}

type memo struct {
	arrival   time.Time
	predicted int64
	until     time.Time
}

// Core is the admission state of one gateway.
type Core struct {
	mu struct {
		sync.Mutex
		o          Options
		live       map[string]*session
		queue      indexheap.Heap[*session]
		queued     map[string]*session
		retry      map[string]memo
		shed       map[string]time.Time
		tenants    map[string]int
		workingSet int64
		reserved   int64
		// allowance, when allowanceOn, bounds the reservations of the sessions admitted from
		// now on, whatever ends meanwhile (SetAllowance).
		allowance   int64
		allowanceOn bool
		seq         uint64
		admits      []time.Time // recent admissions, for the drain-rate estimate
		nextSweep   time.Time
		counters    Counters
		// stale counts the queued sessions gone stale (Options.StaleAfter).
		stale int
		// liveLog is the recent changes of the live set (Options.LiveLog).
		liveLog liveLog
		// The hold list (hold.go): how many sessions are held, their contexts and demands, how
		// many of their calls wait now and how long released calls waited in all.
		nHeld, waiting int
		heldCtx        int64
		heldWait       time.Duration
		// holdCheck: no waiting call reaches the hold bound before it (ExpireHolds).
		holdCheck time.Time
		// deadlineCheck: no queued session reaches its start deadline before it (ExpireQueued).
		deadlineCheck time.Time
		// gaps are the recent tool gaps; nDormant and dormantCtx the dormant sessions and their
		// contexts, out of workingSet and reserved (dormant.go).
		gaps       toolGaps
		nDormant   int
		dormantCtx int64
		// speed is the deployment's seconds per second of the core's clock (SetDeploymentSpeed;
		// 0 until set, read as 1).
		speed float64
	}
}

// Counters are cumulative, for metrics and the admin API (snake_case there, as every admin field).
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
	// Staled counts queued sessions that went stale (Options.StaleAfter).
	Staled uint64 `json:"staled"`
	// TooLate counts sessions refused for their start deadline, at arrival or in the queue.
	TooLate uint64 `json:"too_late"`
	// Held counts sessions put on the hold list, Resumed those taken off it, CallsHeld the
	// calls that waited and HoldBoundReleases those that went at Options.HoldBound.
	Held              uint64 `json:"held"`
	Resumed           uint64 `json:"resumed"`
	CallsHeld         uint64 `json:"calls_held"`
	HoldBoundReleases uint64 `json:"hold_bound_releases"`
	// Dormant counts live sessions that went dormant, Woken the dormant ones that called again.
	Dormant uint64 `json:"dormant"`
	Woken   uint64 `json:"woken"`
}

// New returns a Core, or an error naming every bad option.
func New(o Options) (*Core, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("admission options: %w", err)
	}
	o = o.withDefaults()
	c := &Core{}
	c.mu.o = o
	c.mu.live = map[string]*session{}
	c.mu.queued = map[string]*session{}
	c.mu.retry = map[string]memo{}
	c.mu.shed = map[string]time.Time{}
	c.mu.tenants = map[string]int{}
	c.mu.liveLog.keep = o.LiveLog
	return c, nil
}

// demand is what a live (or candidate) session counts against the budget.
func (c *Core) demandLocked(s *session) int64 {
	if c.mu.o.Mode == ModePeak {
		return max(s.predicted, s.context)
	}
	return s.context
}

// priority is a session's fixed priority, p = arrival + lead, its lead peak/r capped at
// Options.MaxLead (see there).
func (c *Core) priority(arrival time.Time, peak int64) time.Time {
	if c.mu.o.ArrivalOrder {
		return arrival
	}
	lead := float64(peak) / c.mu.o.TokensPerSecond * float64(time.Second)
	if m := c.mu.o.MaxLead; m > 0 && lead > float64(m) {
		return arrival.Add(m)
	}
	return arrival.Add(time.Duration(lead))
}

// Live reports whether a session is admitted and live: its calls pass without admission.
func (c *Core) Live(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.mu.live[id]
	return ok
}

// Arrive decides on a session's first call. A live session's call is admitted (calls of admitted
// sessions always pass); a session already queued keeps its place.
func (c *Core) Arrive(now time.Time, r Request) Decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(now)
	if _, ok := c.mu.live[r.ID]; ok {
		return Decision{Verdict: Admitted, Reason: ReasonLive}
	}
	if s, ok := c.mu.queued[r.ID]; ok {
		return Decision{Verdict: Queued, Priority: s.priority, Arrival: s.arrival, Reason: "budget"}
	}
	c.mu.counters.Arrivals++
	if until, ok := c.mu.shed[r.ID]; ok && now.Before(until) {
		c.mu.counters.Refused++
		return Decision{Verdict: Refused, Reason: "shed", RetryAfter: until.Sub(now)}
	}
	if q := c.quotaLocked(r.Tenant); q > 0 && c.mu.tenants[r.Tenant] >= q {
		c.mu.counters.OverQuota++
		return Decision{Verdict: OverQuota, Reason: "tenant_quota", RetryAfter: c.estimateLocked(now, 0)}
	}
	arrival, predicted := now, max(r.PredictedPeak, r.FirstPrompt)
	if !r.Arrival.IsZero() && r.Arrival.Before(now) {
		arrival = r.Arrival
	}
	if m, ok := c.mu.retry[r.ID]; ok {
		if now.Before(m.until) && !arrival.Before(m.arrival) {
			// A retry keeps its place: the same arrival and, when known, the same prediction, so
			// its priority is exactly what it was.
			arrival = m.arrival
			if m.predicted > 0 {
				predicted = max(m.predicted, r.FirstPrompt)
			}
		}
		delete(c.mu.retry, r.ID)
	}
	c.mu.seq++
	s := &session{id: r.ID, tenant: r.Tenant, arrival: arrival, predicted: predicted, context: r.FirstPrompt,
		peak: r.FirstPrompt, seq: c.mu.seq, heapIndex: -1}
	s.priority = c.priority(arrival, predicted)
	c.mu.tenants[r.Tenant]++
	c.orderLocked(now)
	c.keyLocked(s)
	if c.mu.queue.Len() == 0 && c.fitsLocked(s) {
		c.admitLocked(now, s)
		c.mu.counters.AdmittedAtOnce++
		return Decision{Verdict: Admitted, Priority: s.priority, Arrival: arrival, Reason: "admitted"}
	}
	s.queued = true
	c.mu.queued[s.id] = s
	c.mu.queue.Push(s)
	c.mu.counters.Queued++
	evs := c.drainLocked(now)
	for _, e := range evs {
		if e.ID == s.id {
			// Admitted by the drain: answer directly; the caller has nothing to wait for.
			rest := evs[:0:0]
			for _, o := range evs {
				if o.ID != s.id {
					rest = append(rest, o)
				}
			}
			return Decision{Verdict: Admitted, Priority: s.priority, Arrival: arrival, Reason: "admitted", Events: rest}
		}
	}
	if d := c.mu.o.StartDeadline; d > 0 {
		// The deadline runs from this call, not from a retry's kept arrival: a client that asks
		// again has its place back, and a fresh wait to be judged by.
		s.deadline = now.Add(d)
		if c.mu.deadlineCheck.IsZero() || s.deadline.Before(c.mu.deadlineCheck) {
			c.mu.deadlineCheck = s.deadline
		}
		if wait := c.estimateLocked(now, c.positionLocked(s)); wait > d {
			// It would start past its deadline: say so now, and keep its place for a retry.
			c.removeQueuedLocked(s)
			c.mu.counters.TooLate++
			c.mu.retry[s.id] = memo{arrival: s.arrival, predicted: s.predicted, until: now.Add(c.mu.o.RetryMemory)}
			return Decision{Verdict: TooLate, Priority: s.priority, Arrival: arrival, Reason: "too_late", RetryAfter: wait,
				Events: append(evs, c.drainLocked(now)...)}
		}
	}
	return Decision{Verdict: Queued, Priority: s.priority, Arrival: arrival, Reason: "budget", Events: evs}
}

// ExpireQueued refuses the queued sessions that have waited Options.StartDeadline since their call
// arrived (EventTooLate; none when it is off). Each keeps its place for a retry.
func (c *Core) ExpireQueued(now time.Time) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.mu.o.StartDeadline
	// deadlineCheck is no later than the first queued deadline, so most calls (the simulator
	// asks after every event) return here without a walk of the queue.
	if d <= 0 || c.mu.queue.Len() == 0 || c.mu.deadlineCheck.IsZero() || now.Before(c.mu.deadlineCheck) {
		return nil
	}
	var evs []Event
	var next time.Time
	for _, s := range append([]*session(nil), c.mu.queue.Items()...) {
		if s.deadline.IsZero() {
			continue
		}
		if now.Before(s.deadline) {
			if next.IsZero() || s.deadline.Before(next) {
				next = s.deadline
			}
			continue
		}
		c.removeQueuedLocked(s)
		c.mu.counters.TooLate++
		c.mu.retry[s.id] = memo{arrival: s.arrival, predicted: s.predicted, until: now.Add(c.mu.o.RetryMemory)}
		evs = append(evs, Event{Kind: EventTooLate, ID: s.id, At: now, Reason: "too_late", Waited: now.Sub(s.deadline.Add(-d))})
	}
	c.mu.deadlineCheck = next
	if len(evs) == 0 {
		return nil
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].ID < evs[j].ID })
	return append(evs, c.drainLocked(now)...)
}

func (c *Core) quotaLocked(tenant string) int {
	if q, ok := c.mu.o.Quotas[tenant]; ok {
		return q
	}
	return c.mu.o.TenantQuota
}

// fitsLocked is the admission test for a candidate at the head of the queue.
func (c *Core) fitsLocked(s *session) bool {
	if c.mu.o.CountOnly {
		return true // no budget yet: count only
	}
	if c.activeLocked() == 0 {
		// Nothing live but dormant sessions, which free nothing until they end: admit even over
		// budget, so the service makes progress.
		return true
	}
	if c.mu.allowanceOn && c.demandLocked(s) > c.mu.allowance {
		return false
	}
	// Held sessions stay in the test: a hold reorders who runs among the admitted, it does not
	// make room for more of them (hold.go).
	ws, reserved := c.mu.workingSet, c.mu.reserved
	if ws+s.context <= c.mu.o.ReferenceBudget {
		return true // admission engages only past the reference budget
	}
	return reserved+c.demandLocked(s) <= c.mu.o.Budget
}

func (c *Core) admitLocked(now time.Time, s *session) {
	s.queued = false
	s.admitted = now
	s.lastDone = now
	s.inFlight = 1 // the first call is what is being admitted
	s.demandCache = c.demandLocked(s)
	c.mu.live[s.id] = s
	c.noteLocked(s.id, true, false)
	c.mu.workingSet += s.context
	c.mu.reserved += s.demandCache
	c.mu.admits = append(c.mu.admits, now)
	if c.mu.allowanceOn {
		c.mu.allowance -= s.demandCache
	}
}

// keyLocked sets a session's place in the queue: by priority while fresh, newest first (with the
// same size term) once stale.
func (c *Core) keyLocked(s *session) {
	if s.stale {
		s.key, s.tie = int64(s.priority.Sub(s.arrival))-s.arrival.UnixNano(), -int64(s.seq)
		return
	}
	s.key, s.tie = s.priority.UnixNano(), int64(s.seq)
}

// orderLocked moves the sessions next in line that have waited StaleAfter behind the fresh ones.
// It looks at the head only, O(log n) a move: a fresh session that waited longer but is further
// back (a larger peak) goes stale when it reaches the head.
func (c *Core) orderLocked(now time.Time) {
	if c.mu.o.StaleAfter <= 0 {
		return
	}
	for c.mu.queue.Len() > 0 {
		h := c.mu.queue.Peek()
		if h.stale || now.Sub(h.arrival) < c.mu.o.StaleAfter {
			return
		}
		h.stale = true
		c.keyLocked(h)
		c.mu.queue.Fix(h)
		c.mu.stale++
		c.mu.counters.Staled++
	}
}

// drainLocked admits queue heads while they fit.
func (c *Core) drainLocked(now time.Time) []Event {
	var evs []Event
	c.orderLocked(now)
	for c.mu.queue.Len() > 0 {
		h := c.mu.queue.Peek()
		if !c.fitsLocked(h) {
			break
		}
		c.mu.queue.Pop()
		if h.stale {
			c.mu.stale--
		}
		delete(c.mu.queued, h.id)
		c.admitLocked(now, h)
		c.mu.counters.AdmittedFromQueue++
		evs = append(evs, Event{Kind: EventAdmitted, ID: h.id, At: now, Waited: now.Sub(h.arrival)})
	}
	return evs
}

// setContextLocked moves a live session's context and its demand (a dormant session's apart).
func (c *Core) setContextLocked(s *session, ctx int64) {
	delta := ctx - s.context
	s.context = ctx
	s.peak = max(s.peak, ctx)
	d := c.demandLocked(s)
	if s.dormant {
		c.mu.dormantCtx += delta
	} else {
		c.mu.workingSet += delta
		c.mu.reserved += d - s.demandCache
	}
	if s.held {
		c.mu.heldCtx += delta
	}
	s.demandCache = d
}

// Begin records that a live session sent a call (with its prompt estimate, which only ever
// raises the tracked context until the response's usage corrects it). It reports false if the
// session is not live. The call passes whatever the hold list says: Begin records calls already
// sent (a replica's report); BeginCall is the hold-aware entry for a call still to send.
func (c *Core) Begin(now time.Time, id string, promptEstimate int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	if !ok {
		return false
	}
	c.beginLocked(now, s, promptEstimate)
	return true
}

// beginLocked counts a call of s in flight and raises its tracked context to the call's prompt
// estimate (Begin, BeginCall); the call wakes a dormant session and may close a tool gap.
func (c *Core) beginLocked(now time.Time, s *session, promptEstimate int64) {
	c.noteCallLocked(now, s)
	s.inFlight++
	if promptEstimate > s.context {
		c.setContextLocked(s, promptEstimate)
	}
}

// Finish records the end of a live session's call with its context from the response's usage
// (prompt + completion tokens; 0 if unknown keeps the estimate). A shrinking context can admit
// queued sessions, returned as events.
func (c *Core) Finish(now time.Time, id string, contextTokens int64) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	if !ok {
		return nil
	}
	if s.inFlight > 0 {
		s.inFlight--
	}
	if s.dormant {
		c.wakeLocked(s) // a call finished that began elsewhere (a replica's report): it calls
	}
	s.lastDone = now
	s.finished = true
	if contextTokens > 0 {
		c.setContextLocked(s, contextTokens)
	}
	return c.drainLocked(now)
}

// End ends a live session (explicit end). Its budget goes to the queue.
func (c *Core) End(now time.Time, id string) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.live[id]
	if !ok {
		return nil
	}
	var evs []Event
	if e, ok := c.releaseLocked(now, s, ResumeReasonEnded); ok {
		evs = append(evs, e)
	}
	evs = append(evs, c.endLocked(now, s, "ended"))
	return append(evs, c.drainLocked(now)...)
}

func (c *Core) endLocked(now time.Time, s *session, reason string) Event {
	if !s.waitSince.IsZero() {
		// A waiting call whose client gave up (Abandon was not called) must not outlive its
		// session in the count.
		s.waitSince = time.Time{}
		c.mu.waiting--
	}
	if s.held {
		c.unholdLocked(s)
	}
	delete(c.mu.live, s.id)
	c.noteLocked(s.id, false, false)
	if s.dormant {
		c.mu.nDormant--
		c.mu.dormantCtx -= s.context
	} else {
		c.mu.workingSet -= s.context
		c.mu.reserved -= s.demandCache
	}
	c.mu.tenants[s.tenant]--
	if c.mu.tenants[s.tenant] <= 0 {
		delete(c.mu.tenants, s.tenant)
	}
	c.mu.counters.Ended++
	return Event{Kind: EventEnded, ID: s.id, At: now, Reason: reason, Peak: s.peak}
}

// Expire ends live sessions idle (no call in flight) for longer than the idle timeout, and makes
// those idle past the workload's tool time dormant (dormant.go; held sessions are not): the room
// either frees admits from the queue.
func (c *Core) Expire(now time.Time) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(now)
	var evs []Event
	dormantAfter, slept := c.dormantAfterLocked(), false
	for _, s := range c.mu.live {
		if s.inFlight > 0 {
			continue
		}
		switch idle := now.Sub(s.lastDone); {
		case idle >= c.idleTimeoutLocked():
			evs = append(evs, c.endLocked(now, s, "idle"))
		case idle >= dormantAfter && !s.dormant && !s.held:
			c.sleepLocked(s)
			c.mu.counters.Dormant++
			slept = true
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].ID < evs[j].ID })
	if len(evs) > 0 || slept {
		evs = append(evs, c.drainLocked(now)...)
	}
	return evs
}

// Queued reports whether a session is waiting in the queue.
func (c *Core) Queued(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.mu.queued[id]
	return ok
}

// Cancel takes a queued session out of the queue (its client gave up or timed out). A retry with
// the same id within RetryMemory keeps its arrival time.
func (c *Core) Cancel(now time.Time, id string) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mu.queued[id]
	if !ok {
		return nil
	}
	c.removeQueuedLocked(s)
	c.mu.counters.Cancelled++
	c.mu.retry[id] = memo{arrival: s.arrival, predicted: s.predicted, until: now.Add(c.mu.o.RetryMemory)}
	return c.drainLocked(now)
}

// CancelAll takes every queued session out of the queue, as Cancel does one, but admits no one
// in their place: a gateway replica that stops deciding (it lost the admission lease, or
// reached the leader again after deciding alone) hands its queue to the leader, and must not
// admit from it on the way. It returns the ids, whose waiting calls ask the leader again.
func (c *Core) CancelAll(now time.Time) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, 0, c.mu.queue.Len())
	for _, s := range append([]*session(nil), c.mu.queue.Items()...) {
		c.removeQueuedLocked(s)
		c.mu.counters.Cancelled++
		c.mu.retry[s.id] = memo{arrival: s.arrival, predicted: s.predicted, until: now.Add(c.mu.o.RetryMemory)}
		ids = append(ids, s.id)
	}
	return ids
}

func (c *Core) removeQueuedLocked(s *session) {
	c.mu.queue.Remove(s)
	if s.stale {
		c.mu.stale--
	}
	delete(c.mu.queued, s.id)
	c.mu.tenants[s.tenant]--
	if c.mu.tenants[s.tenant] <= 0 {
		delete(c.mu.tenants, s.tenant)
	}
}

// Shed drops queued sessions, lowest priority first: count of them, or exactly ids (unknown ids
// are skipped). Their clients get 529 and retries stay refused for ShedMemory.
func (c *Core) Shed(now time.Time, count int, ids []string, reason string) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var victims []*session
	if len(ids) > 0 {
		for _, id := range ids {
			if s, ok := c.mu.queued[id]; ok {
				victims = append(victims, s)
			}
		}
	} else if count > 0 {
		all := append([]*session(nil), c.mu.queue.Items()...)
		sort.Slice(all, func(i, j int) bool { return less(all[j], all[i]) }) // lowest priority first
		victims = all[:min(count, len(all))]
	}
	evs := make([]Event, 0, len(victims))
	for _, s := range victims {
		c.removeQueuedLocked(s)
		c.mu.shed[s.id] = now.Add(c.mu.o.ShedMemory)
		c.mu.counters.Shed++
		evs = append(evs, Event{Kind: EventShed, ID: s.id, At: now, Reason: reason})
	}
	return append(evs, c.drainLocked(now)...)
}

// SetBudget changes B (and, if reference > 0, the reference budget). A looser budget admits from
// the queue at once; a tighter one never cuts a live session. It ends count-only mode: admission
// engages past the reference budget from now on, which is the budget itself when the core was
// counting only and no reference is given (there was no reference to keep).
func (c *Core) SetBudget(now time.Time, budget, reference int64) ([]Event, error) {
	if budget <= 0 {
		return nil, fmt.Errorf("budget tokens: must be > 0, got %d", budget)
	}
	if reference < 0 {
		return nil, fmt.Errorf("reference budget tokens: must be ≥ 0, got %d", reference)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.o.Budget = budget
	switch {
	case reference > 0:
		c.mu.o.ReferenceBudget = reference
	case c.mu.o.CountOnly:
		c.mu.o.ReferenceBudget = budget
	}
	c.mu.o.CountOnly = false
	return c.drainLocked(now), nil
}

// SetAllowance bounds the reservations of the sessions the core admits from now on to tokens in
// all, beside the budget: an end frees budget but never refills the allowance. tokens < 0 lifts
// it. A degraded replica (package replication) admits against its slice of the free budget this
// way: its local core also counts sessions that passed through it and live, or ended, at other
// replicas, and their ends must not open room the deployment does not have. The progress rule
// (nothing live: admit the head) still applies.
func (c *Core) SetAllowance(now time.Time, tokens int64) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.allowanceOn, c.mu.allowance = tokens >= 0, max(0, tokens)
	return c.drainLocked(now)
}

// forgetLocked drops expired retry and shed memories and old admissions. The memories are swept
// at most every few seconds (lookups check expiry themselves), so a long memory does not make
// every decision walk it.
func (c *Core) forgetLocked(now time.Time) {
	cut := now.Add(-c.mu.o.DrainWindow)
	i := 0
	for i < len(c.mu.admits) && c.mu.admits[i].Before(cut) {
		i++
	}
	if i > 0 {
		c.mu.admits = append(c.mu.admits[:0], c.mu.admits[i:]...)
	}
	if now.Before(c.mu.nextSweep) {
		return
	}
	c.mu.nextSweep = now.Add(sweepEvery)
	for id, m := range c.mu.retry {
		if !now.Before(m.until) {
			delete(c.mu.retry, id)
		}
	}
	for id, until := range c.mu.shed {
		if !now.Before(until) {
			delete(c.mu.shed, id)
		}
	}
}

const sweepEvery = 10 * time.Second

// estimateLocked is how long a session at position pos may wait, from the recent admission rate.
// With no admission in the window it says a minute: long enough to back off, short enough to
// notice a recovery.
func (c *Core) estimateLocked(now time.Time, pos int) time.Duration {
	n := len(c.mu.admits)
	if n == 0 {
		return time.Minute
	}
	window := min(c.mu.o.DrainWindow, now.Sub(c.mu.admits[0]))
	if window < time.Second {
		window = time.Second
	}
	rate := float64(n) / window.Seconds()
	wait := time.Duration(float64(pos+1) / rate * float64(time.Second))
	return min(max(wait, time.Second), 15*time.Minute)
}

// RetryAfter estimates the wait of a queued session, or of a newcomer when id is not queued.
func (c *Core) RetryAfter(now time.Time, id string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(now)
	pos := c.mu.queue.Len()
	if s, ok := c.mu.queued[id]; ok {
		pos = c.positionLocked(s)
	}
	return c.estimateLocked(now, pos)
}

// positionLocked counts the queued sessions ahead of s. It walks the heap, O(queue), so the
// admission path never calls it; refusals and the admin API do.
func (c *Core) positionLocked(s *session) int {
	n := 0
	for _, o := range c.mu.queue.Items() {
		if less(o, s) {
			n++
		}
	}
	return n
}

// SetDeploymentSpeed says how many seconds of the deployment's time pass per second of the core's
// clock: 1 for real engines, S in front of `basin sim serve --speed S` (which announces it). The
// durations that belong to the sessions' own time — the idle timeout and the dormant floor, set
// against a workload's tool time — are divided by it; the waits a client sees (max_queue_wait,
// the hold bound, the start deadline, retry and shed memory) stay in the clock's time. It returns
// false and changes nothing for a speed that is not a finite number > 0.
func (c *Core) SetDeploymentSpeed(speed float64) bool {
	if !(speed > 0) || math.IsInf(speed, 0) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.speed = speed
	return true
}

// IdleTimeout is the idle timeout in the core's clock (Options.IdleTimeout over the deployment's
// speed).
func (c *Core) IdleTimeout() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idleTimeoutLocked()
}

// inClockLocked converts a duration of the deployment's time to the core's clock.
func (c *Core) inClockLocked(d time.Duration) time.Duration {
	if c.mu.speed == 0 || c.mu.speed == 1 {
		return d
	}
	return time.Duration(float64(d) / c.mu.speed)
}

func (c *Core) idleTimeoutLocked() time.Duration { return c.inClockLocked(c.mu.o.IdleTimeout) }
