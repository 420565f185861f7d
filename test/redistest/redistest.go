//go:build unix

// Package redistest runs a real redis-server (Debian's redis-server package) for integration
// tests: on its own port, in a temporary directory, with an append-only file, so a test can
// SIGSTOP it, SIGKILL it and restart it from its file. Unit tests use miniredis; these tests are
// for what only the real server does (persistence, a process that stops answering).
package redistest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server.
type Server struct {
	tb    testing.TB
	bin   string
	dir   string
	addr  string
	fsync string
	cmd   *exec.Cmd
}

// Start starts redis-server with appendfsync set to fsync ("always", "everysec"). Without the
// binary the test is skipped, except under CI (CI set), where .ci/run installs the Debian
// package and a missing server is a failure. The server is killed when the test ends.
func Start(tb testing.TB, fsync string) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("redis-server not on PATH under CI: .ci/run must install the Debian package redis-server")
		}
		tb.Skip("redis-server not on PATH: install the Debian package redis-server to run the store integration tests")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir(), addr: addr, fsync: fsync}
	s.Restart()
	tb.Cleanup(s.Kill)
	return s
}

// Addr is host:port.
func (s *Server) Addr() string { return s.addr }

// Dir is the server's directory (its append-only file and log).
func (s *Server) Dir() string { return s.dir }

// Restart starts the server again on the same port and directory (after Kill: from its
// append-only file) and waits until it answers.
func (s *Server) Restart() {
	s.tb.Helper()
	_, port, err := net.SplitHostPort(s.addr)
	if err != nil {
		s.tb.Fatal(err)
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.tb.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	s.cmd = exec.Command(s.bin, "--port", port, "--bind", "127.0.0.1", "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", s.fsync, "--save", "", "--daemonize", "no")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatal(err)
	}
	probe := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer func() { _ = probe.Close() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := probe.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.tb.Fatalf("redis-server on %s not ready in 5 s: %v\n%s", s.addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill SIGKILLs the server: no shutdown, no final fsync. Safe to call twice.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies only once continued on some kernels
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Pause SIGSTOPs the server: connections stay open and nothing is answered, as with a hung
// host. Resume SIGCONTs it.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		s.tb.Fatalf("redis-server on %s is not running", s.addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}

// Client is a client of the server with short timeouts, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: s.addr, ContextTimeoutEnabled: true,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
