package detector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLearntPoints: the detector's one passive learner learns the way up and not the collapsed
// branch. Without a calibration it learns a reading by the state its step starts in (the knee of
// the step includes it); with one, by the state the step ends in — the daemon refits the
// calibration's knee on these points, and the step that enters trapped has read the collapse
// while the one that leaves recovering reads the plateau again.
func TestLearntPoints(t *testing.T) {
	cal := &Calibration{Version: 1, KneeRatio: 1.9, PlateauHit: 0.96, PeakCompletionRatePerS: 5.1 / 60,
		CallsPerSession: testK, Created: t0, Source: "test",
		Points: []Point{{WorkingSetOverCache: 0.5, HitRate: 0.96, Sessions: 20, CompletionRatePerS: 4.0 / 60}}}
	// Each step's W/C a little apart, so that which steps a bin learnt shows in its mean.
	script := func(off time.Duration) sample {
		s := trapAndRecovery(off)
		s.wc += 1e-5 * float64(off/step)
		return s
	}
	tests := []struct {
		name string
		cal  *Calibration
		// byEnd: the learner learns by the state the step ends in, else the one it starts in.
		byEnd bool
	}{
		{name: "learnt knee", cal: nil, byEnd: false},
		{name: "calibrated", cal: cal, byEnd: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := scriptOptions()
			o.DisablePassive, o.Calibration = false, tc.cal
			o.Passive = PassiveOptions{MinSamples: 1}
			d := newDetector(t, o)
			as := runScript(t, d, 0, 20*time.Minute, script)
			require.Contains(t, transitions(as), "6m30s drifting→trapped")
			require.Contains(t, transitions(as), "17m0s recovering→healthy")

			byStart, err := NewPassive(o.Passive)
			require.NoError(t, err)
			byEnd, err := NewPassive(o.Passive)
			require.NoError(t, err)
			from := Healthy
			for _, a := range as {
				learnt := func(s State) bool {
					return a.Blind == nil && a.HitEvidence.Enough && s != Trapped && s != Recovering
				}
				if learnt(from) {
					byStart.Observe(a.WorkingSetOverCache, a.HitRate)
				}
				if learnt(a.State) {
					byEnd.Observe(a.WorkingSetOverCache, a.HitRate)
				}
				from = a.State
			}
			want, other := byStart.Points(), byEnd.Points()
			if tc.byEnd {
				want, other = other, want
			}
			require.NotEqual(t, want, other, "the script tells the two rules apart")
			got := d.LearntPoints()
			assert.Equal(t, want, got)
			if tc.cal != nil {
				assert.Equal(t, SourceCalibration, as[len(as)-1].Knee.Source, "it learns, but judges by the calibration")
			}
		})
	}
}

// TestLearntPointsDisabled: with passive learning off nothing is learnt.
func TestLearntPointsDisabled(t *testing.T) {
	o := scriptOptions()
	o.Passive = PassiveOptions{MinSamples: 1}
	d := newDetector(t, o)
	runScript(t, d, 0, 20*time.Minute, trapAndRecovery)
	assert.Empty(t, d.LearntPoints())
}
