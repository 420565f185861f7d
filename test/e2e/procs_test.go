//go:build unix

package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stopGrace is how long a process has to exit after SIGTERM before its group is killed.
const stopGrace = 5 * time.Second

// proc is a child process in a process group of its own (so that stopping it stops anything it
// started), writing stdout and stderr to a log file in the test's directory.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // set before done is closed
}

// procs starts the test's processes (from the test's goroutine), stops them all when the test
// ends, and prints the tail of every log when it failed.
type procs struct {
	t   *testing.T
	dir string
	all []*proc
}

func newProcs(t *testing.T, dir string) *procs {
	ps := &procs{t: t, dir: dir}
	// Registered before any process is started, so it runs after every process has been stopped
	// (cleanups run last-in first-out) and the logs are complete.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range ps.all {
			t.Logf("--- %s (%s), exit: %v, last lines of %s:\n%s", p.name, strings.Join(p.cmd.Args, " "), p.err, p.log, tail(p.log, 40))
		}
	})
	return ps
}

// start starts bin with args in the test's directory; name names its log file (name.log).
func (ps *procs) start(name, bin string, args ...string) *proc {
	t := ps.t
	t.Helper()
	logPath := filepath.Join(ps.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Dir = ps.dir
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	ps.all = append(ps.all, p)
	t.Cleanup(p.stop)
	return p
}

// exited reports whether the process has ended, and how.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group (basin, Prometheus and Alertmanager shut down cleanly
// on it), waits up to stopGrace, then kills the group. It is safe to call more than once.
func (p *proc) stop() {
	if done, _ := p.exited(); done {
		return
	}
	pgid := p.cmd.Process.Pid // Setpgid: the group id is the leader's pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// alive fails the test if one of the processes has ended.
func alive(t *testing.T, ps ...*proc) {
	t.Helper()
	for _, p := range ps {
		if done, err := p.exited(); done {
			t.Fatalf("%s exited early (%v); last lines of its log:\n%s", p.name, err, tail(p.log, 40))
		}
	}
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freeAddrs returns n loopback addresses nobody listens on now. They are found together and
// released together just before the processes bind them; another process could still take one
// in between, which fails the test at start with "address already in use", never silently.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var lns []net.Listener
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		require.NoError(t, ln.Close())
	}
	return out
}

// waitFor calls check every 250 ms until it says done or the deadline passes, and returns
// whether it was done and what check said last. It fails the test if a process in watch ends
// meanwhile, or the test's context is cancelled.
func waitFor(t *testing.T, deadline time.Time, watch []*proc, check func() (done bool, detail string)) (bool, string) {
	t.Helper()
	for {
		alive(t, watch...)
		done, detail := check()
		if done || time.Now().After(deadline) {
			return done, detail
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%v (last seen: %s)", t.Context().Err(), detail)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// mustWaitFor is waitFor that fails the test when the deadline passes first.
func mustWaitFor(t *testing.T, deadline time.Time, what string, watch []*proc, check func() (bool, string)) {
	t.Helper()
	if done, detail := waitFor(t, deadline, watch, check); !done {
		t.Fatalf("%s: timed out (last seen: %s)", what, detail)
	}
}
