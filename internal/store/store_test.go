package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/yamlconf"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want []string // fields named, in order
	}{
		{"disabled", Config{}, nil},
		{"fields without url", Config{Prefix: "p"}, []string{"url"}},
		{"ok", Config{URL: "redis://localhost:6379/0"}, nil},
		{"tls", Config{URL: "rediss://user:pw@redis.example:6380"}, nil},
		{"bad url", Config{URL: "http://x"}, []string{"url"}},
		{"bad prefix", Config{URL: "redis://h:1", Prefix: "a b"}, []string{"prefix"}},
		{"short ttl", Config{URL: "redis://h:1", LeaseTTL: yamlconf.Duration(100 * time.Millisecond)}, []string{"lease_ttl"}},
		{"negative timeouts", Config{URL: "redis://h:1", DialTimeout: -1, OpTimeout: -1}, []string{"dial_timeout", "op_timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			if c.Enabled() {
				c = c.WithDefaults("prod", 5*time.Second)
			}
			var got []string
			for _, p := range c.Check() {
				got = append(got, p.Field)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestCheckKeepsThePasswordOut(t *testing.T) {
	c := Config{URL: "redis://user:hunter2@h:notaport"}.WithDefaults("", time.Second)
	ps := c.Check()
	require.Len(t, ps, 1)
	assert.NotContains(t, ps[0].Message, "hunter2")
}

func TestWithDefaults(t *testing.T) {
	c := Config{URL: "redis://h:1"}.WithDefaults("prod", 5*time.Second)
	assert.Equal(t, "basin:prod", c.Prefix)
	assert.Equal(t, 5*time.Second, time.Duration(c.LeaseTTL))
	assert.Equal(t, "basin", Config{URL: "redis://h:1"}.WithDefaults("", time.Second).Prefix)
	assert.Equal(t, "mine", Config{URL: "redis://h:1", Prefix: "mine"}.WithDefaults("prod", time.Second).Prefix)
}

func TestOpen(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.RequireAuth("s3cret")
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == PasswordEnv {
				return v
			}
			return ""
		}
	}
	base := Config{URL: "redis://" + mr.Addr() + "/0"}.WithDefaults("prod", time.Second)
	ctx := context.Background()

	_, err := Open(ctx, base, env(""))
	require.Error(t, err, "no password")
	assert.Contains(t, err.Error(), mr.Addr())

	c, err := Open(ctx, base, env("s3cret"))
	require.NoError(t, err, "password from the environment")
	require.NoError(t, c.Close())

	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	withFile := base
	withFile.PasswordFile = pw
	c, err = Open(ctx, withFile, env("wrong"))
	require.NoError(t, err, "the file wins over the environment")
	require.NoError(t, c.Close())

	withFile.PasswordFile = filepath.Join(t.TempDir(), "missing")
	_, err = Open(ctx, withFile, env(""))
	require.ErrorContains(t, err, "password_file")

	inURL := base
	inURL.URL = "redis://:s3cret@" + mr.Addr()
	c, err = Open(ctx, inURL, env("wrong"))
	require.NoError(t, err, "the URL's password wins")
	require.NoError(t, c.Close())

	lazy, err := OpenLazy(Config{URL: "redis://127.0.0.1:1"}.WithDefaults("", time.Second), env(""))
	require.NoError(t, err, "a lazy client does not connect")
	require.True(t, strings.HasSuffix(lazy.Options().Addr, ":1"))
	require.NoError(t, lazy.Close())
}
