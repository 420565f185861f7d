package daemon

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway"
)

// realEngines is the operator's guide whose configurations must run as written.
var realEngines = filepath.Join("..", "docs", "real-engines.md")

// docBlock returns the first ```yaml block after the line containing marker.
func docBlock(t *testing.T, path, marker string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	i := strings.Index(doc, marker)
	require.GreaterOrEqual(t, i, 0, "%s: no %q", path, marker)
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(doc[i:])
	require.NotNil(t, m, "%s: no yaml block after %q", path, marker)
	return m[1]
}

// TestRealEnginesMinimalConfigRuns: docs/real-engines.md's minimal daemon configuration loads and
// the daemon starts with it as written — before the guide has explained `basin calibrate`, so
// without a calibration file: the knee is learnt passively, from the paper's default. Only
// data_dir (an absolute system path) is moved to a temporary directory, and the secret files the
// configuration names are created.
func TestRealEnginesMinimalConfigRuns(t *testing.T) {
	block := docBlock(t, realEngines, "The daemon (`daemon.yaml`")
	dir := t.TempDir()
	dataDir := regexp.MustCompile(`(?m)^data_dir: .*$`)
	require.Regexp(t, dataDir, block)
	block = dataDir.ReplaceAllString(block, "data_dir: data")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "daemon.yaml"), []byte(block), 0o600))
	for _, f := range []string{"daemon-token", "admin-token"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("secret-"+f), 0o600))
	}

	cfg, err := LoadConfig(filepath.Join(dir, "daemon.yaml"))
	require.NoError(t, err, "the guide's configuration:\n%s", block)
	assert.True(t, cfg.DryRun, "the guide starts in a dry run")
	d, err := New(cfg, Options{Logger: testLogger(t)})
	require.NoError(t, err, "the daemon starts with the guide's configuration")

	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, listen(t)) }()
	// A first step is 5 s away on the wall clock; step once by hand instead of waiting for it.
	d.Step(ctx)
	s := d.StatusNow()
	assert.True(t, s.DryRun)
	assert.Equal(t, detector.SourceDefault, s.Assessment.Knee.Source, "no calibration: the paper's knee until one is learnt")
	assert.True(t, s.Blind, "its targets do not exist here")
	cancel()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

// TestRealEnginesGatewayConfigLoads: the guide's minimal gateway configuration, which the daemon
// above takes over, is valid as written and starts in count-only mode.
func TestRealEnginesGatewayConfigLoads(t *testing.T) {
	block := docBlock(t, realEngines, "The gateway (`gateway.yaml`")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte(block), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "admin-token"), []byte("secret-admin-token"), 0o600))
	cfg, err := gateway.LoadConfig(filepath.Join(dir, "gateway.yaml"))
	require.NoError(t, err, "the guide's gateway configuration:\n%s", block)
	assert.True(t, cfg.Admission.CountOnly, "the gateway goes in counting, ahead of the daemon")
}

// TestCalibrationNamedButMissing: a calibration file that is configured but absent stops the
// daemon with what to do, rather than silently using the default knee.
func TestCalibrationNamedButMissing(t *testing.T) {
	e := newEnv(t, "")
	e.cfg.Calibration = filepath.Join(e.dir, "absent.json")
	_, err := New(e.cfg, Options{Logger: testLogger(t)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "calibration: ")
	assert.Contains(t, err.Error(), "basin calibrate")
	assert.Contains(t, err.Error(), "remove the key")
}
