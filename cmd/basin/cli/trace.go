package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/basin-dev/basin/internal/trace"
)

// traceImport converts a TraceLab round trace into basin's trace format and prints per-session
// statistics. The trace goes to -o (or stdout); the statistics to stdout when -o is set, else to
// stderr, so `basin trace import x.jsonl > y.jsonl` still yields a clean trace file.
func traceImport(env Env, args []string) error {
	fs := newFlags(env)
	format := fs.String("format", "tracelab", "input format: tracelab or basin")
	out := fs.String("o", "", "write the basin trace here (default: stdout)")
	if err := parse(fs, args, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want one input file: basin trace import [-format tracelab] [-o out.jsonl] IN", errUsage)
	}
	in := fs.Arg(0)
	f, err := os.Open(in)
	if err != nil {
		return fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	var sessions []trace.Session
	switch *format {
	case "tracelab":
		sessions, err = trace.ReadTraceLab(f)
	case "basin":
		sessions, err = trace.ReadBasin(f)
	default:
		return fmt.Errorf("%w: -format: %q, want tracelab or basin", errUsage, *format)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	statsOut := env.Stderr
	if *out != "" {
		if err := writeFile(*out, func(w io.Writer) error { return trace.WriteBasin(w, sessions) }); err != nil {
			return err
		}
		statsOut = env.Stdout
	} else if err := trace.WriteBasin(env.Stdout, sessions); err != nil {
		return err
	}
	stats := make([]trace.SessionStats, len(sessions))
	for i, s := range sessions {
		stats[i] = trace.Summarize(s)
	}
	return trace.WriteStats(statsOut, stats)
}
