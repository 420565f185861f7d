//go:build unix

package daemon

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDataDirLock: a second daemon on a data directory in use fails, naming it, instead of
// appending to the same audit log and acting twice; once the first is closed it starts.
func TestDataDirLock(t *testing.T) {
	e := newEnv(t, "")
	first, err := New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw})
	require.NoError(t, err)

	_, err = New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw})
	require.ErrorContains(t, err, "data_dir: "+e.cfg.DataDir+" is in use by another basin daemon")

	require.NoError(t, first.Close())
	require.NoError(t, first.Close(), "closing twice is harmless")
	second, err := New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw})
	require.NoError(t, err, "the lock went with the first daemon")
	assert.NoError(t, second.Close())
}
