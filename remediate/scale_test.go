package remediate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/scaler"
)

// scaleSnapshot is a deployment of one 560K prefill and one 800K decode instance, 60 sessions of
// 20K live, 0.15 arriving a second.
func scaleSnapshot() collector.Snapshot {
	s := snapshotOf(map[collector.Signal]float64{collector.CacheCapacity: 560_000, collector.DecodeCapacity: 800_000,
		collector.WorkingSet: 1.2e6, collector.LiveSessions: 60, collector.SessionsInCall: 30,
		collector.ArrivalRate: 0.15, collector.DecodeReserved: 500_000})
	s.Prefill = []collector.PrefillInstance{{Name: "prefill-0", At: t0, State: collector.OK, Complete: true, CacheTokens: 560_000}}
	s.Decode = []collector.DecodeInstance{{Name: "decode-0", At: t0, State: collector.OK, Complete: true, CapacityTokens: 800_000}}
	return s
}

func scaleAssessment(now time.Time) detector.Assessment {
	a := assess(now, detector.Healthy, 0.95)
	a.Knee.Ratio, a.SessionLifetime, a.Lambda, a.SettledLambda = 1.25, 400, 0.15, 0.15
	return a
}

func TestNeedInputsFrom(t *testing.T) {
	a := scaleAssessment(t0)
	a.Lambda, a.SettledLambda, a.SettledLambdaSD, a.MeanContext = 0.3, 0.2, 0.01, 21_000
	p := newPolicy(t, Options{})
	in, err := p.NeedInputsFrom(scaleSnapshot(), a)
	require.NoError(t, err)
	assert.Equal(t, scaler.NeedInputs{Arrivals: 0.2, ArrivalsSD: 0.01, MeanContext: 21_000, Lifetime: 400 * time.Second,
		LiveSessions: 60, WorkingSet: 1.2e6, ServedFraction: 0.5, KneeRatio: 1.25, PrefillCache: 560_000, DecodeKV: 800_000,
		CacheCapacity: 560_000, DecodeReserved: 500_000, Prefill: 1, Decode: 1, ServedKnown: true}, in,
		"the settled λ (neither the windowed rate nor the λ started at its first reading) is the rate to serve, with its noise and the smoothed mean context")

	// The detector's smoothed served fraction, once it has one, over the instant's (30 of 60);
	// a smoothed 0 is a reading too.
	for _, served := range []float64{0.2, 0} {
		a.ServedFraction = &served
		in, err = p.NeedInputsFrom(scaleSnapshot(), a)
		require.NoError(t, err)
		assert.Equal(t, served, in.ServedFraction)
		assert.True(t, in.ServedKnown)
	}
	a.ServedFraction = nil

	// Off the plateau: the hit rate a reading, more than the policy's plateau_tolerance (0.03
	// by default) under the plateau — the budget rules' own reading of it.
	wide := newPolicy(t, Options{PlateauTolerance: 0.04, LeaveDrop: 0.08})
	for _, tc := range []struct {
		p      *Policy
		hit    float64
		enough bool
		off    bool
	}{{p, 0.95, true, false}, {p, 0.94, true, false}, {p, 0.92, true, true}, {wide, 0.92, true, false},
		{p, 0.90, true, true}, {p, 0.90, false, false}} {
		a := a
		a.Plateau, a.HitRate, a.HitEvidence.Enough = 0.96, tc.hit, tc.enough
		in, err := tc.p.NeedInputsFrom(scaleSnapshot(), a)
		require.NoError(t, err)
		assert.Equal(t, tc.off, in.OffPlateau, "hit %.2f against plateau 0.96 within %.2f, a reading %t",
			tc.hit, tc.p.Options().PlateauTolerance, tc.enough)
	}

	s := scaleSnapshot()
	s.Prefill[0].State = collector.Stale
	s.Signals[collector.DecodeReserved] = collector.Value{State: collector.Missing}
	_, err = p.NeedInputsFrom(s, a)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "decode_reserved_tokens missing")
	assert.Contains(t, err.Error(), "no prefill instance read")
}

// scaleRecorder is a scaler backend that records what it is asked.
type scaleRecorder struct {
	got  []scaler.Request
	fail error
}

func (r *scaleRecorder) Name() string { return "recorder" }
func (r *scaleRecorder) Apply(_ context.Context, q scaler.Request) error {
	r.got = append(r.got, q)
	return r.fail
}
func (r *scaleRecorder) Current(context.Context, scaler.Role) (scaler.Count, bool, error) {
	return scaler.Count{}, false, nil
}

// TestLoopScales: with a Scaler the loop's step sizes the deployment, plans the scale-out, audits
// it (intent, then outcome) and applies it through the backend; in a dry run it audits and
// applies nothing; without a Scaler it only sizes.
func TestLoopScales(t *testing.T) {
	for _, tc := range []struct {
		name       string
		scale      bool
		dryRun     bool
		fail       error
		applied    []scaler.Request
		phases     []Phase
		planScaled bool
	}{
		{name: "scales out through the backend", scale: true,
			applied: []scaler.Request{{Deployment: "d", Role: scaler.RolePrefill, Replicas: 3, Seq: 1}, {Deployment: "d", Role: scaler.RoleDecode, Replicas: 2, Seq: 1}},
			phases:  []Phase{PhaseIntent, PhaseDone}, planScaled: true},
		{name: "dry run: audited, not applied", scale: true, dryRun: true, phases: []Phase{PhaseDryRun}, planScaled: true},
		{name: "a failed apply is recorded failed", scale: true, fail: errors.New("quota exceeded"),
			applied: []scaler.Request{{Deployment: "d", Role: scaler.RolePrefill, Replicas: 3, Seq: 1}, {Deployment: "d", Role: scaler.RoleDecode, Replicas: 2, Seq: 1}},
			phases:  []Phase{PhaseIntent, PhaseFailed}, planScaled: true},
		{name: "no scaler: not scaled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			audit := openAudit(t, filepath.Join(t.TempDir(), "audit.jsonl"))
			rec := &scaleRecorder{fail: tc.fail}
			ex, err := NewExecutor(ExecutorOptions{Audit: audit, DryRun: tc.dryRun, Scaling: BackendScaling{Backend: rec, Deployment: "d"}})
			require.NoError(t, err)
			loop, err := NewLoop(newPolicy(t, Options{}), nil, ex)
			require.NoError(t, err)
			if tc.scale {
				loop.Scaler, err = scaler.New(scaler.Options{Roles: scaler.Roles(), Ceiling: map[scaler.Role]int{scaler.RolePrefill: 8, scaler.RoleDecode: 8}})
				require.NoError(t, err)
			}
			res := loop.Step(context.Background(), StepInputs{Inputs: Inputs{At: t0, Assessment: scaleAssessment(t0), DryRun: tc.dryRun},
				Snapshot: scaleSnapshot()}, nil)
			assert.Equal(t, tc.planScaled, res.Plan.Scale != nil, "%q", res.Plan.Reasons)
			require.Equal(t, tc.scale, res.Scale != nil)
			if res.Scale != nil {
				// 0.15/s × 400 s = 60 sessions, 90 with the spike: 1.8M ÷ 700K → 3 prefill; 900K ÷ 720K → 2 decode.
				assert.Equal(t, 3, res.Scale.Need.Prefill)
				assert.Equal(t, 2, res.Scale.Need.Decode)
			}
			for i := range rec.got {
				assert.Contains(t, rec.got[i].Reason, "basin plan 1")
				rec.got[i].Reason = ""
			}
			assert.Equal(t, tc.applied, rec.got)
			var phases []Phase
			for _, r := range audit.Records(0) {
				if r.Kind == "scale" {
					phases = append(phases, r.Phase)
					assert.Equal(t, "scale prefill 1 → 3, decode 1 → 2", r.Change())
				}
			}
			assert.Equal(t, tc.phases, phases)
		})
	}
}

// TestLoopScaleBlind: a step without a reading the sizing needs says so and scales nothing.
func TestLoopScaleBlind(t *testing.T) {
	rec := &scaleRecorder{}
	ex, err := NewExecutor(ExecutorOptions{Audit: NewMemoryAudit(), Scaling: BackendScaling{Backend: rec}})
	require.NoError(t, err)
	loop, err := NewLoop(newPolicy(t, Options{}), nil, ex)
	require.NoError(t, err)
	loop.Scaler, err = scaler.New(scaler.Options{Roles: scaler.Roles(), Ceiling: map[scaler.Role]int{scaler.RolePrefill: 8, scaler.RoleDecode: 8}})
	require.NoError(t, err)
	s := scaleSnapshot()
	s.Decode = nil
	res := loop.Step(context.Background(), StepInputs{Inputs: Inputs{At: t0, Assessment: scaleAssessment(t0)}, Snapshot: s}, nil)
	assert.Nil(t, res.Scale)
	assert.Nil(t, res.Plan.Scale)
	assert.Empty(t, rec.got)
}

// TestSizeFrom: the sizing the daemon exports is Size on the step's readings.
func TestSizeFrom(t *testing.T) {
	p := newPolicy(t, Options{})
	n, err := p.SizeFrom(scaleSnapshot(), scaleAssessment(t0), scaler.NeedOptions{}, 0)
	require.NoError(t, err)
	assert.Equal(t, 3, n.Prefill)
	assert.Equal(t, 2, n.Decode)
	assert.Equal(t, detector.CacheFirst, n.Binding)
	_, err = p.SizeFrom(collector.Snapshot{}, scaleAssessment(t0), scaler.NeedOptions{}, 0)
	assert.Error(t, err)

	// One prefill instance and three decode lending 1.2M (scaler's TestSize, "only the decode
	// instances kept lend"): with the decode pool scaled down to its need (kept 1), the third
	// decode instance's KV goes, and the spike needs a second prefill instance.
	s := scaleSnapshot()
	s.Signals[collector.CacheCapacity] = collector.Value{V: 560_000 + 1_200_000, State: collector.OK, At: t0}
	for i := 1; i < 3; i++ {
		s.Decode = append(s.Decode, collector.DecodeInstance{Name: fmt.Sprintf("decode-%d", i), At: t0, State: collector.OK, Complete: true, CapacityTokens: 800_000})
	}
	for kept, want := range map[int]int{0: 1, 1: 2} {
		n, err := p.SizeFrom(s, scaleAssessment(t0), scaler.NeedOptions{}, kept)
		require.NoError(t, err)
		assert.Equal(t, want, n.Prefill, "decode kept %d: %q", kept, n.Reasons)
	}
}

// TestReconcileAppliesScaleAgain: a scale intent a crash left without its outcome is applied again
// on restart (the backends are level-triggered) and recorded done, reconciled.
func TestReconcileAppliesScaleAgain(t *testing.T) {
	audit := NewMemoryAudit()
	plan := ScalePlan{Changes: []scaler.Change{{Role: scaler.RoleDecode, From: 1, To: 2}}}
	require.NoError(t, audit.Append(context.Background(), Record{Seq: 7, At: t0, Kind: "scale", Phase: PhaseIntent, Scale: &plan}))
	rec := &scaleRecorder{}
	ex, err := NewExecutor(ExecutorOptions{Audit: audit, Scaling: BackendScaling{Backend: rec, Deployment: "d"}})
	require.NoError(t, err)
	require.NoError(t, ex.Reconcile(context.Background(), t0.Add(time.Minute), Observed{}))
	require.Len(t, rec.got, 1)
	assert.Equal(t, 2, rec.got[0].Replicas)
	assert.EqualValues(t, 7, rec.got[0].Seq)
	assert.Empty(t, audit.Pending())
	recs := audit.Records(0)
	assert.True(t, recs[len(recs)-1].Reconciled)
}
