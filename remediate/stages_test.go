package remediate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// The executor's stages (stages.go), each alone and in their order.

// stageFunc is a stage from a function, for tests.
type stageFunc func(ctx context.Context, acts []action) ([]action, error)

func (f stageFunc) Exec(ctx context.Context, acts []action) ([]action, error) { return f(ctx, acts) }

// recorder is every actuator at once: it records each call in calls (shared with the other
// fakes of a test, so their order shows) and returns err.
type recorder struct {
	gatewayStub
	calls *[]string
	err   error
}

func (r *recorder) call(s string) error {
	*r.calls = append(*r.calls, s)
	return r.err
}

func (r *recorder) SetBudget(_ context.Context, req adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	var ref int64
	if req.ReferenceTokens != nil {
		ref = *req.ReferenceTokens
	}
	return adminapi.BudgetResult{}, r.call(fmt.Sprintf("budget %d %d: %s", *req.Tokens, ref, req.Reason))
}

func (r *recorder) Shed(_ context.Context, req adminapi.ShedRequest) (adminapi.ShedResult, error) {
	return adminapi.ShedResult{}, r.call(fmt.Sprintf("shed %v: %s", req.SessionIDs, req.Reason))
}

func (r *recorder) Hold(_ context.Context, req adminapi.HoldRequest) (adminapi.HoldResult, error) {
	return adminapi.HoldResult{}, r.call(fmt.Sprintf("hold %v resume %v: %s", req.Hold, req.Resume, req.Reason))
}

func (r *recorder) ApplyLending(_ context.Context, p LendingPlan) error {
	return r.call(fmt.Sprintf("lending %t", p.Enabled))
}

// orderedStore is an audit store that records each append in calls, and fails with err.
type orderedStore struct {
	calls *[]string
	recs  []Record
	err   error
}

func (s *orderedStore) Append(_ context.Context, recs []Record) error {
	for _, r := range recs {
		*s.calls = append(*s.calls, fmt.Sprintf("audit %s %s", r.Kind, r.Phase))
	}
	if s.err != nil {
		return s.err
	}
	s.recs = append(s.recs, recs...)
	return nil
}

func (s *orderedStore) Load(context.Context) ([]Record, error) { return s.recs, nil }
func (s *orderedStore) Close() error                           { return nil }

// fullPlan is a plan with one action of each kind, each with its own reason.
func fullPlan() Plan {
	return Plan{Seq: 3, At: t0, State: "trapped", Mode: Incident,
		Budget:  &BudgetChange{From: 1_000_000, To: 700_000, Reference: 1_000_000, Reasons: []string{"cut"}},
		Shed:    &ShedAction{IDs: []string{"q1"}, Reasons: []string{"shed q1"}},
		Hold:    &HoldAction{Hold: []string{"s9"}, Reasons: []string{"hold s9"}},
		Lending: &LendingPlan{Enabled: false},
		Reasons: []string{"cut", "shed q1", "hold s9", "lender: off"}}
}

// counters is the actions counter, as NewExecutor makes it.
func counters(t *testing.T) *prometheus.CounterVec {
	t.Helper()
	e, err := NewExecutor(ExecutorOptions{Audit: NewMemoryAudit()})
	require.NoError(t, err)
	return e.actions
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestPipelineRunsInOrderAndStopsAtAnError(t *testing.T) {
	var calls []string
	step := func(name string, err error) stage {
		return stageFunc(func(_ context.Context, acts []action) ([]action, error) {
			calls = append(calls, name)
			return append(acts, action{rec: Record{Kind: name}}), err
		})
	}
	acts, err := pipeline{step("a", nil), step("b", nil), step("c", nil)}.Exec(context.Background(), nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c"}, calls)
	assert.Len(t, acts, 3, "each stage works on what the one before handed on")

	calls = nil
	boom := errors.New("boom")
	_, err = pipeline{step("a", nil), step("b", boom), step("c", nil)}.Exec(context.Background(), nil)
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, []string{"a", "b"}, calls, "nothing after the stage that failed")
}

func TestIntents(t *testing.T) {
	acts := intents(fullPlan())
	var kinds []string
	for _, a := range acts {
		kinds = append(kinds, a.rec.Kind)
		assert.Equal(t, uint64(3), a.rec.Seq)
		assert.Equal(t, t0, a.rec.At)
		assert.Equal(t, "trapped", a.rec.State)
		assert.Equal(t, Incident, a.rec.Mode)
		assert.Empty(t, a.rec.Phase, "the intent stage sets the phase")
	}
	assert.Equal(t, []string{"budget", "shed", "hold", "lending"}, kinds)
	assert.Equal(t, []string{"cut"}, acts[0].rec.Reasons, "each action its own reasons")
	assert.Equal(t, []string{"shed q1"}, acts[1].rec.Reasons)
	assert.Equal(t, []string{"hold s9"}, acts[2].rec.Reasons)
	assert.Equal(t, fullPlan().Reasons, acts[3].rec.Reasons, "an action without reasons of its own carries the plan's")
	assert.Empty(t, intents(Plan{Seq: 1}))
}

func TestFenceStage(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		paused  bool
		wantErr string
		wantIs  error
	}{
		{name: "free to act", ctx: context.Background()},
		{name: "paused", ctx: context.Background(), paused: true,
			wantErr: "execute plan 3: paused until 2026-05-01T13:00:00Z (by hand)"},
		{name: "shutting down", ctx: cancelled, wantErr: "execute plan 3: context canceled (nothing done)", wantIs: context.Canceled},
		{name: "paused and shutting down: paused says more", ctx: cancelled, paused: true,
			wantErr: "execute plan 3: paused until 2026-05-01T13:00:00Z (by hand)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked time.Time
			s := fenceStage{paused: func(now time.Time) (bool, time.Time, string) {
				asked = now
				return tc.paused, t0.Add(time.Hour), "by hand"
			}}
			acts, err := s.Exec(tc.ctx, intents(fullPlan()))
			assert.Equal(t, t0, asked, "paused at the plan's time")
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Len(t, acts, 4)
				return
			}
			assert.EqualError(t, err, tc.wantErr)
			if tc.wantIs != nil {
				assert.ErrorIs(t, err, tc.wantIs)
			}
			assert.Empty(t, acts)
		})
	}
}

func TestIntentStage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		phase    Phase
		storeErr error
		wantErr  string
	}{
		{name: "intents, all in one append", phase: PhaseIntent},
		{name: "a dry run's", phase: PhaseDryRun},
		{name: "the log refuses: nothing done", phase: PhaseIntent, storeErr: errors.New("disk full"),
			wantErr: "execute plan 3: disk full (nothing done)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []string
			store := &orderedStore{calls: &calls, err: tc.storeErr}
			audit, err := NewAudit(AuditOptions{Store: store})
			require.NoError(t, err)
			in := intents(fullPlan())
			acts, err := intentStage{audit: audit, phase: tc.phase}.Exec(context.Background(), in)
			if tc.wantErr != "" {
				assert.EqualError(t, err, tc.wantErr)
				assert.Empty(t, acts)
				assert.Empty(t, audit.Records(0))
				return
			}
			require.NoError(t, err)
			p := string(tc.phase)
			assert.Equal(t, []string{"audit budget " + p, "audit shed " + p, "audit hold " + p, "audit lending " + p}, calls)
			for _, a := range acts {
				assert.Equal(t, tc.phase, a.rec.Phase)
			}
			assert.Empty(t, in[0].rec.Phase, "the caller's actions are not written to")
		})
	}
}

func TestPersistStage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		persist func() error
		wantErr string
		wantLog string
	}{
		{name: "no persist"},
		{name: "saved", persist: func() error { return nil }},
		{name: "a failed save is logged, the plan goes on", persist: func() error { return errors.New("disk full") },
			wantLog: "saving the policy state failed; acting anyway, the audit log has the intent"},
		{name: "superseded: stop", persist: func() error { return fmt.Errorf("lease lost: %w", ErrSuperseded) },
			wantErr: "execute plan 3: lease lost: superseded: another daemon acts now (nothing done; the intents are the successor's to reconcile)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			acts, err := persistStage{persist: tc.persist, log: slog.New(slog.NewTextHandler(&logs, nil))}.Exec(context.Background(), intents(fullPlan()))
			if tc.wantErr != "" {
				assert.EqualError(t, err, tc.wantErr)
				assert.ErrorIs(t, err, ErrSuperseded)
				assert.Empty(t, acts)
				return
			}
			require.NoError(t, err)
			assert.Len(t, acts, 4)
			if tc.wantLog == "" {
				assert.Empty(t, logs.String())
			} else {
				assert.Contains(t, logs.String(), tc.wantLog)
			}
		})
	}
}

func TestDryRunStage(t *testing.T) {
	actions := counters(t)
	var logs bytes.Buffer
	var heard []string
	s := dryRunStage{actions: actions, log: slog.New(slog.NewTextHandler(&logs, nil)), notify: func(r Record) { heard = append(heard, r.Kind) }}
	_, err := s.Exec(context.Background(), intents(fullPlan()))
	require.NoError(t, err)
	assert.Equal(t, []string{"budget", "shed", "hold", "lending"}, heard)
	for _, kind := range heard {
		assert.Equal(t, 1.0, testutil.ToFloat64(actions.WithLabelValues(kind, string(PhaseDryRun))), kind)
		assert.Zero(t, testutil.ToFloat64(actions.WithLabelValues(kind, string(PhaseDone))), kind)
	}
	assert.Equal(t, 4, strings.Count(logs.String(), "dry run: would act"))
	assert.Contains(t, logs.String(), `change="budget 1.00M → 700K tokens"`)
}

func TestEachStage(t *testing.T) {
	boom := errors.New("boom")
	superseded := fmt.Errorf("gateway 409: %w", ErrSuperseded)
	for _, tc := range []struct {
		name string
		// fail says what taking an action of that kind returns; cancelAfter cancels ctx once
		// that kind is taken.
		fail        map[string]error
		cancelAfter string
		wantTaken   []string
		wantErr     []string // substrings of the error, in order
		wantIs      []error
	}{
		{name: "every action in order", wantTaken: []string{"budget", "shed", "hold", "lending"}},
		{name: "a failure does not stop the next", fail: map[string]error{"shed": boom},
			wantTaken: []string{"budget", "shed", "hold", "lending"}, wantErr: []string{"boom"}, wantIs: []error{boom}},
		{name: "superseded: none after it begun", fail: map[string]error{"shed": superseded},
			wantTaken: []string{"budget", "shed"},
			wantErr:   []string{"gateway 409", "execute plan 3: 2 action(s) not begun: superseded"}, wantIs: []error{ErrSuperseded}},
		{name: "superseded on the last: nothing left to abandon", fail: map[string]error{"lending": superseded},
			wantTaken: []string{"budget", "shed", "hold", "lending"}, wantErr: []string{"gateway 409"}, wantIs: []error{ErrSuperseded}},
		{name: "shutting down: the action begun ends, none after it begins", cancelAfter: "budget",
			wantTaken: []string{"budget"}, wantErr: []string{"execute plan 3: 3 action(s) not begun: context canceled"},
			wantIs: []error{context.Canceled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var taken []string
			each := stageFunc(func(_ context.Context, acts []action) ([]action, error) {
				require.Len(t, acts, 1, "one action at a time")
				kind := acts[0].rec.Kind
				taken = append(taken, kind)
				if kind == tc.cancelAfter {
					cancel()
				}
				return acts, tc.fail[kind]
			})
			out, err := eachStage{each: each, log: quiet()}.Exec(ctx, intents(fullPlan()))
			assert.Equal(t, tc.wantTaken, taken)
			assert.Len(t, out, len(tc.wantTaken), "what was begun is handed on")
			if len(tc.wantErr) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			last := -1
			for _, w := range tc.wantErr {
				i := strings.Index(err.Error(), w)
				assert.Greater(t, i, last, "%q in %q, in order", w, err.Error())
				last = i
			}
			for _, target := range tc.wantIs {
				assert.ErrorIs(t, err, target)
			}
		})
	}
}

func TestDetachedStageOutlivesTheCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var (
		innerErr error
		deadline time.Time
		bounded  bool
	)
	_, err := detachedStage{timeout: time.Minute, stages: stageFunc(func(ctx context.Context, acts []action) ([]action, error) {
		innerErr = ctx.Err()
		deadline, bounded = ctx.Deadline()
		return acts, nil
	})}.Exec(ctx, nil)
	require.NoError(t, err)
	assert.NoError(t, innerErr, "an action begun is carried to its end")
	require.True(t, bounded, "bounded by the timeout")
	assert.WithinDuration(t, time.Now().Add(time.Minute), deadline, 5*time.Second)
}

func TestActStage(t *testing.T) {
	boom := errors.New("gateway down")
	plan := fullPlan()
	for _, tc := range []struct {
		name       string
		act        action
		missing    bool // no actuator configured
		err        error
		reconciled bool
		wantCall   string
		wantPhase  Phase
		wantError  string
	}{
		{name: "budget", act: intents(plan)[0], wantCall: "budget 700000 1000000: basin plan 3 (trapped, incident): cut", wantPhase: PhaseDone},
		{name: "shed", act: intents(plan)[1], wantCall: "shed [q1]: basin plan 3 (trapped, incident): shed q1", wantPhase: PhaseDone},
		{name: "hold", act: intents(plan)[2], wantCall: "hold [s9] resume []: basin plan 3 (trapped, incident): hold s9", wantPhase: PhaseDone},
		{name: "lending", act: intents(plan)[3], wantCall: "lending false", wantPhase: PhaseDone},
		{name: "no reasons: the plan's header alone", act: action{rec: Record{Seq: 4, Kind: "budget", State: "healthy", Mode: Normal,
			Budget: &BudgetChange{To: 1, Reference: 2}}}, wantCall: "budget 1 2: basin plan 4 (healthy, normal)", wantPhase: PhaseDone},
		{name: "the actuator fails: the outcome says so", act: intents(plan)[0], err: boom,
			wantCall: "budget 700000 1000000: basin plan 3 (trapped, incident): cut", wantPhase: PhaseFailed, wantError: "gateway down"},
		{name: "no actuator configured: failed", act: intents(plan)[1], missing: true, wantPhase: PhaseFailed, wantError: "no gateway configured for the shed action"},
		{name: "no action at all: failed", act: action{rec: Record{Seq: 5, Kind: "budget"}}, wantPhase: PhaseFailed,
			wantError: "record 5 (budget) carries no action"},
		{name: "reconciled", act: intents(plan)[0], reconciled: true,
			wantCall: "budget 700000 1000000: basin plan 3 (trapped, incident): cut", wantPhase: PhaseDone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []string
			r := &recorder{calls: &calls, err: tc.err}
			s := actStage{gateway: r, lending: r, log: slog.New(slog.DiscardHandler), reconciled: tc.reconciled}
			if tc.missing {
				s = actStage{}
			}
			in := []action{tc.act}
			out, err := s.Exec(context.Background(), in)
			require.NoError(t, err, "a failed action does not stop the pipeline: its outcome is still to be recorded")
			require.Len(t, out, 1)
			if tc.wantCall == "" {
				assert.Empty(t, calls)
			} else {
				assert.Equal(t, []string{tc.wantCall}, calls)
			}
			got := out[0]
			assert.Equal(t, tc.wantPhase, got.rec.Phase)
			assert.Equal(t, tc.wantError, got.rec.Error)
			assert.Equal(t, tc.reconciled, got.rec.Reconciled)
			if tc.wantError == "" {
				assert.NoError(t, got.err)
			} else {
				assert.EqualError(t, got.err, tc.wantError)
			}
			if tc.err != nil {
				assert.ErrorIs(t, got.err, tc.err, "the actuator's error is handed on as it is")
			}
			assert.Equal(t, tc.act, in[0], "the caller's action is not written to")
		})
	}
}

func TestOutcomeStage(t *testing.T) {
	boom := errors.New("gateway down")
	fenced := fmt.Errorf("write fenced: %w", ErrSuperseded)
	outcome := func(phase Phase, reconciled bool, err error) action {
		r := intents(fullPlan())[0].rec
		r.Phase, r.Reconciled = phase, reconciled
		if err != nil {
			r.Error = err.Error()
		}
		return action{rec: r, err: err}
	}
	for _, tc := range []struct {
		name         string
		act          action
		storeErr     error
		wantCounted  string // the outcome label counted
		wantRecorded bool
		wantNotified bool
		wantErr      string
		wantIs       []error
		wantLog      string
	}{
		{name: "done", act: outcome(PhaseDone, false, nil), wantCounted: "done", wantRecorded: true, wantNotified: true,
			wantLog: "remediation action"},
		{name: "reconciled", act: outcome(PhaseDone, true, nil), wantCounted: "reconciled", wantRecorded: true, wantNotified: true,
			wantLog: "reconciled=true"},
		{name: "failed: recorded as failed, the error returned", act: outcome(PhaseFailed, false, boom), wantCounted: "failed",
			wantRecorded: true, wantNotified: true, wantErr: "budget (plan 3): gateway down", wantIs: []error{boom},
			wantLog: "remediation action failed"},
		{name: "the log refuses: logged, announced all the same", act: outcome(PhaseDone, false, nil), storeErr: errors.New("disk full"),
			wantCounted: "done", wantNotified: true, wantLog: "recording an action's outcome failed"},
		{name: "superseded: not recorded, not announced", act: outcome(PhaseFailed, false, boom), storeErr: fenced,
			wantCounted: "failed", wantErr: "budget (plan 3): outcome failed not recorded: write fenced: superseded: another daemon acts now\ngateway down",
			wantIs: []error{ErrSuperseded, boom}, wantLog: "superseded: the action's outcome is left to the daemon that acts now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []string
			audit, err := NewAudit(AuditOptions{Store: &orderedStore{calls: &calls, err: tc.storeErr}})
			require.NoError(t, err)
			actions := counters(t)
			var logs bytes.Buffer
			var heard []Record
			s := outcomeStage{audit: audit, actions: actions, log: slog.New(slog.NewTextHandler(&logs, nil)),
				notify: func(r Record) { heard = append(heard, r) }}
			_, err = s.Exec(context.Background(), []action{tc.act})
			assert.Equal(t, 1.0, testutil.ToFloat64(actions.WithLabelValues("budget", tc.wantCounted)))
			assert.Equal(t, []string{"audit budget " + string(tc.act.rec.Phase)}, calls, "one outcome written")
			if tc.wantRecorded {
				assert.Equal(t, []Record{tc.act.rec}, audit.Records(0))
			} else {
				assert.Empty(t, audit.Records(0))
			}
			if tc.wantNotified {
				assert.Equal(t, []Record{tc.act.rec}, heard)
			} else {
				assert.Empty(t, heard)
			}
			if tc.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.EqualError(t, err, tc.wantErr)
			}
			for _, target := range tc.wantIs {
				assert.ErrorIs(t, err, target)
			}
			assert.Contains(t, logs.String(), tc.wantLog)
		})
	}
}

// TestPlanStagesOrder runs the executor's own pipeline with every side effect recorded in one
// list: the fence, then the intents, then persist, then each action and its outcome in turn.
func TestPlanStagesOrder(t *testing.T) {
	boom := errors.New("gateway down")
	for _, tc := range []struct {
		name      string
		paused    bool
		dryRun    bool
		actErr    error
		wantCalls []string
		wantErr   string
	}{
		{name: "fence, intents, persist, then act and audit each outcome in turn", wantCalls: []string{
			"audit budget intent", "audit shed intent", "persist",
			"budget 700000 1000000: basin plan 3 (trapped, incident): cut", "audit budget done",
			"shed [q1]: basin plan 3 (trapped, incident): shed q1", "audit shed done"}},
		{name: "a failing fence stops before the intent is audited", paused: true,
			wantErr: "execute plan 3: paused until 2026-05-01T13:00:00Z (by hand)"},
		{name: "a failed act is audited as failed, and the next action still taken", actErr: boom, wantCalls: []string{
			"audit budget intent", "audit shed intent", "persist",
			"budget 700000 1000000: basin plan 3 (trapped, incident): cut", "audit budget failed",
			"shed [q1]: basin plan 3 (trapped, incident): shed q1", "audit shed failed"},
			wantErr: "budget (plan 3): gateway down\nshed (plan 3): gateway down"},
		{name: "a dry run audits its intents and acts on nothing", dryRun: true, wantCalls: []string{
			"audit budget dry_run", "audit shed dry_run", "persist"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []string
			audit, err := NewAudit(AuditOptions{Store: &orderedStore{calls: &calls}})
			require.NoError(t, err)
			r := &recorder{calls: &calls, err: tc.actErr}
			e, err := NewExecutor(ExecutorOptions{Audit: audit, Gateway: r, DryRun: tc.dryRun})
			require.NoError(t, err)
			if tc.paused {
				require.NoError(t, e.Pause(t0, t0.Add(time.Hour), "by hand"))
				calls = nil // the pause's own note
			}
			p := fullPlan()
			p.Hold, p.Lending = nil, nil
			err = e.Execute(context.Background(), p, func() error { calls = append(calls, "persist"); return nil })
			assert.Equal(t, tc.wantCalls, calls)
			if tc.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.EqualError(t, err, tc.wantErr)
			}
		})
	}
}
