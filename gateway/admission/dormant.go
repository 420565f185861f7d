package admission

import (
	"math"
	"slices"
	"time"
)

// Dormant sessions.
//
// A session stays live until it ends or its idle timeout passes, but one that has stopped calling
// is not part of what the deployment serves: its prefix ages out of the engine's cache like any
// other, and the working set the detector reads must not carry it. Clients that never end their
// sessions (a benchmark that exits, a load generator that marks a session failed after a crash)
// leave many such sessions behind: a hundred of them read W/C 4 on an idle engine, which the
// daemon took for a trap and cut the budget for.
//
// What idle time says about a session depends on the workload: an agent is quiet while its tool
// runs, so a minute of silence is nothing where tools run for minutes and a lot where they run
// for seconds. The core sees every session's calls begin and finish, so it learns the workload's
// tool time: the gaps between a call's finish and the same session's next call, the last
// toolGapWindow of them across sessions. A session whose last call finished longer ago than
// dormantMargin × their dormantQuantile quantile (never under Options.DormantFloor, never over the
// idle timeout) is dormant: its context leaves the working set, its demand leaves the admission
// test (it no longer holds the budget) and both are reported apart. If it calls again it is
// active again at once — its call passes as every admitted session's does, never refused or
// cut for budget — and its context and demand count again.
//
// Before minToolGaps gaps are seen the threshold is the idle timeout, that is no session is
// dormant (a fresh or restarted gateway behaves as before): with no evidence of the workload's
// tool time, a quiet session cannot be told from one running a long tool, and calling it
// dormant wrongly lets newcomers into its room, which it takes back when it calls again (it is
// never cut): the overcommit the budget exists to prevent. Keeping it costs only an overstated
// working set, which the idle timeout bounds.
//
// Held sessions are never dormant while held: their calls wait at the gateway, and their
// idleness is the hold's doing. A dormant session is not held either (Hold skips it): its context
// is already out of the working set, and if it calls again it is an active session the policy may
// hold then.

// Dormancy's constants; docs/architecture.md and the package documentation say why.
const (
	// DefaultDormantFloor is the shortest idleness that makes a session dormant, whatever the
	// learnt tool time: builds and test suites of a minute or two are ordinary agent tools, and
	// a session quiet for less is more likely between steps than gone.
	DefaultDormantFloor = 2 * time.Minute
	// dormantQuantile and dormantMargin: a session is dormant past twice the 99th percentile of
	// the workload's tool gaps, so that about one in several thousand gaps of a lognormal tool
	// time with the simulator's spreads (σ 0.7–1) outlasts it: a session mistaken for dormant
	// costs an overcommit when it comes back.
	dormantQuantile = 0.99
	dormantMargin   = 2.0
	// minToolGaps is how many gaps the core must have seen before it judges: a dozen sessions of
	// a few calls. Below 100 gaps the 0.99 quantile is the largest gap seen.
	minToolGaps = 50
	// toolGapWindow is how many recent gaps the core keeps: enough for the 0.99 quantile, recent
	// enough to follow a change of workload.
	toolGapWindow = 1000
)

// toolGaps keeps the last toolGapWindow gaps, in arrival order (a ring once full) and sorted.
type toolGaps struct {
	ring   []time.Duration
	next   int
	sorted []time.Duration
}

// add records one gap.
func (g *toolGaps) add(d time.Duration) {
	if len(g.ring) < toolGapWindow {
		g.ring = append(g.ring, d)
	} else {
		old := g.ring[g.next]
		g.ring[g.next] = d
		g.next = (g.next + 1) % toolGapWindow
		i, _ := slices.BinarySearch(g.sorted, old)
		g.sorted = slices.Delete(g.sorted, i, i+1)
	}
	i, _ := slices.BinarySearch(g.sorted, d)
	g.sorted = slices.Insert(g.sorted, i, d)
}

// quantile is the q quantile by nearest rank (the ⌈q·n⌉-th smallest); false with no gaps.
func (g *toolGaps) quantile(q float64) (time.Duration, bool) {
	n := len(g.sorted)
	if n == 0 {
		return 0, false
	}
	return g.sorted[max(0, min(n-1, int(math.Ceil(q*float64(n)))-1))], true
}

// dormantAfterLocked is how long a session may be idle before it is dormant (see above); the idle
// timeout when dormancy is off or the core has not seen enough gaps.
func (c *Core) dormantAfterLocked() time.Duration {
	idle := c.idleTimeoutLocked()
	if c.mu.o.DormantFloor < 0 || len(c.mu.gaps.sorted) < minToolGaps {
		return idle
	}
	// The gaps are measured on the core's clock already; the floor is the deployment's time.
	q, _ := c.mu.gaps.quantile(dormantQuantile)
	return min(max(time.Duration(float64(q)*dormantMargin), c.inClockLocked(c.mu.o.DormantFloor)), idle)
}

// sleepLocked makes an idle live session dormant: its context and demand leave the working set and
// the admission test. The caller counts it (Counters.Dormant) when it went dormant here.
func (c *Core) sleepLocked(s *session) {
	s.dormant = true
	c.mu.nDormant++
	c.mu.dormantCtx += s.context
	c.mu.workingSet -= s.context
	c.mu.reserved -= s.demandCache
}

// wakeLocked makes a dormant session active again: its context and demand count again, whatever
// the budget (an admitted session is never cut).
func (c *Core) wakeLocked(s *session) {
	s.dormant = false
	c.mu.nDormant--
	c.mu.dormantCtx -= s.context
	c.mu.workingSet += s.context
	c.mu.reserved += s.demandCache
	c.mu.counters.Woken++
}

// noteCallLocked records a call of s beginning at now: the gap since its previous call finished,
// when it had one and none is in flight, is a tool gap; a dormant session is woken.
func (c *Core) noteCallLocked(now time.Time, s *session) {
	if s.finished && s.inFlight == 0 && !now.Before(s.lastDone) {
		c.mu.gaps.add(now.Sub(s.lastDone))
	}
	if s.dormant {
		c.wakeLocked(s)
	}
}

// activeLocked is how many live sessions are not dormant.
func (c *Core) activeLocked() int { return len(c.mu.live) - c.mu.nDormant }
