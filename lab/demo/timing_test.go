package demo

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeWaits plays waits on a fake wall clock: each one ends late by what late says for it.
type fakeWaits struct {
	now  time.Time
	late func(i int) time.Duration // wall
	i    int
}

func (f *fakeWaits) clock() time.Time { return f.now }

func (f *fakeWaits) sleep(ctx context.Context, d time.Duration) error {
	f.now = f.now.Add(max(d, 0) + f.late(f.i))
	f.i++
	return ctx.Err()
}

func TestLagMeter(t *testing.T) {
	const speed = 90
	// A tool pause every 6 s of the deployment's time, for an hour: 600 waits, 10 a minute.
	pause := 6 * time.Second / speed
	for _, tc := range []struct {
		name  string
		waits int
		late  func(i int) time.Duration // wall
		kept  bool
		worst time.Duration // virtual, within 1%
	}{
		{"on time", 600, func(int) time.Duration { return 0 }, true, 0},
		{"a little late, within the tolerance", 600, func(int) time.Duration { return 2 * time.Millisecond }, true,
			180 * time.Millisecond},
		{"late throughout", 600, func(int) time.Duration { return 20 * time.Millisecond }, false, 1800 * time.Millisecond},
		// 0.27 s every wait: within a window's tolerance, past the run's.
		{"a little too late all along", 600, func(int) time.Duration { return 3 * time.Millisecond }, false,
			270 * time.Millisecond},
		// One wait of 300 ms (27 s of the deployment's time) among the 45 of its window: a
		// hiccup, spread to 0.6 s.
		{"one hiccup", 600, func(i int) time.Duration {
			if i == 300 {
				return 300 * time.Millisecond
			}
			return 0
		}, true, 600 * time.Millisecond},
		// Behind for five minutes of the hour, which the run's mean (0.25 s) hides.
		{"behind for one window", 600, func(i int) time.Duration {
			if i >= 300 && i < 350 {
				return 33 * time.Millisecond
			}
			return 0
		}, false, 2970 * time.Millisecond},
		{"too few waits to tell", minWaits - 1, func(int) time.Duration { return 0 }, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeWaits{now: time.Unix(1e9, 0), late: tc.late}
			m := newLagMeter(speed, f.clock, f.sleep)
			m.begin(f.now)
			for range tc.waits {
				require.NoError(t, m.Sleep(t.Context(), pause))
			}
			got := m.timing()
			assert.Equal(t, tc.waits, got.Waits)
			assert.Equal(t, tc.kept, got.Kept(), "%+v", got)
			assert.InDelta(t, float64(tc.worst), float64(got.Worst), 0.01*float64(time.Second), "worst window: %v", got.Worst)
		})
	}
}

func TestLagMeterCounts(t *testing.T) {
	const speed = 100
	t.Run("an arrival dispatched after its time is late by that much", func(t *testing.T) {
		f := &fakeWaits{now: time.Unix(1e9, 0), late: func(int) time.Duration { return 0 }}
		m := newLagMeter(speed, f.clock, f.sleep)
		m.begin(f.now)
		require.NoError(t, m.Sleep(t.Context(), -20*time.Millisecond))
		assert.Equal(t, 2*time.Second, m.timing().Max)
	})
	t.Run("an interrupted wait did not end late: not counted", func(t *testing.T) {
		f := &fakeWaits{now: time.Unix(1e9, 0), late: func(int) time.Duration { return time.Second }}
		m := newLagMeter(speed, f.clock, f.sleep)
		m.begin(f.now)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.ErrorIs(t, m.Sleep(ctx, time.Millisecond), context.Canceled)
		assert.Zero(t, m.timing().Waits)
	})
	t.Run("waits before the load began are not counted", func(t *testing.T) {
		f := &fakeWaits{now: time.Unix(1e9, 0), late: func(int) time.Duration { return time.Second }}
		m := newLagMeter(speed, f.clock, f.sleep)
		require.NoError(t, m.Sleep(t.Context(), time.Millisecond))
		assert.Zero(t, m.timing().Waits)
	})
	t.Run("recent is the last window only", func(t *testing.T) {
		late := time.Duration(0)
		f := &fakeWaits{now: time.Unix(1e9, 0), late: func(int) time.Duration { return late }}
		m := newLagMeter(speed, f.clock, f.sleep)
		m.begin(f.now)
		pause := 6 * time.Second / speed
		for range 200 { // 20 minutes of the deployment's time, 2 s late per wait
			late = 20 * time.Millisecond
			require.NoError(t, m.Sleep(t.Context(), pause))
		}
		mean, n := m.recent(f.now)
		assert.Greater(t, mean, MaxLag)
		assert.GreaterOrEqual(t, n, minWaits)
		for range 100 { // then on time: the 5-minute window forgets
			late = 0
			require.NoError(t, m.Sleep(t.Context(), pause))
		}
		mean, _ = m.recent(f.now)
		assert.Zero(t, mean)
		assert.False(t, m.timing().Kept(), "the run as a whole still fell behind")
	})
	t.Run("behind: for good, once the last window is past its tolerance", func(t *testing.T) {
		late := time.Duration(0)
		f := &fakeWaits{now: time.Unix(1e9, 0), late: func(int) time.Duration { return late }}
		m := newLagMeter(speed, f.clock, f.sleep)
		m.begin(f.now)
		pause := 6 * time.Second / speed
		wait := func(n int, l time.Duration) {
			late = l
			for range n {
				require.NoError(t, m.Sleep(t.Context(), pause))
			}
		}
		wait(20, 10*time.Millisecond) // 1 s late, but too few waits to tell
		_, behind := m.behind(f.now)
		assert.False(t, behind, "too few waits")
		wait(40, 4*time.Millisecond) // 0.4 s late for four minutes: past the run's tolerance so far
		_, behind = m.behind(f.now)
		assert.False(t, behind, "a run's mean can still be made up for: not said while it runs")
		wait(40, 15*time.Millisecond) // 1.5 s late
		how, behind := m.behind(f.now)
		assert.True(t, behind)
		assert.False(t, m.timing().Kept(), "what is said while it runs holds at the end")
		assert.Contains(t, how, "late on average over the last 5 minutes (tolerance 0.75 s)")
	})
}
