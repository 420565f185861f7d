package sim

// lend keeps the finished call's KV on decode, within the lending cap.
func (s *Sim) lend(d *decodeInst, ss *session, tokens int) {
	if old := ss.lent; old != nil { // a session keeps at most one lent prefix: its latest
		old.d.lent.remove(old)
		ss.lent = nil
	}
	limit := int(s.lending.MaxFraction * float64(d.kv))
	if tokens > limit {
		return
	}
	if over := d.lent.tokens + tokens - limit; over > 0 {
		d.reclaim(over, ss)
	}
	if d.kv-d.reserved-d.lent.tokens < tokens {
		return
	}
	e := &lentEntry{s: ss, d: d, tokens: tokens}
	d.lent.push(e)
	ss.lent = e
}

// reclaim frees lent KV, least recently used first, sparing the session about to use its own.
func (d *decodeInst) reclaim(need int, keep *session) {
	for e := range d.lent.entries.all {
		if need <= 0 {
			break
		}
		if e.s != keep {
			need -= e.tokens
			d.lent.remove(e)
			e.s.lent = nil
		}
	}
}

// SetLending implements Control: lending can be switched at run time; switching it off returns
// every lent token to decode.
func (s *Sim) SetLending(enabled bool, maxFraction float64) {
	s.lending = LendingState{Enabled: enabled, MaxFraction: min(max(maxFraction, 0), 1)}
	for _, d := range s.decode {
		limit := int(s.lending.MaxFraction * float64(d.kv))
		if !enabled {
			limit = 0
		}
		if over := d.lent.tokens - limit; over > 0 {
			d.reclaim(over, nil)
		}
		s.tryPrealloc(d)
	}
}

// Lending reports the current lending switch.
func (s *Sim) Lending() LendingState { return s.lending }
