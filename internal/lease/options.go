package lease

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultTTL is the lease's time to live when Options.TTL is zero. Kubernetes' leader election
// uses 15 s; a shorter lease hands over sooner after a crash, and a renewal every TTL/3 costs
// one round trip of well under a millisecond.
const DefaultTTL = 10 * time.Second

// MaxPrefixBytes bounds a key prefix (CheckPrefix): keys are sent on every renewal.
const MaxPrefixBytes = 256

// Options configure a Campaign. Zero fields take the defaults named on each; New and Validate
// reject bad values with the field's name.
type Options struct {
	// Prefix names the lease in the store: its keys are Prefix+":lease" (the owner, with the
	// TTL) and Prefix+":epoch" (the term counter, never expiring). Required; no whitespace or
	// control characters. On Redis Cluster put a hash tag in it ("{basin:prod}:admission") so
	// both keys, and the keys of the fenced writes, share a slot.
	Prefix string
	// Owner identifies this campaigner (required): a pod name, or host and process id. Two
	// processes with the same Owner are still told apart by the epoch.
	Owner string
	// TTL is the lease's time to live in the store (DefaultTTL). A crashed leader is replaced
	// at most TTL after its last renewal.
	TTL time.Duration
	// RenewInterval is how often the leader renews and a follower tries to take a free lease
	// (TTL/3); less than TTL/2, so a failed renewal is retried before the lease can lapse.
	RenewInterval time.Duration
	// Margin is how long before the TTL could lapse in the store the leader steps down without
	// a successful renewal (TTL/5): it covers clock-rate drift between this process and the
	// store and a write sent just before the deadline arriving after it. The deadline runs
	// from the moment a renewal was sent, not answered. At most TTL − RenewInterval, so the
	// leader gets at least one renewal in before stepping down.
	Margin time.Duration
	// OnChange is called on every change of leadership, in order, from the goroutine running
	// Step or Run; keep it short (hand off to a channel): renewals wait for it.
	OnChange func(Change)
	// Logger receives changes of leadership and store errors (discarded when nil).
	Logger *slog.Logger
	// Registerer receives the basin_lease_* metrics, labelled lease=Prefix; a private registry
	// when nil, never the default one unless passed.
	Registerer prometheus.Registerer
	// Now is the clock (time.Now when nil): the leader's deadline is measured on it.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.RenewInterval == 0 {
		o.RenewInterval = o.TTL / 3
	}
	if o.Margin == 0 {
		o.Margin = o.TTL / 5
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate reports every option New refuses, naming each. Zero fields stand for their defaults,
// so a config can be checked before any store is reached.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if err := CheckPrefix(o.Prefix); err != nil {
		errs = append(errs, fmt.Errorf("Prefix: %w", err))
	}
	if strings.TrimSpace(o.Owner) == "" {
		errs = append(errs, errors.New("Owner: required"))
	}
	if o.TTL <= 0 {
		errs = append(errs, fmt.Errorf("TTL: must be > 0, got %v", o.TTL))
	} else if o.TTL%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("TTL: must be whole milliseconds (the store's PX unit), got %v", o.TTL))
	}
	if o.RenewInterval <= 0 || 2*o.RenewInterval >= o.TTL {
		errs = append(errs, fmt.Errorf("RenewInterval: must be > 0 and less than TTL/2 (%v), got %v", o.TTL/2, o.RenewInterval))
	}
	if o.Margin < 0 || o.Margin > o.TTL-o.RenewInterval {
		errs = append(errs, fmt.Errorf("Margin: must be ≥ 0 and at most TTL − RenewInterval (%v), got %v", o.TTL-o.RenewInterval, o.Margin))
	}
	return errors.Join(errs...)
}

// CheckPrefix checks a key prefix in the store: not empty, at most MaxPrefixBytes (keys are
// sent on every renewal), no whitespace or control characters. The session table and the
// daemon's stream use the lease's prefix, so they check theirs with it.
func CheckPrefix(p string) error {
	switch {
	case p == "":
		return errors.New("required")
	case len(p) > MaxPrefixBytes:
		return fmt.Errorf("at most %d bytes, got %d", MaxPrefixBytes, len(p))
	case strings.ContainsFunc(p, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("no whitespace or control characters, got %q", p)
	}
	return nil
}

func (o Options) leaseKey() string { return o.Prefix + ":lease" }
func (o Options) epochKey() string { return o.Prefix + ":epoch" }
