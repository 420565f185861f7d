package remediate

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/lender"
)

// TestLoopStep: the step the daemon and the simulator share decides, lends (only with a lender),
// executes, counts an incident once on entry, and persists even a step that acts on nothing.
func TestLoopStep(t *testing.T) {
	cacheFirst := snapshotOf(map[collector.Signal]float64{collector.CacheCapacity: 1e6, collector.DecodeCapacity: 2.4e6,
		collector.WorkingSet: 1e6, collector.LiveSessions: 40, collector.SessionsInCall: 12})
	decode := []lender.Instance{{Name: "decode-0", CapacityTokens: 800_000, FreeTokens: 700_000, ReservedTokens: 100_000}}
	for _, tc := range []struct {
		name      string
		withLend  bool
		states    []detector.State
		incidents []bool // IncidentStarted per step
		lending   bool   // some step switched lending
	}{
		{name: "incident counted once on entry", states: []detector.State{detector.Healthy, detector.Trapped, detector.Trapped, detector.Healthy, detector.Drifting},
			incidents: []bool{false, true, false, false, true}},
		{name: "lending decided only with a lender", withLend: true, states: []detector.State{detector.Healthy, detector.Healthy},
			incidents: []bool{false, false}, lending: true},
		{name: "no lender: no lending", states: []detector.State{detector.Healthy, detector.Healthy},
			incidents: []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			audit := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
			g := &fakeGateway{t: t, audit: audit, budget: 1_000_000}
			var lent []lender.Decision
			ex, err := NewExecutor(ExecutorOptions{Audit: audit, Gateway: g,
				Lending: BackendLending{Backend: backendFunc(func(d lender.Decision) { lent = append(lent, d) })}})
			require.NoError(t, err)
			var l *lender.Lender
			if tc.withLend {
				l, err = lender.New(lender.Options{})
				require.NoError(t, err)
			}
			loop, err := NewLoop(newPolicy(t, Options{}), l, ex)
			require.NoError(t, err)
			saves := 0
			for i, st := range tc.states {
				now := t0.Add(time.Duration(i) * time.Minute)
				in := StepInputs{Inputs: Inputs{At: now, Assessment: assess(now, st, 0.95), GatewayOK: true, Gateway: gw(g.budget, 0)},
					Snapshot: cacheFirst, Decode: decode}
				before := saves
				res := loop.Step(context.Background(), in, func() error { saves++; return nil })
				require.NoError(t, res.Err)
				assert.Equal(t, tc.incidents[i], res.IncidentStarted, "step %d (%s): %q", i, st, res.Plan.Reasons)
				assert.Greater(t, saves, before, "step %d: every step persists, an empty one too", i)
			}
			assert.Equal(t, tc.lending, len(lent) > 0, "lending applied: %v", lent)
		})
	}
}

// TestLoopStepPersistError: a failed save on a step with nothing to do is the step's error, named.
func TestLoopStepPersistError(t *testing.T) {
	audit := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
	ex, err := NewExecutor(ExecutorOptions{Audit: audit})
	require.NoError(t, err)
	loop, err := NewLoop(newPolicy(t, Options{}), nil, ex)
	require.NoError(t, err)
	// No capacity yet: the policy decides nothing.
	res := loop.Step(context.Background(), StepInputs{Inputs: Inputs{At: t0}}, func() error { return errors.New("disk full") })
	require.True(t, res.Plan.Empty())
	require.Error(t, res.Err)
	assert.Equal(t, "saving state: disk full", res.Err.Error())

	_, err = NewLoop(nil, nil, ex)
	assert.ErrorContains(t, err, "Policy")
	_, err = NewLoop(newPolicy(t, Options{}), nil, nil)
	assert.ErrorContains(t, err, "Executor")
}
