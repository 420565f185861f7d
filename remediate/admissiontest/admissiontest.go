// Package admissiontest is the conformance suite of remediate.Admission, the one contract basin
// reads and changes a gateway's admission through. Every implementation — the gateway's HTTP
// client in front of a real gateway, the admission core served in process to the simulator —
// runs the same scenario and must give the same answers, so that the policy decides alike on
// either and a simulated run says what the daemon would do (after the Gateway API Inference
// Extension's queue conformance tests, one function taking a factory).
package admissiontest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/remediate"
)

// Deployment is one implementation under test and the sessions in front of it.
type Deployment struct {
	// Admission is the implementation under test.
	Admission remediate.Admission
	// Call makes one model call of session id and returns at once: its first call arrives for
	// admission (admitted at once or queued, as the budget says), a live session's next call
	// passes or waits while the session is held. A call that goes finishes on its own, leaving
	// the session live and idle with a context of ContextTokens.
	Call func(id string)
	// ContextTokens is a session's context after its call.
	ContextTokens int64
}

// Factory starts a fresh implementation whose budget and reference budget are budget tokens,
// and stops it when t ends.
type Factory func(t *testing.T, budget int64) Deployment

// Run runs the suite against the implementation factory makes: sessions admitted and queued, the
// state read, the budget set (valid and invalid), queued sessions shed, live ones held and
// resumed.
func Run(t *testing.T, factory Factory) {
	d := factory(t, 1)
	ctx := context.Background()
	a := d.Admission

	// One live session, idle; then three whose first calls queue (the working set is over the
	// reference budget of 1 token).
	d.Call("a")
	eventually(t, a, "a live and idle", func(v adminapi.StateView) bool { return v.Live == 1 && v.InCall == 0 })
	for i, id := range []string{"b", "c", "d"} {
		d.Call(id)
		eventually(t, a, id+" queued", func(v adminapi.StateView) bool { return v.Queued == i+1 })
	}

	t.Run("state", func(t *testing.T) {
		v, err := a.State(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(1), v.Budget)
		assert.Equal(t, int64(1), v.ReferenceBudget)
		assert.False(t, v.CountOnly)
		assert.True(t, v.Engaged)
		assert.Equal(t, 1, v.Live)
		assert.Equal(t, d.ContextTokens, v.WorkingSet)
		assert.Equal(t, 3, v.Queued)
		assert.Equal(t, []string{"b", "c", "d"}, queueIDs(v), "best first")
		assert.Equal(t, uint64(4), v.Counters.Arrivals)
		assert.Equal(t, uint64(1), v.Counters.AdmittedAtOnce)
		assert.Equal(t, uint64(3), v.Counters.Queued)

		v, err = a.StateSessions(ctx)
		require.NoError(t, err)
		require.Len(t, v.Sessions, 1, "the live sessions listed")
		assert.Equal(t, "a", v.Sessions[0].ID)
		assert.Equal(t, d.ContextTokens, v.Sessions[0].Context)
		assert.False(t, v.Sessions[0].Held)
	})

	t.Run("invalid requests", func(t *testing.T) {
		zero, neg, five, one := int64(0), int64(-1), int64(5), 1
		for _, tc := range []struct {
			name      string
			call      func() error
			wantParam string
			wantMsg   string
		}{
			{"budget missing", func() error { _, err := a.SetBudget(ctx, adminapi.BudgetRequest{Reason: "r"}); return err },
				"tokens", "tokens: required, the new budget in tokens"},
			{"budget zero", func() error {
				_, err := a.SetBudget(ctx, adminapi.BudgetRequest{Tokens: &zero, Reason: "r"})
				return err
			},
				"tokens", "tokens: must be > 0, got 0"},
			{"reference negative", func() error {
				_, err := a.SetBudget(ctx, adminapi.BudgetRequest{Tokens: &five, ReferenceTokens: &neg, Reason: "r"})
				return err
			}, "reference_tokens", "reference_tokens: must be > 0, got -1"},
			{"budget without a reason", func() error {
				_, err := a.SetBudget(ctx, adminapi.BudgetRequest{Tokens: &five, Reason: " "})
				return err
			},
				"reason", "reason: required, say why the budget changes"},
			{"shed neither", func() error { _, err := a.Shed(ctx, adminapi.ShedRequest{Reason: "r"}); return err },
				"count", "count or session_ids: one is required"},
			{"shed both", func() error {
				_, err := a.Shed(ctx, adminapi.ShedRequest{Count: &one, SessionIDs: []string{"b"}, Reason: "r"})
				return err
			}, "session_ids", "count and session_ids: give one, not both"},
			{"shed an empty id", func() error {
				_, err := a.Shed(ctx, adminapi.ShedRequest{SessionIDs: []string{"b", ""}, Reason: "r"})
				return err
			},
				"session_ids[1]", "session_ids[1]: empty"},
			{"hold nothing", func() error { _, err := a.Hold(ctx, adminapi.HoldRequest{Reason: "r"}); return err },
				"hold", "hold or resume: at least one session id is required"},
			{"hold and resume one id", func() error {
				_, err := a.Hold(ctx, adminapi.HoldRequest{Hold: []string{"a"}, Resume: []string{"a"}, Reason: "r"})
				return err
			}, "resume[0]", `resume[0]: "a" is also in hold; give each session one change`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := tc.call()
				var re *adminapi.RequestError
				require.True(t, errors.As(err, &re), "want an *adminapi.RequestError, got %v", err)
				assert.Equal(t, tc.wantParam, re.Param)
				assert.Equal(t, tc.wantMsg, re.Message)
			})
		}
		v, err := a.State(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(1), v.Budget, "nothing refused changed anything")
		assert.Equal(t, 3, v.Queued)
		assert.Equal(t, 0, v.Held)
	})

	t.Run("shed", func(t *testing.T) {
		r, err := a.Shed(ctx, adminapi.ShedRequest{SessionIDs: []string{"d", "nobody", "a"}, Reason: "test: shed"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.ShedResult{Shed: []string{"d"}, Admitted: []string{}}, r, "unknown and live ids skipped")
		r, err = a.Shed(ctx, adminapi.ShedRequest{SessionIDs: []string{"d"}, Reason: "test: shed again"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.ShedResult{Shed: []string{}, Admitted: []string{}}, r, "no longer queued: nothing shed")
		v, err := a.State(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"b", "c"}, queueIDs(v))
		assert.Equal(t, uint64(1), v.Counters.Shed)
	})

	t.Run("hold and resume", func(t *testing.T) {
		r, err := a.Hold(ctx, adminapi.HoldRequest{Hold: []string{"a", "nobody"}, Reason: "test: trapped"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.HoldResult{Added: 1, Released: []string{}, HeldSessions: 1, HeldTokens: d.ContextTokens}, r)
		r, err = a.Hold(ctx, adminapi.HoldRequest{Hold: []string{"a"}, Reason: "test: trapped again"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.HoldResult{Released: []string{}, HeldSessions: 1, HeldTokens: d.ContextTokens}, r, "already held")

		d.Call("a")
		v := eventually(t, a, "a's call held", func(v adminapi.StateView) bool { return v.HeldCalls == 1 })
		assert.Equal(t, 1, v.Held)
		assert.Equal(t, d.ContextTokens, v.HeldTokens)

		r, err = a.Hold(ctx, adminapi.HoldRequest{Resume: []string{"a", "b"}, Reason: "test: recovered"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.HoldResult{Resumed: 1, Released: []string{"a"}}, r, "b is queued, not held: skipped")
		eventually(t, a, "a's call gone", func(v adminapi.StateView) bool { return v.HeldCalls == 0 && v.InCall == 0 })
		r, err = a.Hold(ctx, adminapi.HoldRequest{Resume: []string{"a"}, Reason: "test: recovered again"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.HoldResult{Released: []string{}}, r, "not held: nothing to resume")
	})

	t.Run("budget", func(t *testing.T) {
		big := int64(1_000_000)
		r, err := a.SetBudget(ctx, adminapi.BudgetRequest{Tokens: &big, Reason: "test: room again"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.Budget{BudgetTokens: 1, ReferenceBudgetTokens: 1}, r.Before)
		assert.Equal(t, adminapi.Budget{BudgetTokens: big, ReferenceBudgetTokens: 1}, r.After, "no reference given: kept")
		assert.Equal(t, []string{"b", "c"}, r.Admitted, "the queue admitted, best first")
		assert.True(t, r.Engaged, "the working set is over the reference budget")
		assert.GreaterOrEqual(t, r.WorkingSetTokens, d.ContextTokens)
		assert.Contains(t, r.Effect, "admission is engaged: the working set")
		eventually(t, a, "b and c live and idle", func(v adminapi.StateView) bool { return v.Live == 3 && v.InCall == 0 })

		ref := int64(500_000)
		r, err = a.SetBudget(ctx, adminapi.BudgetRequest{Tokens: &big, ReferenceTokens: &ref, Reason: "test: reference"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.BudgetResult{Before: adminapi.Budget{BudgetTokens: big, ReferenceBudgetTokens: 1},
			After: adminapi.Budget{BudgetTokens: big, ReferenceBudgetTokens: ref}, Admitted: []string{}, WorkingSetTokens: 3 * d.ContextTokens,
			Effect: fmt.Sprintf("admission is not engaged: it engages when the working set (now %d tokens) exceeds the reference budget of %d tokens",
				3*d.ContextTokens, ref)}, r)

		one := 1
		s, err := a.Shed(ctx, adminapi.ShedRequest{Count: &one, Reason: "test: nothing queued"})
		require.NoError(t, err)
		assert.Equal(t, adminapi.ShedResult{Shed: []string{}, Admitted: []string{}}, s)
	})
}

// eventually polls the state until cond holds (an implementation over HTTP answers calls
// asynchronously; one in process holds at once).
func eventually(t *testing.T, a remediate.Admission, what string, cond func(adminapi.StateView) bool) adminapi.StateView {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := a.State(context.Background())
		require.NoError(t, err)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func queueIDs(v adminapi.StateView) []string {
	ids := []string{}
	for _, q := range v.Queue {
		ids = append(ids, q.ID)
	}
	return ids
}
