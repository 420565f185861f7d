package hook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Bounds of the stderr kept for an error: the last lines say why a script failed, and a chatty
// script cannot grow the daemon's memory. Chosen.
const (
	StderrKeepBytes = 8 << 10
	StderrLines     = 10
)

// waitDelay is how long Run waits for the command's output to close after the timeout killed it:
// a grandchild that inherited stderr would otherwise hold Run forever. Chosen: a killed process's
// pipes close in milliseconds; a grandchild gets no more than this.
const waitDelay = 2 * time.Second

// Run runs command (no shell: the first element is the program, the rest its arguments) with
// stdin, and env added to the daemon's own environment (later entries win, so an inherited
// variable of the same name cannot shadow one the caller sets). Standard output is discarded.
// Exit 0 is success; otherwise the error names the program, the exit code or the timeout, and
// ends with the last lines of stderr. The command is killed at the timeout (zero: none beyond
// ctx's).
func Run(ctx context.Context, command []string, timeout time.Duration, stdin []byte, env []string) error {
	if len(command) == 0 || command[0] == "" {
		return errors.New("exec: no command")
	}
	prog := command[0]
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()

	cmd := exec.CommandContext(runCtx, prog, command[1:]...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = append(os.Environ(), env...)
	stderr := NewTail(StderrKeepBytes)
	cmd.Stderr = stderr
	cmd.WaitDelay = waitDelay
	err := cmd.Run()
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("exec %s: %w%s", prog, ctx.Err(), stderr.Lines())
	case runCtx.Err() != nil:
		return fmt.Errorf("exec %s: killed after the %v timeout%s", prog, timeout, stderr.Lines())
	case errors.As(err, &ee):
		return fmt.Errorf("exec %s: exit code %d%s", prog, ee.ExitCode(), stderr.Lines())
	}
	return fmt.Errorf("exec %s: %w", prog, err)
}

// Tail keeps the last bytes written to it, up to its bound. One writer at a time (a command's
// stderr copier), and Lines read after it is done: it has no lock.
type Tail struct {
	max int
	buf []byte
	cut bool // the start was dropped: the first line is partial
}

// NewTail keeps the last n bytes.
func NewTail(n int) *Tail { return &Tail{max: n} }

// Write implements io.Writer; it never fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

// Lines is the last StderrLines non-empty lines, as an error suffix "; stderr: a | b", or
// nothing. A line cut by the byte bound is left out rather than shown half.
func (t *Tail) Lines() string {
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
	ls = ls[max(len(ls)-StderrLines, 0):]
	return "; stderr: " + strings.Join(ls, " | ")
}
