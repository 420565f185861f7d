package daemon

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/store"
)

// TestStoreConfigErrorsNameKeyAndLine: the store block's problems are named by their key under
// store, with the line, as every other key of the daemon's configuration.
func TestStoreConfigErrorsNameKeyAndLine(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"fields without url", minimalYAML + "store:\n  prefix: basin:x\n", []string{"store.url: required when any other store field is set"}},
		{"instance without store", minimalYAML + "instance: d0\n", []string{"line 7: instance: needs store.url"}},
		{"bad url", minimalYAML + "store:\n  url: http://redis:6379\n", []string{"line 8: store.url: want redis://"}},
		{"short lease", minimalYAML + "store:\n  url: redis://redis:6379\n  lease_ttl: 100ms\n", []string{"line 9: store.lease_ttl: want at least 300ms"}},
		{"prefix with a space", minimalYAML + "store:\n  url: redis://redis:6379\n  prefix: a b\n", []string{"line 9: store.prefix: no whitespace"}},
		{"instance with a space", minimalYAML + "store:\n  url: redis://redis:6379\ninstance: a b\n", []string{"line 9: instance: no whitespace"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestStoreConfigDefaults: with store.url the prefix is "basin:" and the deployment and the
// lease lasts DefaultLeaseTTL; without it the block stays empty.
func TestStoreConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(minimalYAML + "deployment: prod\nstore:\n  url: redis://redis:6379/0\n"))
	require.NoError(t, err)
	assert.Equal(t, "basin:prod", c.Store.Prefix)
	assert.Equal(t, DefaultLeaseTTL, time.Duration(c.Store.LeaseTTL))
	assert.Equal(t, store.DefaultOpTimeout, time.Duration(c.Store.OpTimeout))

	c, err = ParseConfig([]byte(minimalYAML))
	require.NoError(t, err)
	assert.Equal(t, store.Config{}, c.Store)
}

// TestWithoutAStoreNothingChanges: a daemon without store.url acts from its first step as it
// always has: no campaign, no term on its writes, no role in its status or metrics, and a pause
// is taken as before.
func TestWithoutAStoreNothingChanges(t *testing.T) {
	e := newEnv(t, "")
	d := e.daemon()
	t.Cleanup(func() { _ = d.Close() })
	require.Nil(t, d.ha)
	e.step(d)
	term, acting := d.actingTerm()
	assert.True(t, acting)
	assert.Zero(t, term)
	b, err := json.Marshal(d.StatusNow())
	require.NoError(t, err)
	var s map[string]any
	require.NoError(t, json.Unmarshal(b, &s))
	for _, k := range []string{"role", "term", "instance", "role_since", "role_reason"} {
		assert.NotContains(t, s, k)
	}
	assert.Equal(t, -1.0, gauge(t, d, "basin_daemon_leader"))
	_, isTermGateway := d.gw.(termGateway)
	assert.False(t, isTermGateway)
	code, _ := call(t, http.MethodPost, serveAPI(t, d).URL+"/api/v1/pause", testToken, `{"minutes": 5, "reason": "test"}`)
	assert.Equal(t, http.StatusOK, code)
}

// TestInstanceFlagNeedsAStore: --instance (Options.Instance) without store.url is refused, not
// ignored.
func TestInstanceFlagNeedsAStore(t *testing.T) {
	e := newEnv(t, "")
	_, err := New(e.cfg, Options{Gateway: e.gw, Logger: testLogger(t), Instance: "d0"})
	require.ErrorContains(t, err, "instance: needs store.url")
}
