package benchreport

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Lines captured from real `go test -bench -benchmem` runs of this repository.
func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		line  string
		ok    bool
		name  string
		procs int
		iters int
		want  map[string]float64
	}{
		{line: "BenchmarkArriveWith10kQueued-2   \t     100\t       930.6 ns/op\t     10716 p99-ns\t     406 B/op\t       2 allocs/op",
			ok: true, name: "BenchmarkArriveWith10kQueued", procs: 2, iters: 100,
			want: map[string]float64{"ns/op": 930.6, "p99-ns": 10716, "B/op": 406, "allocs/op": 2}},
		{line: "BenchmarkStreamThroughput/bare-2         \t      20\t   8862950 ns/op\t 473.24 MB/s\t   58261 B/op\t    1429 allocs/op",
			ok: true, name: "BenchmarkStreamThroughput/bare", procs: 2, iters: 20,
			want: map[string]float64{"ns/op": 8862950, "MB/s": 473.24, "B/op": 58261, "allocs/op": 1429}},
		{line: "BenchmarkStepSessions/live=100000-2        \t      51\t  20048545 ns/op\t         1.047 daemon-heap-MiB\t         39.62 heap-MiB\t  165545 B/op\t    1463 allocs/op",
			ok: true, name: "BenchmarkStepSessions/live=100000", procs: 2, iters: 51,
			want: map[string]float64{"ns/op": 20048545, "daemon-heap-MiB": 1.047, "heap-MiB": 39.62, "B/op": 165545, "allocs/op": 1463}},
		{line: "BenchmarkGather/prefill-2         \t     100\t     68178 ns/op\t   57785 B/op\t     524 allocs/op",
			ok: true, name: "BenchmarkGather/prefill", procs: 2, iters: 100,
			want: map[string]float64{"ns/op": 68178, "B/op": 57785, "allocs/op": 524}},
		// GOMAXPROCS=1: no suffix; a sub-benchmark with a dash in its name.
		{line: "BenchmarkPredict   \t     100\t     22563 ns/op", ok: true, name: "BenchmarkPredict", procs: 1, iters: 100,
			want: map[string]float64{"ns/op": 22563}},
		{line: "BenchmarkParseCall/single-pass-8 \t 5000\t 1234 ns/op\t 12 allocs/op", ok: true,
			name: "BenchmarkParseCall/single-pass", procs: 8, iters: 5000, want: map[string]float64{"ns/op": 1234, "allocs/op": 12}},
		{line: "BenchmarkHour1P3D-2   \t       5\t  10500000 ns/op", ok: true, name: "BenchmarkHour1P3D", procs: 2, iters: 5,
			want: map[string]float64{"ns/op": 10500000}},
		{line: "PASS"},
		{line: "ok  \tgithub.com/basin-dev/basin/gateway/admission\t0.017s"},
		{line: "goos: linux"},
		{line: "--- FAIL: BenchmarkStepSessions/live=10000"},
		{line: "BenchmarkStepSessions/live=10000-2   "},           // the name alone, before a benchmark's log
		{line: "BenchmarkFoo-2 \t 100 \t 12 ns/op \t 7"},          // odd field count
		{line: "BenchmarkFoo-2 \t many \t 12 ns/op"},              // no iteration count
		{line: "BenchmarkFoo-2 \t 100 \t twelve ns/op \t 1 B/op"}, // not a number
	} {
		r, ok := ParseLine(tc.line)
		require.Equal(t, tc.ok, ok, "%q", tc.line)
		if !ok {
			continue
		}
		assert.Equal(t, tc.name, r.Name, "%q", tc.line)
		assert.Equal(t, tc.procs, r.Procs, "%q", tc.line)
		assert.Equal(t, tc.iters, r.Iters, "%q", tc.line)
		assert.Equal(t, tc.want, r.Metrics, "%q", tc.line)
	}
}

// sampleOutput is a real two-package output with -count 2.
const sampleOutput = `goos: linux
goarch: amd64
pkg: github.com/basin-dev/basin/gateway/admission
cpu: AMD EPYC
BenchmarkArriveWith10kQueued-2   	     100	       930.6 ns/op	     10716 p99-ns	     406 B/op	       2 allocs/op
BenchmarkArriveWith10kQueued-2   	     100	       598.2 ns/op	      4407 p99-ns	     406 B/op	       2 allocs/op
PASS
ok  	github.com/basin-dev/basin/gateway/admission	0.017s
goos: linux
goarch: amd64
pkg: github.com/basin-dev/basin/gateway/predictor
cpu: AMD EPYC
BenchmarkPredict-2   	     100	     22563 ns/op	    3200 B/op	       1 allocs/op
BenchmarkPredict-2   	     100	     19424 ns/op	    3200 B/op	       1 allocs/op
PASS
ok  	github.com/basin-dev/basin/gateway/predictor	0.024s
`

func TestParse(t *testing.T) {
	out, err := Parse(strings.NewReader(sampleOutput))
	require.NoError(t, err)
	assert.Equal(t, "AMD EPYC", out.CPU)
	require.Len(t, out.Results, 4)
	assert.Equal(t, "github.com/basin-dev/basin/gateway/admission", out.Results[1].Pkg)
	assert.Equal(t, "github.com/basin-dev/basin/gateway/predictor", out.Results[2].Pkg)
	assert.Equal(t, []string{"BenchmarkArriveWith10kQueued", "BenchmarkPredict"}, out.Names())
	assert.True(t, out.Has("BenchmarkPredict"))
	assert.False(t, out.Has("BenchmarkParseCall/before"))

	s, ok := out.Stat("BenchmarkArriveWith10kQueued", "p99-ns")
	require.True(t, ok)
	assert.Equal(t, []float64{10716, 4407}, s.Values)
	assert.InDelta(t, (10716+4407)/2.0, s.Median, 1e-9)
	assert.Equal(t, 4407.0, s.Min)
	assert.Equal(t, 10716.0, s.Max)
	_, ok = out.Stat("BenchmarkPredict", "MB/s")
	assert.False(t, ok, "a unit the benchmark does not report")
	_, ok = out.Stat("BenchmarkMissing", "ns/op")
	assert.False(t, ok)
}

func TestStatAndRatio(t *testing.T) {
	for _, tc := range []struct {
		values           []float64
		median, min, max float64
	}{
		{[]float64{5}, 5, 5, 5},
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
	} {
		s := newStat(tc.values)
		assert.Equal(t, tc.median, s.Median, "%v", tc.values)
		assert.Equal(t, tc.min, s.Min, "%v", tc.values)
		assert.Equal(t, tc.max, s.Max, "%v", tc.values)
		assert.Equal(t, tc.values, s.Values, "run order is kept")
	}
	// Run i against run i: 450/500, 480/520, 470/490.
	r := ratio(newStat([]float64{450, 480, 470}), newStat([]float64{500, 520, 490}))
	assert.InDelta(t, 470.0/500, r.Median, 1e-12, "ratio of the medians")
	assert.InDelta(t, 450.0/500, r.Min, 1e-12)
	assert.InDelta(t, 470.0/490, r.Max, 1e-12)
	assert.Equal(t, 3, r.N)
}
