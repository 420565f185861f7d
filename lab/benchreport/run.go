// Package benchreport runs basin's Go benchmarks and the policy comparison and writes
// docs/benchmarks.md from the results (`make bench`, through its command cmd/gen). Every number in
// the document comes from the run; a ratio is only ever between two benchmarks of the same
// `go test` invocation. go test's output is read with golang.org/x/perf's benchfmt and each
// benchmark's runs are summarised with benchmath, the reader and statistics benchstat uses.
package benchreport

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Command is how the report is regenerated; the document names it with its -count and -o.
const Command = "go run ./lab/benchreport/cmd/gen"

// Options configure a run.
type Options struct {
	// Count is the runs of each benchmark (go test -count), at least 1.
	Count int
	// Out is where to write the markdown.
	Out string
	// Basin is the basin binary for the policy comparison, built when absent.
	Basin string
}

// Run runs the benchmarks from the module's root and writes the report to o.Out, printing
// progress to stderr.
func Run(o Options) error {
	if o.Count < 1 {
		return errors.New("-count: must be at least 1")
	}
	start := time.Now()
	outPath, err := filepath.Abs(o.Out)
	if err != nil {
		return err
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}

	cmd := Command + " -count " + strconv.Itoa(o.Count)
	if rel, err := filepath.Rel(root, outPath); err == nil && !strings.HasPrefix(rel, "..") {
		cmd += " -o " + filepath.ToSlash(rel)
	} else {
		cmd += " -o " + o.Out
	}
	r := &Report{Command: cmd, Date: start, Count: o.Count, Machine: machine()}

	n := strconv.Itoa(o.Count)
	bench := func(regexp string, extra []string, pkgs ...string) []string {
		args := []string{"go", "test", "-run", "^$", "-bench", regexp, "-benchmem"}
		args = append(args, extra...)
		args = append(args, "-count", n)
		return append(args, pkgs...)
	}
	steps := []struct {
		dst  **Invocation
		args []string
	}{
		{&r.Gateway, bench("StreamThroughput|ParseCall|CallShapes", nil, "./gateway/")},
		{&r.AgentCall, bench("ParseRead|ReadShapes", nil, "./internal/agentcall/")},
		{&r.AdmissionPredictor, bench(".", nil, "./gateway/admission/", "./gateway/predictor/")},
		{&r.Daemon, bench("StepSessions", nil, "./daemon/")},
		{&r.Sim, bench(".", nil, "./sim/", "./sim/enginemetrics/")},
		{&r.Serve, bench("ParseGenerate", nil, "./sim/serve/")},
		{&r.Collector, bench("^Benchmark(Snapshot64x2000|RawParse64x2000|SnapshotFullParse64x2000)$", []string{"-benchtime", "5x"}, "./collector/")},
		{&r.Detector, bench("^BenchmarkStep$", nil, "./detector/")},
		// One run whatever -count: a minute of load against a real redis-server.
		{&r.Replicated, []string{"go", "test", "-run", "^$", "-bench", "^BenchmarkReplicatedScale$", "-benchmem", "-benchtime", "1x", "-count", "1", "./gateway/"}},
	}
	total := len(steps) + 2
	for i, s := range steps {
		progress("[%d/%d] %s", i+1, total, shellJoin(s.args))
		*s.dst = runGoTest(s.args)
		iv := *s.dst
		progress("      %d results in %s%s", len(iv.Out.Results), roundDur(iv.Wall), errSuffix(iv.Err))
	}

	if _, err := os.Stat(o.Basin); errors.Is(err, os.ErrNotExist) {
		progress("building %s", o.Basin)
		b := exec.Command("go", "build", "-o", o.Basin, "./cmd/basin")
		b.Stderr = os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("go build -o %s ./cmd/basin: %w", o.Basin, err)
		}
	}
	for i, sc := range []struct {
		dst  **Compare
		name string
	}{{&r.Spike100, "paper-1p3d-h200-spike"}, {&r.Spike300, "paper-1p3d-h200-spike300"}} {
		args := []string{"./" + filepath.ToSlash(filepath.Clean(o.Basin)), "sim", "compare", "--scenario", sc.name, "--json"}
		if filepath.IsAbs(o.Basin) {
			args[0] = o.Basin
		}
		progress("[%d/%d] %s", len(steps)+i+1, total, shellJoin(args))
		*sc.dst = runCompare(sc.name, args)
		progress("      %d policies in %s%s", len((*sc.dst).Policies), roundDur((*sc.dst).Wall), errSuffix((*sc.dst).Err))
	}

	r.Total = time.Since(start)
	var buf bytes.Buffer
	if err := Render(&buf, r); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(outPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(outPath, buf.Bytes(), 0o644); err != nil {
		return err
	}
	progress("wrote %s in %s", o.Out, roundDur(r.Total))
	return nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchreport: "+format+"\n", args...)
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (failed: " + e + ")"
}

// moduleRoot is the directory of the main module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside a Go module: run from the basin repository")
	}
	return filepath.Dir(mod), nil
}

// runGoTest runs one go test invocation and parses its output.
func runGoTest(args []string) *Invocation {
	iv := &Invocation{Args: args}
	c := exec.Command(args[0], args[1:]...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	start := time.Now()
	err := c.Run()
	iv.Wall = time.Since(start)
	parsed, perr := Parse(bytes.NewReader(out.Bytes()))
	iv.Out = parsed
	switch {
	case err != nil:
		iv.Err = err.Error()
		if line := firstFailure(out.String()); line != "" {
			iv.Err += ": " + line
		}
	case perr != nil:
		iv.Err = "reading the output: " + perr.Error()
	}
	return iv
}

// firstFailure is the first line of go test's output that says what went wrong.
func firstFailure(out string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "", l == "PASS", l == "FAIL", strings.HasPrefix(l, "goos:"), strings.HasPrefix(l, "goarch:"),
			strings.HasPrefix(l, "pkg:"), strings.HasPrefix(l, "cpu:"), strings.HasPrefix(l, "ok "):
			continue
		}
		if _, ok := ParseLine(l); ok {
			continue
		}
		if len(l) > 160 {
			l = l[:160] + "…"
		}
		return l
	}
	return ""
}

// runCompare runs one `basin sim compare --json` and decodes its policies.
func runCompare(scenario string, args []string) *Compare {
	c := &Compare{Scenario: scenario, Args: args}
	cmd := exec.Command(args[0], args[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	c.Wall = time.Since(start)
	if err != nil {
		c.Err = err.Error()
		if l := firstFailure(stderr.String()); l != "" {
			c.Err += ": " + l
		}
		return c
	}
	if err := json.Unmarshal(stdout.Bytes(), &c.Policies); err != nil {
		c.Err = "decoding its JSON: " + err.Error()
	}
	return c
}

// machine describes this machine from /proc and /etc/os-release (Linux); what it cannot read
// stays empty and is reported as unknown.
func machine() Machine {
	m := Machine{Cores: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPU = field(string(b), "model name", ':')
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		kb := strings.TrimSuffix(field(string(b), "MemTotal", ':'), " kB")
		if v, err := strconv.ParseFloat(strings.TrimSpace(kb), 64); err == nil {
			m.MemoryGiB = v / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		m.OS = strings.Trim(field(string(b), "PRETTY_NAME", '='), `"`)
	}
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		m.Go = strings.TrimSpace(string(out))
	}
	return m
}

// field is the value of the first "key<sep>value" line of s.
func field(s, key string, sep byte) string {
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(line, string(sep))
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
