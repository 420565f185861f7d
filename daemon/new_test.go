package daemon

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/client"
	"github.com/basin-dev/basin/lender"
)

// TestNewGateway: the gateway the caller gave wins; else gateway.admin_url makes a client, whose
// token must be readable; else the daemon has no gateway.
func TestNewGateway(t *testing.T) {
	dir := t.TempDir()
	fake := newFakeGateway(testReference)
	tests := []struct {
		name    string
		cfg     GatewayConfig
		given   GatewayAPI
		token   string // in GatewayTokenEnv
		want    string // "given", "client" or "none"
		wantErr string
	}{
		{name: "given, even with an admin URL", cfg: GatewayConfig{AdminURL: "http://127.0.0.1:1"}, given: fake, want: "given"},
		{name: "none configured", want: "none"},
		{name: "a client of the admin URL", cfg: GatewayConfig{AdminURL: "http://127.0.0.1:1"}, token: "t", want: "client"},
		{name: "its token unreadable", cfg: GatewayConfig{AdminURL: "http://127.0.0.1:1", TokenFile: filepath.Join(dir, "absent")},
			wantErr: "gateway.token_file"},
		{name: "no token", cfg: GatewayConfig{AdminURL: "http://127.0.0.1:1"}, wantErr: "gateway: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(GatewayTokenEnv, tc.token)
			gw, err := newGateway(tc.cfg, tc.given, nil)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			switch tc.want {
			case "given":
				assert.Same(t, fake, gw)
			case "client":
				assert.IsType(t, &client.Client{}, gw)
			default:
				assert.Nil(t, gw)
			}
		})
	}
}

// TestNewWithoutStore: an instance name needs a store, and lending through the gateway's affinity
// needs a gateway; both are refused at start.
func TestNewWithoutStore(t *testing.T) {
	tests := []struct {
		name     string
		instance string
		mutate   func(e *env)
		wantErr  string
	}{
		{name: "no store, no instance"},
		{name: "an instance without a store", instance: "d0", wantErr: "instance: needs store.url"},
		{name: "affinity without a gateway", mutate: func(e *env) {
			e.cfg.Lending.Backend.Kind = lender.KindAffinity
			e.cfg.Gateway.AdminURL, e.cfg.DryRun = "", true
		}, wantErr: "lending.backend: affinity needs gateway.admin_url"},
		{name: "affinity through the gateway", mutate: func(e *env) { e.cfg.Lending.Backend.Kind = lender.KindAffinity }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "")
			if tc.mutate != nil {
				tc.mutate(e)
			}
			o := Options{Clock: e.deploymentClock(), Instance: tc.instance, Logger: testLogger(t)}
			if e.cfg.Gateway.AdminURL != "" {
				o.Gateway = e.gw
			}
			d, err := New(e.cfg, o)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Nil(t, d.ha, "no store: the daemon acts alone")
			require.NoError(t, d.Close())
		})
	}
}

// TestNewFailingLateReleasesTheDirectory: a New that fails after locking the data directory
// (here: its metrics clash with a registered collector) releases the lock and the logs, so that
// the next start is not refused as a second daemon.
func TestNewFailingLateReleasesTheDirectory(t *testing.T) {
	e := newEnv(t, "")
	reg := prometheus.NewRegistry()
	first, err := New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw, Registerer: reg, Gatherer: reg, Logger: testLogger(t)})
	require.NoError(t, err)
	require.NoError(t, first.Close())

	_, err = New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw, Registerer: reg, Gatherer: reg, Logger: testLogger(t)})
	var dup prometheus.AlreadyRegisteredError
	require.True(t, errors.As(err, &dup), "the same registry twice: %v", err)

	d, err := New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw, Logger: testLogger(t)})
	require.NoError(t, err, "the failed start left the lock behind")
	require.NoError(t, d.Close())
}

// TestFillDefaults: without a registerer the daemon registers on a registry of its own and gathers
// that one; with one, it gathers what the caller said.
func TestFillDefaults(t *testing.T) {
	theirs := prometheus.NewRegistry()
	tests := []struct {
		name       string
		reg        prometheus.Registerer
		gather     prometheus.Gatherer
		ownGathers bool
	}{
		{name: "nothing given", ownGathers: true},
		{name: "registerer and gatherer given", reg: theirs, gather: theirs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &Daemon{gather: tc.gather}
			reg := d.fillDefaults(tc.reg)
			require.NotNil(t, d.log)
			require.NotNil(t, d.clock)
			if tc.ownGathers {
				assert.Same(t, reg, d.gather)
				return
			}
			assert.Same(t, tc.reg, reg)
			assert.Same(t, tc.gather, d.gather)
		})
	}
}
