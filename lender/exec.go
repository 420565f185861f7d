package lender

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/hook"
)

// ExecBackend runs Command (no shell: the first element is the program, the rest its arguments)
// with the decision as JSON on stdin (Payload, PayloadVersion) and, for scripts that do not parse
// JSON, in the environment:
//
//	BASIN_LENDING_ENABLED=true|false
//	BASIN_LENDING_CHANGED=true|false     (whether this decision toggled the switch)
//	BASIN_LENDING_MAX_FRACTION=0.5
//	BASIN_LENDING_GRANTS=decode-0=37000,decode-1=0
//
// on top of the daemon's own environment (PATH, credentials the script needs). It is the other way
// an operator plugs in their own switch, since SGLang has no public API to lend decode KV to
// prefill: typically a blue/green switch between two launch configurations (decode with
// --disaggregation-decode-enable-radix-cache and a router keyed on the session, or without), or a
// call to an engine fork's control API. The command must be idempotent — it runs for every
// decision the caller applies, mostly with nothing changed — and exit 0 when the engine is in the
// requested state. Standard output is discarded.
type ExecBackend struct {
	Command []string
	// Timeout bounds one run (DefaultExecTimeout when 0); the command is killed at the end of it.
	Timeout time.Duration
}

// Name implements Backend.
func (*ExecBackend) Name() string { return KindExec }

// Apply implements Backend. A non-zero exit is an error with the exit code and the last lines of
// stderr.
func (b *ExecBackend) Apply(ctx context.Context, d Decision) error {
	if len(b.Command) == 0 || b.Command[0] == "" {
		return errors.New("exec: no command")
	}
	prog := b.Command[0]
	payload, err := MarshalPayload(d)
	if err != nil {
		return fmt.Errorf("exec %s: encode decision: %w", prog, err)
	}
	return hook.Run(ctx, b.Command, orDefault(b.Timeout, DefaultExecTimeout), payload, env(d))
}

// env is the decision as the exec backend's environment variables, for scripts that do not
// parse JSON. Grants are name=tokens pairs joined by commas; an instance name with a comma or an
// equals sign cannot be read back from it, the JSON on stdin can.
func env(d Decision) []string {
	grants := make([]string, len(d.Grants))
	for i, g := range d.Grants {
		grants[i] = g.Instance + "=" + strconv.FormatInt(g.Tokens, 10)
	}
	return []string{
		"BASIN_LENDING_ENABLED=" + strconv.FormatBool(d.Enabled),
		"BASIN_LENDING_CHANGED=" + strconv.FormatBool(d.Changed),
		"BASIN_LENDING_MAX_FRACTION=" + strconv.FormatFloat(d.MaxFraction, 'g', -1, 64),
		"BASIN_LENDING_GRANTS=" + strings.Join(grants, ","),
	}
}
