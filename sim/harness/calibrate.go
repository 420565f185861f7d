package harness

import (
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim/scenario"
)

// Calibrate measures a scenario's deployment the way `basin calibrate` does (closed-loop step load
// in the simulator) and fits the knee.
func Calibrate(sc *scenario.Scenario, created time.Time) (*detector.Calibration, error) {
	c, err := scenario.MeasureCurve(sc, "", scenario.CurveOptions{}, nil)
	if err != nil {
		return nil, err
	}
	pts := make([]detector.Point, len(c.Points))
	for i, p := range c.Points {
		pts[i] = detector.Point{WorkingSetOverCache: p.WorkingSetOverCache, HitRate: p.HitRate, Sessions: float64(p.N),
			CompletionRatePerS: p.SessionsPerMin / 60}
	}
	return detector.NewCalibration(pts, c.K, created, "basin calibrate --scenario "+sc.Name)
}
