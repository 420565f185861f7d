// Package inproc serves the admission contract (remediate.Admission) over an admission core in
// the same process, and holds the one translation from the core's types to the admin API's wire
// types (gateway/adminapi).
//
// Two programs act on admission: the daemon, through the gateway's admin API and its Go client,
// and the simulator's harness, on a core it drives itself. Both act through one contract whose
// requests and answers are the wire types, so the policy that decides and the executor that acts
// are the same code in both. The answers are built here once — the state from a snapshot, what a
// budget change, a shed or a hold change did from the core's events — and the gateway's admin
// handlers call the same functions, so the simulator sees exactly what a daemon would read.
// It is a package of its own, not part of the core, because the core must not know the wire
// contract, and not part of the gateway, because the simulator must not import the proxy.
package inproc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
)

// StateOf is the admission part of GET /admin/state for a core's snapshot: the one conversion of
// the core's snapshot to the wire. The gateway adds its routing (Now, Affinity, Upstreams, ...).
func StateOf(s admission.Snapshot) adminapi.StateView {
	v := adminapi.StateView{Mode: string(s.Mode), CountOnly: s.CountOnly, Budget: s.Budget, ReferenceBudget: s.ReferenceBudget,
		Reserved: s.Reserved, WorkingSet: s.WorkingSet, Engaged: s.Engaged, Live: s.Live, InCall: s.InCall,
		Queued: s.Queued, OldestWaitSeconds: s.OldestWaitSeconds, Stale: s.Stale,
		Held: s.Held, HeldTokens: s.HeldTokens, HeldCalls: s.HeldCalls, OldestHeldCallSeconds: s.OldestHeldCallSeconds,
		Dormant: s.Dormant, DormantTokens: s.DormantTokens, DormantAfterSeconds: s.DormantAfterSeconds, ToolGaps: s.ToolGaps,
		Counters: adminapi.Counters(s.Counters)}
	if s.Sessions != nil {
		v.Sessions = make([]adminapi.LiveSession, len(s.Sessions))
		for i, l := range s.Sessions {
			v.Sessions[i] = adminapi.LiveSession(l)
		}
	}
	if s.Queue != nil {
		v.Queue = make([]adminapi.QueuedSession, len(s.Queue))
		for i, q := range s.Queue {
			v.Queue[i] = adminapi.QueuedSession(q)
		}
	}
	return v
}

// BudgetResult is the answer to a budget change: the budget before and after (after the queued
// sessions it admitted were taken in), those sessions, and its effect in a sentence.
// referenceGiven says the request carried a reference budget.
func BudgetResult(before, after admission.Snapshot, evs []admission.Event, referenceGiven bool) adminapi.BudgetResult {
	return adminapi.BudgetResult{
		Before:           adminapi.Budget{BudgetTokens: before.Budget, ReferenceBudgetTokens: before.ReferenceBudget, CountOnly: before.CountOnly},
		After:            adminapi.Budget{BudgetTokens: after.Budget, ReferenceBudgetTokens: after.ReferenceBudget, CountOnly: after.CountOnly},
		Admitted:         AdmittedIDs(evs),
		Engaged:          after.Engaged,
		WorkingSetTokens: after.WorkingSet,
		Effect:           budgetEffect(before, after, referenceGiven),
	}
}

// budgetEffect explains a budget change: whether admission engages now and, if not, when.
func budgetEffect(before, after admission.Snapshot, referenceGiven bool) string {
	var b strings.Builder
	if before.CountOnly {
		b.WriteString("count-only mode ended: the gateway enforces a budget from now on")
		if !referenceGiven {
			fmt.Fprintf(&b, " (the reference budget is the budget, %d tokens, as none was given)", after.ReferenceBudget)
		}
		b.WriteString("; ")
	}
	switch {
	case after.Engaged:
		if after.WorkingSet > after.ReferenceBudget {
			fmt.Fprintf(&b, "admission is engaged: the working set (%d tokens) is over the reference budget of %d tokens", after.WorkingSet, after.ReferenceBudget)
		} else {
			fmt.Fprintf(&b, "admission is engaged: %d sessions are queued", after.Queued)
		}
		fmt.Fprintf(&b, "; a new session starts only when its demand fits the budget of %d tokens next to the live sessions' %d tokens",
			after.Budget, after.Reserved)
	case after.Budget < after.ReferenceBudget:
		fmt.Fprintf(&b, "admission is not engaged and the budget of %d tokens changes nothing yet: it binds only once the working set "+
			"(now %d tokens) exceeds the reference budget of %d tokens; send reference_tokens to engage sooner",
			after.Budget, after.WorkingSet, after.ReferenceBudget)
	default:
		fmt.Fprintf(&b, "admission is not engaged: it engages when the working set (now %d tokens) exceeds the reference budget of %d tokens",
			after.WorkingSet, after.ReferenceBudget)
	}
	return b.String()
}

// ShedResult is the answer to a shed: the sessions refused and those admitted in their wake.
func ShedResult(evs []admission.Event) adminapi.ShedResult {
	shed := []string{}
	for _, e := range evs {
		if e.Kind == admission.EventShed {
			shed = append(shed, e.ID)
		}
	}
	return adminapi.ShedResult{Shed: shed, Admitted: AdmittedIDs(evs)}
}

// HoldResult is the answer to a hold change: added sessions held (the core's Hold), the resume's
// events, and the hold list after, counted against the counters before.
func HoldResult(added int, evs []admission.Event, before admission.Counters, after admission.Snapshot) adminapi.HoldResult {
	released := []string{}
	for _, e := range evs {
		if e.Kind == admission.EventResumed {
			released = append(released, e.ID)
		}
	}
	return adminapi.HoldResult{Added: added, Resumed: int(after.Counters.Resumed - before.Resumed), Released: released,
		HeldSessions: after.Held, HeldTokens: after.HeldTokens, HeldCalls: after.HeldCalls}
}

// AdmittedIDs are the sessions the events admit, in order ([] when none).
func AdmittedIDs(evs []admission.Event) []string {
	out := []string{}
	for _, e := range evs {
		if e.Kind == admission.EventAdmitted {
			out = append(out, e.ID)
		}
	}
	return out
}

// Options configure an Admission. Core and Now are required.
type Options struct {
	Core *admission.Core
	// Now is the core's clock: the simulator's virtual time.
	Now func() time.Time
	// Deliver takes the core's events a change causes (admissions, sheds, releases) to the
	// sessions waiting on them, as the gateway answers their calls; nil drops them.
	Deliver func([]admission.Event)
}

// Admission is the admission contract served by a core in this process. Not safe for use
// concurrent with other drivers of the core unless they serialise with it themselves.
type Admission struct {
	o Options
}

// New checks o and returns an Admission.
func New(o Options) (*Admission, error) {
	var errs []error
	if o.Core == nil {
		errs = append(errs, errors.New("Core: required"))
	}
	if o.Now == nil {
		errs = append(errs, errors.New("Now: required, the core's clock"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("in-process admission: %w", errors.Join(errs...))
	}
	if o.Deliver == nil {
		o.Deliver = func([]admission.Event) {}
	}
	return &Admission{o: o}, nil
}

// State is the core's state with its whole queue and live sessions listed, as the gateway's
// GET /admin/state without a query answers.
func (a *Admission) State(context.Context) (adminapi.StateView, error) {
	now := a.o.Now()
	v := StateOf(a.o.Core.Snapshot(now, true))
	v.Now = now
	return v, nil
}

// StateSessions is State: the live sessions are always listed here.
func (a *Admission) StateSessions(ctx context.Context) (adminapi.StateView, error) {
	return a.State(ctx)
}

// SetBudget changes the budget as PUT /admin/budget does.
func (a *Admission) SetBudget(_ context.Context, r adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	if err := r.Validate(); err != nil {
		return adminapi.BudgetResult{}, err
	}
	var ref int64
	if r.ReferenceTokens != nil {
		ref = *r.ReferenceTokens
	}
	now := a.o.Now()
	before := a.o.Core.Snapshot(now, false)
	evs, err := a.o.Core.SetBudget(now, *r.Tokens, ref)
	if err != nil {
		return adminapi.BudgetResult{}, &adminapi.RequestError{Param: "tokens", Message: err.Error()}
	}
	a.o.Deliver(evs)
	return BudgetResult(before, a.o.Core.Snapshot(now, false), evs, r.ReferenceTokens != nil), nil
}

// Shed refuses queued sessions as POST /admin/shed does.
func (a *Admission) Shed(_ context.Context, r adminapi.ShedRequest) (adminapi.ShedResult, error) {
	if err := r.Validate(); err != nil {
		return adminapi.ShedResult{}, err
	}
	count := 0
	if r.Count != nil {
		count = *r.Count
	}
	evs := a.o.Core.Shed(a.o.Now(), count, r.SessionIDs, r.Reason)
	a.o.Deliver(evs)
	return ShedResult(evs), nil
}

// Hold changes the hold list as POST /admin/holds does: Hold before Resume.
func (a *Admission) Hold(_ context.Context, r adminapi.HoldRequest) (adminapi.HoldResult, error) {
	if err := r.Validate(); err != nil {
		return adminapi.HoldResult{}, err
	}
	now := a.o.Now()
	before := a.o.Core.Snapshot(now, false).Counters
	added := a.o.Core.Hold(now, r.Hold)
	evs := a.o.Core.Resume(now, r.Resume)
	after := a.o.Core.Snapshot(now, false)
	a.o.Deliver(evs)
	return HoldResult(added, evs, before, after), nil
}
