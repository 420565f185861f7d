// Package testclock is the settable clock of the tests whose component sits behind a real socket:
// the gateway, the simulator's server, the alert receiver and the daemon take a Now func, and
// their tests move it by hand. Loops and controllers tested in-process run in a testing/synctest
// bubble instead; a bubble's fake time cannot reach a test that talks over a real socket (network
// I/O is not durably blocking), so these tests keep an injected clock, and this is the one copy.
package testclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told to; safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock reading t.
func New(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time; pass the method value as a component's Now.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}
