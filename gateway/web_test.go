package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
)

// TestAdminWebConfig: the admin listener takes TLS and basic auth from an exporter-toolkit web
// configuration file; without the password nothing is served, not even /metrics.
func TestAdminWebConfig(t *testing.T) {
	dir := t.TempDir()
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	require.NoError(t, err)
	web := filepath.Join(dir, "web.yml")
	require.NoError(t, os.WriteFile(web, fmt.Appendf(nil, "basic_auth_users:\n  prometheus: %s\n", hash), 0o600))
	cfg := baseConfig(t, []string{startSim(t)}, func(c *Config) {
		c.Listen, c.AdminListen = freeAddr(t), freeAddr(t)
		c.AdminWebConfigFile = web
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Config: cfg, Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: time.Second})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	status := func(user, pass string) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+cfg.AdminListen+"/metrics", nil)
		require.NoError(t, err)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, "the admin listener", func() bool { return status("prometheus", "s3cret") == http.StatusOK })
	assert.Equal(t, http.StatusUnauthorized, status("", ""))
	assert.Equal(t, http.StatusUnauthorized, status("prometheus", "wrong"))
}

func TestWebConfigInvalid(t *testing.T) {
	web := filepath.Join(t.TempDir(), "web.yml")
	require.NoError(t, os.WriteFile(web, []byte("tls_server_config:\n  cert_file: missing.crt\n"), 0o600))
	cfg := baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) {
		c.Listen, c.AdminListen = freeAddr(t), freeAddr(t)
		c.WebConfigFile = web
	})
	err := Run(context.Background(), Options{Config: cfg, Logger: slog.New(slog.DiscardHandler)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "web config "+web)
}
