package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/predictor"
	"github.com/basin-dev/basin/internal/trace"
	"github.com/basin-dev/basin/lab/calibrate"
	"github.com/basin-dev/basin/lab/demo"
	"github.com/basin-dev/basin/loadgen"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/test/servetest"
)

func basin(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), Env{Stdout: &out, Stderr: &errOut}, args)
	return code, out.String(), errOut.String()
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: basin"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"sim"}, 2, "basin sim: missing command"},
		{[]string{"sim", "fly"}, 2, `basin sim: unknown command "fly"`},
		{[]string{"sim", "run"}, 2, "--scenario is required"},
		{[]string{"sim", "run", "--scenario", "paper-1p1d-h100", "--bogus"}, 2, "bogus"},
		{[]string{"sim", "run", "--scenario", "nope"}, 1, "no such file and no such preset"},
		{[]string{"sim", "compare", "--scenario", "paper-1p1d-h100", "--policies", "none,magic"}, 2, "magic"},
		{[]string{"sim", "curve", "--scenario", "paper-1p1d-h100", "-n", "5,x"}, 2, `"x" is not a positive integer`},
		{[]string{"trace", "import"}, 2, "want one input file"},
		{[]string{"demo", "--scenario", "paper-1p1d-h100"}, 2, "has no spike"},
		{[]string{"daemon", "--config", "none.yaml", "--clock-speed", "0"}, 2, "--clock-speed 0: must be a number in (0, "},
		{[]string{"daemon", "--config", "none.yaml", "--clock-speed", "20", "--clock-start", "noon"}, 2, `--clock-start "noon": want an RFC 3339 time`},
		{[]string{"sim", "run", "--scenario", "paper-1p1d-h100", "--bogus"}, 2, "run 'basin sim run --help'"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := basin(t, tc.args...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, stderr, tc.want)
			assert.Empty(t, stdout, "a mistake prints no help on stdout")
		})
	}
}

// TestEveryCommandHasHelp walks the command tree: every group and command answers --help on stdout
// with exit 0, says what it does, gives an example invocation of itself, and (commands) lists its
// flags — which proves the help came from the command's own flag set rather than running it.
func TestEveryCommandHasHelp(t *testing.T) {
	var walk func(path []string, c command)
	n := 0
	walk = func(path []string, c command) {
		name := strings.Join(append([]string{"basin"}, path...), " ")
		n++
		t.Run(name, func(t *testing.T) {
			assert.NotEmpty(t, strings.TrimSpace(c.summary), "a one-line description")
			require.NotEmpty(t, c.examples, "at least one example")
			for _, e := range c.examples {
				assert.True(t, strings.HasPrefix(e, name), "example %q invokes %s", e, name)
			}
			for _, h := range []string{"--help", "-h"} {
				code, stdout, stderr := basin(t, append(append([]string(nil), path...), h)...)
				require.Equal(t, 0, code, stderr)
				assert.Empty(t, stderr, "help asked for goes to stdout")
				assert.True(t, strings.HasPrefix(stdout, name+" — "+c.summary+"\n"), "starts with what it does: %q", stdout)
				assert.Contains(t, stdout, "\nusage: "+name)
				assert.Contains(t, stdout, "\nexamples:\n  "+c.examples[0]+"\n")
				if c.subs != nil {
					assert.Contains(t, stdout, "\ncommands:\n")
				} else {
					assert.Contains(t, stdout, "\nflags:\n")
				}
			}
			if len(path) > 0 {
				code, stdout, _ := basin(t, append([]string{"help"}, path...)...)
				assert.Equal(t, 0, code)
				assert.True(t, strings.HasPrefix(stdout, name+" — "), "basin help %s", strings.Join(path, " "))
			}
		})
		for sub, sc := range c.subs {
			walk(append(append([]string(nil), path...), sub), sc)
		}
	}
	walk(nil, root())
	assert.Greater(t, n, 20, "the walk reached the subcommands")

	_, stdout, _ := basin(t, "trace", "import", "--help")
	for _, want := range []string{"IN.jsonl", "TraceLab", "round trace", "--format basin", "-format string"} {
		assert.Contains(t, stdout, want, "trace import --help names its input")
	}
	_, stdout, _ = basin(t, "sim", "run", "--help")
	assert.Contains(t, stdout, "  -scenario string\n", "the flags with their help")
}

func TestVersion(t *testing.T) {
	code, want, stderr := basin(t, "version")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `^basin \S+`, want)
	for _, args := range [][]string{{"--version"}, {"-version"}} {
		code, got, stderr := basin(t, args...)
		assert.Equal(t, 0, code, stderr)
		assert.Equal(t, want, got, "%v prints what basin version prints", args)
	}
	code, _, stderr = basin(t, "--version", "extra")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `unexpected argument "extra"`)
}

func TestSimRunJSONAndTimeline(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	tl := filepath.Join(t.TempDir(), "tl.csv")
	code, stdout, stderr := basin(t, "sim", "run", "--scenario", "paper-1p1d-h100-spike", "--json", "--timeline", tl)
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, stderr, "--json is quiet on stderr")
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &got))
	for _, k := range []string{"goodput_per_hour", "no_spike_goodput_per_hour", "sessions", "hit_rate_mean_window",
		"hit_rate_end", "ttft_p50_s_window", "first_call_wait_p50_s", "live_sessions_end"} {
		assert.Contains(t, got, k)
	}
	sessions := got["sessions"].(map[string]any)
	for _, k := range []string{"arrived", "completed", "good", "rejected", "shed"} {
		assert.Contains(t, sessions, k)
	}
	assert.Less(t, got["goodput_per_hour"].(float64), got["no_spike_goodput_per_hour"].(float64))

	f, err := os.Open(tl)
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 91, "a header and one row per simulated minute")
	assert.Equal(t, []string{"minute", "arrivals", "live_sessions", "live_base_sessions", "queued_sessions", "held_calls",
		"working_set_tokens", "cache_capacity_tokens", "hit_rate", "ttft_p50_s", "completions", "good_completions",
		"calls_completed", "prefill_busy", "prefill_instances", "decode_instances", "prefill_instance_minutes",
		"decode_instance_minutes", "missed_arrivals"}, rows[0])
	assert.Equal(t, []string{"1", "1", "1.000", "1.000"}, rows[1][14:18], "the 1P1D preset's instances, each a whole minute")
	missed := 0
	for _, r := range rows[1:] {
		n, err := strconv.Atoi(r[18])
		require.NoError(t, err)
		missed += n
	}
	assert.Positive(t, missed, "the +100% spike traps the default policy: sessions miss their deadline")

	// Same seed, same bytes.
	_, again, _ := basin(t, "sim", "run", "--scenario", "paper-1p1d-h100-spike", "--json")
	assert.Equal(t, stdout, again)
}

func TestSimCompareTable(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	code, stdout, stderr := basin(t, "sim", "compare", "--scenario", "paper-1p1d-h100-spike")
	require.Equal(t, 0, code, stderr)
	for _, p := range []string{"none", "hicache", "continuum"} {
		assert.Contains(t, stdout, p)
	}
	assert.Contains(t, stdout, "goodput/h")
}

func TestSimCurveJSON(t *testing.T) {
	code, stdout, stderr := basin(t, "sim", "curve", "--scenario", "paper-1p1d-h100", "-n", "10,30,80", "--json")
	require.Equal(t, 0, code, stderr)
	var c struct {
		Points []struct {
			N              int     `json:"n"`
			SessionsPerMin float64 `json:"sessions_per_min"`
		} `json:"points"`
		Stable *float64 `json:"stable_n"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &c))
	require.Len(t, c.Points, 3)
	assert.Greater(t, c.Points[1].SessionsPerMin, c.Points[0].SessionsPerMin)
	assert.Less(t, c.Points[2].SessionsPerMin, c.Points[1].SessionsPerMin)
	assert.NotNil(t, c.Stable)
}

// TestDemo runs `basin demo` on a 24-minute cut of the paper's spike scenario at 180×, with the
// speed from BASIN_DEMO_SPEED and the files kept in --dir.
func TestDemo(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("plays 24 simulated minutes on three deployments (about 8 s of wall time)")
	}
	dir := t.TempDir()
	sc := filepath.Join(dir, "short-spike.yaml")
	require.NoError(t, os.WriteFile(sc, []byte(`name: short-spike
seed: 1
duration: 24m
measure: {from: 10m, to: 24m}
deployment: {preset: paper-1p1d-h100}
workload: {kind: terminal-bench}
arrivals:
  rate_per_min: 3.3
  spikes: [{from: 5m, to: 12m, multiplier: 3}]
slo: {slowdown: 4, tpot_ms: 50, tpot_fraction: 0.95}
`), 0o600))
	keep := filepath.Join(dir, "kept")
	var out, errOut bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		return map[string]string{"BASIN_DEMO_SPEED": "180", "BASIN_DEMO_SCENARIO": sc}[k]
	}}
	code := Run(t.Context(), env, []string{"demo", "--dir", keep})
	require.Equal(t, 0, code, errOut.String())
	stdout := out.String()
	for _, want := range []string{
		"basin demo: short-spike", "arrivals ×3 in minutes 5–12", "24 minutes of traffic at 180× (8s of wall time)",
		"status page: http://127.0.0.1:", "What the daemons saw and did", "set the session budget",
		"no spike", "dry run", "acting", "goodput (sessions/h)", "ratio to no spike", "prefix hit rate",
		"first answer p50 (s)", "The runs' configs, calibration, audit logs and state are in " + keep,
	} {
		assert.Contains(t, stdout, want)
	}
	for _, f := range []string{"calibration.json", "dryrun/daemon.yaml", "acting/gateway.yaml", "acting/data/audit.jsonl"} {
		assert.FileExists(t, filepath.Join(keep, f))
	}
}

func TestDemoBadEnvironment(t *testing.T) {
	var out, errOut bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		return map[string]string{"BASIN_DEMO_SPEED": "fast"}[k]
	}}
	assert.Equal(t, 2, Run(t.Context(), env, []string{"demo"}))
	assert.Contains(t, errOut.String(), `BASIN_DEMO_SPEED: "fast" is not a number`)
	assert.Empty(t, out.String())
}

func TestTraceImport(t *testing.T) {
	in := filepath.Join("..", "..", "..", "internal", "trace", "testdata", "tracelab-claude-session.jsonl")
	out := filepath.Join(t.TempDir(), "basin.jsonl")
	code, stdout, stderr := basin(t, "trace", "import", "-o", out, in)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "claude:92ee5b8a", "per-session statistics name the session")
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, 10, strings.Count(string(b), "\n"), "one basin row per TraceLab round")

	code, _, stderr = basin(t, "trace", "import", "-format", "basin", out)
	assert.Equal(t, 0, code, stderr)
	code, _, stderr = basin(t, "trace", "import", "-format", "basin", in)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "line 1")
}

func TestSimServeStartsAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, Env{Stdout: &out, Stderr: &errOut}, []string{"sim", "serve", "--scenario", "paper-1p1d-h100",
			"--listen", "127.0.0.1:0", "--speed", "600", "--traffic", "scenario"})
	}()
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errOut.String())
	case <-time.After(10 * time.Second):
		t.Fatal("sim serve did not stop after its context was cancelled")
	}
	assert.Contains(t, errOut.String(), "serving simulated deployment")

	code, _, stderr := basin(t, "sim", "serve", "--scenario", "paper-1p1d-h100", "--traffic", "mixed")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--traffic")
	code, _, stderr = basin(t, "sim", "serve", "--scenario", "paper-1p1d-h100", "--speed", "0", "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "speed")
}

func TestPredictorTrain(t *testing.T) {
	dir := t.TempDir()
	w, err := sim.SyntheticWorkload("terminal-bench")
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var sessions []trace.Session
	for i := range 300 {
		spec := w.Session(rng)
		ts := trace.Session{ID: fmt.Sprint("s", i), TaskChars: spec.TaskChars}
		at := start.Add(time.Duration(i) * time.Minute)
		for _, c := range spec.Calls {
			at = at.Add(c.GapBefore)
			ts.Calls = append(ts.Calls, trace.Call{Start: at, Prompt: c.Prompt, Reused: c.Reused, Output: c.Output,
				GapBefore: c.GapBefore})
			at = at.Add(5 * time.Second)
		}
		sessions = append(sessions, ts)
	}
	tracePath := filepath.Join(dir, "calls.jsonl")
	f, err := os.Create(tracePath)
	require.NoError(t, err)
	require.NoError(t, trace.WriteBasin(f, sessions))
	require.NoError(t, f.Close())

	model := filepath.Join(dir, "model.json")
	code, stdout, stderr := basin(t, "predictor", "train", "--traces", tracePath, "-o", model)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "Spearman rank correlation: holdout")
	m, err := predictor.Load(model)
	require.NoError(t, err)
	assert.InDelta(t, 240, m.TrainedOn(), 30, "about a fifth of the sessions is held out")
	assert.False(t, math.IsNaN(m.SpearmanHoldout()), "the holdout measured the model")

	code, _, stderr = basin(t, "predictor", "train", "--traces", tracePath)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "-o are required")
}

func TestLoadgenAgainstSimServe(t *testing.T) {
	hs := servetest.Start(t, 1200)

	dir := t.TempDir()
	yaml := "name: tiny\nseed: 4\nduration: 3m\nmeasure: {from: 0s, to: 3m}\ndeployment: {preset: paper-1p1d-h100}\n" +
		"workload: {kind: short}\narrivals: {rate_per_min: 2}\n"
	path := filepath.Join(dir, "tiny.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	code, stdout, stderr := basin(t, "loadgen", "--target", hs.URL, "--scenario", path, "--speed", "1200")
	require.Equal(t, 0, code, stderr)
	var rep struct {
		Sessions struct {
			Arrived, Completed, Good int
		} `json:"sessions"`
		Goodput *float64 `json:"goodput_per_hour"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	assert.Positive(t, rep.Sessions.Arrived)
	assert.Equal(t, rep.Sessions.Arrived, rep.Sessions.Completed)
	assert.NotNil(t, rep.Goodput, "the scenario's deployment gives the unloaded times goodput needs")

	code, _, stderr = basin(t, "loadgen", "--scenario", path)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--target")
}

// TestLoadgenInterrupted: Ctrl-C during a run prints the report of what happened so far, marked
// interrupted, and says on stderr that it is partial.
func TestLoadgenInterrupted(t *testing.T) {
	started := make(chan struct{}, 1)
	var ends atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/end") {
			// The gateway answers a session's end at once; only the engine behind it hangs. (A
			// server hanging the ends too held this test for two EndTimeouts, 30 s.)
			ends.Add(1)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		select {
		case started <- struct{}{}:
		default:
		}
		_, _ = io.Copy(io.Discard, r.Body) // then the server notices the client going away
		<-r.Context().Done()               // an engine that never answers
	}))
	defer hs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-started:
			cancel()
		case <-time.After(30 * time.Second):
		}
	}()
	var out, errOut bytes.Buffer
	path := filepath.Join(t.TempDir(), "tiny.yaml")
	require.NoError(t, os.WriteFile(path, []byte("name: tiny\nseed: 4\nduration: 30m\nmeasure: {from: 0s, to: 30m}\n"+
		"deployment: {preset: paper-1p1d-h100}\nworkload: {kind: short}\narrivals: {rate_per_min: 6}\n"), 0o600))
	code := Run(ctx, Env{Stdout: &out, Stderr: &errOut}, []string{"loadgen", "--target", hs.URL, "--scenario",
		path, "--speed", "60"})
	require.Equal(t, 0, code, errOut.String())
	var rep struct {
		Interrupted bool `json:"interrupted"`
		Sessions    struct {
			Arrived    int `json:"arrived"`
			Unfinished int `json:"unfinished"`
		} `json:"sessions"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	assert.True(t, rep.Interrupted)
	assert.Positive(t, rep.Sessions.Arrived)
	assert.Equal(t, rep.Sessions.Arrived, rep.Sessions.Unfinished)
	assert.Equal(t, int64(rep.Sessions.Arrived), ends.Load(), "every session started is ended, interrupted or not")
	assert.Contains(t, errOut.String(), "basin loadgen: interrupted; the report is partial")

	assert.Equal(t, "minute 12.5 of 90: 40 of 300 sessions arrived, 20 live, 15 completed, 4 refused, 1 failed",
		loadgenNote(loadgen.Progress{Elapsed: 750 * time.Second, Duration: 90 * time.Minute, Offered: 300, Arrived: 40,
			Live: 20, Completed: 15, Refused: 4, Failed: 1}))
}

func TestRiskAndCalibrate(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	code, stdout, stderr := basin(t, "risk", "--scenario", "paper-1p1d-h100")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "binds first   cache-first")
	assert.Regexp(t, `spike tolerance  \+\d+% arrivals for 10 min \(\d+ extra sessions\), settled at N [\d.]+ \(the stable point of λ 3.30 sessions/min\)`, stdout)
	assert.Contains(t, stdout, "completion curve from the scenario, measured")

	cal := filepath.Join(t.TempDir(), "calibration.json")
	code, stdout, stderr = basin(t, "calibrate", "--scenario", "paper-1p1d-h100", "-o", cal, "--max-sessions", "90")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "knee at W/C")
	code, stdout, stderr = basin(t, "risk", "--scenario", "paper-1p1d-h100", "--calibration", cal, "--json")
	require.Equal(t, 0, code, stderr)
	var r struct {
		CacheN    float64 `json:"cache_limit_sessions"`
		Binding   string  `json:"binding"`
		Tolerance struct {
			Ratio     float64 `json:"ratio"`
			CurveFrom string  `json:"curve_from"`
		} `json:"spike_tolerance"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	assert.Less(t, r.CacheN, 49.0, "the measured knee is below the paper's 1.9 in the simulator")
	// The paper's 1P1D deployment recovers from +33% and is trapped by +100%; the fluid model's
	// estimate from the calibrated curve lands in that neighbourhood.
	assert.Greater(t, r.Tolerance.Ratio, 1.33)
	assert.Less(t, r.Tolerance.Ratio, 3.0)
	assert.Equal(t, "--calibration", r.Tolerance.CurveFrom)

	code, stdout, stderr = basin(t, "sim", "riskgrid")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "of 36 deployments")
}

func TestSimRunWithDetector(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	code, stdout, stderr := basin(t, "sim", "run", "--scenario", "paper-1p1d-h100-spike")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "detector               first warning minute")
	assert.Contains(t, stdout, "now trapped")

	// The last rescue times re-run each collapsed seed about sixteen times: under the race
	// detector that alone outlasts the package's test timeout, so the race pass checks the tables
	// without them (the harness's own tests bisect under the race detector).
	args := []string{"sim", "detect", "--seeds", "1"}
	if raceEnabled {
		args = append(args, "--rescue=false")
	}
	code, stdout, stderr = basin(t, args...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "| paper-1p3d-h200-spike | 1 |")
	assert.Contains(t, stdout, "### Pages versus states")
	assert.Contains(t, stdout, "| paper-1p1d-h100 | 1 | 1 |", "the healthy preset does not collapse")
	if raceEnabled {
		assert.NotContains(t, stdout, "### Last rescue time")
		return
	}
	assert.Contains(t, stdout, "### Last rescue time")
	assert.Regexp(t, `\| paper-1p1d-h100-spike \| 1 \| [0-9.]+ \|`, stdout, "seed 1 of the +100% spike collapses and is searched")
	assert.Contains(t, stdout, "| last rescue: daemon | margin | last rescue: budget cut | margin |", "both interventions are searched")
	assert.Contains(t, stdout, "What bounds the lead")
}

// TestSimTolerance: the quick slice prints its three points and the summary line; --json carries
// the multipliers tried; a bad flag is a usage error naming it.
func TestSimTolerance(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	code, stdout, stderr := basin(t, "sim", "tolerance", "--quick", "--seeds", "1", "--steps", "2")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "| 1p3d | gpu | 0.50 |")
	assert.Contains(t, stdout, "| 1p3d | gpu | 0.90 |")
	assert.Contains(t, stdout, "Spearman rank correlation")
	assert.Contains(t, stderr, "3 points in")

	code, stdout, stderr = basin(t, "sim", "tolerance", "--quick", "--seeds", "1", "--steps", "1", "--json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		Points []struct {
			Tries []struct{ Multiplier float64 } `json:"tries"`
		} `json:"points"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Len(t, res.Points, 3)
	assert.NotEmpty(t, res.Points[0].Tries)

	code, _, stderr = basin(t, "sim", "tolerance", "--steps", "0")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "steps")
}

// TestCalibrateKeepsPartial: a live calibration that stops early leaves its points next to -o,
// says where, and still fails; one that measured nothing says so and writes nothing.
func TestCalibrateKeepsPartial(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "calibration.json")
	runErr := fmt.Errorf("interrupted in step 2 of 3, after 1 measured: %w", context.Canceled)
	res := &calibrate.Result{Points: []detector.Point{{WorkingSetOverCache: 0.4, HitRate: 0.93, Sessions: 12}},
		Multipliers: []float64{1, 2, 3}, Step: time.Minute, Source: "test", CallsPerSession: 30}
	var errOut bytes.Buffer
	err := keepPartial(Env{Stderr: &errOut}, out, res, runErr)
	require.ErrorIs(t, err, context.Canceled)
	partial := filepath.Join(dir, "calibration.partial.json")
	assert.Contains(t, errOut.String(), "the 1 of 3 steps measured are saved in "+partial)
	assert.NoFileExists(t, out, "a partial run is not a calibration")
	b, rerr := os.ReadFile(partial)
	require.NoError(t, rerr)
	assert.Contains(t, string(b), `"partial": true`)
	assert.Contains(t, string(b), `"reason": "interrupted in step 2 of 3`)

	errOut.Reset()
	err = keepPartial(Env{Stderr: &errOut}, filepath.Join(dir, "other.json"), &calibrate.Result{}, runErr)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, errOut.String(), "no step was measured; nothing saved")
	assert.NoFileExists(t, filepath.Join(dir, "other.partial.json"))

	note := calibrationNote(calibrate.Progress{Step: 2, Steps: 6, Multiplier: 1, RatePerMin: 3.3,
		Elapsed: 61 * time.Second, Points: res.Points})
	assert.Equal(t, "step 2/6 ×1 (3.30 sessions/min), 1m1s; 1 measured, last W/C 0.40 hit rate 0.930", note)

	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	code, _, stderr := runQuick(t, 30*time.Second, "calibrate", "--scenario", "paper-1p1d-h100", "--target", gone.URL,
		"--metrics", "prefill="+gone.URL+"/metrics", "-o", filepath.Join(dir, "never.json"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "metrics target prefill-0 ("+gone.URL+"/metrics): cannot connect", "checked before any step")
}

func TestParseMetricTargets(t *testing.T) {
	ts, err := parseMetricTargets("prefill=http://a/metrics, decode=http://b/metrics,decode=http://c/metrics,gateway=http://g/metrics")
	require.NoError(t, err)
	require.Len(t, ts, 4)
	assert.Equal(t, "decode-1", ts[2].Name)
	for _, bad := range []string{"prefill", "router=http://x", "decode="} {
		_, err := parseMetricTargets(bad)
		assert.Error(t, err, bad)
	}
	code, _, stderr := basin(t, "calibrate", "--scenario", "paper-1p1d-h100", "--target", "http://127.0.0.1:1",
		"--metrics", "router=http://x")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "want prefill, decode, unified or gateway")
}

// runQuick runs basin and fails the test if it takes longer than limit: the commands under test
// must answer without waiting out their --window.
func runQuick(t *testing.T, limit time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	type result struct {
		code           int
		stdout, stderr string
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan result, 1)
	go func() {
		var out, errOut bytes.Buffer
		c := Run(ctx, Env{Stdout: &out, Stderr: &errOut}, args)
		done <- result{c, out.String(), errOut.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.stdout, r.stderr
	case <-time.After(limit):
		cancel()
		<-done
		t.Fatalf("basin %s took longer than %v", strings.Join(args, " "), limit)
		return 0, "", ""
	}
}

// TestLiveRiskChecksTargetsFirst: an endpoint that cannot be reached, or answers with an error, is
// reported at once with the target's name and URL — not after the ten-minute window.
func TestLiveRiskChecksTargetsFirst(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL := gone.URL + "/metrics"
	gone.Close()
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	ts := servetest.Start(t, 100)

	code, stdout, stderr := runQuick(t, 30*time.Second, "risk", "--window", "10m", "--metrics",
		"prefill="+ts.URL+"/metrics/prefill-0,decode="+goneURL+",gateway="+notFound.URL+"/metrics")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "metrics target decode-0 ("+goneURL+"): cannot connect:")
	assert.Contains(t, stderr, "cannot connect: connection refused")
	assert.Contains(t, stderr, "metrics target gateway-0 ("+notFound.URL+"/metrics): answered 404")
	assert.NotContains(t, stderr, "prefill-0", "the reachable target is not blamed")
}

// TestLiveRiskWithoutTheGateway: the engines alone give the cache capacity, the knee's working
// set and decode's capacity, at once; which limit binds first is unknown — said, not zero.
func TestLiveRiskWithoutTheGateway(t *testing.T) {
	ts := servetest.Start(t, 100)
	metrics := "prefill=" + ts.URL + "/metrics/prefill-0,decode=" + ts.URL + "/metrics/decode-0"
	code, stdout, stderr := runQuick(t, 30*time.Second, "risk", "--metrics", metrics, "--window", "10m")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "which limit binds first is unknown without a gateway target")
	for _, want := range []string{"cache capacity   560K tokens\n",
		"knee             W/C 1.90 (the Basin paper's, without --calibration): working set 1.06M tokens\n",
		"decode capacity  800K tokens\n", "unknown          cache and decode limits in sessions", "add gateway=URL"} {
		assert.Contains(t, stdout, want)
	}
	assert.NotContains(t, stdout, "cache limit ", "no number where the gateway's is needed")

	cal := filepath.Join(t.TempDir(), "calibration.json")
	code, _, stderr = basin(t, "calibrate", "--scenario", "paper-1p1d-h100", "-o", cal, "--max-sessions", "90")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr = runQuick(t, 30*time.Second, "risk", "--metrics", metrics, "--window", "10m", "--json",
		"--calibration", cal)
	assert.Equal(t, 1, code)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	c, ok := rep["cache_capacity_tokens"].(float64)
	require.True(t, ok, stdout)
	assert.Positive(t, c)
	knee := rep["knee_ratio"].(float64)
	assert.NotEqual(t, 1.9, knee, "the calibration's knee")
	assert.Equal(t, "calibration", rep["knee_from"])
	assert.InDelta(t, knee*c, rep["knee_working_set_tokens"], 1)
	dec, ok := rep["decode_capacity_tokens"].(float64)
	require.True(t, ok, "decode capacity read: %s\nstderr: %s", stdout, stderr)
	assert.Positive(t, dec)
	assert.NotContains(t, rep, "binding")
	assert.NotContains(t, rep, "cache_limit_sessions")

	code, _, stderr = basin(t, "risk", "--metrics", "prefill=http://x", "--scenario", "paper-1p1d-h100")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "not both")
}

// TestLiveRiskWithTheGateway reads the served fraction off a gateway's metrics over the window and
// decides the binding limit.
func TestLiveRiskWithTheGateway(t *testing.T) {
	ts := servetest.Start(t, 100)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "basin_gateway_working_set_tokens 2e6\nbasin_gateway_sessions_live 40\n"+
			"basin_gateway_sessions_in_call 10\n")
	}))
	defer gw.Close()
	code, stdout, stderr := runQuick(t, 30*time.Second, "risk", "--window", "1s", "--json", "--metrics",
		"prefill="+ts.URL+"/metrics/prefill-0,decode="+ts.URL+"/metrics/decode-0,gateway="+gw.URL)
	require.Equal(t, 0, code, stderr)
	var rep struct {
		CacheN  float64  `json:"cache_limit_sessions"`
		DecodeN float64  `json:"decode_limit_sessions"`
		Binding string   `json:"binding"`
		Unknown []string `json:"unknown"`
		C       float64  `json:"cache_capacity_tokens"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.InDelta(t, 1.9*rep.C/50_000, rep.CacheN, 0.01, "knee × C ÷ mean context (2M ÷ 40)")
	assert.Positive(t, rep.DecodeN)
	assert.NotEmpty(t, rep.Binding)
	assert.Empty(t, rep.Unknown)
	var tol struct {
		T struct {
			Unknown string `json:"unknown"`
		} `json:"spike_tolerance"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &tol))
	assert.Contains(t, tol.T.Unknown, "needs --calibration", "the spike tolerance is said unknown, not zero")
}

// TestDemoHelpNamesItsRuns keeps `basin demo`'s help in step with what the demo plays: the
// summary and the detail name every run, and the summary counts them.
func TestDemoHelpNamesItsRuns(t *testing.T) {
	c := root().subs["demo"]
	words := map[int]string{2: "two", 3: "three", 4: "four"}
	assert.Contains(t, c.summary, words[len(demo.Runs)]+" deployments", "the summary counts the runs")
	for _, run := range demo.Runs {
		assert.Contains(t, c.summary, run, "the summary names run %q", run)
		assert.Contains(t, strings.ReplaceAll(c.detail, "\n", " "), run, "the detail names run %q", run)
	}
}

// sim run --scale-ceiling: basin's daemon scales the scenario's pools (the timeline shows the
// prefill instance added for arrivals at 1.3 × the deployment's peak); flags that cannot go with
// it are refused by name.
func TestSimRunScaleCeiling(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	tl := filepath.Join(t.TempDir(), "timeline.csv")
	code, _, stderr := basin(t, "sim", "run", "--scenario", "paper-1p1d-h100-overload", "--policy", "basin",
		"--scale-ceiling", "4", "--timeline", tl)
	require.Equal(t, 0, code, stderr)
	f, err := os.Open(tl)
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Equal(t, "prefill_instances", rows[0][14])
	most := 0
	for _, r := range rows[1:] {
		n, err := strconv.Atoi(r[14])
		require.NoError(t, err)
		most = max(most, n)
	}
	assert.Greater(t, most, 1, "the sustained overload made basin add a prefill instance")
	assert.LessOrEqual(t, most, 4, "never past the ceiling")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "none", "--scale-ceiling", "4"}, `--scale-ceiling: scaling is basin's daemon's; policy "none" has none`},
		{[]string{"--policy", "basin", "--scale-ceiling", "-1"}, "--scale-ceiling -1: under the scenario's 1 prefill and 1 decode instances"},
		{[]string{"--act-at", "30", "--scale-ceiling", "4"}, "--scale-ceiling does not go with --act-at"},
	} {
		code, _, stderr := basin(t, append([]string{"sim", "run", "--scenario", "paper-1p1d-h100-spike", "--no-detector"}, tc.args...)...)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

// sim run --act-at: the daemon acts from the minute; the JSON has recovered_min and
// held_sessions_max next to the result, and the flags that do not go with it are refused.
func TestSimRunActAt(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	code, stdout, stderr := basin(t, "sim", "run", "--scenario", "paper-1p1d-h100-spike", "--act-at", "30", "--duration", "60m", "--json")
	require.Equal(t, 0, code, stderr)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &got))
	assert.Equal(t, 30.0, got["act_at_min"])
	assert.Equal(t, 30.0, got["measure_from_min"], "goodput counts the sessions arriving from the acting minute")
	require.Contains(t, got, "recovered_min")
	assert.Positive(t, got["held_sessions_max"], "the spike traps this run and the daemon holds")
	assert.Contains(t, got, "goodput_per_hour")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--act-at", "30", "--policy", "basin"}, "--policy does not apply"},
		{[]string{"--duration", "60m"}, "--duration goes with --act-at"},
	} {
		code, _, stderr := basin(t, append([]string{"sim", "run", "--scenario", "paper-1p1d-h100-spike"}, tc.args...)...)
		assert.Equal(t, 2, code, tc.args)
		assert.Contains(t, stderr, tc.want)
	}
}
