package remediate

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// fencedStore is a shared audit store that refuses every append once fenced is set, as the
// daemon's stream refuses a writer whose term is over.
type fencedStore struct {
	mu     sync.Mutex
	recs   []Record
	fenced bool
	tries  int
}

func (s *fencedStore) Append(_ context.Context, recs []Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries++
	if s.fenced {
		return fmt.Errorf("audit stream: write fenced: %w", ErrSuperseded)
	}
	s.recs = append(s.recs, recs...)
	return nil
}

func (s *fencedStore) Load(context.Context) ([]Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.recs...), nil
}

func (s *fencedStore) Close() error { return nil }

// supersedingGateway fences the store while the budget call is in flight (another daemon took
// over meanwhile), or refuses the call as the gateway refuses a stale term.
type supersedingGateway struct {
	gatewayStub
	store  *fencedStore
	refuse bool
	calls  []string
}

func (g *supersedingGateway) SetBudget(context.Context, adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	g.calls = append(g.calls, "budget")
	if g.refuse {
		return adminapi.BudgetResult{}, fmt.Errorf("set budget: gateway answered 409: %w", ErrSuperseded)
	}
	g.store.mu.Lock()
	g.store.fenced = true
	g.store.mu.Unlock()
	return adminapi.BudgetResult{}, nil
}

func (g *supersedingGateway) Shed(context.Context, adminapi.ShedRequest) (adminapi.ShedResult, error) {
	g.calls = append(g.calls, "shed")
	return adminapi.ShedResult{}, nil
}

// TestSupersededStopsAtOnce: an executor superseded mid-plan (its outcome fenced, or the gateway
// refusing its term) begins no further action, writes no outcome the store refused, does not
// retry, and leaves the intents pending in the shared log for its successor — one outcome per
// intent. The local copy holds only what the shared log took.
func TestSupersededStopsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name        string
		refuse      bool
		wantOutcome Phase // the budget's outcome in the shared log; "" for none
	}{
		{"outcome fenced after the action", false, ""},
		{"gateway refuses the term", true, PhaseFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &fencedStore{}
			cp, _, _, err := OpenAuditFile(filepath.Join(t.TempDir(), "audit.jsonl"))
			require.NoError(t, err)
			a, err := NewAudit(AuditOptions{Store: store, Copy: cp})
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Close() })
			g := &supersedingGateway{store: store, refuse: tc.refuse}
			e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g})
			require.NoError(t, err)
			p := budgetPlan(3, 1_000_000, 700_000)
			p.Shed = &ShedAction{IDs: []string{"s1"}}
			err = e.Execute(context.Background(), p, nil)
			require.ErrorIs(t, err, ErrSuperseded)
			assert.Equal(t, []string{"budget"}, g.calls, "no action begun after the executor was superseded")

			shared, err := store.Load(context.Background())
			require.NoError(t, err)
			var phases []Phase
			for _, r := range shared {
				phases = append(phases, Phase(r.Kind+" ")+r.Phase)
			}
			want := []Phase{"budget intent", "shed intent"}
			if tc.wantOutcome != "" {
				want = append(want, "budget "+tc.wantOutcome)
			}
			assert.Equal(t, want, phases)
			assert.Equal(t, 2, store.tries, "the intents, then one outcome (taken or refused): no retry")
			// The successor reconciles the shed (and, when fenced, the budget) from the shared log.
			succ, err := NewAudit(AuditOptions{Store: store, Records: shared})
			require.NoError(t, err)
			assert.NotEmpty(t, succ.Pending())
			local, err := cp.Load(context.Background())
			require.NoError(t, err)
			assert.Len(t, local, len(shared), "the local copy has what the shared log took, nothing more")
		})
	}
}

// TestSupersededPersistActsOnNothing: when saving the policy state after the intents says the
// executor was superseded (the shared state's write fenced), nothing is acted on.
func TestSupersededPersistActsOnNothing(t *testing.T) {
	store := &fencedStore{}
	a, err := NewAudit(AuditOptions{Store: store})
	require.NoError(t, err)
	g := &supersedingGateway{store: store}
	e, err := NewExecutor(ExecutorOptions{Audit: a, Gateway: g})
	require.NoError(t, err)
	err = e.Execute(context.Background(), budgetPlan(4, 1_000_000, 700_000), func() error {
		return fmt.Errorf("shared state: %w", ErrSuperseded)
	})
	require.ErrorIs(t, err, ErrSuperseded)
	assert.Empty(t, g.calls)
	assert.Len(t, a.Pending(), 1, "the intent is left to the successor")
}
