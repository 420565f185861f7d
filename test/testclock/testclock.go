// Package testclock is the settable clock of tests that step a component by hand: the gateway and
// the simulator's server behind real sockets, the alert receiver's handler, the daemon's Step. Each
// takes a Now func and the test moves it between requests or steps. Loops and controllers tested
// as they run (Run with its tickers) go in a testing/synctest bubble instead; a bubble's fake time
// cannot reach a test that talks over a real socket (network I/O is not durably blocking), so
// these tests keep an injected clock, and this is its one copy.
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
