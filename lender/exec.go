package lender

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Bounds of the stderr kept for an error: the last lines say why a script failed, and a chatty
// script cannot grow the daemon's memory.
const (
	stderrKeepBytes = 8 << 10
	stderrLines     = 10
)

// waitDelay is how long Apply waits for the command's output to close after the timeout killed
// it: a grandchild that inherited stderr would otherwise hold Apply forever.
const waitDelay = 2 * time.Second

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
	timeout := orDefault(b.Timeout, DefaultExecTimeout)
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := exec.CommandContext(runCtx, prog, b.Command[1:]...)
	cmd.Stdin = bytes.NewReader(payload)
	cmd.Env = append(os.Environ(), env(d)...) // later entries win over inherited ones
	stderr := &tail{max: stderrKeepBytes}
	cmd.Stderr = stderr
	cmd.WaitDelay = waitDelay
	err = cmd.Run()
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("exec %s: %w%s", prog, ctx.Err(), stderr.lines())
	case runCtx.Err() != nil:
		return fmt.Errorf("exec %s: killed after the %v timeout%s", prog, timeout, stderr.lines())
	case errors.As(err, &ee):
		return fmt.Errorf("exec %s: exit code %d%s", prog, ee.ExitCode(), stderr.lines())
	}
	return fmt.Errorf("exec %s: %w", prog, err)
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

// tail keeps the last max bytes written to it. Only the command's stderr copier writes, and lines
// is read after Run returns, so it needs no lock.
type tail struct {
	max int
	buf []byte
	cut bool // the start was dropped: the first line is partial
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

// lines is the last stderrLines non-empty lines, as an error suffix, or nothing. A line cut by
// the byte bound is left out rather than shown half.
func (t *tail) lines() string {
	text := strings.ToValidUTF8(string(t.buf), "�")
	if i := strings.IndexByte(text, '\n'); t.cut && i >= 0 {
		text = text[i+1:]
	}
	var ls []string
	for l := range strings.Lines(text) {
		if l = strings.TrimSpace(l); l != "" {
			ls = append(ls, l)
		}
	}
	if len(ls) == 0 {
		return ""
	}
	ls = ls[max(len(ls)-stderrLines, 0):]
	return "; stderr: " + strings.Join(ls, " | ")
}
