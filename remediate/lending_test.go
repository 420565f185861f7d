package remediate

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/lender"
)

func snapshotOf(vals map[collector.Signal]float64) collector.Snapshot {
	s := collector.Snapshot{At: t0, Signals: map[collector.Signal]collector.Value{}}
	for sig, v := range vals {
		s.Signals[sig] = collector.Value{V: v, State: collector.OK, At: t0}
	}
	return s
}

func TestLend(t *testing.T) {
	// Cache-first: the cache limit (1.9 × 1M ÷ 25K = 76) binds before decode (800K × 3 ÷ 25K ÷ 0.3).
	snap := snapshotOf(map[collector.Signal]float64{collector.CacheCapacity: 1e6, collector.DecodeCapacity: 2.4e6,
		collector.WorkingSet: 1e6, collector.LiveSessions: 40, collector.SessionsInCall: 12})
	decode := []lender.Instance{{Name: "decode-0", CapacityTokens: 800_000, FreeTokens: 700_000, ReservedTokens: 100_000}}
	p := newPolicy(t, Options{})
	l, err := lender.New(lender.Options{})
	require.NoError(t, err)

	plan := p.Lend(Plan{At: t0}, l, snap, 1.9, decode)
	require.NotNil(t, plan.Lending, "cache-first with decode headroom: lending on")
	assert.True(t, plan.Lending.Enabled)
	assert.Equal(t, int64(400_000), plan.Lending.Grants["decode-0"], "min(free − headroom, 0.5 × capacity)")
	assert.Equal(t, uint64(1), plan.Seq, "a plan with only lending is numbered")
	assert.NotEmpty(t, plan.Reasons)

	assert.Nil(t, p.Lend(Plan{At: t0.Add(1)}, l, snap, 1.9, decode).Lending, "no change, nothing planned")
	blind := snapshotOf(map[collector.Signal]float64{collector.CacheCapacity: 1e6})
	assert.Nil(t, p.Lend(Plan{At: t0.Add(2)}, l, blind, 1.9, decode).Lending, "cannot classify: the switch holds")

	var got lender.Decision
	be := BackendLending{Backend: backendFunc(func(d lender.Decision) { got = d })}
	require.NoError(t, be.ApplyLending(context.Background(), *plan.Lending))
	assert.True(t, got.Enabled)
	assert.Equal(t, []lender.Grant{{Instance: "decode-0", Tokens: 400_000}}, got.Grants)
}

type backendFunc func(lender.Decision)

func (f backendFunc) Name() string { return "test" }
func (f backendFunc) Apply(_ context.Context, d lender.Decision) error {
	f(d)
	return nil
}

// TestClassifyIgnoresLentKV: lending moves memory from decode to the cache, so the risk rule must
// read the deployment's own cache; counting the KV lent now made the answer depend on the switch
// it decides (on: the cache looks big, decode-first, off; off: cache-first, on) and the lender
// flapped with its dwell. The 1P1D preset's numbers: a 650K cache, 800K of decode KV of which up
// to 400K lent, 40 live sessions of 25K with half in a call: the cache limit (1.9 × 650K ÷ 25K ≈ 49
// sessions) binds before decode's (800K ÷ 25K ÷ 0.5 = 64), lending or not.
func TestClassifyIgnoresLentKV(t *testing.T) {
	for _, lent := range []float64{0, 200_000, 400_000} {
		snap := snapshotOf(map[collector.Signal]float64{collector.CacheCapacity: 650_000 + lent, collector.DecodeCapacity: 800_000,
			collector.WorkingSet: 1e6, collector.LiveSessions: 40, collector.SessionsInCall: 20})
		snap.Decode = []collector.DecodeInstance{{Name: "decode-0", State: collector.OK, Complete: true,
			CapacityTokens: 800_000, FreeTokens: 800_000 - 300_000 - lent, ReservedTokens: 300_000, LentTokens: lent}}
		cf, why, ok := Classify(snap, 1.9)
		require.True(t, ok)
		assert.True(t, cf, "lent %.0f: %s", lent, why)
	}
}
