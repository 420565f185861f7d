package scenario

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
)

const spikeYAML = `name: tb-spike
seed: 7
duration: 90m
measure: {from: 25m, to: 85m}
deployment:
  preset: paper-1p1d-h100
  prefill: {instances: 1, cache_tokens: 500000, host_cache_tokens: 0}
  decode: {instances: 1, kv_tokens: 500000}
  lending: {enabled: false, max_fraction: 0.5}
workload: {kind: terminal-bench}
arrivals:
  rate_per_min: 3.3
  spikes: [{from: 15m, to: 25m, multiplier: 2.0}]
  extra: [{from: 15m, to: 25m, rate_per_min: 13.2, workload: short, kill_at: 25m}]
slo: {slowdown: 4, tpot_ms: 50, tpot_fraction: 0.95}
`

func TestParseIssueExample(t *testing.T) {
	sc, err := Parse([]byte(spikeYAML))
	require.NoError(t, err)
	assert.Equal(t, "tb-spike", sc.Name)
	assert.Equal(t, uint64(7), sc.Seed)
	d := sc.Deployment.Deployment
	assert.Equal(t, 500_000, d.Prefill.CacheTokens, "the file overrides the preset")
	assert.Equal(t, 500_000, d.Decode.KVTokens)
	assert.Equal(t, 24_000.0, d.Prefill.TokensPerSec, "keys the file omits keep the preset's value")
	assert.Equal(t, 3350.0, d.Decode.HBMGBPerSec, "the preset's decode hardware is kept")
	o, err := sc.Options("")
	require.NoError(t, err)
	require.Len(t, o.Streams, 3)
	assert.Equal(t, "base", o.Streams[0].Class)
	assert.InDelta(t, 3.3, o.Streams[1].RatePerMin, 1e-9, "a ×2 spike is a second stream at the base rate")
	assert.Equal(t, 25*time.Minute, o.Streams[2].KillAt)
	assert.Equal(t, "short", o.Streams[2].Workload.Name())
	calm := sc.WithoutSpikes()
	assert.False(t, calm.HasSpikes())
	assert.True(t, sc.HasSpikes(), "WithoutSpikes leaves the original alone")
}

func TestParseErrorsNameKeyAndLine(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown top-level key", "name: x\nduraton: 90m\n", []string{"line 2", `unknown key "duraton"`}},
		{"unknown nested key", "name: x\nduration: 1h\ndeployment:\n  preset: paper-1p1d-h100\n  prefill: {cache_tokenz: 1}\n",
			[]string{"line 5", `unknown key "cache_tokenz"`}},
		{"old step formula on a bandwidth preset", "name: x\nduration: 1h\ndeployment:\n  preset: paper-1p1d-h100\n  decode: {step_base_ms: 15}\nworkload: {kind: short}\n",
			[]string{"deployment.decode.step_base_ms", "hbm_gb_per_sec: 0"}},
		{"bad duration", "name: x\nduration: ninety\n", []string{"line 2", "duration", "ninety"}},
		{"wrong type", "name: x\nduration: 1h\nseed: [1]\n", []string{"line 3"}},
		{"unknown preset", "name: x\nduration: 1h\ndeployment: {preset: h999}\nworkload: {kind: short}\n",
			[]string{"deployment.preset", "h999"}},
		{"unknown workload", "name: x\nduration: 1h\ndeployment: {preset: paper-1p1d-h100}\nworkload: {kind: chat}\n",
			[]string{"workload.kind", "chat"}},
		{"trace without path", "name: x\nduration: 1h\ndeployment: {preset: paper-1p1d-h100}\nworkload: {kind: trace}\n",
			[]string{"workload.trace.path"}},
		{"window outside run", "name: x\nduration: 1h\nmeasure: {from: 10m, to: 2h}\ndeployment: {preset: paper-1p1d-h100}\nworkload: {kind: short}\n",
			[]string{"measure"}},
		{"spike backwards", "name: x\nduration: 1h\ndeployment: {preset: paper-1p1d-h100}\nworkload: {kind: short}\narrivals: {rate_per_min: 1, spikes: [{from: 20m, to: 10m, multiplier: 2}]}\n",
			[]string{"arrivals.spikes[0]"}},
		{"no deployment", "name: x\nduration: 1h\nworkload: {kind: short}\n", []string{"deployment.prefill.instances"}},
		{"bad policy", "name: x\nduration: 1h\ndeployment: {preset: paper-1p1d-h100}\nworkload: {kind: short}\npolicy: magic\n",
			[]string{"policy"}},
		{"not yaml", "name: [\n", []string{"line"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestPresetsLoadAndRun(t *testing.T) {
	names := Presets()
	require.Contains(t, names, "paper-1p1d-h100")
	require.Contains(t, names, "paper-1p3d-h200")
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			sc, err := Load(n)
			require.NoError(t, err)
			assert.Equal(t, n, sc.Name, "a preset's name matches its file")
			_, err = sc.Options("")
			require.NoError(t, err)
		})
	}
	_, err := Load("no-such-preset")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "paper-1p1d-h100", "the error lists the presets")
}

func TestRunFillsNoSpikeTwin(t *testing.T) {
	sc, err := Load("paper-1p1d-h100-spike")
	require.NoError(t, err)
	spiked, calm, err := RunPair(sc, "", nil)
	require.NoError(t, err)
	require.NotNil(t, spiked.NoSpikeGoodputPerHour)
	assert.Equal(t, calm.GoodputPerHour, *spiked.NoSpikeGoodputPerHour)
	assert.Less(t, *spiked.GoodputRatio, 0.3)
	assert.Equal(t, "paper-1p1d-h100-spike", spiked.Scenario)

	res, err := Compare(sc, []string{"none", "hicache", "continuum"}, nil)
	require.NoError(t, err)
	require.Len(t, res, 3)
	assert.Equal(t, spiked.GoodputPerHour, res[0].GoodputPerHour, "compare and run agree on the same policy")
	for _, r := range res {
		assert.NotNil(t, r.NoSpikeGoodputPerHour)
	}
}

func TestTraceScenario(t *testing.T) {
	dir := t.TempDir()
	sample, err := os.ReadFile(filepath.Join("..", "..", "internal", "trace", "testdata", "tracelab-claude-session.jsonl"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rounds.jsonl"), sample, 0o600))
	yaml := `name: replay
seed: 3
duration: 40m
measure: {from: 5m, to: 35m}
deployment: {preset: paper-1p1d-h100}
workload: {kind: trace, trace: {path: rounds.jsonl, format: tracelab}}
arrivals: {rate_per_min: 2}
`
	path := filepath.Join(dir, "replay.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	sc, err := Load(path)
	require.NoError(t, err)
	r, err := Run(sc, "", nil)
	require.NoError(t, err)
	assert.Positive(t, r.Sessions.Arrived)
	assert.Equal(t, r.Sessions.Arrived, r.Sessions.Good, "a light replay serves everyone")
	assert.Greater(t, *r.HitRateMeanWindow, 0.5, "replayed sessions reuse their prefixes")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "rounds.jsonl"), []byte("{not json\n"), 0o600))
	_, err = Load(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "line 1")
}

func TestEquilibria(t *testing.T) {
	pt := func(n int, v float64) CurvePoint { return CurvePoint{N: n, SessionsPerMin: v} }
	cases := []struct {
		name             string
		pts              []CurvePoint
		lambda           float64
		stable, unstable float64 // -1: none
	}{
		{"rise then fall", []CurvePoint{pt(10, 1), pt(20, 3), pt(30, 5), pt(40, 1)}, 2, 15, 37.5},
		{"never reaches λ", []CurvePoint{pt(10, 1), pt(20, 1.5)}, 2, -1, -1},
		{"never falls back", []CurvePoint{pt(10, 1), pt(20, 4), pt(30, 5)}, 2, 10 + 10.0/3, -1},
		{"touches λ at the end", []CurvePoint{pt(10, 1), pt(20, 3), pt(30, 2)}, 2, 15, -1},
		{"exact crossing", []CurvePoint{pt(10, 2), pt(20, 4), pt(30, 2), pt(40, 1)}, 2, 10, 30},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, u := Equilibria(tc.pts, tc.lambda)
			check := func(got *float64, want float64) {
				if want < 0 {
					assert.Nil(t, got)
					return
				}
				require.NotNil(t, got)
				assert.InDelta(t, want, *got, 1e-9)
			}
			check(s, tc.stable)
			check(u, tc.unstable)
		})
	}
}

func TestCurveRisesThenFalls(t *testing.T) {
	sc, err := Load("paper-1p1d-h100")
	require.NoError(t, err)
	c, err := MeasureCurve(sc, "", CurveOptions{Ns: []int{10, 25, 40, 60, 90}}, nil)
	require.NoError(t, err)
	require.Len(t, c.Points, 5)
	assert.InDelta(t, 30, c.K, 1, "K is the workload's mean calls per session")
	assert.Greater(t, c.PeakN, 10)
	assert.Less(t, c.PeakN, 90)
	last := c.Points[len(c.Points)-1]
	assert.Less(t, last.SessionsPerMin, 0.7*c.PeakSessionsPerMin, "past the knee completions fall")
	assert.Less(t, last.HitRate, 0.5)
	require.NotNil(t, c.Stable)
	require.NotNil(t, c.Unstable)
	assert.Less(t, *c.Stable, *c.Unstable)
}

// FuzzParse: no input may panic the parser, and whatever it accepts must build simulator options.
func FuzzParse(f *testing.F) {
	f.Add([]byte(spikeYAML))
	entries, _ := os.ReadDir(filepath.Join("..", "..", "scenarios"))
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") {
			b, err := os.ReadFile(filepath.Join("..", "..", "scenarios", e.Name()))
			if err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte("name: x\nduration: 1h\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := Parse(data)
		if err != nil {
			return
		}
		if sc.Workload.Kind == "trace" {
			return // needs a file
		}
		o, err := sc.Options("")
		if err != nil {
			return
		}
		_, err = sim.New(o)
		_ = err // invalid combinations are reported, never panic
	})
}
