package scaledclock

import (
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/testclock"
)

// TestNowRunsAtTheSpeed: in a synctest bubble (fake wall time), a wall second is Speed seconds of
// the clock's time, from the instant the clock was made, whatever happened to the wall clock
// before.
func TestNowRunsAtTheSpeed(t *testing.T) {
	for _, tc := range []struct {
		speed float64
		wall  time.Duration // slept after New
		want  time.Duration // the clock's time since New
	}{
		{1, 7 * time.Second, 7 * time.Second},
		{90, time.Second, 90 * time.Second},
		{90, 40 * time.Second, time.Hour},
		{200, 1500 * time.Millisecond, 5 * time.Minute},
		{0.5, 10 * time.Second, 5 * time.Second},
	} {
		t.Run(fmt.Sprintf("speed %v", tc.speed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				time.Sleep(time.Hour) // the wall clock's past is not the clock's
				c, err := New(tc.speed, nil)
				require.NoError(t, err)
				start := c.Now()
				assert.Equal(t, time.Now(), start, "the clock reads the wall clock when made")
				time.Sleep(tc.wall)
				assert.Equal(t, tc.want, c.Now().Sub(start))
			})
		})
	}
}

// TestTickerAtWallDurationTicksInClockTime: a ticker whose wall period is WallDuration(d) ticks
// once per d of the clock's time — the daemon's loop and the collector's rounds run every interval
// of the deployment's time.
func TestTickerAtWallDurationTicksInClockTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := New(90, nil)
		require.NoError(t, err)
		interval := 30 * time.Second
		require.Equal(t, 333333333*time.Nanosecond, c.WallDuration(interval))
		tk := time.NewTicker(c.WallDuration(interval))
		defer tk.Stop()
		start := c.Now()
		for i := 1; i <= 10; i++ {
			<-tk.C
			assert.InDelta(t, float64(time.Duration(i)*interval), float64(c.Now().Sub(start)), float64(time.Microsecond), "tick %d", i)
		}
	})
}

// TestSettableWall: tests that step a component by hand pass a settable wall clock; the clock
// follows it at its speed.
func TestSettableWall(t *testing.T) {
	t0 := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	wall := testclock.New(t0)
	c, err := New(100, wall.Now)
	require.NoError(t, err)
	assert.Equal(t, t0, c.Now())
	wall.Advance(3 * time.Second)
	assert.Equal(t, t0.Add(5*time.Minute), c.Now())
	assert.Equal(t, 100*time.Millisecond, c.WallDuration(10*time.Second))
	assert.Equal(t, 100.0, c.Speed())

	one, err := New(1, wall.Now)
	require.NoError(t, err)
	wall.Advance(time.Minute)
	assert.Equal(t, wall.Now(), one.Now(), "speed 1 is the wall clock")
	assert.Equal(t, 10*time.Second, one.WallDuration(10*time.Second))
}

func TestNewRefusesBadSpeeds(t *testing.T) {
	for _, s := range []float64{0, -1, math.NaN(), math.Inf(1), MaxSpeed + 1} {
		_, err := New(s, nil)
		require.Error(t, err, "%v", s)
		assert.Contains(t, err.Error(), "speed: ")
	}
}

// TestSinceAgreesAcrossRestarts: two clocks given the same start — a process and the same process
// restarted later — read the same deployment time, which kept running in between; a clock made
// afresh at the restart would be behind it by (speed − 1) × the first one's uptime.
func TestSinceAgreesAcrossRestarts(t *testing.T) {
	t0 := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	wall := testclock.New(t0)
	first, err := Since(20, t0, wall.Now)
	require.NoError(t, err)
	wall.Advance(10 * time.Second)
	before := first.Now()
	assert.Equal(t, t0.Add(200*time.Second), before)

	wall.Advance(time.Second) // the process is down for a wall second
	second, err := Since(20, t0, wall.Now)
	require.NoError(t, err)
	assert.Equal(t, 20*time.Second, second.Now().Sub(before), "the deployment's time ran on")
	assert.Equal(t, first.Now(), second.Now())

	afresh, err := New(20, wall.Now)
	require.NoError(t, err)
	assert.True(t, afresh.Now().Before(before), "a clock started at the restart goes back")
}
