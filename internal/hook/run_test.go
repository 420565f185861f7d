package hook

import (
	"context"
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

func TestRunPassesStdinAndEnv(t *testing.T) {
	needShell(t)
	t.Setenv("BASIN_HOOK_X", "stale")
	t.Setenv("BASIN_HOOK_INHERITED", "kept")
	out := filepath.Join(t.TempDir(), "out")
	err := Run(context.Background(), []string{"sh", "-c",
		`{ cat; echo; echo "$BASIN_HOOK_X $BASIN_HOOK_INHERITED"; } > "$1"`, "hook", out},
		time.Minute, []byte(`{"a":1}`), []string{"BASIN_HOOK_X=fresh"})
	require.NoError(t, err)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, "{\"a\":1}\nfresh kept\n", string(b), "stdin, the caller's variables over inherited ones, the rest inherited")
}

func TestRunFailures(t *testing.T) {
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
		{"no command", nil, 0, []string{"exec: no command"}, nil},
		{"empty program", []string{""}, 0, []string{"exec: no command"}, nil},
		{"non-zero exit with stderr", []string{"sh", "-c", "echo 'router unreachable' >&2; exit 3"}, 0,
			[]string{"exec sh: exit code 3; stderr: router unreachable"}, nil},
		{"only the last stderr lines", []string{"sh", "-c", noisy.String() + "exit 1"}, 0,
			[]string{"exit code 1; stderr: line-20 | line-21", "line-29"}, []string{"line-19"}},
		{"non-zero exit without stderr", []string{"sh", "-c", "exit 7"}, 0,
			[]string{"exec sh: exit code 7"}, []string{"stderr"}},
		{"program missing", []string{filepath.Join(t.TempDir(), "switch")}, 0, []string{"exec ", "switch: "}, nil},
		{"killed at the timeout", []string{"sleep", "30"}, 100 * time.Millisecond,
			[]string{"exec sleep: killed after the 100ms timeout"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Run(context.Background(), tt.command, tt.timeout, nil, nil)
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

func TestRunCancelled(t *testing.T) {
	needShell(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Run(ctx, []string{"sh", "-c", "exit 0"}, time.Minute, nil, nil)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestTailKeepsTheEnd(t *testing.T) {
	tl := NewTail(16)
	for i := range 10 {
		_, _ = fmt.Fprintf(tl, "line %d\n", i)
	}
	assert.LessOrEqual(t, len(tl.buf), 16)
	assert.Equal(t, "; stderr: line 8 | line 9", tl.Lines(), "the line cut by the bound is left out")
	assert.Empty(t, NewTail(16).Lines())
}
