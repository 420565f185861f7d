package benchreport

import (
	"bytes"
	"io"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/perf/benchmath"
)

// Result is one benchmark result of `go test -bench` output, as benchfmt reads it: one
// benchmark, one of the -count runs.
type Result struct {
	// Pkg is the "pkg:" configuration in effect for the result.
	Pkg string
	// Name is the full name without the -GOMAXPROCS suffix, e.g. "BenchmarkStreamThroughput/bare".
	Name string
	// Procs is GOMAXPROCS from the suffix (1 when there is none).
	Procs int
	// Iters is the number of iterations the line reports.
	Iters int
	// Metrics maps a unit as the benchmark wrote it ("ns/op", "MB/s", "B/op", "allocs/op",
	// "p99-ns", ...) to its value: the report speaks the units of the benchmarks, not benchfmt's
	// tidied ones (sec/op, B/s).
	Metrics map[string]float64
}

// Output is a parsed `go test -bench` output.
type Output struct {
	// CPU is the first result's "cpu:" configuration.
	CPU     string
	Results []Result
}

// Parse reads a whole `go test -bench` output with benchfmt. Lines that start like a result but
// are not one (a benchmark's name printed before its log, a malformed line) are skipped, as
// benchstat skips them; an I/O error is returned with what was read before it.
func Parse(rd io.Reader) (Output, error) {
	var out Output
	r := benchfmt.NewReader(rd, "go test")
	for r.Scan() {
		res, ok := r.Result().(*benchfmt.Result)
		if !ok {
			continue // a *benchfmt.SyntaxError or unit metadata
		}
		out.Results = append(out.Results, fromBenchfmt(res))
		if out.CPU == "" {
			out.CPU = res.GetConfig("cpu")
		}
	}
	return out, r.Err()
}

// ParseLine reads one line as a benchmark result; ok is false for any other line.
func ParseLine(line string) (r Result, ok bool) {
	rd := benchfmt.NewReader(strings.NewReader(line), "line")
	for rd.Scan() {
		if res, isResult := rd.Result().(*benchfmt.Result); isResult {
			return fromBenchfmt(res), true
		}
	}
	return Result{}, false
}

// fromBenchfmt copies what the report reads out of a benchfmt result (whose buffers the reader
// reuses).
func fromBenchfmt(res *benchfmt.Result) Result {
	base, parts := res.Name.Parts()
	name := "Benchmark" + string(base)
	procs := 1
	for _, p := range parts {
		if n, err := strconv.Atoi(string(bytes.TrimPrefix(p, []byte("-")))); p[0] == '-' && err == nil {
			procs = n
			continue
		}
		name += string(p)
	}
	r := Result{Pkg: res.GetConfig("pkg"), Name: name, Procs: procs, Iters: res.Iters,
		Metrics: make(map[string]float64, len(res.Values))}
	for _, v := range res.Values {
		if v.OrigUnit != "" {
			r.Metrics[v.OrigUnit] = v.OrigValue
		} else {
			r.Metrics[v.Unit] = v.Value
		}
	}
	return r
}

// Stat summarises one metric of one benchmark over the -count runs of an invocation.
type Stat struct {
	// Values are in run order.
	Values []float64
	// Median is benchstat's center (benchmath.AssumeNothing: no distribution assumed); Min and
	// Max bound the runs. With the few runs a report affords (3), benchstat's 95% interval of the
	// median is unbounded, so the report shows the range instead.
	Median, Min, Max float64
}

// N is the number of runs.
func (s Stat) N() int { return len(s.Values) }

// newStat summarises values (at least one).
func newStat(values []float64) Stat {
	s := Stat{Values: values}
	sample := benchmath.NewSample(slices.Clone(values), &benchmath.DefaultThresholds)
	s.Median = benchmath.AssumeNothing.Summary(sample, 0.95).Center
	s.Min, s.Max = sample.Values[0], sample.Values[len(sample.Values)-1]
	return s
}

// Stat is the named benchmark's unit over every run in out; ok is false when it has none.
func (o Output) Stat(name, unit string) (Stat, bool) {
	var vs []float64
	for _, r := range o.Results {
		if r.Name != name {
			continue
		}
		if v, ok := r.Metrics[unit]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return Stat{}, false
	}
	return newStat(vs), true
}

// Has reports whether the named benchmark ran.
func (o Output) Has(name string) bool {
	return slices.ContainsFunc(o.Results, func(r Result) bool { return r.Name == name })
}

// Names lists the benchmarks that ran, in order of first appearance.
func (o Output) Names() []string {
	var names []string
	for _, r := range o.Results {
		if !slices.Contains(names, r.Name) {
			names = append(names, r.Name)
		}
	}
	return names
}

// Ratio is a / b: the ratio of the medians, and the range of the per-run ratios (run i of a
// against run i of b; both come from the same invocation).
type Ratio struct {
	Median, Min, Max float64
	N                int
}

func ratio(a, b Stat) Ratio {
	r := Ratio{Median: a.Median / b.Median}
	n := min(len(a.Values), len(b.Values))
	var per []float64
	for i := range n {
		per = append(per, a.Values[i]/b.Values[i])
	}
	s := newStat(per)
	r.Min, r.Max, r.N = s.Min, s.Max, n
	return r
}
