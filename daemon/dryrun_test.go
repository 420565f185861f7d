package daemon

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/remediate"
)

// outOfReach is the gateway's count-only budget of docs/real-engines.md.
const outOfReach = 1_000_000_000_000

// TestDryRunThenActing is real-engines.md's "from watching to acting": a dry run long enough to
// decide a budget and lending, then the daemon restarted acting on the same data directory. The dry
// run's decisions were never applied, so the first real budget action starts from the gateway's
// real budget (the out-of-reach one, not the dry run's target), and lending is switched on for real
// (not reported "on since" the dry run while the gateway's affinity stays off).
func TestDryRunThenActing(t *testing.T) {
	e := newEnv(t, "dry_run: true\nlending:\n  backend: {kind: affinity}\n")
	e.gw = newFakeGateway(outOfReach)
	e.dep.inCall = 5
	var logs syncBuffer
	e.log = slog.New(slog.NewTextHandler(&logs, nil))
	d1 := e.daemon()

	var budgetDecided, lendingDecided bool
	for i := 0; i < 60 && !(budgetDecided && lendingDecided); i++ {
		e.step(d1)
		for _, r := range d1.audit.Records(0) {
			budgetDecided = budgetDecided || r.Kind == "budget" && r.Phase == remediate.PhaseDryRun
			lendingDecided = lendingDecided || r.Kind == "lending" && r.Phase == remediate.PhaseDryRun && r.Lending.Enabled
		}
	}
	require.True(t, budgetDecided && lendingDecided, "the dry run decided a budget and lending on: %+v", d1.audit.Records(0))
	s := d1.StatusNow()
	require.NotEqual(t, int64(outOfReach), s.Policy.Target, "the dry run has a target of its own")
	assert.True(t, s.Lending.Enabled && s.Lending.DecidedOnly, "the dry run's switch is marked as decided only: %+v", s.Lending)
	assert.Empty(t, e.gw.Budgets(), "a dry run never acts")
	assert.Empty(t, e.gw.affinity)
	assert.Contains(t, logs.String(), `msg="dry run: would act"`, "dry-run decisions are logged")
	assert.Contains(t, logs.String(), `kind=budget change="budget 1.00T →`)

	e.cfg.DryRun = false
	d2 := e.daemon()
	s = d2.StatusNow()
	assert.False(t, s.Lending.Enabled, "lending is not on: the dry run never switched it")
	assert.Zero(t, s.Policy.Target, "no target until the gateway's budget is read")
	for range 3 {
		e.step(d2)
	}
	var first *remediate.Record
	for _, r := range d2.audit.Records(0) {
		if r.Kind == "budget" && r.Phase == remediate.PhaseDone {
			first = &r
			break
		}
	}
	require.NotNil(t, first, "the acting daemon set the budget")
	assert.EqualValues(t, outOfReach, first.Budget.From, "the first action starts from the gateway's real budget: %+v", first.Budget)
	assert.Equal(t, []bool{true}, e.gw.affinity, "lending switched on for real")
	s = d2.StatusNow()
	assert.True(t, s.Lending.Enabled)
	assert.False(t, s.Lending.DecidedOnly)
	assert.True(t, s.Lending.Since.After(t0), "on since the real switch")
}

// TestLendingFollowsTheGatewaysAffinity: an acting daemon whose lending is on finds the gateway's
// affinity off (the gateway restarted with its configured switch): it takes the gateway's state
// and switches it on again, instead of believing it on for ever.
func TestLendingFollowsTheGatewaysAffinity(t *testing.T) {
	e := newEnv(t, "lending:\n  backend: {kind: affinity}\n")
	e.dep.inCall = 5
	var logs syncBuffer
	e.log = slog.New(slog.NewTextHandler(&logs, nil))
	d := e.daemon()
	e.stepUntil(d, 20, "lending on", func(s Status) bool { return s.Lending.Enabled })
	require.Equal(t, []bool{true}, e.gw.affinity)

	e.gw.set(func(g *fakeGateway) { g.affinityOn = false }) // the gateway restarted
	e.stepUntil(d, 3, "lending on again", func(Status) bool {
		e.gw.mu.Lock()
		defer e.gw.mu.Unlock()
		return len(e.gw.affinity) == 2
	})
	assert.Equal(t, []bool{true, true}, e.gw.affinity)
	assert.Contains(t, logs.String(), "the gateway's affinity switch is not the one basin last set")
}

// TestCountOnlyGatewayTakenOver: the guide's gateway starts in count-only mode (budget 0 meaning
// none). A dry run leaves it counting; the acting daemon's first decision takes admission over at the
// top of the normal range — recorded from count-only, not from 0 — and logs what the gateway says
// the budget does.
func TestCountOnlyGatewayTakenOver(t *testing.T) {
	e := newEnv(t, "dry_run: true\n")
	e.gw.set(func(g *fakeGateway) { g.countOnly = true })
	var logs syncBuffer
	e.log = slog.New(slog.NewTextHandler(&logs, nil))
	d1 := e.daemon()
	for range 20 {
		e.step(d1)
	}
	assert.Empty(t, e.gw.Budgets(), "a dry run leaves the gateway counting")

	e.cfg.DryRun = false
	d2 := e.daemon()
	e.stepUntil(d2, 5, "a budget set", func(Status) bool { return len(e.gw.Budgets()) > 0 })
	calls := e.gw.Budgets()
	require.NotEmpty(t, calls, "the acting daemon's first step sets a budget")
	// From 1.1 × B_ref, the top of the normal range (not the floor), one step back towards B_ref:
	// nobody queues.
	assert.EqualValues(t, 1_050_000, calls[0].Tokens)
	var first *remediate.Record
	for _, r := range d2.audit.Records(0) {
		if r.Kind == "budget" && r.Phase == remediate.PhaseDone {
			first = &r
			break
		}
	}
	require.NotNil(t, first)
	assert.True(t, first.Budget.FromCountOnly, "%+v", first.Budget)
	assert.Contains(t, logs.String(), `msg="gateway budget set" component=executor tokens=1050000`)
	assert.Contains(t, logs.String(), `kind=budget change="budget count only → 1.05M tokens"`, "the dry run's first decision too")
	assert.Contains(t, logs.String(), "was_count_only=true")
	assert.Contains(t, logs.String(), "effect=")
}

// TestDryRunClaimsNoBudget: a dry run in front of a count-only gateway decides a budget but sets
// none, so it exports no basin_budget_tokens (the budget in force is the gateway's own, none):
// the budget it would set is basin_dry_run_budget_tokens. Acting, the budget set is
// basin_budget_tokens.
func TestDryRunClaimsNoBudget(t *testing.T) {
	e := newEnv(t, "dry_run: true\n")
	e.gw.set(func(g *fakeGateway) { g.countOnly = true })
	d1 := e.daemon()
	for range 20 {
		e.step(d1)
	}
	require.NotZero(t, d1.StatusNow().Policy.Target, "the dry run decided a budget")
	assert.Equal(t, -1.0, gauge(t, d1, "basin_budget_tokens"), "no budget in force is claimed")
	assert.Equal(t, float64(d1.StatusNow().Policy.Target), gauge(t, d1, "basin_dry_run_budget_tokens"))

	e.cfg.DryRun = false
	d2 := e.daemon()
	e.stepUntil(d2, 5, "a budget set", func(Status) bool { return len(e.gw.Budgets()) > 0 })
	assert.Equal(t, float64(e.gw.Budget()), gauge(t, d2, "basin_budget_tokens"))
	assert.Equal(t, -1.0, gauge(t, d2, "basin_dry_run_budget_tokens"))
}
