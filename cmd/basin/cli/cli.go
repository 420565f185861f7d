// Package cli is the basin command: it parses arguments and wires the packages that do the work.
// It lives outside cmd/basin so tests can run commands in-process.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
)

// Env is what a command may touch: its streams and arguments. Tests supply their own.
type Env struct {
	Stdout, Stderr io.Writer
	// Getenv reads the environment (os.Getenv in production).
	Getenv func(string) string

	// path and doc are the command being run ("sim run") and its help; the dispatcher sets them so
	// that newFlags can answer --help for every command the same way.
	path string
	doc  help
}

// help is what `basin … --help` prints for a command: what it does, how it is called, examples.
// Every command and group has one; TestEveryCommandHasHelp fails if one lacks a summary or an
// example.
type help struct {
	// summary is one line: what the command does, also shown in its parent's command list.
	summary string
	// usage is the synopsis after the command's path, e.g. "--scenario S [flags]".
	usage string
	// detail is more prose: inputs, outputs and why (optional).
	detail string
	// examples are complete invocations, each starting with "basin <path>".
	examples []string
}

// command is a node of the command tree: a leaf with run, or a group with subs.
type command struct {
	help
	run  func(ctx context.Context, env Env, args []string) error
	subs map[string]command
}

// root is the command tree. Help texts live here, next to the dispatch, so that a command cannot
// be added without them (the test walks this tree). Each group is built by its own function, so
// that the tree reads as its top level here.
func root() command {
	return command{help: help{
		summary: "keep LLM agent-serving deployments out of the cache-pressure trap",
		usage:   "<command> [arguments]",
		examples: []string{
			"basin demo",
			"basin sim run --scenario paper-1p1d-h100-spike",
			"basin gateway --config gateway.yaml",
		},
	}, subs: map[string]command{
		"sim":   simCommands(),
		"trace": traceCommands(),
		"demo": {help: help{
			summary: "show the cache-pressure trap: three deployments side by side — no spike, dry run (basin watches), acting",
			usage:   "[flags]",
			detail: "Plays a spike scenario on three simulated deployments on loopback, each behind a real gateway:\n" +
				"no spike (the same sessions without it), dry run (the spike; the daemon watches), acting (the\n" +
				"spike; the daemon acts). Prints the status pages, what the daemons saw and did, and a table.\n" +
				"Ctrl-C prints what was measured so far.",
			examples: []string{"basin demo", "basin demo --speed 60 --dir demo-files"},
		}, run: runDemo},
		"predictor": predictorCommands(),
		"loadgen": {help: help{
			summary: "drive a scenario's agent sessions over the OpenAI API against an endpoint and report goodput",
			usage:   "--target URL --scenario S [flags]",
			detail: "The endpoint may be the gateway, basin sim serve or a real engine. The report (JSON) goes to\n" +
				"stdout; progress to stderr. Ctrl-C stops the run and prints the partial report.",
			examples: []string{"basin loadgen --target http://127.0.0.1:8080 --scenario paper-1p1d-h100-spike --speed 60",
				"basin loadgen --target http://127.0.0.1:8080 --scenario my-workload.yaml --speed 1 --api-key-env OPENAI_API_KEY"},
		}, run: runLoadgen},
		"gateway": {help: help{
			summary:  "serve the session-admission gateway in front of the engines until interrupted",
			usage:    "--config gateway.yaml [flags]",
			detail:   "gateway/testdata/gateway.example.yaml has every key explained; the admin token comes from the environment.",
			examples: []string{"basin gateway --config gateway.yaml", "basin gateway --config gateway.yaml --log-level debug"},
		}, run: runGateway},
		"daemon": {help: help{
			summary:  "collect, detect and remediate against a live deployment (the gateway, engines, Alertmanager, Slack)",
			usage:    "--config daemon.yaml [flags]",
			detail:   "examples/daemon.yaml is an annotated config. Start with --dry-run to see what it would do.",
			examples: []string{"basin daemon --config daemon.yaml --dry-run", "basin daemon --config daemon.yaml"},
		}, run: runDaemon},
		"risk": {help: help{
			summary: "which limit a deployment reaches first: the cache knee (the trap) or decode memory",
			usage:   "--scenario S | --metrics role=URL,… [flags]",
			detail: "From a scenario, or live from the engines' and the gateway's metrics. The engines alone give the\n" +
				"cache capacity and the working set at the knee; the limits in sessions and which binds first need\n" +
				"the gateway's metrics (live sessions, sessions in a call).",
			examples: []string{"basin risk --scenario paper-1p1d-h100",
				"basin risk --metrics prefill=http://p:30000/metrics,decode=http://d:30001/metrics,gateway=http://127.0.0.1:8081/metrics --calibration calibration.json"},
		}, run: runRisk},
		"calibrate": {help: help{
			summary: "measure a deployment's knee by step load (simulated, or a live endpoint) and write calibration.json",
			usage:   "--scenario S [--target URL --metrics role=URL,…] [flags]",
			detail: "With --scenario only, the simulated deployment is step-loaded in virtual time. With --target,\n" +
				"agent sessions are sent at rising arrival rates to a live endpoint while its metrics are scraped;\n" +
				"progress goes to stderr, and Ctrl-C writes the points measured so far next to -o (<name>.partial.json).",
			examples: []string{"basin calibrate --scenario paper-1p1d-h100 -o calibration.json",
				"basin calibrate --target http://127.0.0.1:8080 --metrics prefill=http://p:30000/metrics,decode=http://d:30001/metrics,gateway=http://127.0.0.1:8081/metrics --scenario paper-1p1d-h100"},
		}, run: runCalibrate},
		"version": {help: help{
			summary:  "print the version (also: basin --version)",
			usage:    "",
			examples: []string{"basin version"},
		}, run: runVersion},
	}}
}

// leaf adapts a command that needs no context (it finishes on its own, in virtual time or on a
// file) to the tree's signature; commands that serve until interrupted take the context.
func leaf(f func(Env, []string) error) func(context.Context, Env, []string) error {
	return func(_ context.Context, env Env, args []string) error { return f(env, args) }
}

// simCommands is `basin sim`: the simulator's commands, which run in virtual time except serve.
func simCommands() command {
	return command{help: help{
		summary: "simulate a deployment: run, compare, curve, serve, and the figures in docs/results.md",
		usage:   "<command> [flags]",
		detail: "The simulator plays a prefill/decode deployment serving agent sessions, in virtual time (an hour\n" +
			"in well under a second) or over HTTP at an accelerated wall clock (serve).",
		examples: []string{"basin sim run --scenario paper-1p1d-h100-spike", "basin sim compare --scenario paper-1p1d-h100-spike"},
	}, subs: map[string]command{
		"run": {help: help{
			summary: "run one scenario in virtual time and print goodput, hit rate, TTFT and what the detector saw",
			usage:   "--scenario S [flags]",
			detail: "Without --calibration the scenario's deployment is step-loaded first (well under a second) to\n" +
				"give the detector its knee. --json prints the whole result; --timeline writes one CSV row per minute.",
			examples: []string{"basin sim run --scenario paper-1p1d-h100-spike",
				"basin sim run --scenario paper-1p1d-h100-spike --policy basin --json --timeline out.csv"},
		}, run: leaf(simRun)},
		"compare": {help: help{
			summary: "run a scenario under several policies (engine baselines and basin's) side by side",
			usage:   "--scenario S [flags]",
			examples: []string{"basin sim compare --scenario paper-1p1d-h100-spike",
				"basin sim compare --scenario paper-1p1d-h100-spike --policies none,basin --json"},
		}, run: leaf(simCompare)},
		"curve": {help: help{
			summary: "measure the completion curve X(N) and the fluid model's equilibria (the basin edge)",
			usage:   "--scenario S [flags]",
			examples: []string{"basin sim curve --scenario paper-1p1d-h100",
				"basin sim curve --scenario paper-1p1d-h100 -n 10,40,80 --json"},
		}, run: leaf(simCurve)},
		"fidelity": {help: help{
			summary:  "check the simulator against the Basin paper's observations (a)–(e) over seeds",
			usage:    "[flags]",
			examples: []string{"basin sim fidelity --seeds 10", "basin sim fidelity --seeds 10 --markdown > docs/fidelity.md"},
		}, run: leaf(simFidelity)},
		"serve": {help: help{
			summary: "serve a simulated deployment over HTTP: the OpenAI API, per-instance SGLang-named /metrics, lending switch",
			usage:   "--scenario S [flags]",
			detail:  "Runs on the wall clock at --speed until interrupted; point the gateway, basin loadgen or basin calibrate at it.",
			examples: []string{"basin sim serve --scenario paper-1p1d-h100 --speed 60 --listen 127.0.0.1:8000",
				"basin sim serve --scenario paper-1p1d-h100-spike --traffic scenario"},
		}, run: simServe},
		"riskgrid": {help: help{
			summary:  "validate the risk rule on the 36-deployment grid against what the simulator runs into first",
			usage:    "[flags]",
			examples: []string{"basin sim riskgrid", "basin sim riskgrid --markdown --seed 1"},
		}, run: leaf(simRiskGrid)},
		"detect": {help: help{
			summary: "the detector against conventional utilisation alerts over seeds of the spike scenarios, and each collapse's last rescue time",
			usage:   "[flags]",
			detail: "For every collapsed +100% run the same seed is re-run with basin's daemon switched from watching to\n" +
				"acting at different minutes, and again with the admission budget cut to the daemon's incident value;\n" +
				"the latest minute that still avoids the collapse is its last rescue time for each (--rescue=false\n" +
				"skips them).",
			examples: []string{"basin sim detect --seeds 20", "basin sim detect --seeds 20 --markdown",
				"basin sim detect --seeds 5 --rescue=false"},
		}, run: leaf(simDetect)},
		"tolerance": {help: help{
			summary: "the detector's predicted spike tolerance against the simulated one over deployments, tiers and base loads",
			usage:   "[flags]",
			detail: "For each point the fluid model predicts, at the stable point of the base rate, the largest\n" +
				"ten-minute spike the deployment absorbs; the simulator bisects for the smallest spike multiplier that\n" +
				"collapses at least half of the seeds. Prints the table, the rank correlation and the median ratio.",
			examples: []string{"basin sim tolerance --quick", "basin sim tolerance --seeds 5 --markdown"},
		}, run: leaf(simTolerance)},
		"late": {help: help{
			summary: "act on an already trapped deployment: the daemon watches until a minute, then acts, with and without holds",
			usage:   "[flags]",
			detail: "For each +100% spike preset, seed and acting minute, the engine baseline runs with basin's daemon\n" +
				"watching until that minute and acting from it, once with today's levers only (budget, shedding,\n" +
				"lending) and once with holds; the table gives the runs recovered, the minutes to recover, goodput\n" +
				"against the no-spike twin and the first-call wait after acting.",
			examples: []string{"basin sim late", "basin sim late --markdown --also-hold-bound 8m", "basin sim late --scenarios paper-1p3d-h200-spike --act-at 40 --seeds 2"},
		}, run: leaf(simLate)},
		"scaling": {help: help{
			summary: "basin's scaling against the pools as provisioned and the peers' utilisation autoscaler, past the peak",
			usage:   "[flags]",
			detail: "Each row (deployment × load × spike) runs basin's admission three ways on the same seeds: the pools as\n" +
				"provisioned, with a utilisation autoscaler (the HPA's algorithm on decode KV usage and prefill queue), and\n" +
				"with basin's own scaling. The table gives goodput, first-call wait, instance-minutes and goodput per\n" +
				"instance-hour, and whether each arm scaled.",
			examples: []string{"basin sim scaling --markdown --plot docs/results-scaling.svg", "basin sim scaling --loads 1.2,1.5 --spikes 100 --second-spike 45m --seeds 6 --markdown", "basin sim scaling --deployments 1p1d --loads 1.5 --spikes 0 --seeds 1"},
		}, run: leaf(simScaling)},
		"matrix": {help: help{
			summary: "every policy over load (a fraction of each deployment's calibrated peak) × spike × tier × deployment × workload, over seeds",
			usage:   "[flags]",
			examples: []string{"basin sim matrix --seeds 3 --markdown --plot docs/results-matrix",
				"basin sim matrix --seeds 1 --loads 0.8,1.2 --spikes 300 --tiers gpu --deployments 1p3d --workloads terminal-bench"},
		}, run: leaf(simMatrix)},
	}}
}

// traceCommands is `basin trace`: agent-session traces.
func traceCommands() command {
	return command{help: help{
		summary:  "agent-session traces: import",
		usage:    "<command> [flags]",
		examples: []string{"basin trace import --format tracelab -o session.jsonl round_trace.jsonl"},
	}, subs: map[string]command{
		"import": {help: help{
			summary: "convert a recorded agent-session trace into basin's trace format and print per-session statistics",
			usage:   "[--format tracelab|basin] [-o OUT.jsonl] IN.jsonl",
			detail: "IN is a JSON-lines file. With --format tracelab (the default) it is a normalized round trace of\n" +
				"the TraceLab project (github.com/uw-syfi/TraceLab; real Claude Code and Codex sessions, one row per\n" +
				"model round, e.g. its round_trace.jsonl). With --format basin it is basin's own trace format, as\n" +
				"written by this command or by the gateway's record.path, and is checked and re-written.\n" +
				"The trace goes to -o (or stdout); the statistics to stdout when -o is set, else to stderr.",
			examples: []string{"basin trace import --format tracelab -o session.jsonl round_trace.jsonl",
				"basin trace import --format basin recorded.jsonl > /dev/null"},
		}, run: leaf(traceImport)},
	}}
}

// predictorCommands is `basin predictor`: the gateway's peak-context predictor.
func predictorCommands() command {
	return command{help: help{
		summary:  "the gateway's peak-context predictor: train",
		usage:    "<command> [flags]",
		examples: []string{"basin predictor train --traces recorded.jsonl -o model.json"},
	}, subs: map[string]command{
		"train": {help: help{
			summary: "fit the peak-context predictor on recorded sessions and report how well it ranks held-out ones",
			usage:   "--traces T.jsonl -o MODEL.json [flags]",
			examples: []string{"basin predictor train --traces recorded.jsonl -o model.json",
				"basin predictor train --traces round_trace.jsonl --format tracelab -o model.json"},
		}, run: leaf(predictorTrain)},
	}}
}

// errUsage marks an error whose message is a usage text; it exits 2.
var errUsage = errors.New("usage")

// Main runs the basin command with os.Args and returns the exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, os.Args[1:])
}

// isHelp says whether an argument asks for help.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// Run runs one basin command and returns its exit code: 0 ok, 1 failure, 2 bad usage. Help asked
// for goes to stdout; usage after a mistake to stderr.
func Run(ctx context.Context, env Env, args []string) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	if len(args) > 1 && args[0] == "help" { // basin help sim run
		args = append(args[1:], "--help")
	}
	cmd, path := root(), []string(nil)
	for cmd.subs != nil {
		name := strings.Join(append([]string{"basin"}, path...), " ")
		switch {
		case len(args) == 0:
			printGroupHelp(env.Stderr, path, cmd)
			if len(path) == 0 {
				return 2
			}
			fmt.Fprintf(env.Stderr, "%s: missing command\n", name)
			return 2
		case isHelp(args[0]):
			printGroupHelp(env.Stdout, path, cmd)
			return 0
		}
		sub, ok := cmd.subs[args[0]]
		if !ok {
			fmt.Fprintf(env.Stderr, "%s: unknown command %q\n", name, args[0])
			printGroupHelp(env.Stderr, path, cmd)
			return 2
		}
		cmd, path, args = sub, append(path, args[0]), args[1:]
	}
	env.path, env.doc = strings.Join(path, " "), cmd.help
	if err := cmd.run(ctx, env, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(env.Stderr, "basin %s: %v\n", env.path, err)
		if errors.Is(err, errUsage) {
			fmt.Fprintf(env.Stderr, "run 'basin %s --help' for its flags and examples\n", env.path)
			return 2
		}
		return 1
	}
	return 0
}

// printGroupHelp lists a group's commands with their summaries, and its examples.
func printGroupHelp(w io.Writer, path []string, c command) {
	name := strings.Join(append([]string{"basin"}, path...), " ")
	fmt.Fprintf(w, "%s — %s\n\nusage: %s %s\n", name, c.summary, name, c.usage)
	if c.detail != "" {
		fmt.Fprintf(w, "\n%s\n", c.detail)
	}
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(c.subs))
	for n := range c.subs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, c.subs[n].summary)
	}
	printExamples(w, c.examples)
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags and examples.\n", name)
}

func printExamples(w io.Writer, examples []string) {
	fmt.Fprintln(w, "\nexamples:")
	for _, e := range examples {
		fmt.Fprintf(w, "  %s\n", e)
	}
}

// printLeafHelp writes a command's help: what it does, the synopsis, examples, and its flags.
func printLeafHelp(w io.Writer, path string, h help, fs *flag.FlagSet) {
	fmt.Fprintf(w, "basin %s — %s\n\nusage: %s\n", path, h.summary, strings.TrimSpace("basin "+path+" "+h.usage))
	if h.detail != "" {
		fmt.Fprintf(w, "\n%s\n", h.detail)
	}
	printExamples(w, h.examples)
	fmt.Fprintln(w, "\nflags:")
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// flagSet is a command's flags and its help.
type flagSet struct {
	*flag.FlagSet
	help func()
}

// newFlags makes the running command's flag set. It reports errors instead of exiting and prints
// nothing itself: parse turns -h/--help into the command's help on stdout, and a bad flag into a
// usage error that Run prints once (the flag package would print the whole help with it).
func newFlags(env Env) *flagSet {
	fs := flag.NewFlagSet("basin "+env.path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, help: func() { printLeafHelp(env.Stdout, env.path, env.doc, fs) }}
}

// parse parses flags and rejects stray positional arguments unless allowed.
func parse(fs *flagSet, args []string, positional int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.help()
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > positional {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(positional))
	}
	return nil
}

func runVersion(_ context.Context, env Env, args []string) error {
	fs := newFlags(env)
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		// Go stamps the main module's version from the checkout (a pseudo-version naming the
		// commit, "+dirty" for uncommitted changes) unless VCS stamping is off; then it is
		// "(devel)" and the commit, if stamped at all, is in the settings.
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		if v == "(devel)" {
			for _, s := range bi.Settings {
				switch {
				case s.Key == "vcs.revision":
					v += " " + s.Value[:min(12, len(s.Value))]
				case s.Key == "vcs.modified" && s.Value == "true":
					v += "-dirty"
				}
			}
		}
	}
	fmt.Fprintf(env.Stdout, "basin %s\n", strings.TrimSpace(v))
	return nil
}
