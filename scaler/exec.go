package scaler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/basin-dev/basin/internal/hook"
)

// ExecBackend runs Command (no shell: the first element is the program, the rest its arguments)
// with the request as JSON on stdin (Payload, PayloadVersion) and, for scripts that do not parse
// JSON, in the environment:
//
//	BASIN_SCALE_DEPLOYMENT=prod
//	BASIN_SCALE_ROLE=prefill|decode
//	BASIN_SCALE_REPLICAS=3
//	BASIN_SCALE_REASON=trapped: …
//	BASIN_SCALE_SEQ=42
//
// on top of the daemon's own environment (PATH, the credentials the script needs). It is how an
// operator scales with a tool of their own (a cloud CLI, helm, a Slurm allocation). The command
// must be idempotent — it runs for every request the caller applies, mostly with nothing changed
// — and exit 0 once the request is accepted; it should ask for the instances and return rather
// than wait for them to serve. Standard output is discarded.
type ExecBackend struct {
	Command []string
	// Timeout bounds one run (DefaultExecTimeout when 0); the command is killed at the end of it.
	Timeout time.Duration
}

// Name implements Backend.
func (*ExecBackend) Name() string { return KindExec }

// Apply implements Backend. A non-zero exit is an error with the exit code and the last lines of
// stderr.
func (b *ExecBackend) Apply(ctx context.Context, r Request) error {
	if len(b.Command) == 0 || b.Command[0] == "" {
		return errors.New("exec: no command")
	}
	prog := b.Command[0]
	if err := r.Validate(); err != nil {
		return fmt.Errorf("exec %s: %w", prog, err)
	}
	payload, err := MarshalPayload(r)
	if err != nil {
		return fmt.Errorf("exec %s: encode scale request: %w", prog, err)
	}
	return hook.Run(ctx, b.Command, orDefault(b.Timeout, DefaultExecTimeout), payload, env(r))
}

// Current implements Backend: a script only acts, so the engines' metrics say what runs.
func (*ExecBackend) Current(_ context.Context, role Role) (Count, bool, error) {
	return Count{}, false, checkRole(KindExec, role)
}

// env is the request as the exec backend's environment variables, for scripts that do not parse
// JSON.
func env(r Request) []string {
	return []string{
		"BASIN_SCALE_DEPLOYMENT=" + r.Deployment,
		"BASIN_SCALE_ROLE=" + string(r.Role),
		"BASIN_SCALE_REPLICAS=" + strconv.Itoa(r.Replicas),
		"BASIN_SCALE_REASON=" + r.Reason,
		"BASIN_SCALE_SEQ=" + strconv.FormatUint(r.Seq, 10),
	}
}
