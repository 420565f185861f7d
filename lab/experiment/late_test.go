package experiment

import (
	"bytes"
	"github.com/basin-dev/basin/sim/harness"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// On the Basin paper's trap, a daemon that starts acting at minute 30 gets the deployment out
// within minutes with holds, and not without them (the baseline: 43–46 minutes on these
// seeds); the hold never cuts a session nor holds a call past its bound.
func TestActingLateWithHolds(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	if testing.Short() {
		t.Skip("runs the simulator for minutes of virtual time")
	}
	sc, err := scenario.Load("paper-1p1d-h100-spike")
	require.NoError(t, err)
	sc.Seed = 41
	cal, err := harness.Calibrate(sc.WithoutSpikes(), harness.Epoch)
	require.NoError(t, err)
	run := func(holds bool) *LateResult {
		r, err := RunLate(sc, LateOptions{ActAt: 30 * time.Minute, Duration: 100 * time.Minute, Calibration: cal,
			Remediate: remediate.Options{DisableHolds: !holds}})
		require.NoError(t, err)
		return r
	}
	off, on := run(false), run(true)

	assert.Zero(t, off.HeldSessionsMax, "holds off: nothing held")
	assert.Zero(t, off.CallsHeld)
	require.NotNil(t, off.RecoveredMin)
	assert.Greater(t, *off.RecoveredMin-30, 15.0, "without holds the trap outlasts 15 minutes of acting")

	assert.Positive(t, on.HeldSessionsMax, "holds engaged")
	require.NotNil(t, on.RecoveredMin)
	assert.LessOrEqual(t, *on.RecoveredMin-30, 5.0, "holds get the deployment out within minutes")
	require.NotNil(t, on.GoodputRatio)
	require.NotNil(t, off.GoodputRatio)
	assert.Greater(t, *on.GoodputRatio, *off.GoodputRatio, "and serve more of the sessions arriving after acting")
	assert.GreaterOrEqual(t, *on.GoodputRatio, 0.9)
	assert.Zero(t, on.AdmittedCut)
	assert.Positive(t, on.HoldBoundReleases, "this trap is deep enough that some held calls reach the bound")
	assert.LessOrEqual(t, on.HeldCallMaxSeconds, admission.DefaultHoldBound.Seconds()+harness.ObserveEvery.Seconds())
}

func TestRecoveredFrom(t *testing.T) {
	mk := func(hits ...float64) []sim.Minute {
		tl := make([]sim.Minute, len(hits))
		for i, h := range hits {
			tl[i] = sim.Minute{Minute: i, PromptTokens: 100, HitTokens: 100 * h}
		}
		return tl
	}
	for _, tc := range []struct {
		name string
		tl   []sim.Minute
		from time.Duration
		want *float64
	}{
		{"never", mk(0.3, 0.3, 0.9, 0.9, 0.9, 0.9), 0, nil},
		{"five good minutes", mk(0.3, 0.9, 0.9, 0.9, 0.9, 0.9), 0, ptrOf(1)},
		{"token-weighted window", mk(0.3, 0.99, 0.99, 0.99, 0.99, 0.5), 0, ptrOf(0)},
		{"not before acting", mk(0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9), 90 * time.Second, ptrOf(2)},
		{"a window past the end does not count", mk(0.3, 0.3, 0.9, 0.9, 0.9), 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, recoveredFrom(tc.tl, tc.from))
		})
	}
}

func TestLateMarkdownNamesMisses(t *testing.T) {
	never := &LateResult{Result: &sim.Result{}, ActAtMin: 60, HeldSessionsMax: 3}
	fast := &LateResult{Result: &sim.Result{GoodputRatio: ptrOf(1), FirstCallWaitP50: ptrOf(0)}, ActAtMin: 25,
		RecoveredMin: ptrOf(26), HeldSessionsMax: 5, HeldCallMaxSeconds: 100}
	t1 := &LateTable{Options: LateTableOptions{Seeds: []uint64{41}, Duration: 150 * time.Minute}}
	def := admission.DefaultHoldBound.Seconds()
	for _, r := range []LateRow{{Scenario: "paper-1p1d-h100-spike", ActAtMin: 25, Holds: true, HoldBoundSeconds: def, Results: []*LateResult{fast}},
		{Scenario: "paper-1p3d-h200-spike", ActAtMin: 60, Holds: true, HoldBoundSeconds: def, Results: []*LateResult{never}},
		// A longer bound's row is shown but not held to the targets: it would miss none here.
		{Scenario: "paper-1p3d-h200-spike", ActAtMin: 60, Holds: true, HoldBoundSeconds: 480, Results: []*LateResult{fast}},
		{Scenario: "paper-1p1d-h100-spike", ActAtMin: 25, Holds: true, HoldBoundSeconds: def, StartDeadlineSeconds: 300,
			Results: []*LateResult{{Result: &sim.Result{GoodputRatio: ptrOf(0.97), FirstCallWaitP50: ptrOf(0)}, ActAtMin: 25,
				RecoveredMin: ptrOf(26), TooLate: 7}}}} {
		r.aggregate(150 * time.Minute)
		t1.Rows = append(t1.Rows, r)
	}
	var b bytes.Buffer
	require.NoError(t, WriteLateMarkdown(&b, t1))
	out := b.String()
	assert.Contains(t, out, "| 1P1D H100 | 0.00 | 25 | **on**, 4m0s bound | 5 | 1/1 | 1/1 | 1 (1–1) | 1.00 (1.00) | 0 |")
	assert.Contains(t, out, "| 1P3D H200 | 0.00 | 60 | on, 8m0s bound | 5 | 1/1 | 1/1 |")
	assert.Contains(t, out, "every run recovered within 15 minutes of acting: **not met**, 1 of 2 runs; short: 1P3D H200 at 60 (0/1)")
	assert.Contains(t, out, "1P3D H200 at 60: — < 0.75")
	assert.Contains(t, out, "no admitted session refused or cut: met, 0 cut")
	assert.Contains(t, out, "Where the default bound falls short: 1P3D H200 acting at 60: up to 3 sessions held")
	assert.Contains(t, out, "; with a 8m0s bound, 0 releases and 1/1 runs out within 15 minutes (median 1 minutes, goodput ÷ twin 1.00)")
	assert.Contains(t, out, "Refusing early (`admission.start_deadline`, the rows that name it) against holds alone on the same runs: "+
		"1P1D H100 at 25: goodput ÷ twin 1.00 → 0.97, first-call wait p50 0 s → 0 s, 7 refused.")
	assert.Contains(t, out, "| 1P1D H100 | 0.00 | 25 | on, 4m0s bound, refusing what cannot start within 5m0s |")
}
