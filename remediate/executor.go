package remediate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BudgetSetter sets the gateway's admission budget. Setting the same values twice is harmless.
type BudgetSetter interface {
	SetBudget(ctx context.Context, tokens, reference int64, reason string) error
}

// Shedder drops queued sessions by ID; IDs no longer queued are skipped.
type Shedder interface {
	Shed(ctx context.Context, ids []string, reason string) error
}

// Holder changes the gateway's hold list: the live sessions whose next calls wait, and those
// taken off it. Unknown or ended ids are skipped; applying the same change twice is harmless.
type Holder interface {
	Hold(ctx context.Context, hold, resume []string, reason string) error
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

// ErrSuperseded is what an actuator or an audit store wraps when this executor may no longer act:
// another daemon has taken over (replicated mode), the gateway refused its term or the shared
// audit log fenced its write. The executor then stops at once: no further action of the plan is
// begun and nothing is retried; the intents left without an outcome are the successor's to
// reconcile.
var ErrSuperseded = errors.New("superseded: another daemon acts now")

// Notifier hears about each recorded action; it must not block.
type Notifier func(Record)

// ExecutorOptions configure an Executor. Audit is required; a nil actuator means that kind of
// action is not configured (its plans fail, loudly).
type ExecutorOptions struct {
	Audit   *Audit
	Budget  BudgetSetter
	Shed    Shedder
	Hold    Holder
	Lending Lending
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
		Help: "Remediation actions by kind (budget, shed, hold, lending) and outcome (done, failed, dry_run, reconciled).",
	}, []string{"kind", "outcome"})
	// Every series from 0, so increase() sees the first shed after a start.
	for _, kind := range []string{"budget", "shed", "hold", "lending"} {
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
	if paused, until, why := e.Paused(p.At); paused {
		return fmt.Errorf("execute plan %d: paused until %s (%s)", p.Seq, until.UTC().Format(time.RFC3339), why)
	}
	base := Record{Seq: p.Seq, At: p.At, State: string(p.State), Mode: p.Mode, Reasons: p.Reasons}
	var intents []Record
	// Each record carries its own action's reasons, so that a budget change is not explained by
	// the lender's measurements (the plan's reasons hold them all, in order).
	own := func(r Record, reasons []string) Record {
		if len(reasons) > 0 {
			r.Reasons = slices.Clone(reasons)
		}
		return r
	}
	if p.Budget != nil {
		r := own(base, p.Budget.Reasons)
		r.Kind, r.Budget = "budget", p.Budget
		intents = append(intents, r)
	}
	if p.Shed != nil {
		r := own(base, p.Shed.Reasons)
		r.Kind, r.Shed = "shed", p.Shed
		intents = append(intents, r)
	}
	if p.Hold != nil {
		r := own(base, p.Hold.Reasons)
		r.Kind, r.Hold = "hold", p.Hold
		intents = append(intents, r)
	}
	if p.Lending != nil {
		r := own(base, p.Lending.Reasons)
		r.Kind, r.Lending = "lending", p.Lending
		intents = append(intents, r)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("execute plan %d: %w (nothing done)", p.Seq, err)
	}
	phase := PhaseIntent
	if e.o.DryRun {
		phase = PhaseDryRun
	}
	for i := range intents {
		intents[i].Phase = phase
	}
	if err := e.o.Audit.Append(ctx, intents...); err != nil {
		return fmt.Errorf("execute plan %d: %w (nothing done)", p.Seq, err)
	}
	if persist != nil {
		if err := persist(); errors.Is(err, ErrSuperseded) {
			return fmt.Errorf("execute plan %d: %w (nothing done; the intents are the successor's to reconcile)", p.Seq, err)
		} else if err != nil {
			e.log.Error("saving the policy state failed; acting anyway, the audit log has the intent", "err", err)
		}
	}
	if e.o.DryRun {
		for _, r := range intents {
			e.actions.WithLabelValues(r.Kind, string(PhaseDryRun)).Inc()
			// Logged as an action is: an operator watching a dry run reads the log, not only
			// /api/v1/events.
			e.log.Info("dry run: would act", "seq", r.Seq, "kind", r.Kind, "change", r.Change(), "reasons", r.Reasons)
			e.notify(r)
		}
		return nil
	}
	var errs []error
	for i, r := range intents {
		if ctx.Err() != nil {
			// Shutting down: the intents not yet begun stay in the log without an outcome, and
			// the next start reconciles them against the world.
			left := len(intents) - i
			e.log.Warn("stopping before acting; the rest of the plan is left to reconciliation", "seq", p.Seq, "actions", left)
			return errors.Join(append(errs, fmt.Errorf("execute plan %d: %d action(s) not begun: %w", p.Seq, left, ctx.Err()))...)
		}
		if err := e.act(ctx, r, false); err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrSuperseded) {
				return errors.Join(append(errs, e.abandon(p.Seq, len(intents)-i-1))...)
			}
		}
	}
	return errors.Join(errs...)
}

// abandon says that a superseded executor leaves left actions of plan seq unbegun.
func (e *Executor) abandon(seq uint64, left int) error {
	if left == 0 {
		return nil
	}
	e.log.Warn("superseded: the rest of the plan is left to the daemon that acts now", "seq", seq, "actions", left)
	return fmt.Errorf("execute plan %d: %d action(s) not begun: %w", seq, left, ErrSuperseded)
}

// act takes one recorded intent and records its outcome. An action once begun is carried to its
// end (bounded by Timeout) even when ctx is cancelled — a daemon shutting down mid-call would
// otherwise record as failed a change the gateway may well have applied, and the log that says
// what was done would be wrong.
func (e *Executor) act(ctx context.Context, r Record, reconciled bool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.o.Timeout)
	defer cancel()
	reason := fmt.Sprintf("basin plan %d (%s, %s)", r.Seq, r.State, r.Mode)
	if len(r.Reasons) > 0 {
		reason += ": " + strings.Join(r.Reasons, "; ")
	}
	var err error
	switch {
	case r.Budget != nil:
		if e.o.Budget == nil {
			err = errors.New("no budget actuator configured")
		} else {
			err = e.o.Budget.SetBudget(ctx, r.Budget.To, r.Budget.Reference, reason)
		}
	case r.Shed != nil:
		if e.o.Shed == nil {
			err = errors.New("no shedder configured")
		} else {
			err = e.o.Shed.Shed(ctx, r.Shed.IDs, reason)
		}
	case r.Hold != nil:
		if e.o.Hold == nil {
			err = errors.New("no holder configured")
		} else {
			err = e.o.Hold.Hold(ctx, r.Hold.Hold, r.Hold.Resume, reason)
		}
	case r.Lending != nil:
		if e.o.Lending == nil {
			err = errors.New("no lending backend configured")
		} else {
			err = e.o.Lending.ApplyLending(ctx, *r.Lending)
		}
	default:
		err = fmt.Errorf("record %d (%s) carries no action", r.Seq, r.Kind)
	}
	out := r
	out.Phase, out.Reconciled = PhaseDone, reconciled
	outcome := string(PhaseDone)
	if err != nil {
		out.Phase, out.Error = PhaseFailed, err.Error()
		outcome = string(PhaseFailed)
	} else if reconciled {
		outcome = "reconciled"
	}
	e.actions.WithLabelValues(r.Kind, outcome).Inc()
	if aerr := e.o.Audit.Append(ctx, out); errors.Is(aerr, ErrSuperseded) {
		// Another daemon owns the log now and reconciles this intent itself: one outcome per
		// intent, so this one is not written, nor retried, nor announced.
		e.log.Warn("superseded: the action's outcome is left to the daemon that acts now", "seq", r.Seq, "kind", r.Kind,
			"outcome", out.Phase, "err", aerr)
		return fmt.Errorf("%s (plan %d): outcome %s not recorded: %w", r.Kind, r.Seq, out.Phase, errors.Join(aerr, err))
	} else if aerr != nil {
		e.log.Error("recording an action's outcome failed", "seq", r.Seq, "kind", r.Kind, "err", aerr)
	}
	e.notify(out)
	if err != nil {
		e.log.Warn("remediation action failed", "seq", r.Seq, "kind", r.Kind, "err", err)
		return fmt.Errorf("%s (plan %d): %w", r.Kind, r.Seq, err)
	}
	e.log.Info("remediation action", "seq", r.Seq, "kind", r.Kind, "change", r.Change(), "reasons", r.Reasons, "reconciled", reconciled)
	return nil
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
// shed only drops sessions still queued, a lending plan is applied again (idempotent). With the
// gateway unread, the budget intents stay pending for the next call.
func (e *Executor) Reconcile(ctx context.Context, now time.Time, w Observed) error {
	if paused, until, why := e.Paused(now); paused && !e.o.DryRun {
		if n := len(e.o.Audit.Pending()); n > 0 {
			return fmt.Errorf("reconcile: paused until %s (%s): %d interrupted actions left pending",
				until.UTC().Format(time.RFC3339), why, n)
		}
		return nil
	}
	var errs []error
	for _, r := range e.o.Audit.Pending() {
		switch {
		case e.o.DryRun:
			continue
		case r.Budget != nil && !w.BudgetOK:
			errs = append(errs, fmt.Errorf("budget (plan %d): gateway unread, left pending", r.Seq))
			continue
		case r.Budget != nil && w.Budget == r.Budget.To:
			out := r
			out.At, out.Phase, out.Reconciled = now, PhaseDone, true
			out.Reasons = append(slices.Clone(r.Reasons), "found applied after a restart")
			if err := e.o.Audit.Append(ctx, out); errors.Is(err, ErrSuperseded) {
				return errors.Join(append(errs, err)...)
			} else if err != nil {
				errs = append(errs, err)
			}
			e.actions.WithLabelValues(r.Kind, "reconciled").Inc()
			continue
		case r.Shed != nil && w.Queued != nil:
			var still []string
			for _, id := range r.Shed.IDs {
				if w.Queued(id) {
					still = append(still, id)
				}
			}
			if len(still) == 0 {
				out := r
				out.At, out.Phase, out.Reconciled = now, PhaseDone, true
				out.Reasons = append(slices.Clone(r.Reasons), "no longer queued after a restart: shed (or admitted) already")
				if err := e.o.Audit.Append(ctx, out); errors.Is(err, ErrSuperseded) {
					return errors.Join(append(errs, err)...)
				} else if err != nil {
					errs = append(errs, err)
				}
				e.actions.WithLabelValues(r.Kind, "reconciled").Inc()
				continue
			}
			r.Shed = &ShedAction{IDs: still}
		}
		r.At = now
		if err := e.act(ctx, r, true); err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrSuperseded) {
				return errors.Join(errs...)
			}
		}
	}
	return errors.Join(errs...)
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
