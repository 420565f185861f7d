// Package store is the connection to the Redis or Valkey server that replicated mode keeps its
// shared state in: the admission leader's lease and session table (gateway) and the acting
// daemon's lease and audit stream (daemon). Both read the same Config block, so an operator
// writes the server's address, password and key prefix once per process the same way.
//
// Valkey speaks the same protocol and runs the same scripts; anything here that says Redis
// means either.
package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/basin-dev/basin/internal/secret"
	"github.com/basin-dev/basin/internal/yamlconf"
)

// PasswordEnv is the environment variable the password is read from when neither the URL nor
// password_file gives one.
const PasswordEnv = "BASIN_STORE_PASSWORD"

// Defaults of Config.
const (
	DefaultDialTimeout = 2 * time.Second
	// DefaultOpTimeout bounds one command. Short: a leader that cannot reach the store within it
	// is better off degraded than blocking calls.
	DefaultOpTimeout = time.Second
)

// Config is the store block of a configuration file. With URL empty there is no store and the
// process runs alone, exactly as without the block.
type Config struct {
	// URL of the server: redis://[user[:password]@]host:port[/db], or rediss:// for TLS. Empty:
	// no store (single-process mode).
	URL string `yaml:"url"`
	// PasswordFile holds the password when the URL has none; else it comes from the environment
	// variable BASIN_STORE_PASSWORD, else there is none.
	PasswordFile string `yaml:"password_file"`
	// Prefix starts every key this process writes ("basin:" and the deployment when empty). Two
	// deployments sharing a server need different prefixes. On Redis Cluster put a hash tag in it
	// ("{basin:prod}") so the lease, the epoch and the fenced writes share a slot.
	Prefix string `yaml:"prefix"`
	// LeaseTTL is the leader lease's time to live: a crashed leader is replaced within it. The
	// gateway's default is 5s, the daemon's 15s (the defaults of their own configs).
	LeaseTTL yamlconf.Duration `yaml:"lease_ttl"`
	// DialTimeout bounds connecting (DefaultDialTimeout).
	DialTimeout yamlconf.Duration `yaml:"dial_timeout"`
	// OpTimeout bounds one command (DefaultOpTimeout).
	OpTimeout yamlconf.Duration `yaml:"op_timeout"`
}

// Enabled says whether a store is configured.
func (c Config) Enabled() bool { return c.URL != "" }

// WithDefaults fills the zero fields: the prefix from the deployment's name and the lease's TTL
// from the caller's default.
func (c Config) WithDefaults(deployment string, ttl time.Duration) Config {
	if c.Prefix == "" {
		c.Prefix = "basin:" + deployment
		if deployment == "" {
			c.Prefix = "basin"
		}
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = yamlconf.Duration(ttl)
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = yamlconf.Duration(DefaultDialTimeout)
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = yamlconf.Duration(DefaultOpTimeout)
	}
	return c
}

// Problem is one bad field: its key under the block and what is wrong with it.
type Problem struct {
	Field   string
	Message string
}

// Check reports every bad field of an enabled block (after WithDefaults), naming each by its key.
// A disabled block is checked for fields set without a URL, which would otherwise be ignored.
func (c Config) Check() []Problem {
	var out []Problem
	bad := func(f, format string, a ...any) { out = append(out, Problem{f, fmt.Sprintf(format, a...)}) }
	if !c.Enabled() {
		if c.PasswordFile != "" || c.Prefix != "" || c.LeaseTTL != 0 {
			bad("url", "required when any other store field is set")
		}
		return out
	}
	if _, err := redis.ParseURL(c.URL); err != nil {
		bad("url", "want redis://host:port[/db] or rediss://…: %v", redactErr(err, c.URL))
	}
	if strings.ContainsFunc(c.Prefix, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		bad("prefix", "no whitespace or control characters, got %q", c.Prefix)
	}
	if len(c.Prefix) > 200 {
		bad("prefix", "at most 200 bytes, got %d", len(c.Prefix))
	}
	ttl := time.Duration(c.LeaseTTL)
	if ttl < 300*time.Millisecond || ttl%time.Millisecond != 0 {
		bad("lease_ttl", "want at least 300ms in whole milliseconds, got %v", ttl)
	}
	if c.DialTimeout < 0 {
		bad("dial_timeout", "must be ≥ 0, got %v", time.Duration(c.DialTimeout))
	}
	if c.OpTimeout < 0 {
		bad("op_timeout", "must be ≥ 0, got %v", time.Duration(c.OpTimeout))
	}
	return out
}

// redactErr keeps a password in the URL out of an error message.
func redactErr(err error, url string) string {
	msg := err.Error()
	if i := strings.Index(url, "@"); i > 0 {
		msg = strings.ReplaceAll(msg, url[:i], "<redacted>")
	}
	return msg
}

// Open connects to the store (after WithDefaults and Check), reading the password as Config
// says, and checks the server answers a PING within the dial timeout. getenv reads the
// environment (os.Getenv in production).
func Open(ctx context.Context, c Config, getenv func(string) string) (*redis.Client, error) {
	client, err := OpenLazy(c, getenv)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, time.Duration(c.DialTimeout))
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("store: redis at %s: %w", client.Options().Addr, err)
	}
	return client, nil
}

// OpenLazy is Open without the PING: for a process that must start, and serve degraded, while
// the store is down. The client connects on its first command.
func OpenLazy(c Config, getenv func(string) string) (*redis.Client, error) {
	opts, err := redis.ParseURL(c.URL)
	if err != nil {
		return nil, fmt.Errorf("store: url: %s", redactErr(err, c.URL))
	}
	if opts.Password == "" {
		pw, err := secret.FileOrEnv(c.PasswordFile, PasswordEnv, getenv)
		if err != nil {
			return nil, fmt.Errorf("store: password_file: %w", err)
		}
		opts.Password = pw // empty: a server without a password
	}
	opts.DialTimeout = time.Duration(c.DialTimeout)
	opts.ReadTimeout = time.Duration(c.OpTimeout)
	opts.WriteTimeout = time.Duration(c.OpTimeout)
	// Replicated mode wants a failure fast and a retry by the caller's own loop (renewals,
	// saves), not the client's backoff stretching one call past a lease's margin.
	opts.MaxRetries = -1
	return redis.NewClient(opts), nil
}

// ErrNoStore is returned by callers that need a store when none is configured.
var ErrNoStore = errors.New("store: not configured (store.url is empty)")
