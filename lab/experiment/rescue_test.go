package experiment

import (
	"bytes"
	"github.com/basin-dev/basin/sim/harness"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

func TestCollapseStart(t *testing.T) {
	tl := func(hits ...float64) []sim.Minute {
		out := make([]sim.Minute, len(hits))
		for i, h := range hits {
			out[i].HitRate = h
		}
		return out
	}
	cases := []struct {
		name string
		tl   []sim.Minute
		want int
	}{
		{"healthy", tl(0.9, 0.9, 0.9, 0.9, 0.9, 0.9), -1},
		{"four low minutes are not a collapse", tl(0.9, 0.3, 0.3, 0.3, 0.3, 0.9, 0.9), -1},
		{"the first of five", tl(0.9, 0.3, 0.9, 0.4, 0.3, 0.3, 0.3, 0.2, 0.9), 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, collapseStart(tc.tl))
			assert.Equal(t, tc.want >= 0, Collapsed(tc.tl))
		})
	}
}

// TestActingFromNeverIsTheEvaluatedRun: with the daemon never acting, the re-run is minute for
// minute the detector evaluation's run of the same seed — the warning times measured there are
// the warning times of the run the rescue is searched on.
func TestActingFromNeverIsTheEvaluatedRun(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	const name = "paper-1p1d-h100-spike"
	sc, err := scenario.Load(name)
	require.NoError(t, err)
	cal, err := harness.Calibrate(sc.WithoutSpikes(), harness.Epoch)
	require.NoError(t, err)
	sc.Seed = 2
	o, err := sc.Options("")
	require.NoError(t, err)
	require.NoError(t, harness.Observe(&o, detector.Options{Calibration: cal}))
	s, err := sim.New(o)
	require.NoError(t, err)
	want := s.Run().Timeline

	got, err := rerun(name, 2, cal, ActDaemon, math.MaxInt64)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for i := range want {
		assert.Equal(t, want[i].LiveSessions, got[i].LiveSessions, "minute %d", i)
		assert.Equal(t, want[i].HitTokens, got[i].HitTokens, "minute %d", i)
	}

	// Acting from the start changes the run: admission takes over.
	early, err := rerun(name, 2, cal, ActDaemon, 0)
	require.NoError(t, err)
	assert.True(t, Collapsed(want))
	assert.False(t, Collapsed(early), "basin acting from the start avoids the +100% collapse of this seed")
}

// TestBudgetCut: the budget cut sets the gateway's budget once, at the first step from its minute,
// to the policy's incident fraction of its B_ref, and made early it avoids the +100% collapse of a
// seed that collapses with nothing done.
func TestBudgetCut(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	const name = "paper-1p1d-h100-spike"
	sc, err := scenario.Load(name)
	require.NoError(t, err)
	cal, err := harness.Calibrate(sc.WithoutSpikes(), harness.Epoch)
	require.NoError(t, err)
	sc.Seed = 2
	o, err := sc.Options("")
	require.NoError(t, err)
	core, err := admission.New(admission.Options{CountOnly: true})
	require.NoError(t, err)
	g := harness.NewGate(core, func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) })
	o.Gate = g
	require.NoError(t, attachBudgetCut(&o, g, detector.Options{Calibration: cal}, 10*time.Minute))
	var before admission.Snapshot
	cutAt := o.Controller.Tick
	o.Controller.Tick = func(d time.Duration, c sim.Control) {
		if d == 10*time.Minute-harness.ObserveEvery {
			before = g.Core().Snapshot(harness.Epoch.Add(d), false)
		}
		cutAt(d, c)
	}
	s, err := sim.New(o)
	require.NoError(t, err)
	tl := s.Run().Timeline
	assert.True(t, before.CountOnly, "nothing is cut before the minute")
	after := g.Core().Snapshot(harness.Epoch.Add(time.Hour), false)
	require.False(t, after.CountOnly, "the cut takes admission over")
	require.Positive(t, after.ReferenceBudget)
	assert.InDelta(t, remediate.DefaultIncidentFraction, float64(after.Budget)/float64(after.ReferenceBudget), 1e-6)
	assert.False(t, Collapsed(tl), "a budget cut at minute 10 avoids the +100% collapse of this seed")

	never, err := rerun(name, 2, cal, CutBudget, math.MaxInt64)
	require.NoError(t, err)
	assert.True(t, Collapsed(never), "never cut, the seed collapses")
}

// TestLastRescue bisects one collapsed run for each intervention: the minute found avoids the
// collapse, every later minute tried does not, and it lies before the collapse is complete.
func TestLastRescue(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	if raceEnabled {
		t.Skip("some thirty simulated runs, sequential: the plain pass covers them")
	}
	runs, err := EvaluateDetector([]string{"paper-1p1d-h100-spike"}, []uint64{2})
	require.NoError(t, err)
	require.True(t, runs[0].Collapsed)
	rs, err := LastRescues(runs, []string{"paper-1p1d-h100-spike"}, nil)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	r := rs[0]
	// Started late, holds on, the daemon gets this run out at every offset.
	require.Len(t, r.LateActs, len(LateActOffsets))
	for i, la := range r.LateActs {
		assert.Equal(t, r.CollapseMin+LateActOffsets[i], la.ActAtMin)
		if assert.NotNil(t, la.RecoveredAfterMin, "acting at %.0f", la.ActAtMin) {
			t.Logf("acting at %.0f: recovered after %.0f minutes", la.ActAtMin, *la.RecoveredAfterMin)
		}
	}
	for _, iv := range []struct {
		name  string
		last  *float64
		tries []RescueTry
	}{{"daemon", r.LastRescueMin, r.Tries}, {"budget cut", r.LastCutMin, r.CutTries}} {
		t.Run(iv.name, func(t *testing.T) {
			require.NotNil(t, iv.last)
			last := *iv.last
			assert.Greater(t, last, 15.0, "the spike starts at minute 15: acting then still helps")
			assert.LessOrEqual(t, last, r.CollapseMin+5)
			for _, tr := range iv.tries {
				if tr.ActFromMin <= last {
					assert.False(t, tr.Collapsed, "acting from %.2f", tr.ActFromMin)
				} else {
					assert.True(t, tr.Collapsed, "acting from %.2f", tr.ActFromMin)
				}
			}
			// The bracket is closed to RescueResolution by a try that collapsed.
			closest := math.Inf(1)
			for _, tr := range iv.tries {
				if tr.Collapsed {
					closest = min(closest, tr.ActFromMin)
				}
			}
			assert.LessOrEqual(t, closest-last, RescueResolution)
		})
	}
}

func TestRescueMarkdownTargets(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	at := func(min float64, reasons ...string) detector.Transition {
		return detector.Transition{From: detector.Healthy, To: detector.Pressure,
			At: harness.Epoch.Add(time.Duration(min * float64(time.Minute))), Reasons: reasons}
	}
	runs := []DetectionRun{
		{Scenario: "s-spike", Seed: 1, Collapsed: true, SpikeStartMin: f(15), Obs: &harness.Observation{FirstWarningMin: f(16), UtilisationFirstMin: f(24),
			Transitions: []detector.Transition{at(9, "W/C 1.10 ≥ 0.80 × knee"), at(16, "arrivals 16.00/min > peak completion rate 11.86/min")}}},
		{Scenario: "s-spike", Seed: 2, Collapsed: true, SpikeStartMin: f(15), Obs: &harness.Observation{FirstWarningMin: f(14), UtilisationFirstMin: f(19),
			Transitions: []detector.Transition{at(14, "W/C 1.10 ≥ 0.80 × knee", "arrivals 6.00/min > peak completion rate 5.38/min")}}},
		{Scenario: "s-spike", Seed: 3, Collapsed: true, SpikeStartMin: f(15), Obs: &harness.Observation{FirstWarningMin: f(18)}},
	}
	rescues := []Rescue{
		{Scenario: "s-spike", Seed: 1, CollapseMin: 25, LastRescueMin: f(22), LastCutMin: f(17.5), FirstWarningMin: f(16), UtilisationFirstMin: f(24),
			LateActs: []LateAct{{ActAtMin: 30, RecoveredAfterMin: f(2)}, {ActAtMin: 40, RecoveredAfterMin: f(16)}, {ActAtMin: 55}}},
		{Scenario: "s-spike", Seed: 2, CollapseMin: 22, LastRescueMin: f(15), LastCutMin: f(17), FirstWarningMin: f(14), UtilisationFirstMin: f(19)},
		{Scenario: "s-spike", Seed: 3, CollapseMin: 30, FirstWarningMin: f(18)},
	}
	var b bytes.Buffer
	require.NoError(t, RescueMarkdown(&b, rescues, runs))
	out := b.String()
	assert.Contains(t, out, "| s-spike | 1 | 16.0 | arrivals > peak | +1.0 | 24.0 | 8.0 | 25 | 22.0 | 6.0 | 17.5 | 1.5 | +5: 2, +15: **16** ✗, +30: **never** ✗ |")
	assert.Contains(t, out, "1 of 3 late starts got the deployment out within 15 minutes; still failing to rescue: s-spike seed 1 at 40, s-spike seed 1 at 55.")
	assert.Contains(t, out, "| s-spike | 2 | 14.0 | working set + arrivals > peak | -1.0 | 19.0 | 5.0 | 22 | 15.0 | 1.0 | 17.0 | 3.0 |")
	assert.Contains(t, out, "| s-spike | 3 | 18.0 | — | +3.0 | — | no alert | 30 | none | — | none | — |")
	// The daemon: seed 1 is warned 6 minutes ahead, seed 2 only 1. The budget cut: seed 1 only
	// 1.5, seed 2 3. Seed 3 has neither rescue time; leads 8, 5, +Inf.
	assert.Contains(t, out, "over 3 collapsed +100% runs: warned at least 2 minutes before the last rescue time in 1 with the daemon and 1 with the budget cut")
	assert.Contains(t, out, "did not avoid the collapse — 1 and 1)")
	assert.Contains(t, out, "ahead of the first utilisation alert in 3 ")
	assert.Contains(t, out, "median lead 8.0 minutes")
	// The bound, over seeds 1 and 2 (seed 3 has no alert): warnings +1 and −1 minute after the
	// spike, alerts +9 and +4. Warned at the spike's start: leads 9 and 5 (seed 2 keeps its earlier
	// warning, lead 5); half a minute after: 8.5 and 5; a minute after: 8 and 5.
	assert.Contains(t, out, "over the 2 of them with a warning and a utilisation alert: the first warning came -1.0 / 0.0 / 1.0 minutes after the spike began (quartiles; 1 before it")
	assert.Contains(t, out, "the first utilisation alert 4.0 / 6.5 / 9.0 minutes after it (earliest 4.0)")
	assert.Contains(t, out, "Warned by: arrivals > peak 1, working set + arrivals > peak 1.")
	assert.Contains(t, out, "median lead of 7.0 minutes; half a minute after it 6.8, one minute after it 6.5.")
}
