package detector

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Knee defaults.
const (
	// DefaultKneeRatio is the Basin paper's cache knee: the hit rate collapses once the working
	// set exceeds about 1.9 times the cache capacity (paper §0.2, unverified summary). The
	// simulator's paper-1p1d-h100 curve collapses by 1.8, consistent with it.
	DefaultKneeRatio = 1.9
	// DefaultPlateauHit is the hit rate assumed on the plateau until one is calibrated or learnt:
	// the paper's healthy reference run hits 0.95 (paper §0.1); the simulator's hits 0.96.
	DefaultPlateauHit = 0.95
	// DefaultPlateauTolerance is how far a point may sit from the plateau and still be on it
	// (basin's design value, 0.05: half the gap between the paper's healthy 0.95 and the lowest
	// never-collapsed hit rate at 1.6–1.7× cache, 0.81, would be 0.07; 0.05 keeps the knee early).
	DefaultPlateauTolerance = 0.05
	// MinFitPoints is the fewest points FitKnee accepts: fewer leave a plateau third of one point
	// and nothing to bracket a drop with.
	MinFitPoints = 4
)

// Sources of a knee or a plateau.
const (
	SourceCalibration = "calibration"
	SourcePassive     = "passive"
	SourceDefault     = "default"
)

// Errors of FitKnee.
var (
	// ErrTooFewPoints: fewer than MinFitPoints usable points.
	ErrTooFewPoints = errors.New("too few points to fit a knee")
	// ErrNoDrop: the hit rate never left its plateau over the measured range; the Knee returned
	// with it is usable: BeyondRange is set and Ratio is the largest measured W/C, a lower bound.
	ErrNoDrop = errors.New("hit rate never leaves its plateau: knee beyond the measured range")
)

// Knee is where the prefix-cache hit rate leaves its plateau, as a ratio of the working set to the
// cache capacity.
type Knee struct {
	// Ratio is W/C where the hit rate leaves its plateau.
	Ratio float64 `json:"ratio"`
	// PlateauHit is the hit rate on the plateau, before the knee.
	PlateauHit float64 `json:"plateau_hit"`
	// Source says where Ratio comes from: "calibration", "passive" or "default".
	Source string `json:"source"`
	// PlateauSource says where PlateauHit comes from; it may be learnt before the knee is.
	PlateauSource string `json:"plateau_source"`
	// BeyondRange is set when no drop was measured: Ratio is then a lower bound.
	BeyondRange bool `json:"beyond_range,omitempty"`
}

// Point is one measurement of the hit rate at a working set, as a calibration or the passive
// learner sees it.
type Point struct {
	WorkingSetOverCache float64 `json:"working_set_over_cache"`
	HitRate             float64 `json:"hit_rate"`
	// Sessions is the mean live population during the measurement (0 when unknown).
	Sessions float64 `json:"sessions"`
	// CompletionRatePerS is sessions completed per second during the measurement (0 when unknown).
	CompletionRatePerS float64 `json:"completion_rate_per_s"`
}

// FitKnee fits the knee of a hit-rate curve with DefaultPlateauTolerance.
func FitKnee(points []Point) (Knee, error) {
	return FitKneeTolerance(points, DefaultPlateauTolerance)
}

// FitKneeTolerance fits the knee of a hit-rate curve: the plateau is the median hit rate of the
// lowest-W third of the points or of the points below W/C 1, whichever set is larger; the knee is
// where the hit rate first falls below plateau − tol and stays below at the next point,
// interpolated linearly between the last point on the plateau and the first one below it. One
// point below the band with the next back inside it is noise, not the knee. Points above the band
// count as on the plateau: a knee is a drop. Leading points below the band (a cache still warming
// at the lowest loads) come before the plateau, not after it, and are skipped.
//
// With no drop it returns ErrNoDrop and a Knee at the largest measured W/C with BeyondRange set.
func FitKneeTolerance(points []Point, tol float64) (Knee, error) {
	if !(tol > 0 && tol < 1) {
		return Knee{}, fmt.Errorf("fit knee: tolerance %v outside (0, 1)", tol)
	}
	pts := make([]Point, 0, len(points))
	for _, p := range points {
		if p.WorkingSetOverCache > 0 && !math.IsInf(p.WorkingSetOverCache, 0) && p.HitRate >= 0 && p.HitRate <= 1 {
			pts = append(pts, p)
		}
	}
	if len(pts) < MinFitPoints {
		return Knee{}, fmt.Errorf("fit knee: %d usable points, need %d: %w", len(pts), MinFitPoints, ErrTooFewPoints)
	}
	slices.SortStableFunc(pts, func(a, b Point) int {
		switch {
		case a.WorkingSetOverCache < b.WorkingSetOverCache:
			return -1
		case a.WorkingSetOverCache > b.WorkingSetOverCache:
			return 1
		}
		return 0
	})
	third := (len(pts) + 2) / 3
	below1 := 0
	for _, p := range pts {
		if p.WorkingSetOverCache < 1 {
			below1++
		}
	}
	plateauSet := max(third, below1)
	hits := make([]float64, plateauSet)
	for i := range plateauSet {
		hits[i] = pts[i].HitRate
	}
	plateau := median(hits)
	band := plateau - tol
	k := Knee{PlateauHit: plateau, Source: SourceCalibration, PlateauSource: SourceCalibration}
	// The plateau starts at the first point in the band; one exists, the median point is in it.
	start := max(0, slices.IndexFunc(pts, func(p Point) bool { return p.HitRate >= band }))
	for j := start + 1; j < len(pts); j++ {
		p := pts[j]
		if p.HitRate >= band {
			continue
		}
		if j+1 < len(pts) && pts[j+1].HitRate >= band {
			continue // an isolated dip: noise
		}
		prev := pts[j-1]
		k.Ratio = prev.WorkingSetOverCache
		if dh := prev.HitRate - p.HitRate; dh > 0 {
			k.Ratio += (p.WorkingSetOverCache - prev.WorkingSetOverCache) * (prev.HitRate - band) / dh
		}
		return k, nil
	}
	k.Ratio = pts[len(pts)-1].WorkingSetOverCache
	k.BeyondRange = true
	return k, fmt.Errorf("fit knee: plateau %.2f held up to W/C %.2f: %w", plateau, k.Ratio, ErrNoDrop)
}

// median of a non-empty slice; it sorts the slice.
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
