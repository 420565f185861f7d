package remediate

import (
	"context"
	"errors"
	"fmt"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/lender"
	"github.com/basin-dev/basin/scaler"
)

// Loop is one remediation loop's parts: the policy that decides, the lender that switches KV
// lending (nil when no lending backend is configured), the scaling policy that asks for instances
// (nil when no scaling backend is configured) and the executor that acts. `basin daemon`
// and the simulator's harness step through the same Loop.Step, so that what the simulator
// measures is what the daemon does: decide, then lend, then execute, with incidents counted the
// same way. Not safe for concurrent use: one loop owns it (as it owns the Policy).
type Loop struct {
	Policy   *Policy
	Lender   *lender.Lender
	Executor *Executor
	// Scaler asks for instances; nil: no scaling.
	Scaler *scaler.Policy
}

// StepInputs are one step's readings: the policy's inputs, and the lender's (the collector's
// snapshot for the risk rule and the decode instances as the lender sees them).
type StepInputs struct {
	Inputs
	Snapshot collector.Snapshot
	Decode   []lender.Instance
}

// StepResult is what one step decided and how carrying it out went.
type StepResult struct {
	// Plan is the step's plan, lending included; it may be empty.
	Plan Plan
	// IncidentStarted: this step entered incident mode (the daemon's daily summary and the
	// simulator's count of incidents both count these).
	IncidentStarted bool
	// Err is the executor's error, or the persist function's when the plan was empty.
	Err error
	// Scale is the scaling policy's decision: nil without a Scaler, or when a reading the sizing
	// needs is missing (Policy.SizeFrom, which the daemon runs every step, says which).
	Scale *scaler.Decision
}

// NewLoop checks that the loop has what it needs to decide and act.
func NewLoop(p *Policy, l *lender.Lender, e *Executor) (*Loop, error) {
	switch {
	case p == nil:
		return nil, errors.New("remediation loop: Policy is required")
	case e == nil:
		return nil, errors.New("remediation loop: Executor is required")
	}
	return &Loop{Policy: p, Lender: l, Executor: e}, nil
}

// Step decides on in, lets the lender add its change, and executes the plan; persist (nil: none)
// is called between each action's intent and outcome, as Executor.Execute does, and once when the
// plan is empty, so the policy's state moved by the decision (arrival rate, held capacity) is kept
// even on a step that acts on nothing.
func (l *Loop) Step(ctx context.Context, in StepInputs, persist func() error) StepResult {
	before := l.Policy.State().Mode
	plan := l.Policy.Decide(in.Inputs)
	res := StepResult{IncidentStarted: plan.Mode == Incident && before != Incident}
	if l.Lender != nil {
		plan = l.Policy.Lend(plan, l.Lender, in.Snapshot, in.Assessment.Knee.Ratio, in.Decode)
	}
	plan = l.scale(plan, in, &res)
	res.Plan = plan
	switch {
	case !plan.Empty():
		res.Err = l.Executor.Execute(ctx, plan, persist)
	case persist != nil:
		if err := persist(); err != nil {
			res.Err = fmt.Errorf("saving state: %w", err)
		}
	}
	return res
}

// scale lets the Scaler, if any, add its change to the plan. Sizing needs every reading: when one
// is missing nothing is scaled.
func (l *Loop) scale(plan Plan, in StepInputs, res *StepResult) Plan {
	if l.Scaler == nil {
		return plan
	}
	need, err := l.Policy.NeedInputsFrom(in.Snapshot, in.Assessment)
	if err != nil {
		return plan
	}
	plan, d := l.Policy.Scale(plan, l.Scaler, scaler.Inputs{At: in.At, NeedInputs: need})
	if d.Sized {
		res.Scale = &d
	}
	return plan
}
