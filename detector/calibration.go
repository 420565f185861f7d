package detector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"github.com/basin-dev/basin/internal/atomicfile"
)

// CalibrationVersion is the only calibration file version this package reads and writes.
const CalibrationVersion = 1

// Calibration is the result of an offline step-load (`basin calibrate`): the knee, the plateau,
// the peak completion rate and the measured points, as a versioned JSON file. KneeRatio and
// PlateauHit are authoritative; Points are the evidence and seed the fluid model's completion
// curve (Sessions and CompletionRatePerS, with CallsPerSession, give X(N)).
type Calibration struct {
	Version int `json:"version"`
	// KneeRatio is W/C where the hit rate leaves its plateau.
	KneeRatio float64 `json:"knee_ratio"`
	// PlateauHit is the hit rate before the knee.
	PlateauHit float64 `json:"plateau_hit"`
	// PeakCompletionRatePerS is the highest session completion rate measured, sessions per second.
	PeakCompletionRatePerS float64 `json:"peak_completion_rate_per_s"`
	// CallsPerSession is K, the mean model calls per session of the calibrated workload.
	CallsPerSession float64 `json:"calls_per_session"`
	Points          []Point `json:"points"`
	// Created is when the calibration was measured.
	Created time.Time `json:"created"`
	// Source says how it was measured (command, scenario or deployment), for provenance.
	Source string `json:"source"`
}

// NewCalibration fits the knee of step-load points and fills a calibration from them. A curve with
// no drop is an error: a calibration has to reach the knee.
func NewCalibration(points []Point, callsPerSession float64, created time.Time, source string) (*Calibration, error) {
	k, err := FitKnee(points)
	if err != nil {
		return nil, fmt.Errorf("new calibration: %w", err)
	}
	c := &Calibration{
		Version: CalibrationVersion, KneeRatio: k.Ratio, PlateauHit: k.PlateauHit,
		CallsPerSession: callsPerSession, Points: slices.Clone(points), Created: created, Source: source,
	}
	for _, p := range points {
		c.PeakCompletionRatePerS = max(c.PeakCompletionRatePerS, p.CompletionRatePerS)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("new calibration: %w", err)
	}
	return c, nil
}

// Knee returns the calibrated knee.
func (c *Calibration) Knee() Knee {
	return Knee{Ratio: c.KneeRatio, PlateauHit: c.PlateauHit, Source: SourceCalibration, PlateauSource: SourceCalibration}
}

// Validate checks every field and names the first bad one.
func (c *Calibration) Validate() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case c.Version != CalibrationVersion:
		return fmt.Errorf("version: %d, want %d", c.Version, CalibrationVersion)
	case !finite(c.KneeRatio) || c.KneeRatio <= 0 || c.KneeRatio > 100:
		return fmt.Errorf("knee_ratio: %v outside (0, 100]", c.KneeRatio)
	case !finite(c.PlateauHit) || c.PlateauHit <= 0 || c.PlateauHit > 1:
		return fmt.Errorf("plateau_hit: %v outside (0, 1]", c.PlateauHit)
	case !finite(c.PeakCompletionRatePerS) || c.PeakCompletionRatePerS <= 0:
		return fmt.Errorf("peak_completion_rate_per_s: %v, must be positive", c.PeakCompletionRatePerS)
	case !finite(c.CallsPerSession) || c.CallsPerSession < 1:
		return fmt.Errorf("calls_per_session: %v, a session makes at least one call", c.CallsPerSession)
	case c.Created.IsZero():
		return errors.New("created: missing")
	case c.Source == "":
		return errors.New("source: missing")
	}
	for i, p := range c.Points {
		switch {
		case !finite(p.WorkingSetOverCache) || p.WorkingSetOverCache <= 0:
			return fmt.Errorf("points[%d].working_set_over_cache: %v, must be positive", i, p.WorkingSetOverCache)
		case !finite(p.HitRate) || p.HitRate < 0 || p.HitRate > 1:
			return fmt.Errorf("points[%d].hit_rate: %v outside [0, 1]", i, p.HitRate)
		case !finite(p.Sessions) || p.Sessions < 0:
			return fmt.Errorf("points[%d].sessions: %v, must not be negative", i, p.Sessions)
		case !finite(p.CompletionRatePerS) || p.CompletionRatePerS < 0:
			return fmt.Errorf("points[%d].completion_rate_per_s: %v, must not be negative", i, p.CompletionRatePerS)
		}
	}
	return nil
}

// ReadCalibration decodes and validates a calibration; unknown fields and trailing data are errors.
func ReadCalibration(r io.Reader) (*Calibration, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var c Calibration
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("read calibration: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("read calibration: trailing data after the object")
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("read calibration: %w", err)
	}
	return &c, nil
}

// LoadCalibration reads a calibration file.
func LoadCalibration(path string) (*Calibration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load calibration: %w", err)
	}
	defer f.Close()
	c, err := ReadCalibration(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Write validates the calibration and encodes it as indented JSON.
func (c *Calibration) Write(w io.Writer) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("write calibration: %w", err)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return fmt.Errorf("write calibration: %w", err)
	}
	return nil
}

// Save writes the calibration to path atomically (a temporary file in the same directory, then a
// rename), so a daemon reading it never sees half a file.
func (c *Calibration) Save(path string) error {
	var buf bytes.Buffer
	if err := c.Write(&buf); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("save calibration %s: %w", path, err)
	}
	return nil
}
