package sim

import (
	"fmt"
	"time"
)

// checkInvariants walks the whole state and reports the first accounting that does not add up.
// Tests run it at every control tick: a leak of one reserved token shows up here long before it
// distorts a result.
func (s *Sim) checkInvariants() error {
	var ws int64
	live, heldCalls := 0, 0
	for _, ss := range s.sessions {
		if ss.state == stLive {
			live++
			ws += int64(ss.ctx)
		}
		if ss.callHeld {
			heldCalls++
			if ss.state != stLive || ss.inFlight != nil {
				return fmt.Errorf("session %d: a held call on a session not live or with a call in flight", ss.id)
			}
		}
	}
	if live != s.live {
		return fmt.Errorf("live sessions: counted %d, tracked %d", live, s.live)
	}
	if heldCalls != s.heldCalls {
		return fmt.Errorf("held calls: counted %d, tracked %d", heldCalls, s.heldCalls)
	}
	if ws != s.workingSet {
		return fmt.Errorf("working set: summed %d, tracked %d", ws, s.workingSet)
	}
	for _, p := range s.prefill {
		for _, c := range []*prefixCache{&p.cache, &p.host} {
			if c.capacity == 0 {
				continue
			}
			used, lru, pinned := c.shared, 0, 0
			seen := map[*entry]bool{}
			for _, ss := range s.sessions {
				e := ss.gpu
				if c == &p.host {
					e = ss.host
				}
				if e == nil || ss.prefill != p.idx || seen[e] {
					continue
				}
				seen[e] = true
				if e.tokens < 0 {
					return fmt.Errorf("%s: negative entry", p.st.Name)
				}
				used += e.tokens
				if e.inLRU {
					lru += e.tokens
				}
				if e.pinUntil != 0 {
					pinned++
				}
			}
			if used != c.used {
				return fmt.Errorf("%s: cache used summed %d, tracked %d", p.st.Name, used, c.used)
			}
			if c.used > c.capacity {
				return fmt.Errorf("%s: cache used %d over capacity %d", p.st.Name, c.used, c.capacity)
			}
			if lru != c.lruTokens {
				return fmt.Errorf("%s: LRU tokens summed %d, tracked %d", p.st.Name, lru, c.lruTokens)
			}
			if pinned != c.pinned {
				return fmt.Errorf("%s: pinned summed %d, tracked %d", p.st.Name, pinned, c.pinned)
			}
			n := 0
			for e := range c.lru.all {
				n += e.tokens
			}
			if n != c.lruTokens {
				return fmt.Errorf("%s: LRU list holds %d tokens, tracked %d", p.st.Name, n, c.lruTokens)
			}
		}
	}
	if err := s.checkFleet(); err != nil {
		return err
	}
	for _, d := range s.decode {
		reserved := 0
		for _, ss := range s.sessions {
			if r := ss.inFlight; r != nil && r.d == d {
				reserved += r.reserved
			}
		}
		if reserved != d.reserved {
			return fmt.Errorf("%s: reservations summed %d, tracked %d", d.st.Name, reserved, d.reserved)
		}
		lent := 0
		for e := range d.lent.entries.all {
			lent += e.tokens
			if e.s.lent != e {
				return fmt.Errorf("%s: lent entry not owned by its session", d.st.Name)
			}
		}
		if lent != d.lent.tokens {
			return fmt.Errorf("%s: lent summed %d, tracked %d", d.st.Name, lent, d.lent.tokens)
		}
		if limit := int(s.lending.MaxFraction * float64(d.kv)); d.lent.tokens > limit && s.lending.Enabled {
			return fmt.Errorf("%s: lent %d over cap %d", d.st.Name, d.lent.tokens, limit)
		}
		if d.reserved+d.lent.tokens > d.kv {
			return fmt.Errorf("%s: reserved %d + lent %d over KV %d", d.st.Name, d.reserved, d.lent.tokens, d.kv)
		}
	}
	return nil
}

// checkFleet checks the instances: the counts charged to the timeline, the running lists routing
// chooses from, what draining and gone instances may still hold, and the requests routed to each
// prefill instance.
func (s *Sim) checkFleet() error {
	counts := func(states []instState) (alloc, serving, running int) {
		for _, st := range states {
			if st != instGone {
				alloc++
			}
			if st == instRunning || st == instDraining {
				serving++
			}
			if st == instRunning {
				running++
			}
		}
		return alloc, serving, running
	}
	for i, role := range []Role{RolePrefill, RoleDecode} {
		alloc, serving, running := counts(s.states(role))
		f := s.fleet[i]
		if alloc != f.allocated || serving != f.serving {
			return fmt.Errorf("%s fleet: counted %d allocated, %d serving; tracked %d, %d", role, alloc, serving,
				f.allocated, f.serving)
		}
		if running < 1 {
			return fmt.Errorf("%s: no running instance", role)
		}
		up := len(s.prefillUp)
		if role == RoleDecode {
			up = len(s.decodeUp)
		}
		if up != running {
			return fmt.Errorf("%s: %d running, %d in the routing list", role, running, up)
		}
	}
	for _, p := range s.prefillUp {
		if p.state != instRunning {
			return fmt.Errorf("%s: routed to but not running", p.st.Name)
		}
	}
	for _, d := range s.decodeUp {
		if d.state != instRunning {
			return fmt.Errorf("%s: routed to but not running", d.st.Name)
		}
	}
	pending := make([]int, len(s.prefill))
	for _, ss := range s.sessions {
		r := ss.inFlight
		if r == nil {
			continue
		}
		if (r.stage == stagePrealloc || r.stage == stagePrefillQueue) && !r.killed || r.stage == stagePrefill && r.p.busy == r {
			pending[r.p.idx]++
		}
		if le := ss.lent; le != nil && le.d.state != instRunning {
			return fmt.Errorf("session %d: lent KV on %s, which is not running", ss.id, le.d.st.Name)
		}
	}
	for _, p := range s.prefill {
		if pending[p.idx] != p.pending {
			return fmt.Errorf("%s: %d requests routed here, tracked %d", p.st.Name, pending[p.idx], p.pending)
		}
		switch p.state {
		case instStarting, instGone:
			if p.pending != 0 || p.busy != nil || p.queue.Len() != 0 || p.cache.used != 0 {
				return fmt.Errorf("%s (%d): holds work or cache", p.st.Name, p.state)
			}
		}
	}
	for _, d := range s.decode {
		if d.state != instRunning && d.lent.tokens != 0 {
			return fmt.Errorf("%s (%d): lends %d tokens", d.st.Name, d.state, d.lent.tokens)
		}
		if (d.state == instStarting || d.state == instGone) &&
			(d.reserved != 0 || d.prealloc.Len() != 0 || len(d.running) != 0 || d.transferring != 0) {
			return fmt.Errorf("%s (%d): holds work", d.st.Name, d.state)
		}
	}
	return nil
}

// invariantController checks invariants every simulated 10 s and keeps the first failure.
func invariantController(failed *error) *Controller {
	return &Controller{Every: 10 * time.Second, Tick: func(now time.Duration, c Control) {
		if *failed != nil {
			return
		}
		if err := c.(*Sim).checkInvariants(); err != nil {
			*failed = fmt.Errorf("at %v: %w", now, err)
		}
	}}
}
