package collector

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for the zero fields of Options.
const (
	DefaultInterval     = 5 * time.Second
	DefaultTimeout      = 4 * time.Second
	DefaultWindow       = 60 * time.Second
	DefaultStaleAfter   = 3
	DefaultMaxBodyBytes = 16 << 20
	DefaultConcurrency  = 32
)

// Options configure a Collector. Zero fields take the defaults above; New rejects bad values
// with the field's name.
type Options struct {
	// Targets is the static list of endpoints.
	Targets []Target
	// TargetFile is an optional Prometheus file_sd file (JSON, or YAML when it ends in .yml or
	// .yaml) with more targets; it is read at New and re-read whenever its modification time or
	// size changes (checked every Interval while Run runs). The labels read are described in
	// the package README.
	TargetFile string
	// Interval is the scrape interval (DefaultInterval).
	Interval time.Duration
	// Timeout bounds one scrape, body included (DefaultTimeout), in wall time whatever Now's
	// clock: the network does not run faster with a simulated deployment. At most Interval.
	Timeout time.Duration
	// Window is the span of rates and quantiles (DefaultWindow); at least two intervals.
	Window time.Duration
	// StaleAfter is how many intervals old a signal's oldest input may be before the signal is
	// Stale (DefaultStaleAfter).
	StaleAfter int
	// MaxBodyBytes bounds a scrape's (decompressed) body (DefaultMaxBodyBytes); larger is a
	// scrape error.
	MaxBodyBytes int64
	// Concurrency bounds the scrapes in flight (DefaultConcurrency).
	Concurrency int
	// HTTPClient does the scrapes (a client with its own transport when nil). Its Timeout, if
	// any, applies on top of Timeout.
	HTTPClient *http.Client
	// Logger receives scrape failures and recoveries, target changes and target-file errors
	// (discarded when nil).
	Logger *slog.Logger
	// Registerer receives the basin_signal_*, basin_scrape_* and basin_target* metrics; a
	// private registry when nil, never the default one unless passed.
	Registerer prometheus.Registerer
	// Now is the clock (time.Now when nil): scrape timestamps and Snapshot's instant. Interval,
	// Timeout, Window and staleness are spans of its time.
	Now func() time.Time
	// WallDuration converts a span of Now's time to wall time, for the period between Run's
	// rounds (the identity when nil: Now is the wall clock). A clock that runs S times faster
	// than the wall clock — a simulated deployment served at the speed S it announces as
	// basin_sim_speed, see internal/scaledclock — passes its own, d/S, so that the collector
	// scrapes every Interval of the deployment's time. Its ratio is the clock's speed: a scraped
	// engine that announces another speed (SpeedMetric) is refused, since its counters would be
	// read against the wrong time.
	WallDuration func(time.Duration) time.Duration
}

func (o Options) withDefaults() Options {
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout == 0 {
		o.Timeout = min(DefaultTimeout, o.Interval)
	}
	if o.Window == 0 {
		o.Window = max(DefaultWindow, 2*o.Interval)
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
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
	if o.WallDuration == nil {
		o.WallDuration = func(d time.Duration) time.Duration { return d }
	}
	o.Targets = slices.Clone(o.Targets)
	for i := range o.Targets {
		o.Targets[i] = o.Targets[i].withDefaults()
	}
	return o
}

// Validate reports every option New refuses, naming each. Zero fields stand for their defaults,
// so a config can be checked before anything is built.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if o.Interval < 0 {
		errs = append(errs, fmt.Errorf("Interval: must be > 0, got %v", o.Interval))
	}
	if o.Timeout < 0 || o.Timeout > o.Interval {
		errs = append(errs, fmt.Errorf("Timeout: must be > 0 and at most Interval (%v), got %v", o.Interval, o.Timeout))
	}
	if o.Window < 2*o.Interval {
		errs = append(errs, fmt.Errorf("Window: must be at least two intervals (%v), got %v", 2*o.Interval, o.Window))
	}
	if o.StaleAfter < 1 {
		errs = append(errs, fmt.Errorf("StaleAfter: must be ≥ 1, got %d", o.StaleAfter))
	}
	if o.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes: must be > 0, got %d", o.MaxBodyBytes))
	}
	if o.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("Concurrency: must be > 0, got %d", o.Concurrency))
	}
	seen := make(map[string]bool, len(o.Targets))
	for i, t := range o.Targets {
		if err := t.validate(true); err != nil {
			errs = append(errs, fmt.Errorf("Targets[%d] (%s): %w", i, t.Name, err))
			continue
		}
		if seen[t.Name] {
			errs = append(errs, fmt.Errorf("Targets[%d]: name %q used twice", i, t.Name))
		}
		seen[t.Name] = true
	}
	return errors.Join(errs...)
}
