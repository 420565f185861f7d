package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/basin-dev/basin/collector"
)

// AnnouncedSpeed asks the configured engines once for the speed their deployment announces
// (collector.SpeedMetric: `basin sim serve --speed S` exports it, real engines do not), so that
// the daemon's clock can run at it before the first rate is read. Engines that do not answer are
// skipped; an invalid value, or engines announcing different speeds, is an error naming the
// metric. Each engine is given the collector's scrape timeout, wall time.
func AnnouncedSpeed(ctx context.Context, cfg *Config, client *http.Client) (collector.AnnouncedSpeed, error) {
	timeout, _ := CollectorDefaults(time.Duration(cfg.Interval))
	if cfg.Collector.Timeout > 0 {
		timeout = time.Duration(cfg.Collector.Timeout)
	}
	col, err := collector.New(collector.Options{Targets: cfg.Collector.Targets, TargetFile: cfg.Collector.TargetFile,
		Interval: time.Duration(cfg.Interval), Timeout: timeout, HTTPClient: client, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return collector.AnnouncedSpeed{}, err
	}
	return col.ProbeSpeed(ctx)
}
