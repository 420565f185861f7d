package cli

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCommandGroups: each group the tree is built from holds its commands, every one runnable,
// and sits under its name at the top level.
func TestCommandGroups(t *testing.T) {
	tests := []struct {
		name  string
		group func() command
		subs  []string
	}{
		{"sim", simCommands, []string{"compare", "curve", "detect", "fidelity", "late", "matrix", "riskgrid", "run", "scaling", "serve", "tolerance"}},
		{"trace", traceCommands, []string{"import"}},
		{"predictor", predictorCommands, []string{"train"}},
	}
	top := root().subs
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.group()
			assert.Nil(t, g.run, "a group runs nothing itself")
			assert.Equal(t, tc.subs, slices.Sorted(maps.Keys(g.subs)))
			for name, c := range g.subs {
				assert.NotNil(t, c.run, "%s %s runs", tc.name, name)
				assert.Nil(t, c.subs, "%s %s is a leaf", tc.name, name)
			}
			require.Contains(t, top, tc.name)
			assert.Equal(t, g.summary, top[tc.name].summary)
			assert.Equal(t, slices.Sorted(maps.Keys(g.subs)), slices.Sorted(maps.Keys(top[tc.name].subs)))
		})
	}
	assert.Equal(t, []string{"calibrate", "daemon", "demo", "gateway", "loadgen", "predictor", "risk", "sim", "trace", "version"},
		slices.Sorted(maps.Keys(top)))
}

// TestLeaf: a command without a context gets the environment and the arguments, and its error.
func TestLeaf(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name string
		args []string
		err  error
	}{
		{"no arguments", nil, nil},
		{"arguments passed on", []string{"--seed", "3"}, nil},
		{"its error returned", []string{"x"}, boom},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			var gotEnv Env
			run := leaf(func(env Env, args []string) error {
				gotEnv, got = env, args
				return tc.err
			})
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // a leaf finishes on its own: a done context changes nothing
			err := run(ctx, Env{path: "basin test"}, tc.args)
			assert.Equal(t, tc.err, err)
			assert.Equal(t, tc.args, got)
			assert.Equal(t, "basin test", gotEnv.path)
		})
	}
}
