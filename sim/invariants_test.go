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
