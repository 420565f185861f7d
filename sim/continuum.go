package sim

import (
	"slices"
	"time"
)

// continuumPin pins the session's prefix for the TTL if a reload would be costly, then records the
// gap (the engine learns tool durations only as they complete, so the gap is observed later; using
// it now only shifts the quantile by one sample in a window of a thousand).
func (s *Sim) continuumPin(ss *session, gap time.Duration) {
	cp := s.o.Continuum
	if s.ttlStale <= 0 && len(s.toolGaps) > 0 {
		// Re-estimate the quantile every few dozen samples: sorting the window on every call
		// would dominate the run, and the quantile of a thousand samples barely moves.
		sorted := slices.Clone(s.toolGaps)
		slices.Sort(sorted)
		q := sorted[min(len(sorted)-1, int(cp.TTLQuantile*float64(len(sorted))))]
		s.ttl = min(max(q, cp.TTLMin), cp.TTLMax)
		s.ttlStale = min(32, len(s.toolGaps))
	}
	s.ttlStale--
	ttl := max(s.ttl, cp.TTLMin)
	if len(s.toolGaps) < cp.Window {
		s.toolGaps = append(s.toolGaps, gap)
	} else {
		s.toolGaps[s.toolGapIdx] = gap
		s.toolGapIdx = (s.toolGapIdx + 1) % cp.Window
	}
	e := ss.gpu
	if e == nil || e.tokens == 0 {
		return
	}
	if reload := s.dep.prefillTime(e.tokens, 0, 0, 0); reload < cp.MinReload {
		return
	}
	p := s.prefill[ss.prefill]
	if p.state != instRunning {
		return // the next call goes to another instance
	}
	until := s.now + ttl
	p.cache.pin(e, until)
	s.push(event{at: until, kind: evUnpin, id: ss.id, ver: uint64(until)})
}

func (s *Sim) unpin(ss *session, until time.Duration) {
	e := ss.gpu
	if e == nil || e.pinUntil != until {
		return
	}
	p := s.prefill[ss.prefill]
	if p.state == instGone {
		return // the cache the pin was in is gone
	}
	p.cache.unpin(e)
	if p.waitingMem {
		s.tryPrefill(p)
	}
}
