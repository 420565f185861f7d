package collector

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// SpeedMetric is the gauge a simulated deployment (`basin sim serve --speed S`) announces its
// speed with: simulated seconds per wall-clock second. Real engines do not export it, and a
// deployment that does not is read at speed 1.
const SpeedMetric = "basin_sim_speed"

// speedOf reads an engine's announced speed: absent when the family is not there (a real
// engine); an error naming the metric when it is there but not one finite positive number —
// reading it as 1 would compute every rate of a fast deployment S times too high.
func speedOf(fams map[string]*dto.MetricFamily) (opt, error) {
	mf := fams[SpeedMetric]
	if mf == nil || len(mf.GetMetric()) == 0 {
		return opt{}, nil
	}
	if n := len(mf.GetMetric()); n > 1 {
		return opt{}, fmt.Errorf("%s: %d series, want one (no labels)", SpeedMetric, n)
	}
	m := mf.GetMetric()[0]
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return opt{}, fmt.Errorf("%s: not a gauge", SpeedMetric)
	}
	if !(v > 0) || math.IsInf(v, 0) { // NaN fails the first test
		return opt{}, fmt.Errorf("%s: got %v, want a finite number > 0 (simulated seconds per wall second)", SpeedMetric, v)
	}
	return some(v), nil
}

// sameSpeed compares speeds with a relative tolerance: a clock's speed derived from its
// conversion of durations to wall time is exact only to the nanosecond.
func sameSpeed(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(a, b) }

// formatSpeed prints a speed as the metric would carry it (60, 0.5).
func formatSpeed(s float64) string { return strconv.FormatFloat(s, 'g', 6, 64) }

// clockSpeed is the speed of Options.Now's clock, from its conversion to wall time.
func (o Options) clockSpeed() float64 {
	const span = time.Hour
	w := o.WallDuration(span)
	if w <= 0 {
		return 1
	}
	return float64(span) / float64(w)
}

// AnnouncedSpeed is what a deployment's engines say of its speed (ProbeSpeed).
type AnnouncedSpeed struct {
	// Speed is the announced speed, 1 when no engine announces one.
	Speed float64
	// Announced lists the engine targets that export SpeedMetric, sorted; empty for real
	// engines (or when none answered).
	Announced []string
	// Answered counts the engine targets that answered; Engines counts those asked.
	Answered, Engines int
}

// ProbeSpeed scrapes every engine target once, at the same time and each within Timeout (wall
// time), and reads the speed the deployment announces: a reader sets its clock to it before it
// reads any rate. Targets that do not answer are skipped (Answered says how many did). An
// invalid SpeedMetric, or engines that announce different speeds, is an error naming the
// metric and the targets.
func (c *Collector) ProbeSpeed(ctx context.Context) (AnnouncedSpeed, error) {
	c.reloadTargetFile()
	var (
		mu     sync.Mutex
		out    = AnnouncedSpeed{Speed: 1}
		errs   []error
		speeds = map[string]float64{}
		wg     sync.WaitGroup
	)
	for _, t := range c.Targets() {
		if t.URL == "" || !t.Role.engine() {
			continue
		}
		out.Engines++
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
			defer cancel()
			raw, kept := getBuffer(), getBuffer()
			defer putBuffer(raw)
			defer putBuffer(kept)
			fams, _, _, err := c.scrape(sctx, t, raw, kept)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				return
			}
			out.Answered++
			s, err := speedOf(fams)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("target %s (%s): %w", t.Name, t.URL, err))
			case s.ok:
				speeds[t.Name] = s.v
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return out, err
	}
	for name := range speeds {
		out.Announced = append(out.Announced, name)
	}
	slices.Sort(out.Announced)
	for i, name := range out.Announced {
		if i == 0 {
			out.Speed = speeds[name]
			continue
		}
		if first := out.Announced[0]; !sameSpeed(speeds[name], speeds[first]) {
			return out, fmt.Errorf("%s: target %s announces %s, target %s announces %s: one deployment runs at one speed",
				SpeedMetric, first, formatSpeed(speeds[first]), name, formatSpeed(speeds[name]))
		}
	}
	return out, nil
}

// checkSpeed refuses a scraped engine reading whose announced speed is not the speed of the
// collector's clock: its counters would be read against the wrong time, every rate off by the
// ratio. (Ingest callers give readings their own timestamps; the metric is not checked there.)
func (c *Collector) checkSpeed(fams map[string]*dto.MetricFamily) error {
	s, err := speedOf(fams)
	if err != nil {
		return err
	}
	if s.ok && !sameSpeed(s.v, c.speed) {
		return fmt.Errorf("%s: the engine announces %s simulated seconds per wall second, but this reader's clock runs at %s "+
			"(it takes the speed when it starts): restart it", SpeedMetric, formatSpeed(s.v), formatSpeed(c.speed))
	}
	return nil
}
