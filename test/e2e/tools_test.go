package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tool finds the first of names on PATH. Without any of them the test is skipped on a workstation
// and fails in CI, which installs the Debian packages prometheus and prometheus-alertmanager.
func tool(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	msg := strings.Join(names, " or ") + " is not on PATH (Debian packages prometheus and prometheus-alertmanager)"
	if os.Getenv("CI") != "" {
		t.Fatalf("%s, and CI is set: CI must install it", msg)
	}
	t.Skipf("%s: skipping; install it to run this test (with CI set, this test fails instead)", msg)
	return ""
}

// The real tools the tests run.
func promtoolPath(t *testing.T) string   { t.Helper(); return tool(t, "promtool") }
func prometheusPath(t *testing.T) string { t.Helper(); return tool(t, "prometheus") }
func amtoolPath(t *testing.T) string     { t.Helper(); return tool(t, "amtool") }

// alertmanagerPath is Alertmanager: prometheus-alertmanager on Debian, alertmanager upstream.
func alertmanagerPath(t *testing.T) string {
	t.Helper()
	return tool(t, "prometheus-alertmanager", "alertmanager")
}

// moduleRoot is the directory of basin's go.mod, from `go env GOMOD`.
func moduleRoot(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to build basin")
	out, err := exec.CommandContext(t.Context(), goBin, "env", "GOMOD").Output()
	require.NoError(t, err, "go env GOMOD")
	mod := strings.TrimSpace(string(out))
	require.NotEmpty(t, mod, "go env GOMOD: not inside a module")
	require.NotEqual(t, os.DevNull, mod, "go env GOMOD: not inside a module")
	return filepath.Dir(mod)
}

// run runs a command to completion and fails the test with its output if it fails.
func run(t *testing.T, dir string, timeout time.Duration, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = childEnv()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s (in %s):\n%s", strings.Join(cmd.Args, " "), dir, out)
	return string(out)
}

// childEnv is this process' environment without basin's own variables, so that a secret or a
// Slack webhook set in the shell cannot reach the processes under test.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BASIN_") {
			env = append(env, kv)
		}
	}
	return env
}

// busy counts the parallel end-to-end tests still running: each adds itself before t.Parallel,
// in the sequential phase (their files sort before replicated_test.go), so by the time
// TestReplicatedGateways waits, every one that runs has been counted.
var busy sync.WaitGroup

// built is the basin binary the package's tests share: they run in parallel, and each used to
// link its own copy of the same binary.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// TestMain removes the shared binary after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// basinBinary builds ./cmd/basin once (without the race detector: the processes under test are
// the product as shipped) and returns its path.
func basinBinary(t *testing.T) string {
	t.Helper()
	root := moduleRoot(t)
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "basin-e2e-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "basin")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", built.bin, "./cmd/basin")
		cmd.Dir = root
		cmd.Env = childEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/basin: %w\n%s", err, out)
		}
	})
	require.NoError(t, built.err)
	return built.bin
}
