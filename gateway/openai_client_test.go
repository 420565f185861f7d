package gateway

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openAIClientDir holds the Node script and its pinned openai dependency.
const openAIClientDir = "testdata/openai-client"

// needNodeClient skips the test when Node or the openai package is missing — except in CI, where
// a skip would hide that the test never ran.
func needNodeClient(t *testing.T) string {
	t.Helper()
	return needNode(t, openAIClientDir, "openai")
}

// needNode finds node and checks that the npm package pkg is installed in dir (a directory under
// testdata holding a pinned package-lock.json).
func needNode(t *testing.T, dir, pkg string) string {
	t.Helper()
	install := "cd gateway/" + dir + " && npm ci"
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, "node is not on PATH (Node 20 or later); then run: "+install)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", filepath.FromSlash(pkg), "package.json")); err != nil {
		missing(t, "the "+pkg+" npm package is not installed; run: "+install)
	}
	return node
}

func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func TestOpenAINodeClientStreamsThroughTheGateway(t *testing.T) {
	node := needNodeClient(t)
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs", h.ts.URL+"/v1", "17", "node-session")
	cmd.Dir = openAIClientDir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "node client: %s", stderr.String())

	var got struct {
		Content      string `json:"content"`
		FinishReason string `json:"finish_reason"`
		Chunks       int    `json:"chunks"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "client output: %s", out)
	assert.Len(t, strings.Fields(got.Content), 17, "content %q", got.Content)
	assert.Equal(t, "stop", got.FinishReason)
	assert.Greater(t, got.Chunks, 1, "streamed in several chunks")

	h.settle()
	s := h.state()
	assert.Equal(t, uint64(1), s.Counters.AdmittedAtOnce, "the client's session was admitted")
	assert.Equal(t, 0, s.Live, "x-session-end from the client ended it")
	assert.Equal(t, uint64(1), s.Counters.Ended)
}
