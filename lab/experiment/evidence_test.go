package experiment

import (
	"github.com/basin-dev/basin/sim/harness"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// TestEvidenceHoldsUnderRealLoad: the detector's minimum evidence for a hit-rate reading
// (detector.DefaultMinHitCalls and the rest) is there to ignore quiet windows, never a busy
// deployment's: from the fifth minute on, every window of the paper's spike runs — healthy,
// under pressure, drifting and trapped — is a reading, with margin. The margins are the figures
// the defaults' comments quote.
func TestEvidenceHoldsUnderRealLoad(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	for _, name := range []string{"paper-1p1d-h100-spike", "paper-1p3d-h200-spike"} {
		t.Run(name, func(t *testing.T) {
			sc, err := scenario.Load(name)
			require.NoError(t, err)
			cal, err := harness.Calibrate(sc, time.Unix(0, 0))
			require.NoError(t, err)
			o, err := sc.Options("")
			require.NoError(t, err)
			var steps, trapped int
			minCalls, maxShare, minPromptC := 1e18, 0.0, 1e18
			require.NoError(t, harness.ObserveEach(&o, detector.Options{Calibration: cal}, func(tk harness.Tick) {
				a := tk.Assessment
				if a.ObservedAt.IsZero() || tk.T < 5*time.Minute {
					return
				}
				steps++
				if a.State == detector.Trapped {
					trapped++
				}
				e := a.HitEvidence
				assert.True(t, e.Enough, "%s: %s", tk.T, e.Why)
				minCalls = min(minCalls, e.Calls)
				maxShare = max(maxShare, e.FirstCalls/e.Calls)
				minPromptC = min(minPromptC, e.PromptTokens/(a.KneeTokens/a.Knee.Ratio))
			}))
			s, err := sim.New(o)
			require.NoError(t, err)
			s.Run()
			require.Positive(t, trapped, "the run reaches the trap")
			assert.GreaterOrEqual(t, minCalls, 2.0*detector.DefaultMinHitCalls, "calls per window")
			assert.LessOrEqual(t, maxShare, detector.DefaultMaxFirstCallShare/2, "first-call share")
			assert.GreaterOrEqual(t, minPromptC, 10*detector.DefaultMinHitPromptFraction, "prompt tokens per window ÷ C")
			t.Logf("%d steps: calls/window ≥ %.0f, first-call share ≤ %.3f, prompt/C ≥ %.2f", steps, minCalls, maxShare, minPromptC)
		})
	}
}
