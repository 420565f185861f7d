package benchreport

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/benchmarks.golden.md from the recorded outputs")

// recorded is a report of the outputs recorded in testdata: every `go test -bench` invocation
// of `make bench` with -count 2 (testdata/<name>.txt, the command line as Run builds it) and
// both `basin sim compare --json` runs. The machine, date and wall times are fixed.
// raw maps each invocation to the output it was parsed from.
func recorded(t *testing.T) (r *Report, raw map[*Invocation][]byte) {
	t.Helper()
	raw = map[*Invocation][]byte{}
	iv := func(file string, args ...string) *Invocation {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(t, err)
		out, err := Parse(bytes.NewReader(b))
		require.NoError(t, err, file)
		require.NotEmpty(t, out.Results, file)
		iv := &Invocation{Args: append([]string{"go", "test", "-run", "^$"}, args...), Wall: 10 * time.Second, Out: out}
		raw[iv] = b
		return iv
	}
	cmp := func(file, scenario string) *Compare {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(t, err)
		c := &Compare{Scenario: scenario, Args: []string{"./bin/basin", "sim", "compare", "--scenario", scenario, "--json"}, Wall: 2 * time.Second}
		require.NoError(t, json.Unmarshal(b, &c.Policies), file)
		return c
	}
	return &Report{
		Machine: Machine{CPU: "AMD EPYC", Cores: 2, MemoryGiB: 23.5, OS: "Debian GNU/Linux 12 (bookworm)", Go: "go1.26.8"},
		Command: "go run ./lab/benchreport/cmd/gen -count 2 -o docs/benchmarks.md", Date: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC),
		Total: 3 * time.Minute, Count: 2,
		Gateway:            iv("gateway.txt", "-bench", "StreamThroughput|ParseCall|CallShapes", "-benchmem", "-count", "2", "./gateway/"),
		AgentCall:          iv("agentcall.txt", "-bench", "ParseRead|ReadShapes", "-benchmem", "-count", "2", "./internal/agentcall/"),
		AdmissionPredictor: iv("admission-predictor.txt", "-bench", ".", "-benchmem", "-count", "2", "./gateway/admission/", "./gateway/predictor/"),
		Daemon:             iv("daemon.txt", "-bench", "StepSessions", "-benchmem", "-count", "2", "./daemon/"),
		Sim:                iv("sim.txt", "-bench", ".", "-benchmem", "-count", "2", "./sim/", "./sim/enginemetrics/"),
		Serve:              iv("serve.txt", "-bench", "ParseGenerate", "-benchmem", "-count", "2", "./sim/serve/"),
		Collector: iv("collector.txt", "-bench", "^Benchmark(Snapshot64x2000|RawParse64x2000|SnapshotFullParse64x2000)$",
			"-benchmem", "-benchtime", "5x", "-count", "2", "./collector/"),
		Detector: iv("detector.txt", "-bench", "^BenchmarkStep$", "-benchmem", "-count", "2", "./detector/"),
		Replicated: iv("replicated.txt", "-bench", "^BenchmarkReplicatedScale$", "-benchmem", "-benchtime", "1x", "-count", "1",
			"./gateway/"),
		Spike100: cmp("compare-spike.json", "paper-1p3d-h200-spike"),
		Spike300: cmp("compare-spike300.json", "paper-1p3d-h200-spike300"),
	}, raw
}

// TestRenderRecorded renders a whole report from real recorded output: every row a report names
// is measured (so the names, sub-benchmarks included, match what the benchmarks print), every
// result line is read, and the document is the checked-in golden file (go test -update rewrites
// it after a change to the report's text).
func TestRenderRecorded(t *testing.T) {
	r, raw := recorded(t)
	ran := map[string]bool{}
	for iv, b := range raw {
		for _, n := range iv.Out.Names() {
			ran[n] = true
		}
		// Every result line of the raw output was read: one per benchmark per run.
		lines := 0
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "Benchmark") && strings.Contains(line, " ns/op") {
				lines++
			}
		}
		assert.Len(t, iv.Out.Results, lines, iv.Command())
	}
	for name := range namedBenchmarks {
		assert.True(t, ran[name], "%s is not in the recorded output", name)
	}

	var b strings.Builder
	require.NoError(t, Render(&b, r))
	got := b.String()
	assert.NotContains(t, got, "not measured")
	golden := filepath.Join("testdata", "benchmarks.golden.md")
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "go test ./lab/benchreport -run TestRenderRecorded -update")
	assert.Equal(t, string(want), got)
}
