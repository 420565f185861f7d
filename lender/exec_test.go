package lender

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func needShell(t *testing.T) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the exec tests run POSIX sh")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh on PATH")
	}
}

func TestExecBackendPassesTheDecision(t *testing.T) {
	needShell(t)
	// An inherited variable of the same name must not win over the decision's.
	t.Setenv("BASIN_LENDING_ENABLED", "stale")
	dir := t.TempDir()
	stdin, envOut := filepath.Join(dir, "stdin.json"), filepath.Join(dir, "env")
	b, err := NewBackend(BackendConfig{Kind: "exec", Command: []string{"sh", "-c",
		`cat > "$1" && env | grep '^BASIN_LENDING_' | sort > "$2"`, "switch", stdin, envOut}}, Wiring{})
	require.NoError(t, err)

	d := decision(t)
	require.NoError(t, b.Apply(context.Background(), d))

	raw, err := os.ReadFile(stdin)
	require.NoError(t, err)
	var p Payload
	require.NoError(t, json.Unmarshal(raw, &p))
	assert.Equal(t, PayloadVersion, p.Version)
	assert.True(t, p.Enabled)
	assert.Equal(t, d.Grants, p.Grants)

	env, err := os.ReadFile(envOut)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"BASIN_LENDING_CHANGED=true",
		"BASIN_LENDING_ENABLED=true",
		"BASIN_LENDING_GRANTS=decode-0=37000,decode-1=75000",
		"BASIN_LENDING_MAX_FRACTION=0.5",
	}, strings.Fields(string(env)))
}

func TestExecBackendEnvWhenOff(t *testing.T) {
	l := newLender(t, Options{})
	d := l.Decide(Inputs{At: t0, Instances: []Instance{dec("decode-0", 60_000, 0, 0), dec("decode-1", 60_000, 0, 0)}})
	require.False(t, d.Enabled)
	assert.Equal(t, []string{"BASIN_LENDING_ENABLED=false", "BASIN_LENDING_CHANGED=false",
		"BASIN_LENDING_MAX_FRACTION=0.5", "BASIN_LENDING_GRANTS=decode-0=0,decode-1=0"}, env(d))
}

func TestExecBackendFailures(t *testing.T) {
	needShell(t)
	var noisy strings.Builder
	for i := range 30 {
		fmt.Fprintf(&noisy, "echo line-%02d >&2; ", i)
	}
	tests := []struct {
		name    string
		command []string
		timeout time.Duration
		want    []string
		notWant []string
	}{
		{"non-zero exit with stderr", []string{"sh", "-c", "echo 'switch: router unreachable' >&2; exit 3"}, 0,
			[]string{"exec sh: exit code 3; stderr: switch: router unreachable"}, nil},
		{"only the last stderr lines", []string{"sh", "-c", noisy.String() + "exit 1"}, 0,
			[]string{"exit code 1; stderr: line-20 | line-21", "line-29"}, []string{"line-19"}},
		{"non-zero exit without stderr", []string{"sh", "-c", "exit 7"}, 0,
			[]string{"exec sh: exit code 7"}, []string{"stderr"}},
		{"program gone since start", []string{filepath.Join(t.TempDir(), "switch")}, 0,
			[]string{"exec ", "switch: "}, nil},
		{"killed at the timeout", []string{"sleep", "30"}, 100 * time.Millisecond,
			[]string{"exec sleep: killed after the 100ms timeout"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &ExecBackend{Command: tt.command, Timeout: tt.timeout}
			err := b.Apply(context.Background(), decision(t))
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, w := range tt.notWant {
				assert.NotContains(t, err.Error(), w)
			}
		})
	}
}

func TestExecBackendCancelled(t *testing.T) {
	needShell(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := (&ExecBackend{Command: []string{"sh", "-c", "exit 0"}}).Apply(ctx, decision(t))
	assert.ErrorIs(t, err, context.Canceled)
}
