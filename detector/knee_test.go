package detector

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// curve returns points every 0.1 in W/C from lo to hi with hit(W/C).
func curve(lo, hi float64, hit func(r float64) float64) []Point {
	var pts []Point
	for i := 0; ; i++ {
		r := lo + 0.1*float64(i)
		if r > hi+1e-9 {
			return pts
		}
		pts = append(pts, Point{WorkingSetOverCache: r, HitRate: hit(r)})
	}
}

// cliff is a plateau of 0.96 until knee, then a fall to 0.3 over 0.3 of W/C.
func cliff(knee float64) func(float64) float64 {
	return func(r float64) float64 {
		if r <= knee+1e-9 {
			return 0.96
		}
		return max(0.3, 0.96-(r-knee)*0.66/0.3)
	}
}

func TestFitKnee(t *testing.T) {
	noisy := curve(0.2, 2.6, cliff(1.7))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range noisy {
		noisy[i].HitRate += (rng.Float64()*2 - 1) * 0.03 // within the tolerance
	}
	dip := curve(0.2, 2.6, cliff(1.7))
	dip[8].HitRate = 0.80 // W/C 1.0: one bad measurement on the plateau
	// Nine points below W/C 1 (the cache still warming on the first three) outnumber the lowest
	// third (five of fourteen), whose median would be the warming 0.80.
	manyBelow1 := curve(0.1, 1.4, func(r float64) float64 {
		switch {
		case r < 0.35:
			return 0.80
		case r < 1.15:
			return 0.95
		case r < 1.25:
			return 0.5
		}
		return 0.3
	})

	tests := []struct {
		name        string
		pts         []Point
		knee, tol   float64
		plateau     float64
		err         error
		beyondRange bool
	}{
		{name: "cliff at 1.7", pts: curve(0.2, 2.6, cliff(1.7)), knee: 1.7, tol: 0.03, plateau: 0.96},
		{name: "cliff at 1.2", pts: curve(0.2, 2.6, cliff(1.2)), knee: 1.2, tol: 0.03, plateau: 0.96},
		{name: "noisy", pts: noisy, knee: 1.7, tol: 0.1, plateau: 0.96},
		{name: "isolated dip is noise", pts: dip, knee: 1.7, tol: 0.03, plateau: 0.96},
		{name: "plateau from the points below 1", pts: manyBelow1, knee: 1.1 + 0.1*0.05/0.45, tol: 1e-9, plateau: 0.95},
		{name: "no drop", pts: curve(0.2, 1.5, func(float64) float64 { return 0.96 }), knee: 1.5, tol: 1e-9,
			plateau: 0.96, err: ErrNoDrop, beyondRange: true},
		{name: "too few points", pts: curve(0.2, 0.4, cliff(1.7)), err: ErrTooFewPoints},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := FitKnee(tc.pts)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}
			if tc.knee == 0 {
				return
			}
			assert.InDelta(t, tc.knee, k.Ratio, tc.tol)
			assert.InDelta(t, tc.plateau, k.PlateauHit, 0.015)
			assert.Equal(t, tc.beyondRange, k.BeyondRange)
		})
	}
}

// TestFitKneeInterpolates checks the knee lies between the last plateau point and the first point
// below the band, where the line between them crosses plateau − tolerance.
func TestFitKneeInterpolates(t *testing.T) {
	pts := []Point{{0.5, 0.9, 0, 0}, {0.8, 0.9, 0, 0}, {1.0, 0.9, 0, 0}, {1.2, 0.9, 0, 0}, {1.4, 0.5, 0, 0}, {1.6, 0.3, 0, 0}}
	k, err := FitKnee(pts)
	require.NoError(t, err)
	// 0.9 → 0.5 between 1.2 and 1.4 crosses 0.85 an eighth of the way.
	assert.InDelta(t, 1.225, k.Ratio, 1e-9)
	// Order of the input does not matter.
	rev := []Point{pts[5], pts[2], pts[4], pts[0], pts[3], pts[1]}
	k2, err := FitKnee(rev)
	require.NoError(t, err)
	assert.Equal(t, k, k2)
}

func testCalibration(t *testing.T) *Calibration {
	t.Helper()
	pts := curve(0.2, 2.4, cliff(1.7))
	for i := range pts {
		pts[i].Sessions = pts[i].WorkingSetOverCache * 26
		pts[i].CompletionRatePerS = 0.05 * min(pts[i].WorkingSetOverCache, 1.5) * pts[i].HitRate
	}
	c, err := NewCalibration(pts, 40, time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), "basin calibrate --scenario paper-1p1d-h100")
	require.NoError(t, err)
	return c
}

func TestCalibrationRoundTrip(t *testing.T) {
	c := testCalibration(t)
	assert.InDelta(t, 1.7, c.KneeRatio, 0.03)
	assert.InDelta(t, 0.05*1.5*0.96, c.PeakCompletionRatePerS, 1e-9)

	var buf bytes.Buffer
	require.NoError(t, c.Write(&buf))
	assert.Contains(t, buf.String(), `"version": 1`)
	assert.Contains(t, buf.String(), `"working_set_over_cache"`)
	got, err := ReadCalibration(&buf)
	require.NoError(t, err)
	assert.Equal(t, c, got)

	path := filepath.Join(t.TempDir(), "calibration.json")
	require.NoError(t, c.Save(path))
	loaded, err := LoadCalibration(path)
	require.NoError(t, err)
	assert.Equal(t, c, loaded)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left behind")

	k := loaded.Knee()
	assert.Equal(t, SourceCalibration, k.Source)
	assert.Equal(t, c.KneeRatio, k.Ratio)
}

func TestCalibrationValidation(t *testing.T) {
	good := `{"version":1,"knee_ratio":1.8,"plateau_hit":0.96,"peak_completion_rate_per_s":0.085,"calls_per_session":40,` +
		`"points":[{"working_set_over_cache":0.5,"hit_rate":0.96,"sessions":12,"completion_rate_per_s":0.03},` +
		`{"working_set_over_cache":2.0,"hit_rate":0.3,"sessions":50,"completion_rate_per_s":0.01}],` +
		`"created":"2026-05-01T12:00:00Z","source":"step-load"}`
	_, err := ReadCalibration(strings.NewReader(good))
	require.NoError(t, err)

	tests := []struct{ name, old, new, want string }{
		{"unknown field", `"source"`, `"colour":"blue","source"`, `unknown field "colour"`},
		{"version", `"version":1`, `"version":2`, "version: 2"},
		{"knee ratio", `"knee_ratio":1.8`, `"knee_ratio":0`, "knee_ratio"},
		{"plateau hit", `"plateau_hit":0.96`, `"plateau_hit":1.2`, "plateau_hit"},
		{"peak", `"peak_completion_rate_per_s":0.085`, `"peak_completion_rate_per_s":-1`, "peak_completion_rate_per_s"},
		{"calls per session", `"calls_per_session":40`, `"calls_per_session":0.5`, "calls_per_session"},
		{"point hit rate", `"hit_rate":0.3`, `"hit_rate":1.5`, "points[1].hit_rate"},
		{"point ratio", `"working_set_over_cache":0.5`, `"working_set_over_cache":-0.5`, "points[0].working_set_over_cache"},
		{"point sessions", `"sessions":50`, `"sessions":-3`, "points[1].sessions"},
		{"point completions", `"completion_rate_per_s":0.03`, `"completion_rate_per_s":-0.03`, "points[0].completion_rate_per_s"},
		{"created", `"created":"2026-05-01T12:00:00Z",`, ``, "created"},
		{"created format", `"2026-05-01T12:00:00Z"`, `"yesterday"`, "yesterday"},
		{"source", `"source":"step-load"`, `"source":""`, "source"},
		{"trailing data", `"step-load"}`, `"step-load"} {}`, "trailing data"},
		{"wrong type", `"knee_ratio":1.8`, `"knee_ratio":"1.8"`, "knee_ratio"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := strings.Replace(good, tc.old, tc.new, 1)
			require.NotEqual(t, good, in, "the test must change the input")
			_, err := ReadCalibration(strings.NewReader(in))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	t.Run("write refuses an invalid calibration", func(t *testing.T) {
		c := testCalibration(t)
		c.PlateauHit = 0
		assert.ErrorContains(t, c.Write(&bytes.Buffer{}), "plateau_hit")
	})
	t.Run("new calibration needs a knee", func(t *testing.T) {
		_, err := NewCalibration(curve(0.2, 1.5, func(float64) float64 { return 0.96 }), 40, time.Now(), "x")
		assert.ErrorIs(t, err, ErrNoDrop)
	})
}
