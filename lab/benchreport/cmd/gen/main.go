// Command gen runs basin's Go benchmarks and the policy comparison and writes docs/benchmarks.md:
//
//	go run ./lab/benchreport/cmd/gen -count 3 -o docs/benchmarks.md
//
// `make bench` runs it. It prints only progress, to stderr.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/basin-dev/basin/lab/benchreport"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o benchreport.Options
	fs.IntVar(&o.Count, "count", 3, "runs of each benchmark (go test -count)")
	fs.StringVar(&o.Out, "o", "docs/benchmarks.md", "where to write the markdown")
	fs.StringVar(&o.Basin, "basin", "bin/basin", "the basin binary for the policy comparison (built when absent)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gen: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := benchreport.Run(o); err != nil {
		fmt.Fprintf(stderr, "gen: %v\n", err)
		return 1
	}
	return 0
}
