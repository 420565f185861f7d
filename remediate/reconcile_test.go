package remediate

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReconcileOne: each interrupted intent is finished as the world shows it, and only what is
// not done already is acted on.
func TestReconcileOne(t *testing.T) {
	budget := Record{Seq: 7, At: t0, Kind: "budget", Phase: PhaseIntent, State: "trapped", Mode: Incident,
		Budget: &BudgetChange{From: 1_000_000, To: 700_000, Reference: 1_000_000}, Reasons: []string{"cut"}}
	shed := Record{Seq: 7, At: t0, Kind: "shed", Phase: PhaseIntent, State: "trapped", Mode: Incident,
		Shed: &ShedAction{IDs: []string{"q1", "q2"}}, Reasons: []string{"shed"}}
	lending := Record{Seq: 8, At: t0, Kind: "lending", Phase: PhaseIntent, State: "healthy", Mode: Normal,
		Lending: &LendingPlan{Enabled: true}}
	queued := func(ids ...string) func(string) bool {
		return func(id string) bool { return slices.Contains(ids, id) }
	}
	now := t0.Add(time.Minute)
	for _, tc := range []struct {
		name        string
		r           Record
		w           Observed
		wantCalls   []string
		wantErr     string
		wantOutcome *Record // the outcome recorded, nil for none
	}{
		{name: "a budget with the gateway unread: left pending", r: budget, w: Observed{},
			wantErr: "budget (plan 7): gateway unread, left pending"},
		{name: "a budget found at its target: recorded done, not set again", r: budget, w: Observed{Budget: 700_000, BudgetOK: true},
			wantOutcome: &Record{Seq: 7, At: now, Kind: "budget", Phase: PhaseDone, State: "trapped", Mode: Incident, Budget: budget.Budget,
				Reasons: []string{"cut", "found applied after a restart"}, Reconciled: true}},
		{name: "a budget not applied: set now", r: budget, w: Observed{Budget: 1_000_000, BudgetOK: true},
			wantCalls: []string{"budget 700000 1000000: basin plan 7 (trapped, incident): cut"},
			wantOutcome: &Record{Seq: 7, At: now, Kind: "budget", Phase: PhaseDone, State: "trapped", Mode: Incident, Budget: budget.Budget,
				Reasons: []string{"cut"}, Reconciled: true}},
		{name: "a shed with nobody left queued: recorded done", r: shed, w: Observed{Queued: queued()},
			wantOutcome: &Record{Seq: 7, At: now, Kind: "shed", Phase: PhaseDone, State: "trapped", Mode: Incident, Shed: shed.Shed,
				Reasons: []string{"shed", "no longer queued after a restart: shed (or admitted) already"}, Reconciled: true}},
		{name: "a shed: only the sessions still queued", r: shed, w: Observed{Queued: queued("q2")},
			wantCalls: []string{"shed [q2]: basin plan 7 (trapped, incident): shed"},
			wantOutcome: &Record{Seq: 7, At: now, Kind: "shed", Phase: PhaseDone, State: "trapped", Mode: Incident,
				Shed: &ShedAction{IDs: []string{"q2"}}, Reasons: []string{"shed"}, Reconciled: true}},
		{name: "a lending plan: applied again", r: lending, w: Observed{},
			wantCalls: []string{"lending true"},
			wantOutcome: &Record{Seq: 8, At: now, Kind: "lending", Phase: PhaseDone, State: "healthy", Mode: Normal,
				Lending: lending.Lending, Reconciled: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			audit := NewMemoryAudit()
			var calls []string
			rec := &recorder{calls: &calls}
			e, err := NewExecutor(ExecutorOptions{Audit: audit, Gateway: rec, Lending: rec})
			require.NoError(t, err)
			err = e.reconcile(context.Background(), tc.r, now, tc.w)
			if tc.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.EqualError(t, err, tc.wantErr)
			}
			assert.Equal(t, tc.wantCalls, calls)
			if tc.wantOutcome == nil {
				assert.Empty(t, audit.Records(0))
				return
			}
			assert.Equal(t, []Record{*tc.wantOutcome}, audit.Records(0))
			assert.Equal(t, 1.0, testutil.ToFloat64(e.actions.WithLabelValues(tc.r.Kind, "reconciled")))
		})
	}
}
