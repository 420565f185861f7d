package remediate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// The executor's side effects as stages, after Alertmanager's notify.Stage pipeline: each stage
// does one thing to a plan's actions and hands on what the next stage works on, and the first
// error stops the pipeline. A plan goes
//
//	fence → audit the intents → persist → each action in turn: act → audit the outcome
//
// (a dry run audits the intents and announces them instead of acting), so that nothing is done
// that the audit log does not hold first, and a reconciled intent goes through the same act and
// audit-outcome stages as a new one.

// action is one of a plan's actions on its way through the stages: its audit record (the intent,
// then the outcome) and what its actuator returned, kept for the outcome stage to record and
// return.
type action struct {
	rec Record
	err error
}

// stage is one side effect of carrying a plan out. An error means the stages after it must not
// run.
type stage interface {
	Exec(ctx context.Context, acts []action) ([]action, error)
}

// pipeline runs its stages in order, each on what the one before handed on, and stops at the
// first error (Alertmanager's notify.MultiStage).
type pipeline []stage

// Exec implements stage.
func (p pipeline) Exec(ctx context.Context, acts []action) ([]action, error) {
	for _, s := range p {
		var err error
		if acts, err = s.Exec(ctx, acts); err != nil {
			return acts, err
		}
	}
	return acts, nil
}

// intents are a plan's actions as audit records, in the order they are taken: budget, shed,
// hold, lending, scale. Each record carries its own action's reasons, so that a budget change is not
// explained by the lender's measurements (the plan's reasons hold them all, in order).
func intents(p Plan) []action {
	base := Record{Seq: p.Seq, At: p.At, State: string(p.State), Mode: p.Mode, Reasons: p.Reasons}
	own := func(kind string, reasons []string) Record {
		r := base
		r.Kind = kind
		if len(reasons) > 0 {
			r.Reasons = slices.Clone(reasons)
		}
		return r
	}
	var acts []action
	if p.Budget != nil {
		r := own("budget", p.Budget.Reasons)
		r.Budget = p.Budget
		acts = append(acts, action{rec: r})
	}
	if p.Shed != nil {
		r := own("shed", p.Shed.Reasons)
		r.Shed = p.Shed
		acts = append(acts, action{rec: r})
	}
	if p.Hold != nil {
		r := own("hold", p.Hold.Reasons)
		r.Hold = p.Hold
		acts = append(acts, action{rec: r})
	}
	if p.Lending != nil {
		r := own("lending", p.Lending.Reasons)
		r.Lending = p.Lending
		acts = append(acts, action{rec: r})
	}
	if p.Scale != nil {
		r := own("scale", p.Scale.Reasons)
		r.Scale = p.Scale
		acts = append(acts, action{rec: r})
	}
	return acts
}

// fenceStage stops a plan before anything of it is written: while the executor is paused (an
// operator said so), or once ctx is done (the daemon is shutting down). The actions all carry
// the plan's number and time.
type fenceStage struct {
	paused func(now time.Time) (bool, time.Time, string)
}

// Exec implements stage.
func (s fenceStage) Exec(ctx context.Context, acts []action) ([]action, error) {
	if len(acts) == 0 {
		return acts, nil
	}
	seq, at := acts[0].rec.Seq, acts[0].rec.At
	if paused, until, why := s.paused(at); paused {
		return nil, fmt.Errorf("execute plan %d: paused until %s (%s)", seq, until.UTC().Format(time.RFC3339), why)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("execute plan %d: %w (nothing done)", seq, err)
	}
	return acts, nil
}

// intentStage writes every action's intent to the audit log at once, before any is taken: after
// a crash (or a takeover) the log says what was intended. A dry run writes them as dry_run.
type intentStage struct {
	audit *Audit
	phase Phase
}

// Exec implements stage.
func (s intentStage) Exec(ctx context.Context, acts []action) ([]action, error) {
	acts = slices.Clone(acts)
	recs := make([]Record, len(acts))
	for i := range acts {
		acts[i].rec.Phase = s.phase
		recs[i] = acts[i].rec
	}
	if err := s.audit.Append(ctx, recs...); err != nil {
		return nil, fmt.Errorf("execute plan %d: %w (nothing done)", recs[0].Seq, err)
	}
	return acts, nil
}

// persistStage calls persist between the intents and the actions (the daemon saves the policy
// state there). A failure to save is logged and the plan goes on, the audit log holding the
// intent; a superseded executor stops, its intents the successor's to reconcile.
type persistStage struct {
	persist func() error
	log     *slog.Logger
}

// Exec implements stage.
func (s persistStage) Exec(_ context.Context, acts []action) ([]action, error) {
	if s.persist == nil {
		return acts, nil
	}
	if err := s.persist(); errors.Is(err, ErrSuperseded) {
		return nil, fmt.Errorf("execute plan %d: %w (nothing done; the intents are the successor's to reconcile)", acts[0].rec.Seq, err)
	} else if err != nil {
		s.log.Error("saving the policy state failed; acting anyway, the audit log has the intent", "err", err)
	}
	return acts, nil
}

// dryRunStage announces what a dry run would do, counted, logged and notified as an action is:
// an operator watching a dry run reads the log, not only /api/v1/events.
type dryRunStage struct {
	actions *prometheus.CounterVec
	log     *slog.Logger
	notify  Notifier
}

// Exec implements stage.
func (s dryRunStage) Exec(_ context.Context, acts []action) ([]action, error) {
	for _, a := range acts {
		r := a.rec
		s.actions.WithLabelValues(r.Kind, string(PhaseDryRun)).Inc()
		s.log.Info("dry run: would act", "seq", r.Seq, "kind", r.Kind, "change", r.Change(), "reasons", r.Reasons)
		s.notify(r)
	}
	return acts, nil
}

// eachStage runs its stages on a plan's actions one at a time, in order. An action that fails
// does not stop the next; a superseded executor begins none after it, and a done ctx (shutting
// down) none not yet begun: their intents stay in the log without an outcome for whoever
// reconciles next.
type eachStage struct {
	each stage
	log  *slog.Logger
}

// Exec implements stage.
func (s eachStage) Exec(ctx context.Context, acts []action) ([]action, error) {
	var (
		out  []action
		errs []error
	)
	for i, a := range acts {
		seq, left := a.rec.Seq, len(acts)-i
		if ctx.Err() != nil {
			s.log.Warn("stopping before acting; the rest of the plan is left to reconciliation", "seq", seq, "actions", left)
			return out, errors.Join(append(errs, fmt.Errorf("execute plan %d: %d action(s) not begun: %w", seq, left, ctx.Err()))...)
		}
		done, err := s.each.Exec(ctx, []action{a})
		out = append(out, done...)
		if err == nil {
			continue
		}
		errs = append(errs, err)
		if errors.Is(err, ErrSuperseded) {
			return out, errors.Join(append(errs, s.abandon(seq, left-1))...)
		}
	}
	return out, errors.Join(errs...)
}

// abandon says that a superseded executor leaves left actions of plan seq unbegun.
func (s eachStage) abandon(seq uint64, left int) error {
	if left == 0 {
		return nil
	}
	s.log.Warn("superseded: the rest of the plan is left to the daemon that acts now", "seq", seq, "actions", left)
	return fmt.Errorf("execute plan %d: %d action(s) not begun: %w", seq, left, ErrSuperseded)
}

// detachedStage runs its stages to their end, bounded by timeout, even when ctx is cancelled: an
// action once begun is carried through and its outcome recorded, because a daemon shutting down
// mid-call would otherwise record as failed a change the gateway may well have applied, and the
// log that says what was done would be wrong.
type detachedStage struct {
	timeout time.Duration
	stages  stage
}

// Exec implements stage.
func (s detachedStage) Exec(ctx context.Context, acts []action) ([]action, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	return s.stages.Exec(ctx, acts)
}

// actStage takes each action through the actuator its record names, sending the plan's reasons
// with it, and turns the record into the action's outcome: done, or failed with the error. A
// failure does not stop the pipeline: the outcome stage records it and returns it. A nil
// actuator means that kind of action is not configured, and its actions fail.
type actStage struct {
	gateway Admission
	lending Lending
	scaling Scaling
	log     *slog.Logger
	// reconciled marks outcomes completed after a restart (Reconcile).
	reconciled bool
}

// Exec implements stage.
func (s actStage) Exec(ctx context.Context, acts []action) ([]action, error) {
	acts = slices.Clone(acts)
	for i, a := range acts {
		err := s.take(ctx, a.rec)
		out := a.rec
		out.Phase, out.Reconciled = PhaseDone, s.reconciled
		if err != nil {
			out.Phase, out.Error = PhaseFailed, err.Error()
		}
		acts[i] = action{rec: out, err: err}
	}
	return acts, nil
}

// take calls the actuator r names.
func (s actStage) take(ctx context.Context, r Record) error {
	reason := fmt.Sprintf("basin plan %d (%s, %s)", r.Seq, r.State, r.Mode)
	if len(r.Reasons) > 0 {
		reason += ": " + strings.Join(r.Reasons, "; ")
	}
	noGateway := func() error { return fmt.Errorf("no gateway configured for the %s action", r.Kind) }
	switch {
	case r.Budget != nil:
		if s.gateway == nil {
			return noGateway()
		}
		return s.setBudget(ctx, r.Budget, reason)
	case r.Shed != nil:
		if s.gateway == nil {
			return noGateway()
		}
		_, err := s.gateway.Shed(ctx, adminapi.ShedRequest{SessionIDs: r.Shed.IDs, Reason: reason})
		return err
	case r.Hold != nil:
		if s.gateway == nil {
			return noGateway()
		}
		return s.hold(ctx, r.Hold, reason)
	case r.Lending != nil:
		if s.lending == nil {
			return errors.New("no lending backend configured")
		}
		return s.lending.ApplyLending(ctx, *r.Lending)
	case r.Scale != nil:
		if s.scaling == nil {
			return errors.New("no scaling backend configured")
		}
		return s.scaling.ApplyScale(ctx, r.Seq, *r.Scale, reason)
	}
	return fmt.Errorf("record %d (%s) carries no action", r.Seq, r.Kind)
}

// setBudget sets the budget (a zero reference leaves the gateway's as it is) and logs what the
// gateway says it did: whether admission holds new sessions back now, and if not, when it will —
// a budget under the working set's reference changes nothing yet, and the operator should not
// have to guess that.
func (s actStage) setBudget(ctx context.Context, b *BudgetChange, reason string) error {
	req := adminapi.BudgetRequest{Tokens: &b.To, Reason: reason}
	if b.Reference != 0 {
		req.ReferenceTokens = &b.Reference
	}
	res, err := s.gateway.SetBudget(ctx, req)
	if err != nil {
		return err
	}
	s.log.Info("gateway budget set", "tokens", b.To, "reference_tokens", b.Reference, "was_count_only", res.Before.CountOnly,
		"engaged", res.Engaged, "effect", res.Effect)
	return nil
}

// hold changes the gateway's hold list and logs the list as the gateway left it.
func (s actStage) hold(ctx context.Context, h *HoldAction, reason string) error {
	res, err := s.gateway.Hold(ctx, adminapi.HoldRequest{Hold: h.Hold, Resume: h.Resume, Reason: reason})
	if err != nil {
		return err
	}
	s.log.Info("gateway hold list changed", "held", res.Added, "resumed", res.Resumed, "released_calls", len(res.Released),
		"held_sessions", res.HeldSessions, "held_tokens", res.HeldTokens, "held_calls", res.HeldCalls)
	return nil
}

// outcomeStage records each action's outcome in the audit log, counts and announces it, and
// returns the actuator's error. A superseded executor writes no outcome: another daemon owns the
// log now and reconciles the intent itself, one outcome per intent, so this one is not written,
// nor retried, nor announced.
type outcomeStage struct {
	audit   *Audit
	actions *prometheus.CounterVec
	log     *slog.Logger
	notify  Notifier
}

// Exec implements stage.
func (s outcomeStage) Exec(ctx context.Context, acts []action) ([]action, error) {
	var errs []error
	for _, a := range acts {
		if err := s.record(ctx, a); err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrSuperseded) {
				break
			}
		}
	}
	return acts, errors.Join(errs...)
}

// record records one outcome.
func (s outcomeStage) record(ctx context.Context, a action) error {
	out, err := a.rec, a.err
	outcome := string(PhaseDone)
	switch {
	case out.Phase == PhaseFailed:
		outcome = string(PhaseFailed)
	case out.Reconciled:
		outcome = "reconciled"
	}
	s.actions.WithLabelValues(out.Kind, outcome).Inc()
	if aerr := s.audit.Append(ctx, out); errors.Is(aerr, ErrSuperseded) {
		s.log.Warn("superseded: the action's outcome is left to the daemon that acts now", "seq", out.Seq, "kind", out.Kind,
			"outcome", out.Phase, "err", aerr)
		return fmt.Errorf("%s (plan %d): outcome %s not recorded: %w", out.Kind, out.Seq, out.Phase, errors.Join(aerr, err))
	} else if aerr != nil {
		s.log.Error("recording an action's outcome failed", "seq", out.Seq, "kind", out.Kind, "err", aerr)
	}
	s.notify(out)
	if err != nil {
		s.log.Warn("remediation action failed", "seq", out.Seq, "kind", out.Kind, "err", err)
		return fmt.Errorf("%s (plan %d): %w", out.Kind, out.Seq, err)
	}
	s.log.Info("remediation action", "seq", out.Seq, "kind", out.Kind, "change", out.Change(), "reasons", out.Reasons, "reconciled", out.Reconciled)
	return nil
}
