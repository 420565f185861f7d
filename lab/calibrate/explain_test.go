package calibrate

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

// TestNoKneeUnderABudgetSaysWhy: steps whose working set a gateway's budget held back reach no
// knee, and the error says it was the budget, with its numbers; without a budget holding them (no
// gateway, a count-only one, one far from full) the error is the fit's alone.
func TestNoKneeUnderABudgetSaysWhy(t *testing.T) {
	const cache = 560_000
	// A flat hit rate up to W/C 0.27: the budget (150K = 0.27 C) stopped the working set there.
	pts := []detector.Point{{WorkingSetOverCache: 0.12, HitRate: 0.9}, {WorkingSetOverCache: 0.2, HitRate: 0.91},
		{WorkingSetOverCache: 0.26, HitRate: 0.9}, {WorkingSetOverCache: 0.27, HitRate: 0.9}}
	held := func(queued, reserved float64) *Admission {
		return &Admission{BudgetTokens: 150_000, ReservedTokens: reserved, QueuedSessions: queued, CacheTokens: cache}
	}
	free := &Admission{BudgetTokens: 1e12, ReservedTokens: 150_000, CacheTokens: cache}
	countOnly := &Admission{BudgetTokens: 0, ReservedTokens: 150_000, QueuedSessions: 0, CacheTokens: cache}
	for _, tc := range []struct {
		name      string
		admission []*Admission
		want      []string // in the error, besides the fit's own message; none: the fit's alone
	}{
		{"held from the third step", []*Admission{free, free, held(12, 149_000), held(37, 148_500)},
			[]string{"the gateway's admission budget capped the working set", "2 of 4 steps",
				"from step 3 on W/C reached at most 0.27", "at step 4 the budget was 150000 tokens, 0.27× the cache of 560000",
				"148500 tokens reserved and 37 sessions queued", "admission.count_only: true"}},
		{"full with none queued", []*Admission{free, free, free, held(0, 145_000)},
			[]string{"1 of 4 steps", "from step 4 on"}},
		{"no gateway scraped", []*Admission{nil, nil, nil, nil}, nil},
		{"count-only gateway", []*Admission{countOnly, countOnly, countOnly, countOnly}, nil},
		{"budget out of reach", []*Admission{free, free, free, free}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Result{Points: pts, Admission: tc.admission}
			_, fitErr := detector.NewCalibration(pts, 30, time.Now(), "test")
			require.ErrorIs(t, fitErr, detector.ErrNoDrop)
			err := r.explain(fitErr)
			require.ErrorIs(t, err, detector.ErrNoDrop)
			if tc.want == nil {
				assert.Equal(t, fitErr.Error(), err.Error())
				return
			}
			assert.Contains(t, err.Error(), "knee beyond the measured range: the gateway's admission budget")
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	// Another fit error is left as it is, budget or not.
	r := &Result{Points: pts[:2], Admission: []*Admission{held(3, 149_000), held(3, 149_000)}}
	_, fitErr := detector.NewCalibration(pts[:2], 30, time.Now(), "test")
	require.ErrorIs(t, fitErr, detector.ErrTooFewPoints)
	assert.Equal(t, fitErr, r.explain(fitErr))
}

// TestSavingACalibrationRemovesTheEarlierPartial: a run interrupted earlier left
// calibration.partial.json; the run that finishes writes calibration.json and removes it, so the
// directory holds the calibration alone. Until then (an interrupted run, SavePartial) the partial
// file stays.
func TestSavingACalibrationRemovesTheEarlierPartial(t *testing.T) {
	pts := []detector.Point{{WorkingSetOverCache: 0.5, HitRate: 0.9, CompletionRatePerS: 0.05},
		{WorkingSetOverCache: 1, HitRate: 0.9, CompletionRatePerS: 0.06}, {WorkingSetOverCache: 1.5, HitRate: 0.89, CompletionRatePerS: 0.07},
		{WorkingSetOverCache: 2, HitRate: 0.6, CompletionRatePerS: 0.05}, {WorkingSetOverCache: 2.5, HitRate: 0.4, CompletionRatePerS: 0.03}}
	cal, err := detector.NewCalibration(pts, 30, time.Now().UTC(), "test")
	require.NoError(t, err)
	for _, tc := range []struct {
		name, out, partial string
		earlier            bool
	}{
		{"an earlier partial", "calibration.json", "calibration.partial.json", true},
		{"none", "calibration.json", "calibration.partial.json", false},
		{"a name without .json", "knee", "knee.partial.json", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, tc.out)
			require.Equal(t, filepath.Join(dir, tc.partial), PartialPath(out))
			if tc.earlier {
				interrupted := &Result{Points: pts[:2], Multipliers: []float64{1, 2, 3}, Step: time.Minute, Source: "test"}
				require.NoError(t, interrupted.SavePartial(PartialPath(out), fmt.Errorf("interrupted"), time.Now()))
				require.FileExists(t, PartialPath(out), "an interrupted run keeps what it measured")
			}
			require.NoError(t, SaveCalibration(cal, out))
			assert.NoFileExists(t, PartialPath(out))
			f, err := os.Open(out)
			require.NoError(t, err)
			defer f.Close()
			got, err := detector.ReadCalibration(f)
			require.NoError(t, err)
			assert.InDelta(t, cal.KneeRatio, got.KneeRatio, 1e-9)
		})
	}
}
