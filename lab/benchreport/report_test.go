package benchreport

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatting(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{sig3(1234.6), "1235"},
		{sig3(21.74), "21.7"},
		{sig3(4.219), "4.22"},
		{sig3(0.05361), "0.0536"},
		{sig3(0), "0"},
		{sig3(0.23), "0.230"},
		{sig3(0.9999), "1.000"},
		{trimFloat(23.50, 1), "23.5"},
		{trimFloat(362, 0), "362"},
		{trimFloat(2.0, 2), "2"},
		{points(-0.3), "±0"},
		{points(-8.4), "-8"},
		{points(2.6), "+3"},
		{timeStatText(newStat([]float64{21.7e6, 20.1e6, 23e6}), true), "**21.7 ms** (20.1–23.0 ms, 3 runs)"},
		{timeStatText(newStat([]float64{4220}), false), "4.22 µs (1 run)"},
		{timeStatText(newStat([]float64{930}), false), "930 ns (1 run)"},
		{timeStatText(newStat([]float64{2.5e9, 2.4e9}), false), "2.45 s (2.40–2.50 s, 2 runs)"},
		{plainStat(newStat([]float64{492, 517, 505}), "MB/s"), "505 MB/s (492–517, 3 runs)"},
		{ratioText(Ratio{Median: 0.93, Min: 0.91, Max: 0.95, N: 3}), "**0.930×** (0.910–0.950×, 3 runs)"},
		{ratioText(Ratio{Median: 1.06, Min: 1.06, Max: 1.06, N: 1}), "**1.06×** (1 run)"},
		{target("≥ 0.85×", true), "≥ 0.85× (met)"},
		{target("≤ 1 ms", false), "≤ 1 ms (**not met**)"},
		{shellJoin([]string{"go", "test", "-run", "^$", "-bench", "StreamThroughput|ParseCall", "-count", "3", "./gateway/"}),
			`go test -run '^$' -bench 'StreamThroughput|ParseCall' -count 3 ./gateway/`},
		{shellJoin([]string{"echo", "it's"}), `echo 'it'\''s'`},
		{cell("a|b\nc"), `a\|b c`},
		{roundDur(1234 * time.Millisecond), "1.2s"},
		{roundDur(83*time.Second + 400*time.Millisecond), "1m23s"},
	} {
		assert.Equal(t, tc.want, tc.got)
	}
}

func TestHeapVerdict(t *testing.T) {
	for _, tc := range []struct {
		h10, h100 float64
		want      string
	}{
		{0.80, 0.82, "it does not grow with the number of sessions"},
		{0.224, 0.223, "from 0.224 to 0.223 MiB (0.996×, ±0.00 MiB): it does not grow"},
		{0.80, 1.10, "it grows, far less than in proportion"},
		{0.80, 7.90, "it grows about in proportion"},
	} {
		h10, h100 := newStat([]float64{tc.h10}), newStat([]float64{tc.h100})
		got := heapVerdict(h10, h100, ratio(h100, h10))
		assert.Contains(t, got, tc.want, "%v → %v", tc.h10, tc.h100)
	}
}

// invocation parses output as the result of args.
func invocation(t *testing.T, output string, args ...string) *Invocation {
	t.Helper()
	out, err := Parse(strings.NewReader(output))
	require.NoError(t, err)
	return &Invocation{Args: append([]string{"go", "test"}, args...), Wall: 3 * time.Second, Out: out}
}

const gatewayOutput = `pkg: github.com/basin-dev/basin/gateway
BenchmarkStreamThroughput/bare-2         	      20	   8862950 ns/op	 473.24 MB/s	   58261 B/op	    1429 allocs/op
BenchmarkStreamThroughput/bare-2         	      20	   8601740 ns/op	 487.61 MB/s	   58069 B/op	    1439 allocs/op
BenchmarkStreamThroughput/gateway-2      	      20	   9455595 ns/op	 443.58 MB/s	   60396 B/op	    1425 allocs/op
BenchmarkStreamThroughput/gateway-2      	      20	  10565630 ns/op	 396.98 MB/s	   60504 B/op	    1436 allocs/op
`

const daemonOutput = `pkg: github.com/basin-dev/basin/daemon
BenchmarkStepSessions/live=10000-2         	     336	   3644813 ns/op	         0.8047 daemon-heap-MiB	         6.125 heap-MiB	  136333 B/op	    1462 allocs/op
BenchmarkStepSessions/live=100000-2        	      51	  20048545 ns/op	         1.047 daemon-heap-MiB	        39.62 heap-MiB	  165545 B/op	    1463 allocs/op
BenchmarkStepSessions/queued=100000-2      	      40	  30000000 ns/op	         1.1 daemon-heap-MiB	        50.00 heap-MiB	  165545 B/op	    1463 allocs/op
`

const compareJSON = `[
 {"scenario":"s","policy":"none","seed":1,"goodput_per_hour":0,"no_spike_goodput_per_hour":362,"hit_rate_mean_window":0.3281,"first_call_wait_p50_s":244.07,"measure_from_min":25,"measure_to_min":85},
 {"scenario":"s","policy":"basin","seed":1,"goodput_per_hour":362,"no_spike_goodput_per_hour":362,"hit_rate_mean_window":0.9697,"first_call_wait_p50_s":0.2,"measure_from_min":25,"measure_to_min":85}
]`

func compare(t *testing.T, scenario string) *Compare {
	t.Helper()
	c := &Compare{Scenario: scenario, Args: []string{"./bin/basin", "sim", "compare", "--scenario", scenario, "--json"}, Wall: 2 * time.Second}
	require.NoError(t, json.Unmarshal([]byte(compareJSON), &c.Policies))
	return c
}

func TestRender(t *testing.T) {
	base := func() *Report {
		return &Report{Machine: Machine{CPU: "AMD EPYC 7B13", Cores: 2, MemoryGiB: 23.5, OS: "Debian GNU/Linux 12 (bookworm)", Go: "go1.26.8"},
			Command: "go run ./lab/benchreport/cmd/gen -count 2 -o docs/benchmarks.md", Date: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC),
			Total: 5 * time.Minute, Count: 2,
			Gateway:  invocation(t, gatewayOutput, "-bench", "StreamThroughput|ParseCall", "./gateway/"),
			Daemon:   invocation(t, daemonOutput, "-bench", "StepSessions", "./daemon/"),
			Spike100: compare(t, "paper-1p3d-h200-spike"), Spike300: compare(t, "paper-1p3d-h200-spike300")}
	}
	for _, tc := range []struct {
		name    string
		edit    func(r *Report)
		want    []string
		notWant []string
	}{
		{name: "measured", want: []string{
			"Measured on AMD EPYC 7B13, 2 cores, 23.5 GiB of memory, Debian GNU/Linux 12 (bookworm), go1.26.8.",
			"Each result is the median of\n2 runs (`-count 2`)",
			// (443.58+396.98)/2 / ((473.24+487.61)/2), pairs 443.58/473.24 and 396.98/487.61.
			"gateway 420 MB/s (397–444, 2 runs), bare 480 MB/s (473–488, 2 runs): **0.875×** (0.814–0.937×, 2 runs) | ≥ 0.85× (met) |",
			"| reading a call's body in the gateway (300 KB of chat, `internal/agentcall`) (`BenchmarkParseCall/single-pass`) | not measured: benchmark not found |",
			"go test -bench 'StreamThroughput|ParseCall' ./gateway/  # 3s",
			"| one daemon step, 100,000 live sessions in the gateway | **20.0 ms** (1 run), 1463 allocations |",
			"| daemon's retained heap, 100,000 / 10,000 sessions | **1.30×** (1 run) |",
			"goes from 0.805 to 1.05 MiB (1.30×, +0.24 MiB): it grows, far less than in proportion",
			// A benchmark no row knows about still shows up.
			"| `BenchmarkStepSessions/queued=100000` | **30.0 ms** (1 run), 1.10 daemon-heap-MiB (1 run), 50.0 heap-MiB (1 run), 165545 B/op, 1463 allocations |",
			"| none (SGLang default) | 0 | 0.33 | 0 | 0.33 | 244 s |",
			"| basin | 362 | 0.97 | 362 | 0.97 | 0 s |",
			"Under both spikes it is reached by `basin`, not by `none`.",
			"./bin/basin sim compare --scenario paper-1p3d-h200-spike300 --json  # 2s",
			"| admission decision (`Core.Arrive` + `Cancel`) with 10,000 sessions queued | not measured: not run | p99 ≤ 50 µs |",
		}},
		{name: "failed go test", edit: func(r *Report) {
			r.Collector = &Invocation{Args: []string{"go", "test", "./collector/"}, Err: "exit status 1: collector/x.go:1: syntax error"}
		}, want: []string{
			"| 64 targets × 2,000 series, bytes → Snapshot (the scrape path), one full pass | not measured: `go test` failed (exit status 1: collector/x.go:1: syntax error) | ≤ 50 ms CPU |",
		}, notWant: []string{"ratio collector / raw expfmt parse"}},
		{name: "target missed", edit: func(r *Report) {
			r.Gateway = invocation(t, strings.ReplaceAll(gatewayOutput, " 443.58 MB/s", " 143.58 MB/s"), "./gateway/")
		}, want: []string{"(**not met**)"}},
		{name: "compare failed", edit: func(r *Report) {
			r.Spike300 = &Compare{Scenario: "paper-1p3d-h200-spike300", Args: []string{"./bin/basin", "sim", "compare"}, Err: "exit status 2"}
		}, want: []string{"not measured: `./bin/basin sim compare`: exit status 2."}, notWant: []string{"| none (SGLang default) |"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			if tc.edit != nil {
				tc.edit(r)
			}
			var b strings.Builder
			require.NoError(t, Render(&b, r))
			got := b.String()
			for _, w := range tc.want {
				assert.Contains(t, got, w)
			}
			for _, w := range tc.notWant {
				assert.NotContains(t, got, w)
			}
			// Every table row has exactly three cells (escaped pipes aside).
			for line := range strings.Lines(got) {
				if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| policy") && !strings.Contains(line, "SGLang default") &&
					!strings.HasPrefix(line, "| hicache") && !strings.HasPrefix(line, "| basin") && !strings.HasPrefix(line, "| oracle") &&
					!strings.HasPrefix(line, "| continuum") {
					assert.Equal(t, 4, strings.Count(strings.ReplaceAll(line, `\|`, ""), "|"), "%q", line)
				}
			}
		})
	}
}
