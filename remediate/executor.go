package remediate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// Admission is the gateway's admission control as basin reads and changes it: its state (with
// the live sessions, for the hold rule), its budget, its queue (shed) and its hold list. The
// requests and answers are the admin API's wire types (gateway/adminapi), so the HTTP client of
// a real gateway (gateway/client) and the admission core served in process to the simulator
// (gateway/admission/inproc) are one contract, answering the same requests alike — a
// conformance suite (gateway/adminapi/admissiontest) runs against both. It is declared here,
// where it is consumed: the policy reads the state (GatewayFrom) and the executor acts; the
// daemon reads and acts through this same interface.
//
// Invalid requests are refused with an *adminapi.RequestError, and every change is idempotent:
// setting the same budget twice, shedding sessions no longer queued, holding sessions already
// held or resuming ones not held change nothing the second time.
type Admission interface {
	// State reads the admission state; it may list only the queue's tail and no live sessions
	// (the client's QueueTail), which is all the budget and shedding rules read.
	State(ctx context.Context) (adminapi.StateView, error)
	// StateSessions is State with the live sessions listed: what the hold rule chooses among,
	// at a cost that grows with them, so it is read only while the rule may act.
	StateSessions(ctx context.Context) (adminapi.StateView, error)
	SetBudget(ctx context.Context, r adminapi.BudgetRequest) (adminapi.BudgetResult, error)
	Shed(ctx context.Context, r adminapi.ShedRequest) (adminapi.ShedResult, error)
	Hold(ctx context.Context, r adminapi.HoldRequest) (adminapi.HoldResult, error)
}

// Lending switches KV lending; applying the same plan twice is harmless.
type Lending interface {
	ApplyLending(ctx context.Context, p LendingPlan) error
}

// LendingPlan is a lending change: on or off, and per decode instance the tokens lent.
type LendingPlan struct {
	Enabled bool             `json:"enabled"`
	Grants  map[string]int64 `json:"grants_tokens,omitempty"`
	// MaxFraction is the largest fraction of any instance's KV lent (for backends with one knob).
	MaxFraction float64 `json:"max_fraction"`
	// Reasons are the lender's (the plan's carry every action's), as BudgetChange.Reasons.
	Reasons []string `json:"-"`
}

// Scaling asks for instances; applying the same plan twice is harmless (the backends are
// level-triggered: they set a count, they do not add to one).
type Scaling interface {
	ApplyScale(ctx context.Context, seq uint64, p ScalePlan, reason string) error
}

// ErrSuperseded is what an actuator or an audit store wraps when this executor may no longer act:
// another daemon has taken over (replicated mode), the gateway refused its term or the shared
// audit log fenced its write. The executor then stops at once: no further action of the plan is
// begun and nothing is retried; the intents left without an outcome are the successor's to
// reconcile.
var ErrSuperseded = errors.New("superseded: another daemon acts now")

// Notifier hears about each recorded action; it must not block.
type Notifier func(Record)

// ExecutorOptions configure an Executor. Audit is required; a nil Gateway or Lending means that
// kind of action is not configured (its plans fail, loudly).
type ExecutorOptions struct {
	Audit *Audit
	// Gateway takes the budget, shed and hold actions.
	Gateway Admission
	Lending Lending
	// Scaling takes the scale actions.
	Scaling Scaling
	// DryRun decides, audits and notifies but never acts.
	DryRun     bool
	Notify     Notifier
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Timeout bounds each action (default 10 s).
	Timeout time.Duration
}

// Executor carries plans out: each action is written to the audit log before it is taken, and its
// outcome after. While paused it takes no action.
type Executor struct {
	o       ExecutorOptions
	log     *slog.Logger
	actions *prometheus.CounterVec
	mu      struct {
		sync.Mutex
		pausedUntil time.Time
		pauseReason string
	}
}

// NewExecutor validates the options and registers basin_remediation_actions_total.
func NewExecutor(o ExecutorOptions) (*Executor, error) {
	if o.Audit == nil {
		return nil, errors.New("executor: Audit is required: no action is taken without a record")
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("executor: Timeout %v, must be positive", o.Timeout)
	}
	e := &Executor{o: o, log: o.Logger}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.actions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "basin_remediation_actions_total",
		Help: "Remediation actions by kind (budget, shed, hold, lending, scale) and outcome (done, failed, dry_run, reconciled).",
	}, []string{"kind", "outcome"})
	// Every series from 0, so increase() sees the first shed after a start.
	for _, kind := range []string{"budget", "shed", "hold", "lending", "scale"} {
		for _, outcome := range []string{string(PhaseDone), string(PhaseFailed), string(PhaseDryRun), "reconciled"} {
			e.actions.WithLabelValues(kind, outcome)
		}
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(e.actions); err != nil {
			return nil, fmt.Errorf("executor metrics: %w", err)
		}
	}
	return e, nil
}

// DryRun reports whether the executor only records.
func (e *Executor) DryRun() bool { return e.o.DryRun }

// Pause stops actions until until (zero: resume now), and records it.
func (e *Executor) Pause(now, until time.Time, reason string) error {
	e.mu.Lock()
	e.mu.pausedUntil, e.mu.pauseReason = until, reason
	e.mu.Unlock()
	kind := "pause"
	if !until.After(now) {
		kind = "resume"
	}
	r := Record{At: now, Kind: kind, Phase: PhaseNote, Reasons: []string{reason}}
	if kind == "pause" {
		r.Reasons = append(r.Reasons, "until "+until.UTC().Format(time.RFC3339))
	}
	return e.record(r)
}

// Paused says whether actions are paused at now, until when and why.
func (e *Executor) Paused(now time.Time) (bool, time.Time, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return now.Before(e.mu.pausedUntil), e.mu.pausedUntil, e.mu.pauseReason
}

// Execute carries out a plan. Each action's intent is recorded (and synced) first, then persist
// is called (the daemon saves the policy state there), then the actions are taken and their
// outcomes recorded. The first error is returned; actions after a failed one are still tried.
func (e *Executor) Execute(ctx context.Context, p Plan, persist func() error) error {
	if p.Empty() {
		return nil
	}
	_, err := e.planStages(persist).Exec(ctx, intents(p))
	return err
}

// planStages is how a plan is carried out (stages.go): fenced, its intents audited, persist
// called, then each action taken and its outcome audited; in a dry run the intents are audited
// and announced instead.
func (e *Executor) planStages(persist func() error) pipeline {
	phase, carry := PhaseIntent, stage(eachStage{each: e.actionStages(false), log: e.log})
	if e.o.DryRun {
		phase, carry = PhaseDryRun, dryRunStage{actions: e.actions, log: e.log, notify: e.notify}
	}
	return pipeline{
		fenceStage{paused: e.Paused},
		intentStage{audit: e.o.Audit, phase: phase},
		persistStage{persist: persist, log: e.log},
		carry,
	}
}

// actionStages take one recorded intent and record its outcome, carried to its end once begun
// (detachedStage); reconciled marks an intent finished after a restart.
func (e *Executor) actionStages(reconciled bool) stage {
	return detachedStage{timeout: e.o.Timeout, stages: pipeline{
		actStage{gateway: e.o.Gateway, lending: e.o.Lending, scaling: e.o.Scaling, log: e.log, reconciled: reconciled},
		outcomeStage{audit: e.o.Audit, actions: e.actions, log: e.log, notify: e.notify},
	}}
}

// Observed is what reconciliation reads of the world after a restart.
type Observed struct {
	// Budget is the gateway's current budget (ok false when unread).
	Budget   int64
	BudgetOK bool
	// Queued says whether a session is still queued at the gateway.
	Queued func(id string) bool
}

// Reconcile finishes the actions a crash interrupted between their intent and their outcome,
// without repeating what already happened: a budget already at its target is recorded done, a
// shed only drops sessions still queued, a lending or scale plan is applied again (idempotent). With the
// gateway unread, the budget intents stay pending for the next call. A dry run acts on nothing,
// and leaves them all pending.
func (e *Executor) Reconcile(ctx context.Context, now time.Time, w Observed) error {
	if e.o.DryRun {
		return nil
	}
	if paused, until, why := e.Paused(now); paused {
		if n := len(e.o.Audit.Pending()); n > 0 {
			return fmt.Errorf("reconcile: paused until %s (%s): %d interrupted actions left pending",
				until.UTC().Format(time.RFC3339), why, n)
		}
		return nil
	}
	var errs []error
	for _, r := range e.o.Audit.Pending() {
		if err := e.reconcile(ctx, r, now, w); err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrSuperseded) {
				return errors.Join(errs...)
			}
		}
	}
	return errors.Join(errs...)
}

// reconcile finishes one interrupted intent r as the world w shows it at now: recorded done if
// done already, left pending if w cannot tell, else taken through the same stages as a new
// action, its outcome marked reconciled.
func (e *Executor) reconcile(ctx context.Context, r Record, now time.Time, w Observed) error {
	switch {
	case r.Budget != nil && !w.BudgetOK:
		return fmt.Errorf("budget (plan %d): gateway unread, left pending", r.Seq)
	case r.Budget != nil && w.Budget == r.Budget.To:
		return e.foundDone(ctx, r, now, "found applied after a restart")
	case r.Shed != nil && w.Queued != nil:
		var still []string
		for _, id := range r.Shed.IDs {
			if w.Queued(id) {
				still = append(still, id)
			}
		}
		if len(still) == 0 {
			return e.foundDone(ctx, r, now, "no longer queued after a restart: shed (or admitted) already")
		}
		r.Shed = &ShedAction{IDs: still}
	}
	r.At = now
	_, err := e.actionStages(true).Exec(ctx, []action{{rec: r}})
	return err
}

// foundDone records an interrupted intent as done, reconciled, because the world shows it done
// (why says how): nothing is acted on again. The record is counted unless the executor was
// superseded (its error stops Reconcile).
func (e *Executor) foundDone(ctx context.Context, r Record, now time.Time, why string) error {
	out := r
	out.At, out.Phase, out.Reconciled = now, PhaseDone, true
	out.Reasons = append(slices.Clone(r.Reasons), why)
	err := e.o.Audit.Append(ctx, out)
	if errors.Is(err, ErrSuperseded) {
		return err
	}
	e.actions.WithLabelValues(r.Kind, "reconciled").Inc()
	return err
}

func (e *Executor) record(r Record) error {
	if err := e.o.Audit.Append(context.Background(), r); err != nil {
		return err
	}
	e.notify(r)
	return nil
}

func (e *Executor) notify(r Record) {
	if e.o.Notify != nil {
		e.o.Notify(r)
	}
}
