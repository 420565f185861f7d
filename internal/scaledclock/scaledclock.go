// Package scaledclock is the time of a simulated deployment served faster than real time
// (`basin sim serve --speed S`, `basin demo`): a clock that runs S times faster than the wall
// clock from the instant it is made.
//
// Production code has one time base: the daemon and the gateway read an injected clock for every
// timestamp, hold, rate and deadline, and against real engines that clock is the wall clock. A
// simulated deployment announces its speed (the gauge basin_sim_speed on its engines' metrics,
// the header X-Basin-Sim-Speed on its API); what reads one — `basin daemon`, `basin risk`, the
// demo, tests — builds a Clock at that speed and injects it, so that a 30 s hold or a rate per
// second keeps its meaning in the deployment's time, and no package below them carries a speed.
//
// What waits on the deployment's time on real timers (a loop's ticker, a queue's wait) converts
// the clock's durations to wall time with WallDuration: d of the clock's time lasts d/S of wall
// time. What belongs to the network or to a person — a scrape's or an HTTP client's timeout, an
// Alertmanager alert's lifetime — is not converted: it is wall time, read with Wall.
package scaledclock

import (
	"fmt"
	"math"
	"time"
)

// MaxSpeed bounds the speed: past it a millisecond of scheduling noise is minutes of the
// deployment's time, and nothing served that fast keeps time.
const MaxSpeed = 10_000

// Clock runs Speed times faster than the wall clock from its start (the instant New made it, or
// the one Since was given). It is safe for concurrent use (it holds no mutable state).
type Clock struct {
	speed float64
	wall  func() time.Time
	// start is the instant the clock and the wall clock agree on; they part at the speed.
	start time.Time
}

// New returns a clock reading wall's time now and running speed times faster from then on. wall
// is the wall clock (time.Now when nil; tests pass a settable one). A speed of 1 is the wall
// clock itself. The speed must be finite and in (0, MaxSpeed].
func New(speed float64, wall func() time.Time) (*Clock, error) {
	if wall == nil {
		wall = time.Now
	}
	return Since(speed, wall(), wall)
}

// Since returns the clock of a deployment that read the wall clock at start and has run speed
// times faster since (`basin sim serve` keeps its time so from its own start). Processes that
// watch one deployment — or one process restarted — agree on its time when they are given the
// same start, without any state of their own.
func Since(speed float64, start time.Time, wall func() time.Time) (*Clock, error) {
	if !(speed > 0 && speed <= MaxSpeed) || math.IsInf(speed, 0) { // NaN fails the first test
		return nil, fmt.Errorf("speed: must be a number in (0, %d], got %v", MaxSpeed, speed)
	}
	if wall == nil {
		wall = time.Now
	}
	return &Clock{speed: speed, wall: wall, start: start}, nil
}

// Now is the clock's time: the start plus Speed times the wall time since. It keeps the wall
// clock's monotonic reading (time.Now's), so differences between two readings are immune to a
// step of the system clock.
func (c *Clock) Now() time.Time {
	now := c.wall()
	if c.speed == 1 {
		return now
	}
	return c.start.Add(time.Duration(float64(now.Sub(c.start)) * c.speed))
}

// WallDuration is how long d of the clock's time lasts on the wall clock, d/Speed: the period
// of a ticker that ticks every d of the clock's time, or the wall timeout of a wait of d.
func (c *Clock) WallDuration(d time.Duration) time.Duration {
	if c.speed == 1 {
		return d
	}
	return time.Duration(float64(d) / c.speed)
}

// Wall is the wall clock's time now: what lasts in wall time whatever the deployment's speed —
// an Alertmanager alert's lifetime, timestamps its sender set — is read from it.
func (c *Clock) Wall() time.Time { return c.wall() }

// Speed is the clock's seconds per wall second.
func (c *Clock) Speed() float64 { return c.speed }
