package main

import (
	"bufio"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Result is one line of `go test -bench` output: one benchmark, one of the -count runs.
type Result struct {
	// Pkg is the import path from the preceding "pkg:" line.
	Pkg string
	// Name is the full name without the -GOMAXPROCS suffix, e.g. "BenchmarkStreamThroughput/bare".
	Name string
	// Procs is GOMAXPROCS from the suffix (1 when there is none).
	Procs int
	// Iters is the number of iterations the line reports.
	Iters int64
	// Metrics maps a unit ("ns/op", "MB/s", "B/op", "allocs/op", "p99-ns", ...) to its value.
	Metrics map[string]float64
}

// Output is a parsed `go test -bench` output.
type Output struct {
	// CPU is the first "cpu:" line's value.
	CPU     string
	Results []Result
}

// ParseLine parses one benchmark result line: a name (with an optional -N suffix), an iteration
// count, then value–unit pairs. ok is false for any other line.
func ParseLine(line string) (r Result, ok bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
		return Result{}, false
	}
	iters, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || iters <= 0 {
		return Result{}, false
	}
	r = Result{Name: f[0], Procs: 1, Iters: iters, Metrics: map[string]float64{}}
	if i := strings.LastIndexByte(f[0], '-'); i > 0 {
		if p, err := strconv.Atoi(f[0][i+1:]); err == nil && p > 0 {
			r.Name, r.Procs = f[0][:i], p
		}
	}
	for i := 2; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return Result{}, false
		}
		r.Metrics[f[i+1]] = v
	}
	return r, true
}

// Parse reads a whole `go test -bench` output, attaching each result to the package of the
// "pkg:" line before it.
func Parse(rd io.Reader) (Output, error) {
	var out Output
	pkg := ""
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pkg: "):
			pkg = strings.TrimSpace(strings.TrimPrefix(line, "pkg: "))
		case strings.HasPrefix(line, "cpu: "):
			if out.CPU == "" {
				out.CPU = strings.TrimSpace(strings.TrimPrefix(line, "cpu: "))
			}
		default:
			if r, ok := ParseLine(line); ok {
				r.Pkg = pkg
				out.Results = append(out.Results, r)
			}
		}
	}
	return out, sc.Err()
}

// Stat summarises one metric of one benchmark over the -count runs of an invocation.
type Stat struct {
	// Values are in run order.
	Values           []float64
	Median, Min, Max float64
}

// N is the number of runs.
func (s Stat) N() int { return len(s.Values) }

// newStat summarises values (at least one).
func newStat(values []float64) Stat {
	s := Stat{Values: values}
	sorted := slices.Sorted(slices.Values(values))
	s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
	if n := len(sorted); n%2 == 1 {
		s.Median = sorted[n/2]
	} else {
		s.Median = (sorted[n/2-1] + sorted[n/2]) / 2
	}
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
