package daemon

import (
	"log/slog"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
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

// TestAdoptKnee: a re-estimated knee that moved is written to the calibration file and judged by
// from the next step, without a restart; one that moved less than 0.05 changes nothing.
func TestAdoptKnee(t *testing.T) {
	e := newEnv(t, "")
	d := e.daemon()
	defer d.Close()
	e.step(d)
	require.Equal(t, 1.9, d.StatusNow().Assessment.Knee.Ratio)
	path := filepath.Join(e.dir, "calibration.json")

	d.adoptKnee(detector.Knee{Ratio: 1.93, PlateauHit: 0.95})
	c, err := detector.LoadCalibration(path)
	require.NoError(t, err)
	assert.Equal(t, 1.9, c.KneeRatio, "a move under 0.05 is noise")

	d.adoptKnee(detector.Knee{Ratio: 1.6, PlateauHit: 0.94})
	c, err = detector.LoadCalibration(path)
	require.NoError(t, err)
	assert.Equal(t, 1.6, c.KneeRatio)
	assert.Contains(t, c.Source, "re-estimated passively by basin daemon (was 1.90)")
	e.step(d)
	a := d.StatusNow().Assessment
	assert.Equal(t, 1.6, a.Knee.Ratio, "the running detector judges by the new knee")
	assert.InDelta(t, 0.94, a.Knee.PlateauHit, 1e-9)
}
