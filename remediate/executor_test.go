package remediate

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// fakeGateway records the calls and checks that each action's intent was in the audit log first.
type fakeGateway struct {
	gatewayStub
	t      *testing.T
	audit  *Audit
	budget int64
	queued map[string]bool
	calls  []string
	// reasons are the reasons sent with each call.
	reasons []string
	fail    error
}

func (g *fakeGateway) intentRecorded(kind string) {
	for _, r := range g.audit.Pending() {
		if r.Kind == kind {
			return
		}
	}
	g.t.Errorf("%s acted on with no pending intent in the audit log", kind)
}

// gatewayStub is the part of Admission a test's fake leaves out: each call fails.
type gatewayStub struct{}

func (gatewayStub) State(context.Context) (adminapi.StateView, error) {
	return adminapi.StateView{}, errors.New("state: not faked")
}

func (gatewayStub) StateSessions(context.Context) (adminapi.StateView, error) {
	return adminapi.StateView{}, errors.New("state: not faked")
}

func (gatewayStub) SetBudget(context.Context, adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	return adminapi.BudgetResult{}, errors.New("set budget: not faked")
}

func (gatewayStub) Shed(context.Context, adminapi.ShedRequest) (adminapi.ShedResult, error) {
	return adminapi.ShedResult{}, errors.New("shed: not faked")
}

func (gatewayStub) Hold(context.Context, adminapi.HoldRequest) (adminapi.HoldResult, error) {
	return adminapi.HoldResult{}, errors.New("hold: not faked")
}

func (g *fakeGateway) SetBudget(_ context.Context, r adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	g.intentRecorded("budget")
	g.reasons = append(g.reasons, r.Reason)
	if g.fail != nil {
		return adminapi.BudgetResult{}, g.fail
	}
	g.calls = append(g.calls, "budget")
	g.budget = *r.Tokens
	return adminapi.BudgetResult{}, nil
}

func (g *fakeGateway) Shed(_ context.Context, r adminapi.ShedRequest) (adminapi.ShedResult, error) {
	g.intentRecorded("shed")
	g.reasons = append(g.reasons, r.Reason)
	res := adminapi.ShedResult{Shed: []string{}, Admitted: []string{}}
	for _, id := range r.SessionIDs {
		if g.queued[id] {
			delete(g.queued, id)
			g.calls = append(g.calls, "shed "+id)
			res.Shed = append(res.Shed, id)
		}
	}
	return res, nil
}

func openAudit(t *testing.T, path string) *Audit {
	t.Helper()
	a, warn, err := OpenAudit(path)
	require.NoError(t, err)
	require.Empty(t, warn)
	t.Cleanup(func() { a.Close() })
	return a
}

func budgetPlan(seq uint64, from, to int64) Plan {
	return Plan{Seq: seq, At: t0, State: "trapped", Mode: Incident, Budget: &BudgetChange{From: from, To: to, Reference: 1_000_000},
		Reasons: []string{"incident: cut"}}
}

func TestExecuteRecordsBeforeActing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a := openAudit(t, path)
	g := &fakeGateway{t: t, audit: a, budget: 1_000_000, queued: map[string]bool{"s1": true}}
	reg := prometheus.NewRegistry()
	var notified []Record
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g, Registerer: reg, Notify: func(r Record) { notified = append(notified, r) }})
	require.NoError(t, err)
	persisted := false
	p := budgetPlan(1, 1_000_000, 700_000)
	p.Shed = &ShedAction{IDs: []string{"s1"}}
	require.NoError(t, e.Execute(context.Background(), p, func() error { persisted = true; return nil }))
	assert.True(t, persisted)
	assert.Equal(t, []string{"budget", "shed s1"}, g.calls)
	assert.Equal(t, int64(700_000), g.budget)
	var phases []string
	for _, r := range a.Records(0) {
		phases = append(phases, r.Kind+" "+string(r.Phase))
	}
	assert.Equal(t, []string{"budget intent", "shed intent", "budget done", "shed done"}, phases)
	assert.Empty(t, a.Pending())
	assert.Len(t, notified, 2)
	assert.Equal(t, 1.0, testutil.ToFloat64(e.actions.WithLabelValues("budget", "done")))
}

// TestEachActionItsOwnReasons: a plan that cuts the budget, sheds and switches lending records
// each action with the reasons that led to it, and sends the gateway those, not the plan's last
// line (which was the lender's measurement).
func TestEachActionItsOwnReasons(t *testing.T) {
	a := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
	g := &fakeGateway{t: t, audit: a, budget: 1_000_000, queued: map[string]bool{"s1": true}}
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	p := Plan{Seq: 1, At: t0, State: "trapped", Mode: Incident,
		Budget:  &BudgetChange{From: 1_000_000, To: 700_000, Reference: 1_000_000, Reasons: []string{"mode normal → incident", "incident: cut"}},
		Shed:    &ShedAction{IDs: []string{"s1"}, Reasons: []string{"head waited 15m"}},
		Reasons: []string{"mode normal → incident", "incident: cut", "head waited 15m", "lend: decode-0 reserved 300000 / 800000"}}
	require.NoError(t, e.Execute(context.Background(), p, nil))
	got := map[string][]string{}
	for _, r := range a.Records(0) {
		if r.Phase == PhaseDone {
			got[r.Kind] = r.Reasons
		}
	}
	assert.Equal(t, []string{"mode normal → incident", "incident: cut"}, got["budget"])
	assert.Equal(t, []string{"head waited 15m"}, got["shed"])
	assert.Equal(t, []string{"basin plan 1 (trapped, incident): mode normal → incident; incident: cut",
		"basin plan 1 (trapped, incident): head waited 15m"}, g.reasons)
}

func TestDryRunNeverActs(t *testing.T) {
	a := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
	g := &fakeGateway{t: t, audit: a, budget: 1_000_000}
	var logs bytes.Buffer
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g, DryRun: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	require.NoError(t, e.Execute(context.Background(), budgetPlan(1, 1_000_000, 700_000), nil))
	assert.Empty(t, g.calls)
	recs := a.Records(0)
	require.Len(t, recs, 1)
	assert.Equal(t, PhaseDryRun, recs[0].Phase)
	assert.Empty(t, a.Pending(), "a dry run leaves nothing to reconcile")
	// The decision is logged, not only audited: an operator watching a dry run reads the log.
	assert.Contains(t, logs.String(), `level=INFO msg="dry run: would act" seq=1 kind=budget change="budget 1.00M → 700K tokens"`)
}

func TestRecordChange(t *testing.T) {
	for _, tc := range []struct {
		r    Record
		want string
	}{
		{Record{Budget: &BudgetChange{From: 1_000_000_000_000, To: 1_100_000}}, "budget 1.00T → 1.10M tokens"},
		{Record{Shed: &ShedAction{IDs: []string{"s1"}}}, "shed [s1]"},
		{Record{Lending: &LendingPlan{Enabled: true, Grants: map[string]int64{"decode-1": 20_000, "decode-0": 400_000}}},
			"lending on (decode-0 400K, decode-1 20K)"},
		{Record{Lending: &LendingPlan{}}, "lending off"},
		{Record{Kind: "pause"}, ""},
	} {
		assert.Equal(t, tc.want, tc.r.Change())
	}
}

func TestPause(t *testing.T) {
	a := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
	g := &fakeGateway{t: t, audit: a, budget: 1_000_000}
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g})
	require.NoError(t, err)
	require.NoError(t, e.Pause(t0, t0.Add(30*time.Minute), "maintenance"))
	paused, until, why := e.Paused(t0.Add(time.Minute))
	assert.True(t, paused)
	assert.Equal(t, t0.Add(30*time.Minute), until)
	assert.Equal(t, "maintenance", why)
	err = e.Execute(context.Background(), budgetPlan(1, 1_000_000, 700_000), nil)
	require.ErrorContains(t, err, "paused until")
	assert.Empty(t, g.calls)
	paused, _, _ = e.Paused(t0.Add(31 * time.Minute))
	assert.False(t, paused, "a pause ends by itself")
}

func TestFailedActionRecorded(t *testing.T) {
	a := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
	g := &fakeGateway{t: t, audit: a, budget: 1_000_000, fail: errors.New("connection refused")}
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g})
	require.NoError(t, err)
	err = e.Execute(context.Background(), budgetPlan(1, 1_000_000, 700_000), nil)
	require.ErrorContains(t, err, "connection refused")
	recs := a.Records(0)
	require.Len(t, recs, 2)
	assert.Equal(t, PhaseFailed, recs[1].Phase)
	assert.Equal(t, "connection refused", recs[1].Error)
}

// TestReconcileAfterCrash: the daemon dies between an intent and the action (or between the action
// and its outcome); the restarted executor completes what was not done and repeats nothing.
func TestReconcileAfterCrash(t *testing.T) {
	for _, tc := range []struct {
		name      string
		applied   bool // the action happened before the crash
		wantCalls []string
	}{
		{"killed before acting", false, []string{"budget", "shed s1"}},
		{"killed after acting, before the outcome", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			a, _, err := OpenAudit(path)
			require.NoError(t, err)
			p := budgetPlan(7, 1_000_000, 700_000)
			require.NoError(t, a.Append(context.Background(),
				Record{Seq: 7, At: t0, Kind: "budget", Phase: PhaseIntent, Budget: p.Budget},
				Record{Seq: 7, At: t0, Kind: "shed", Phase: PhaseIntent, Shed: &ShedAction{IDs: []string{"s1"}}},
			))
			require.NoError(t, a.Close())
			g := &fakeGateway{t: t, budget: 1_000_000, queued: map[string]bool{"s1": true}}
			if tc.applied {
				g.budget = 700_000
				delete(g.queued, "s1")
			}
			// restart
			a = openAudit(t, path)
			g.audit = a
			require.Len(t, a.Pending(), 2)
			e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g})
			require.NoError(t, err)
			obs := Observed{Budget: g.budget, BudgetOK: true, Queued: func(id string) bool { return g.queued[id] }}
			require.NoError(t, e.Reconcile(context.Background(), t0.Add(time.Minute), obs))
			assert.Equal(t, tc.wantCalls, g.calls)
			assert.Equal(t, int64(700_000), g.budget)
			assert.Empty(t, a.Pending())
			// a second restart finds nothing to do
			obs.Budget = g.budget
			require.NoError(t, e.Reconcile(context.Background(), t0.Add(2*time.Minute), obs))
			assert.Equal(t, tc.wantCalls, g.calls)
			for _, r := range a.Records(0)[2:] {
				assert.True(t, r.Reconciled)
				assert.Equal(t, PhaseDone, r.Phase)
			}
		})
	}
}

func TestReconcileGatewayUnread(t *testing.T) {
	a := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
	require.NoError(t, a.Append(context.Background(), Record{Seq: 1, Kind: "budget", Phase: PhaseIntent, Budget: &BudgetChange{To: 5}}))
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: &fakeGateway{t: t, audit: a}})
	require.NoError(t, err)
	require.ErrorContains(t, e.Reconcile(context.Background(), t0, Observed{}), "left pending")
	assert.Len(t, a.Pending(), 1)
}

func TestOpenAudit(t *testing.T) {
	dir := t.TempDir()
	good := `{"seq":1,"at":"2026-05-01T12:00:00Z","kind":"budget","phase":"intent"}` + "\n"
	for _, tc := range []struct {
		name, content string
		wantRecs      int
		wantWarn      string
		wantErr       string
	}{
		{"empty", "", 0, "", ""},
		{"good", good + good, 2, "", ""},
		{"last line cut short by a crash", good + `{"seq":2,"at":"2026-05`, 1, "cut short", ""},
		{"a bad line in the middle", good + "garbage\n" + good, 0, "", "line 2"},
		{"a line with no kind", good + "{}\n", 0, "", "line 2: no kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			require.NoError(t, os.WriteFile(path, []byte(tc.content), 0o600))
			a, warn, err := OpenAudit(path)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			defer a.Close()
			assert.Len(t, a.Records(0), tc.wantRecs)
			if tc.wantWarn == "" {
				assert.Empty(t, warn)
			} else {
				assert.Contains(t, warn, tc.wantWarn)
			}
			// appending after a cut line leaves a well-formed file
			require.NoError(t, a.Append(context.Background(), Record{Seq: 9, Kind: "budget", Phase: PhaseDone}))
			require.NoError(t, a.Close())
			a2, warn2, err := OpenAudit(path)
			require.NoError(t, err)
			defer a2.Close()
			assert.Empty(t, warn2)
			assert.Len(t, a2.Records(0), tc.wantRecs+1)
		})
	}
}

// cancellingGateway cancels the executor's context from inside the budget call, as a shutdown
// arriving while the call is in flight does, and reports whether its own context survived.
type cancellingGateway struct {
	fakeGateway
	cancel       context.CancelFunc
	ctxCancelled bool
}

func (g *cancellingGateway) SetBudget(ctx context.Context, r adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	g.cancel()
	g.ctxCancelled = ctx.Err() != nil
	return g.fakeGateway.SetBudget(ctx, r)
}

// TestShutdownMidPlan: an action begun when the daemon is told to stop is carried to its end and
// recorded as done (the gateway applied it); the plan's actions not yet begun stay as intents for
// the next start to reconcile; a plan arriving after the stop records nothing.
func TestShutdownMidPlan(t *testing.T) {
	a := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
	ctx, cancel := context.WithCancel(context.Background())
	g := &cancellingGateway{fakeGateway: fakeGateway{t: t, audit: a, budget: 1_000_000, queued: map[string]bool{"s1": true}}, cancel: cancel}
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g})
	require.NoError(t, err)
	p := budgetPlan(1, 1_000_000, 700_000)
	p.Shed = &ShedAction{IDs: []string{"s1"}}
	err = e.Execute(ctx, p, nil)
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "1 action(s) not begun")
	assert.False(t, g.ctxCancelled, "the call in flight keeps its context")
	assert.Equal(t, []string{"budget"}, g.calls, "the shed was not begun")
	var phases []string
	for _, r := range a.Records(0) {
		phases = append(phases, r.Kind+" "+string(r.Phase))
	}
	assert.Equal(t, []string{"budget intent", "shed intent", "budget done"}, phases)
	pending := a.Pending()
	require.Len(t, pending, 1)
	assert.Equal(t, "shed", pending[0].Kind, "left for reconciliation")

	n := len(a.Records(0))
	require.ErrorIs(t, e.Execute(ctx, budgetPlan(2, 700_000, 650_000), nil), context.Canceled)
	assert.Len(t, a.Records(0), n, "a plan after the stop records nothing")
}
