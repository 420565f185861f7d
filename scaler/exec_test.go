package scaler

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

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

// script writes an executable shell script to a temporary directory and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "scale-pool")
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755))
	return p
}

func TestExecBackendPassesTheRequest(t *testing.T) {
	needShell(t)
	// An inherited variable of the same name must not win over the request's.
	t.Setenv("BASIN_SCALE_REPLICAS", "stale")
	out := t.TempDir()
	prog := script(t, `cat > "$1/stdin.json" && env | grep '^BASIN_SCALE_' | sort > "$1/env" && echo "$2" > "$1/arg"`)
	b, err := NewBackend(BackendConfig{Kind: "exec", Command: []string{prog, out, "--apply"}}, Wiring{})
	require.NoError(t, err)

	require.NoError(t, b.Apply(context.Background(), request()))

	raw, err := os.ReadFile(filepath.Join(out, "stdin.json"))
	require.NoError(t, err)
	var p Payload
	require.NoError(t, json.Unmarshal(raw, &p))
	assert.Equal(t, Payload{Version: PayloadVersion, Request: request()}, p)

	env, err := os.ReadFile(filepath.Join(out, "env"))
	require.NoError(t, err)
	assert.Equal(t, []string{
		"BASIN_SCALE_DEPLOYMENT=prod",
		"BASIN_SCALE_REASON=" + request().Reason,
		"BASIN_SCALE_REPLICAS=3",
		"BASIN_SCALE_ROLE=decode",
		"BASIN_SCALE_SEQ=42",
	}, strings.Split(strings.TrimSpace(string(env)), "\n"))

	arg, err := os.ReadFile(filepath.Join(out, "arg"))
	require.NoError(t, err)
	assert.Equal(t, "--apply\n", string(arg), "arguments are passed as they are, without a shell")

	c, ok, err := b.Current(context.Background(), RolePrefill)
	assert.NoError(t, err)
	assert.False(t, ok, "a script cannot say what runs")
	assert.Zero(t, c)
}

func TestExecBackendFailures(t *testing.T) {
	needShell(t)
	tests := []struct {
		name string
		b    *ExecBackend
		r    Request
		want string
	}{
		{"non-zero exit with stderr", &ExecBackend{Command: []string{script(t, "echo 'quota exceeded: 8 GPUs' >&2; exit 3")}},
			request(), "scale-pool: exit code 3; stderr: quota exceeded: 8 GPUs"},
		{"invalid request not run", &ExecBackend{Command: []string{script(t, "exit 0")}},
			Request{Role: RoleDecode, Replicas: -1}, "scale-pool: scale request: replicas: -1"},
		{"no command", &ExecBackend{}, request(), "exec: no command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.ErrorContains(t, tt.b.Apply(context.Background(), tt.r), tt.want)
		})
	}
}

func TestExecBackendInvalidRequestRunsNothing(t *testing.T) {
	needShell(t)
	marker := filepath.Join(t.TempDir(), "ran")
	b := &ExecBackend{Command: []string{script(t, `touch "$1"`), marker}}
	require.Error(t, b.Apply(context.Background(), Request{Role: "router", Replicas: 1}))
	assert.NoFileExists(t, marker)
	require.NoError(t, b.Apply(context.Background(), request()))
	assert.FileExists(t, marker, "the same script runs for a valid request")
}
