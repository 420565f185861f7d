// Command basin keeps LLM agent-serving deployments out of the cache-pressure trap: it simulates
// deployments, admits sessions at a gateway, detects drift toward the trap and remediates it.
// Run `basin --help` for the commands, and `basin <command> --help` for what one does, with
// examples and its flags.
package main

import (
	"os"

	"github.com/basin-dev/basin/cmd/basin/cli"
)

func main() { os.Exit(cli.Main()) }
