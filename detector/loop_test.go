package detector

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
)

// TestLoop runs twenty minutes of a spike, a blind collector, a collapse and a recovery on the
// bubble's fake clock, stepping every 5 s.
func TestLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		script := func(off time.Duration) sample {
			switch {
			case off < 2*time.Minute:
				return sample{wc: 1.0, hit: 0.96}
			case off < 4*time.Minute:
				return sample{wc: 1.6, hit: 0.96}
			case off < 6*time.Minute:
				return sample{wc: 1.7, hit: 0.88}
			case off < 8*time.Minute: // the collector loses the hit rate while the cache collapses
				return sample{wc: 2.1, hit: 0.41, stale: []collector.Signal{collector.HitRate}}
			case off < 12*time.Minute:
				return sample{wc: 2.1, hit: 0.41}
			case off < 14*time.Minute:
				return sample{wc: 1.5, hit: 0.6}
			}
			return sample{wc: 1.2, hit: 0.95}
		}
		d := newDetector(t, scriptOptions())
		var got []string
		var blindStates []State
		steps := 0
		loop := &Loop{
			Every:    5 * time.Second,
			Detector: d,
			Snapshot: func() collector.Snapshot {
				now := time.Now()
				return script(now.Sub(start)).snapshot(now)
			},
			OnAssessment: func(a Assessment) {
				steps++
				if tr := a.Transition; tr != nil {
					got = append(got, fmt.Sprintf("%s %s→%s", tr.At.Sub(start), tr.From, tr.To))
				}
				if len(a.Blind) > 0 {
					blindStates = append(blindStates, a.State)
				}
			},
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute+time.Second)
		defer cancel()
		require.NoError(t, loop.Run(ctx))
		assert.Equal(t, 20*time.Minute+time.Second, time.Since(start))
		assert.Equal(t, 240, steps, "one step every 5 s for 20 minutes")
		assert.Equal(t, []string{
			"2m15s healthy→pressure",
			"5m0s pressure→drifting",
			"8m30s drifting→trapped", // not before: blind from 6m to 8m, the hold starts again at 8m
			"12m15s trapped→recovering",
			"19m0s recovering→healthy",
		}, got)
		require.Len(t, blindStates, 24)
		for _, s := range blindStates {
			assert.Equal(t, Drifting, s)
		}
		last, ok := d.Last()
		require.True(t, ok)
		assert.Equal(t, Healthy, last.State)
	})
}

func TestLoopConfig(t *testing.T) {
	d := newDetector(t, scriptOptions())
	snap := func() collector.Snapshot { return collector.Snapshot{} }
	for _, tc := range []struct {
		l    Loop
		want string
	}{
		{Loop{Detector: d, Snapshot: snap}, "Every"},
		{Loop{Every: time.Second, Snapshot: snap}, "Detector"},
		{Loop{Every: time.Second, Detector: d}, "Snapshot"},
	} {
		assert.ErrorContains(t, tc.l.Run(t.Context()), tc.want)
	}
}
