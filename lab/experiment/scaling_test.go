package experiment

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScalingOutrunsTheAlerts runs the sweep's 1P1D row at 1.5 × its peak and its quiet row (0.5 ×)
// on one seed: basin's scaling asks for instances before the first utilisation alert holds on the
// pools as provisioned, and before the utilisation autoscaler moves; it serves every arrival, which
// the provisioned pools do not; and on the quiet row neither scaling arm adds an instance.
func TestScalingOutrunsTheAlerts(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	spec := DefaultScaling()
	spec.Deployments, spec.Loads, spec.Spikes, spec.Seeds = []string{"1p1d"}, []float64{0.5, 1.5}, []float64{0}, []uint64{1}
	res, err := RunScaling(spec, nil)
	require.NoError(t, err)
	require.Len(t, res.Rows, 2)
	quiet, busy := res.Rows[0], res.Rows[1]

	base, auto, sc := busy.Runs[ArmBasin][0], busy.Runs[ArmAutoscaler][0], busy.Runs[ArmScaling][0]
	require.NotNil(t, base.FirstUtilAlertMin, "the provisioned pools at 1.5 × peak raise a utilisation alert")
	require.NotNil(t, sc.FirstScaleOutMin, "basin scaled out")
	assert.Less(t, *sc.FirstScaleOutMin, *base.FirstUtilAlertMin, "before the first utilisation alert")
	require.NotNil(t, auto.FirstScaleOutMin)
	assert.Less(t, *sc.FirstScaleOutMin, *auto.FirstScaleOutMin, "before the utilisation autoscaler")
	assert.Greater(t, sc.GoodputPerHour, 1.2*base.GoodputPerHour, "more good sessions than the pools as provisioned")
	assert.Nil(t, base.ServesAllMin, "sessions still wait at the end on the provisioned pools")
	assert.NotNil(t, sc.ServesAllMin)
	assert.Nil(t, base.CeilingMin, "sessions arriving at the end still miss their deadline on the provisioned pools")
	if assert.NotNil(t, sc.CeilingMin, "every arrival good from some minute on") && sc.ServesAllMin != nil {
		assert.LessOrEqual(t, *sc.CeilingMin, *sc.ServesAllMin, "nobody waiting implies every arrival good, here")
	}

	for _, arm := range []string{ArmAutoscaler, ArmScaling} {
		r := quiet.Runs[arm][0]
		assert.Equal(t, quiet.Provisioned, [2]int{r.MaxPrefill, r.MaxDecode}, "%s scaled a quiet deployment up", arm)
		assert.Nil(t, r.FirstScaleOutMin, arm)
	}

	var md bytes.Buffer
	require.NoError(t, WriteScalingMarkdown(&md, res))
	assert.Contains(t, md.String(), "| no scale-out on a quiet deployment (load under 1, no spike) | 1 of 1 rows |")
	var svg bytes.Buffer
	require.NoError(t, ScalingPlot(&svg, res))
	assert.Contains(t, svg.String(), "<svg")
}

func TestScalingSpecValidate(t *testing.T) {
	s := DefaultScaling()
	s.Deployments, s.Workload, s.Ceiling, s.Workers, s.Seeds = []string{"2p2d"}, "nope", 1, 0, nil
	s.SecondSpikeFrom = 20 * time.Minute // inside the first spike
	err := s.Validate()
	require.Error(t, err)
	for _, want := range []string{`deployments: "2p2d"`, "workload:", "seeds", "ceiling: 1", "workers: 0", "second spike: from 20m0s"} {
		assert.Contains(t, err.Error(), want)
	}
	for _, tc := range []struct {
		from time.Duration
		ok   bool
	}{{0, true}, {25 * time.Minute, true}, {45 * time.Minute, true}, {75 * time.Minute, true}, {76 * time.Minute, false}} {
		s := DefaultScaling()
		s.SecondSpikeFrom = tc.from
		assert.Equal(t, tc.ok, s.Validate() == nil, "second spike from %v: %v", tc.from, s.Validate())
	}
}

// TestRunTally: the run-by-run comparison counts each seed against the same seed and names the
// rows with a seed below the autoscaler, which the row's medians can hide.
func TestRunTally(t *testing.T) {
	run := func(seed uint64, good, im float64, prefill int) ScalingRun {
		return ScalingRun{Seed: seed, GoodputPerHour: good, InstanceMinutes: im, MaxPrefill: prefill, MaxDecode: 1}
	}
	row := ScalingRow{Deployment: "1p1d", Load: 1.2, Spike: 1, Provisioned: [2]int{1, 1}, Runs: map[string][]ScalingRun{
		ArmScaling:    {run(1, 400, 200, 2), run(2, 400, 260, 3), run(3, 160, 120, 1), run(4, 300, 180, 2)},
		ArmAutoscaler: {run(1, 400, 240, 4), run(2, 400, 250, 5), run(3, 160, 120, 1), run(4, 300, 180, 3)},
	}}
	var tally runTally
	tally.add(row, 60)
	tally.add(ScalingRow{Deployment: "1p3d", Load: 0.5, Provisioned: [2]int{1, 3}, Runs: map[string][]ScalingRun{
		ArmScaling: {run(1, 360, 240, 1)}, ArmAutoscaler: {run(1, 360, 240, 1)},
	}}, 60)
	// Seed 1 above; seed 2 below; seed 3 the same pools; seed 4 equal, both scaled.
	assert.Equal(t, "1 of 5 runs (and equal on 3); below it: 1p1d 1.2 +100%: 1 of 4", tally.String())
}

// TestInstanceHourTally: the row-level comparison names the rows below the autoscaler and keeps
// apart a row equal because neither arm scaled from one equal because the autoscaler gave its
// instances back before the window.
func TestInstanceHourTally(t *testing.T) {
	run := func(seed uint64, good, im float64, prefill int) ScalingRun {
		return ScalingRun{Seed: seed, GoodputPerHour: good, InstanceMinutes: im, MaxPrefill: prefill, MaxDecode: 1}
	}
	row := func(dep string, load float64, sc, auto ScalingRun) ScalingRow {
		return ScalingRow{Deployment: dep, Load: load, Spike: 1, Provisioned: [2]int{1, 1},
			Runs: map[string][]ScalingRun{ArmScaling: {sc}, ArmAutoscaler: {auto}}}
	}
	var tally instanceHourTally
	tally.add(row("1p1d", 1.2, run(1, 400, 200, 2), run(1, 400, 240, 4)), 60) // above
	tally.add(row("1p1d", 1.5, run(1, 400, 260, 3), run(1, 400, 250, 5)), 60) // below
	tally.add(row("1p1d", 0.5, run(1, 160, 120, 1), run(1, 160, 120, 1)), 60) // neither scaled
	tally.add(row("1p3d", 0.5, run(1, 360, 240, 1), run(1, 360, 240, 2)), 60) // the autoscaler's instance gone before the window
	var b strings.Builder
	tally.write(&b)
	assert.Contains(t, b.String(), "| 1 of 4 rows (and equal on 1 where neither scaled, on 1 with the same instance-minutes in the window); below it: 1p1d 1.5 +100% |")
}

// TestScalingCommandsInMakeResults: the commands the scaling sections say generated them are the
// ones `make results` runs.
func TestScalingCommandsInMakeResults(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	for _, c := range []string{ScalingCommand, HeldOutCommand, SecondSpikeCommand} {
		assert.Contains(t, string(mk), "./$(BIN) "+strings.TrimPrefix(c, "basin "), "make results runs %q", c)
	}
}
