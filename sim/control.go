package sim

import "time"

// Observe implements Control.
func (s *Sim) Observe() Observation {
	return Observation{Now: s.now, LiveSessions: s.live, HeldSessions: s.held, HeldCalls: s.heldCalls, WorkingSetTokens: s.workingSet,
		CacheCapacity: s.cacheCapacity(), CallsCompleted: s.calls, Lending: s.lending}
}

// Stats implements Control: a copy of the counters and gauges now of every instance that serves
// metrics: running and draining ones, not those still starting or gone.
func (s *Sim) Stats() []InstanceStats {
	out := make([]InstanceStats, 0, len(s.prefill)+len(s.decode))
	for _, p := range s.prefill {
		if p.state == instStarting || p.state == instGone {
			continue
		}
		st := p.st
		st.Running = 0
		if p.busy != nil {
			st.Running = 1
		}
		st.Queued = p.queue.Len()
		st.BootstrapQueue = 0
		for _, d := range s.decode {
			for _, r := range d.prealloc.Items() {
				if r.p == p {
					st.BootstrapQueue++
				}
			}
		}
		st.MaxTotalTokens = p.cache.capacity
		st.AvailableTokens = p.cache.free()
		st.EvictableTokens = p.cache.lruTokens
		st.UsedTokens = p.cache.used - p.cache.lruTokens
		st.HostTotalTokens = p.host.capacity
		st.HostUsedTokens = p.host.used
		st.TTFT, st.ITL, st.E2E = st.TTFT.clone(), st.ITL.clone(), st.E2E.clone()
		out = append(out, st)
	}
	for _, d := range s.decode {
		if d.state == instStarting || d.state == instGone {
			continue
		}
		s.advance(d)
		st := d.st
		st.Running = len(d.running)
		st.PreallocQueue = d.prealloc.Len()
		st.TransferQueue = d.transferring
		st.MaxTotalTokens = d.kv
		st.LentTokens = d.lent.tokens
		st.EvictableTokens = d.lent.tokens
		st.UsedTokens = d.reserved
		st.AvailableTokens = d.kv - d.reserved - d.lent.tokens
		st.DecodeBatchTokens = d.batchTokens
		st.TTFT, st.ITL, st.E2E = st.TTFT.clone(), st.ITL.clone(), st.E2E.clone()
		out = append(out, st)
	}
	return out
}

// Now is the simulated time.
func (s *Sim) Now() time.Duration { return s.now }
