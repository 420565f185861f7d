package experiment

import (
	"bytes"
	"encoding/json"
	"github.com/basin-dev/basin/sim/harness"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim"
)

func TestMatrixExpansion(t *testing.T) {
	cals := map[string]*detector.Calibration{
		"1p1d/gpu/terminal-bench":  {PeakCompletionRatePerS: 5.0 / 60},
		"1p1d/host/terminal-bench": {PeakCompletionRatePerS: 10.0 / 60},
	}
	cases := []struct {
		name    string
		spec    MatrixSpec
		rows    int
		perMin  []float64 // the first rows' base rates
		spikes  []float64
		tiers   []Tier
		twinsOK bool
	}{
		{"load is a fraction of the row's own peak", MatrixSpec{Loads: []float64{0.5, 1.2}, Spikes: []float64{0, 3},
			Tiers: []Tier{TierGPU}, Deployments: []string{"1p1d"}, Workloads: []string{"terminal-bench"}},
			4, []float64{2.5, 2.5, 6, 6}, []float64{0, 3, 0, 3}, []Tier{TierGPU, TierGPU, TierGPU, TierGPU}, true},
		{"host rows use HiCache's peak", MatrixSpec{Loads: []float64{0.8}, Spikes: []float64{0},
			Tiers: []Tier{TierGPU, TierHost}, Deployments: []string{"1p1d"}, Workloads: []string{"terminal-bench"}},
			2, []float64{4, 8}, []float64{0, 0}, []Tier{TierGPU, TierHost}, true},
		{"the spike-free twin is added and spikes sorted", MatrixSpec{Loads: []float64{1}, Spikes: []float64{3, 1},
			Tiers: []Tier{TierGPU}, Deployments: []string{"1p1d"}, Workloads: []string{"terminal-bench"}},
			3, []float64{5, 5, 5}, []float64{0, 1, 3}, []Tier{TierGPU, TierGPU, TierGPU}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rows := tc.spec.expand(cals)
			require.Len(t, rows, tc.rows)
			m := &MatrixResult{Rows: rows}
			for i, r := range rows {
				assert.InDelta(t, tc.perMin[i], r.ArrivalsPerMin, 1e-9, "row %d", i)
				assert.InDelta(t, tc.perMin[i]*60, r.ArrivalsPerHour(), 1e-9)
				assert.InDelta(t, tc.perMin[i]*60*(1+r.Spike), r.SpikeArrivalsPerHour(), 1e-9)
				assert.InDelta(t, r.Load, r.ArrivalsPerMin/r.PeakPerMin, 1e-9)
				assert.Equal(t, tc.spikes[i], r.Spike)
				assert.Equal(t, tc.tiers[i], r.Tier)
				tw := m.twin(i)
				require.GreaterOrEqual(t, tw, 0)
				assert.Zero(t, rows[tw].Spike)
				assert.Equal(t, r.Load, rows[tw].Load)
			}
		})
	}
}

func TestMatrixScenarioIsTheRow(t *testing.T) {
	g := MatrixGroup{Deployment: "1p3d", Tier: TierHost, Workload: "swebench-pro"}
	sc, err := matrixScenario(g, 1.5, 3, 0)
	require.NoError(t, err)
	dep, err := sim.DeploymentPreset("paper-1p3d-h200")
	require.NoError(t, err)
	assert.Equal(t, 2*dep.Prefill.CacheTokens, sc.Deployment.Prefill.HostCacheTokens, "host tier twice the GPU pool")
	assert.Equal(t, 1.5, sc.Arrivals.RatePerMin)
	require.Len(t, sc.Arrivals.Spikes, 1)
	assert.Equal(t, 4.0, sc.Arrivals.Spikes[0].Multiplier)
	assert.Equal(t, "swebench-pro", sc.Workload.Kind)
	gpu, err := matrixScenario(MatrixGroup{Deployment: "1p3d", Tier: TierGPU, Workload: "swebench-pro"}, 1.5, 0, 0)
	require.NoError(t, err)
	assert.Zero(t, gpu.Deployment.Prefill.HostCacheTokens)
	assert.False(t, gpu.HasSpikes())

	long, err := matrixScenario(g, 1.5, 3, 4*time.Hour)
	require.NoError(t, err)
	assert.Equal(t, matrixMeasureFrom, time.Duration(long.Measure.From), "the long window starts where the standard one does")
	assert.Equal(t, matrixMeasureFrom+4*time.Hour, time.Duration(long.Measure.To))
	assert.Equal(t, time.Duration(long.Measure.To)+matrixDuration-matrixMeasureTo, time.Duration(long.Duration))
	assert.Equal(t, sc.Arrivals.Spikes, long.Arrivals.Spikes, "the same spike")
}

func TestMatrixSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*MatrixSpec)
	}{
		{"loads", func(s *MatrixSpec) { s.Loads = []float64{0} }},
		{"spikes", func(s *MatrixSpec) { s.Spikes = []float64{-1} }},
		{"tiers", func(s *MatrixSpec) { s.Tiers = []Tier{"nvme"} }},
		{"deployments", func(s *MatrixSpec) { s.Deployments = []string{"2p2d"} }},
		{"workloads", func(s *MatrixSpec) { s.Workloads = []string{"chat"} }},
		{"seeds", func(s *MatrixSpec) { s.Seeds = nil }},
		{"policies", func(s *MatrixSpec) { s.Policies = []string{"hicache"} }},
		{"policies", func(s *MatrixSpec) { s.Policies = []string{"magic"} }},
		{"workers", func(s *MatrixSpec) { s.Workers = 0 }},
		{"long-window", func(s *MatrixSpec) { s.LongWindow = -time.Hour }},
		{"long-window", func(s *MatrixSpec) { s.LongWindow = time.Second }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			s := DefaultMatrix()
			require.NoError(t, s.Validate())
			tc.edit(&s)
			assert.ErrorContains(t, s.Validate(), tc.field+":")
		})
	}
}

// fakeMatrix builds a result by hand: one cache-first row group, a spike-free row and a +300% row
// at load 1.2, with goodputs per policy and seed.
func fakeMatrix(good map[string][2][]float64) *MatrixResult {
	spec := MatrixSpec{Loads: []float64{1.2}, Spikes: []float64{0, 3}, Tiers: []Tier{TierGPU}, Deployments: []string{"1p3d"},
		Workloads: []string{"terminal-bench"}, Seeds: []uint64{1, 2},
		Policies: []string{EnginePolicy, string(sim.PolicyContinuum), harness.Basin}, Workers: 1}
	m := &MatrixResult{Spec: spec, Calibrations: map[string]*detector.Calibration{
		"1p3d/gpu/terminal-bench": {PeakCompletionRatePerS: 0.1, KneeRatio: 1.3}}}
	m.Rows = spec.expand(m.Calibrations)
	for r := range m.Rows {
		for _, p := range spec.Policies {
			c := MatrixCell{Row: r, Policy: p}
			for k, seed := range spec.Seeds {
				wait := 0.0
				if p == string(sim.PolicyContinuum) {
					wait = 200
				}
				c.Runs = append(c.Runs, MatrixRun{Seed: seed, Result: &sim.Result{GoodputPerHour: good[p][r][k],
					FirstCallWaitP50: &wait}})
			}
			m.Cells = append(m.Cells, c)
		}
	}
	m.fillRatios()
	return m
}

func TestMatrixTargets(t *testing.T) {
	m := fakeMatrix(map[string][2][]float64{
		EnginePolicy:  {{100, 100}, {0, 0}},
		"continuum":   {{100, 100}, {50, 0}},
		harness.Basin: {{100, 100}, {90, 0}},
	})
	checks := map[string]RowCheck{}
	for _, c := range m.Checks(1) {
		checks[c.Name] = c
	}
	require.Contains(t, checks, "÷ best")
	assert.InDelta(t, 1, checks["÷ best"].Worst, 1e-9, "seed 2: 0 against 0 is a tie, seed 1: 90/50")
	assert.True(t, checks["÷ best"].OK)
	assert.InDelta(t, 1, checks["÷ continuum"].Worst, 1e-9)
	assert.False(t, checks["÷ continuum"].OK, "a tie at zero is not 1.2×")
	assert.NotContains(t, checks, "÷ no spike", "only +100% rows")
	assert.InDelta(t, 0, checks["wait p50 s"].Worst, 1e-9)
	assert.True(t, checks["wait p50 s"].OK, "continuum waits minutes, basin does not")
	for _, c := range m.Checks(0) {
		assert.NotEqual(t, "÷ continuum", c.Name, "the continuum target is for spiked rows")
	}
	r := m.Cell(1, harness.Basin).Runs[0].Result
	require.NotNil(t, r.GoodputRatio)
	assert.InDelta(t, 0.9, *r.GoodputRatio, 1e-9, "the twin is the spike-free row, same policy and seed")
	assert.True(t, math.IsInf(ratio(1, 0), 1))

	var b bytes.Buffer
	require.NoError(t, MatrixMarkdown(&b, m, "basin sim matrix --test", []string{"plot.svg"}))
	md := b.String()
	for _, want := range []string{"`basin sim matrix --test`", "![goodput against load, per policy](plot.svg)",
		"| 1.20 | +300% | 432 / 1728 |", "÷ continuum 1.00 ✗", "### Where basin misses a target",
		"seed 1: basin 90/h vs continuum 50/h", "1 rows miss at least one target"} {
		assert.Contains(t, md, want)
	}
}

// TestMatrixWhy: each missed target gets its paragraph, with the sweep's numbers, and the long
// re-measurement its table.
func TestMatrixWhy(t *testing.T) {
	m := fakeMatrix(map[string][2][]float64{
		EnginePolicy:  {{100, 100}, {0, 0}},
		"continuum":   {{100, 100}, {50, 45}},
		harness.Basin: {{100, 100}, {90, 40}},
	})
	wait := 300.0
	for k := range m.Cell(1, harness.Basin).Runs {
		r := m.Cell(1, harness.Basin).Runs[k].Result
		r.Sessions.Arrived, r.FirstCallWaitP50 = 100, &wait
		m.Cell(1, harness.Basin).Runs[k].Gate.MaxQueued = 60
	}
	m.Cell(1, harness.Basin).Runs[1].Result.Sessions.Late = 7
	m.Cell(1, string(sim.PolicyContinuum)).Runs[1].Result.Sessions.Late = 3
	m.Long = []LongCheck{{Row: 1, Goodput: map[string][]float64{harness.Basin: {100, 100}, EnginePolicy: {90, 50}, "continuum": {95, 101}}}}
	assert.InDelta(t, 100.0/101, m.Long[0].WorstRatio(), 1e-9)
	m.Spec.LongWindow = 4 * time.Hour

	var b bytes.Buffer
	require.NoError(t, MatrixMarkdown(&b, m, "basin sim matrix --test", nil))
	md := b.String()
	for _, want := range []string{
		"### Why the targets not met are not",
		"falls short of the best baseline on at least one seed in 1 row, by at most 5 good sessions in the hour (11.1% of that seed's 45)",
		"basin lost 7 sessions of the window to lateness or shedding where the baseline lost 3",
		"| 1P3D gpu terminal-bench at load 1.20, spike +300% | 0.889 | 0.990 | 100/h | 98/h |",
		"re-measures these rows over 4 h (minutes 25–265, same seeds)",
		"on every seed in 0 of these 1 rows",
		// continuum served half the arrivals: the target was within reach.
		"In 0 of the 1 cache-first spike rows that miss it", "In the other 1 there was room",
		// 60 queued ÷ 6 per minute (the fake's peak).
		"In 1 of the 1 Terminal-Bench rows that miss it", "at least 4.80× it", "peaked at 10–10 minutes",
	} {
		assert.Contains(t, md, want)
	}
	assert.NotContains(t, md, "≥ 0.9× the no-spike goodput.**", "no +100% row: nothing to explain")
}

// A tiny real sweep: the same output with one worker and with two, the gate's activity recorded,
// and the Markdown and the plot generated from it.
func TestMatrixRunDeterministicAndRendered(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	if testing.Short() {
		t.Skip("runs the simulator")
	}
	spec := MatrixSpec{Loads: []float64{1.2}, Spikes: []float64{3}, Tiers: []Tier{TierGPU}, Deployments: []string{"1p1d"},
		Workloads: []string{"terminal-bench"}, Seeds: []uint64{1}, Policies: []string{EnginePolicy, harness.Basin}, Workers: 1}
	serial, err := RunMatrix(spec, nil)
	require.NoError(t, err)
	spec.Workers = 2
	calls := 0
	parallel, err := RunMatrix(spec, func(done, total int) {
		calls++
		assert.Equal(t, 4, total)
	})
	require.NoError(t, err)
	assert.Equal(t, 4, calls)
	a, err := json.Marshal(serial.Cells)
	require.NoError(t, err)
	b, err := json.Marshal(parallel.Cells)
	require.NoError(t, err)
	assert.JSONEq(t, string(a), string(b), "parallel = serial")

	basin := parallel.Cell(1, harness.Basin).Runs[0]
	assert.Positive(t, basin.Gate.Held, "at 1.2× peak with +300%% basin's gate holds sessions")
	assert.Positive(t, basin.Gate.MaxQueued)
	assert.Zero(t, parallel.Cell(1, EnginePolicy).Runs[0].Gate, "the engine has no gate")
	require.NotNil(t, basin.Result.SlowdownP90)
	assert.GreaterOrEqual(t, *basin.Result.SlowdownP90, *basin.Result.SlowdownP50)

	var md bytes.Buffer
	require.NoError(t, MatrixMarkdown(&md, parallel, "basin sim matrix", nil))
	assert.Contains(t, md.String(), "### 1P1D (decode-first) · GPU only (SGLang default engine) · terminal-bench")
	var svg bytes.Buffer
	require.NoError(t, MatrixPlot(&svg, parallel, "terminal-bench"))
	out := svg.String()
	assert.True(t, strings.HasPrefix(out, "<?xml") || strings.HasPrefix(out, "<svg"), out[:min(80, len(out))])
	for _, want := range []string{"basin", "none / hicache", "1p1d GPU only, spike +300%"} {
		assert.Contains(t, out, want)
	}
	var svg2 bytes.Buffer
	require.NoError(t, MatrixPlot(&svg2, serial, "terminal-bench"))
	assert.Equal(t, out, svg2.String(), "the plot is deterministic")

	// The long re-measurement takes exactly the rows where basin is short of the best baseline on
	// a seed: none here, so a shortfall is made by hand.
	parallel.Spec.LongWindow = 30 * time.Minute
	require.NoError(t, parallel.remeasureLong())
	assert.Empty(t, parallel.Long, "basin is ahead on every row")
	parallel.Cell(1, EnginePolicy).Runs[0].Result.GoodputPerHour = 1e6 // the engine collapses there
	require.NoError(t, parallel.remeasureLong())
	require.Len(t, parallel.Long, 1)
	l := parallel.Long[0]
	assert.Equal(t, 1, l.Row)
	assert.Positive(t, l.Goodput[harness.Basin][0], "re-run, not copied")
	assert.Contains(t, l.Goodput, EnginePolicy)
	assert.NotContains(t, l.Goodput, string(sim.PolicyContinuum), "only the policies the sweep runs")
}
