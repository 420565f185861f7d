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
}

type command struct {
	summary string
	run     func(ctx context.Context, env Env, args []string) error
}

func commands() map[string]command {
	return map[string]command{
		"sim":       {"simulate a deployment: run, compare, curve, serve", runSim},
		"trace":     {"agent-session traces: import", runTrace},
		"demo":      {"show the cache-pressure trap: a healthy and a spike run side by side", runDemo},
		"predictor": {"the gateway's peak-context predictor: train", runPredictor},
		"loadgen":   {"drive a scenario's agent sessions over the OpenAI API against an endpoint", runLoadgen},
		"gateway":   {"the session-admission gateway in front of the engines", runGateway},
		"daemon":    {"collect, detect and remediate against a live deployment (the gateway, engines, Alertmanager, Slack)", runDaemon},
		"risk":      {"which limit a deployment reaches first: the cache knee or decode memory", runRisk},
		"calibrate": {"measure a deployment's knee by step load (simulated, or a live endpoint)", runCalibrate},
		"version":   {"print the version", runVersion},
	}
}

// errUsage marks an error whose message is a usage text; it exits 2.
var errUsage = errors.New("usage")

// Main runs the basin command with os.Args and returns the exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, os.Args[1:])
}

// Run runs one basin command and returns its exit code: 0 ok, 1 failure, 2 bad usage.
func Run(ctx context.Context, env Env, args []string) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.Stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(env.Stderr, "basin: unknown command %q\n", args[0])
		usage(env.Stderr, cmds)
		return 2
	}
	if err := c.run(ctx, env, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(env.Stderr, "basin %s: %v\n", args[0], err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: basin <command> [arguments]\n\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
}

// newFlags makes a flag set that reports errors instead of exiting.
func newFlags(env Env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("basin "+name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	return fs
}

// parse parses flags and rejects stray positional arguments unless allowed.
func parse(fs *flag.FlagSet, args []string, positional int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
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
	fs := newFlags(env, "version")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value[:min(12, len(s.Value))]
			}
		}
	}
	fmt.Fprintf(env.Stdout, "basin %s\n", strings.TrimSpace(v))
	return nil
}

func subcommand(env Env, group string, args []string, subs map[string]func([]string) error) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		names := make([]string, 0, len(subs))
		for n := range subs {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(env.Stderr, "usage: basin %s <%s> [flags]\n", group, strings.Join(names, "|"))
		if len(args) == 0 {
			return fmt.Errorf("%w: missing subcommand", errUsage)
		}
		return flag.ErrHelp
	}
	f, ok := subs[args[0]]
	if !ok {
		return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
	}
	return f(args[1:])
}
