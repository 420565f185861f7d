//go:build unix

package agentcli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// simSpeed is the simulated deployment's speed: fast enough that a call of a few hundred output
// tokens takes well under a second, slow enough that the simulator's and the gateway's idle
// timeouts (ten simulated minutes: a minute of wall time) outlast the pause between two runs of
// an agent.
const simSpeed = "10"

// adminToken is the gateway's admin bearer token in these tests.
const adminToken = "agentcli-admin-token"

// missing skips the test with msg on a workstation and fails it in CI, which installs what the
// tests need.
func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s, and CI is set: CI must install it", msg)
	}
	t.Skipf("%s: skipping (with CI set, this test fails instead)", msg)
}

// needAgent finds an agent's command in testdata/node_modules, after checking for node and the
// pinned package.
func needAgent(t *testing.T, pkg, bin string) string {
	t.Helper()
	install := "run: npm ci --prefix test/agentcli/testdata (or make test)"
	if _, err := exec.LookPath("node"); err != nil {
		missing(t, "node is not on PATH (Node 20 or later); then "+install)
	}
	dir, err := filepath.Abs("testdata")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", filepath.FromSlash(pkg), "package.json")); err != nil {
		missing(t, "the "+pkg+" npm package is not installed; "+install)
	}
	path := filepath.Join(dir, "node_modules", ".bin", bin)
	if _, err := os.Stat(path); err != nil {
		missing(t, fmt.Sprintf("%s is installed without its %s command (%v); %s", pkg, bin, err, install))
	}
	return path
}

// built is basin, built once for the package's tests into a directory TestMain removes.
var built struct {
	dir  string
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agentcli-basin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentcli:", err)
		os.Exit(1)
	}
	built.dir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildBasin builds basin with the go command, from the module's root, the first time a test
// asks.
func buildBasin(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		missing(t, "the go command is not on PATH (it builds basin)")
	}
	built.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, goBin, "env", "GOMOD").Output()
		mod := strings.TrimSpace(string(out))
		switch {
		case err != nil:
			built.err = fmt.Errorf("go env GOMOD: %w", err)
			return
		case mod == "" || mod == os.DevNull:
			built.err = fmt.Errorf("go env GOMOD: not inside a module")
			return
		}
		path := filepath.Join(built.dir, "basin")
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", path, "./cmd/basin")
		cmd.Dir = filepath.Dir(mod)
		if b, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/basin: %w\n%s", err, b)
			return
		}
		built.path = path
	})
	require.NoError(t, built.err)
	return built.path
}

// proc is a basin process in a process group of its own, logging to a file in the test's
// directory; it is stopped (SIGTERM, then SIGKILL after 5 s) when the test ends.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

func startProc(t *testing.T, dir, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	require.NoError(t, err)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("--- %s (exit: %v), log:\n%s", p.name, p.err, tail(string(b), 30))
		}
	})
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// freeAddrs returns n loopback addresses nobody listens on now; a process that takes one before
// basin binds it fails the test at start ("address already in use"), never silently.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
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

// stack is `basin sim serve` and `basin gateway` in front of it.
type stack struct {
	t       *testing.T
	dir     string
	sim     string // base URLs
	gateway string
	admin   string
	procs   []*proc
	// offNet is the HTTP proxy the agents are given for everything but loopback.
	offNet *offNet
}

// gatewayConfig is the part of the gateway's configuration a test chooses.
type gatewayConfig struct {
	budgetTokens int
	maxQueueWait time.Duration
}

func startStack(t *testing.T, gc gatewayConfig) *stack {
	t.Helper()
	dir := t.TempDir()
	basin := buildBasin(t)
	a := freeAddrs(t, 3)
	s := &stack{t: t, dir: dir, sim: "http://" + a[0], gateway: "http://" + a[1], admin: "http://" + a[2],
		offNet: startOffNet(t)}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "admin-token"), []byte(adminToken+"\n"), 0o600))
	cfg := fmt.Sprintf("listen: %s\nadmin_listen: %s\nadmin_token_file: admin-token\nupstreams:\n  - %s\n"+
		"max_queue_wait: %s\nadmission:\n  budget_tokens: %d\n", a[1], a[2], s.sim, gc.maxQueueWait, gc.budgetTokens)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte(cfg), 0o600))
	// The simulator's defaults: the scenario's workload gives the answers their lengths.
	s.procs = append(s.procs, startProc(t, dir, "sim", basin, "sim", "serve", "--scenario", "paper-1p1d-h100",
		"--speed", simSpeed, "--listen", a[0]))
	s.procs = append(s.procs, startProc(t, dir, "gateway", basin, "gateway", "--config", "gateway.yaml"))
	s.waitReady(s.sim+"/healthz", "")
	s.waitReady(s.admin+"/readyz", "")
	return s
}

// waitReady waits up to 30 s for url to answer 200.
func (s *stack) waitReady(url, token string) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.alive()
		code, _ := s.get(url, token)
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s did not answer 200 within 30 s (last: %d)", url, code)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// alive fails the test if basin's sim or gateway has exited.
func (s *stack) alive() {
	s.t.Helper()
	for _, p := range s.procs {
		select {
		case <-p.done:
			s.t.Fatalf("%s exited early: %v", p.name, p.err)
		default:
		}
	}
}

// do sends a request with an admin bearer token (none when empty) and headers h.
func (s *stack) do(method, url, token, body string, h ...string) (int, []byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	require.NoError(s.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(h); i += 2 {
		req.Header.Set(h[i], h[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return resp.StatusCode, b
}

func (s *stack) get(url, token string) (int, []byte) { return s.do(http.MethodGet, url, token, "") }

// gatewayState is the part of the gateway's GET /admin/state?sessions=true the tests read.
type gatewayState struct {
	Live     int `json:"live_sessions"`
	Queued   int `json:"queued_sessions"`
	Sessions []struct {
		ID      string `json:"id"`
		Context int64  `json:"context_tokens"`
	} `json:"sessions"`
	Queue []struct {
		ID string `json:"id"`
	} `json:"queue"`
	Counters struct {
		Arrivals uint64 `json:"arrivals"`
		Shed     uint64 `json:"shed"`
	} `json:"counters"`
}

func (s *stack) state() gatewayState {
	s.t.Helper()
	code, b := s.get(s.admin+"/admin/state?sessions=true", adminToken)
	require.Equal(s.t, http.StatusOK, code, "%s", b)
	var st gatewayState
	require.NoError(s.t, json.Unmarshal(b, &st), "%s", b)
	return st
}

// metric reads one sample of the gateway's /metrics by its name and labels as written
// (`basin_gateway_refusals_total{code="529",reason="shed"}`); 0 when absent.
func (s *stack) metric(series string) float64 {
	s.t.Helper()
	code, b := s.get(s.admin+"/metrics", "")
	require.Equal(s.t, http.StatusOK, code)
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			var f float64
			_, err := fmt.Sscan(v, &f)
			require.NoError(s.t, err, "%s", sc.Text())
			return f
		}
	}
	return 0
}

// offNet is an HTTP proxy on loopback that forwards nothing: every request to it is recorded
// (its first line names where the agent meant to go) and its connection closed, so a call that
// would leave the machine fails at once and the test can name it.
type offNet struct {
	url   string
	mu    sync.Mutex
	tries []string
}

func startOffNet(t *testing.T) *offNet {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o := &offNet{url: "http://" + ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			_ = c.Close()
			o.mu.Lock()
			o.tries = append(o.tries, strings.TrimSpace(line))
			o.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return o
}

// attempts are the requests the agents tried to send off the machine.
func (o *offNet) attempts() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.tries...)
}
