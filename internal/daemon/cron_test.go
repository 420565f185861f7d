package daemon

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCronRecoversAndCounts: a job that panics is counted, logged and runs again at its next
// time — the chain order SkipIfStillRunning then Recover; in the other order it would run once.
func TestCronRecoversAndCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &Daemon{cfg: &Config{Deployment: "test"}, log: slog.New(slog.DiscardHandler)}
		d.metrics = newMetrics(d)
		runs := 0
		stop, err := d.schedule([]cronJob{
			{"boom", "*/10 * * * * *", func() { runs++; panic("boom") }},
			{"off", "-", func() { t.Error("a disabled job ran") }},
		})
		require.NoError(t, err)
		time.Sleep(61 * time.Second)
		synctest.Wait()
		stop()
		assert.Equal(t, 6, runs, "every 10 s for a minute, despite panicking each time")
		assert.Equal(t, 6.0, testutil.ToFloat64(d.metrics.cronRuns.WithLabelValues("boom")))
		assert.Equal(t, 6.0, testutil.ToFloat64(d.metrics.cronPanics.WithLabelValues("boom")))
	})
}

func TestCronBadSpec(t *testing.T) {
	d := &Daemon{cfg: &Config{Deployment: "test"}, log: slog.New(slog.DiscardHandler)}
	d.metrics = newMetrics(d)
	_, err := d.schedule([]cronJob{{"daily_summary", "0 9 * * *", func() {}}})
	require.ErrorContains(t, err, `cron.daily_summary: "0 9 * * *"`)
}
