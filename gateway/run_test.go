package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freeAddr finds a loopback address nothing listens on (for a moment).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestRunServesBothListenersAndShutsDown(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	cfg := baseConfig(t, []string{startSim(t)}, func(c *Config) {
		c.Listen, c.AdminListen = freeAddr(t), freeAddr(t)
		c.StateFile = state
	})
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(logs, nil)),
			ShutdownTimeout: 2 * time.Second})
	}()

	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, "the admin listener", func() bool {
		code, _ := get("http://" + cfg.AdminListen + "/healthz")
		return code == http.StatusOK
	})
	req, err := http.NewRequest(http.MethodPost, "http://"+cfg.Listen+"/v1/chat/completions", strings.NewReader(chatBody(3)))
	require.NoError(t, err)
	req.Header.Set("x-session-id", "via-run")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	code, metrics := get("http://" + cfg.AdminListen + "/metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, metrics, "basin_gateway_sessions_live 1")
	code, _ = get("http://" + cfg.AdminListen + "/admin/state")
	assert.Equal(t, http.StatusUnauthorized, code)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	data, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"via-run"`)
	assert.NotContains(t, logs.String(), testToken)
	_, err = net.DialTimeout("tcp", cfg.Listen, time.Second)
	assert.Error(t, err, "the listener is closed")
}

func TestRunFailsOnABusyAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cfg := baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) {
		c.Listen, c.AdminListen = freeAddr(t), ln.Addr().String()
	})
	err = Run(context.Background(), Options{Config: cfg})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "admin_listen")
	assert.Contains(t, err.Error(), fmt.Sprint(ln.Addr()))
}
