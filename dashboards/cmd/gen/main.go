// Command gen writes basin's Grafana dashboards as JSON files, one <uid>.json per dashboard:
//
//	go run ./dashboards/cmd/gen -o dashboards/json
//
// `make dashboards` runs it; the files it writes are checked in, and the dashboards package's
// tests fail when they differ from what the code builds.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/basin-dev/basin/dashboards"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "dashboards/json", "directory to write the dashboards' JSON files to")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gen: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := dashboards.WriteAll(*out); err != nil {
		fmt.Fprintf(stderr, "gen: %v\n", err)
		return 1
	}
	return 0
}
