package sim

import (
	"fmt"
	"time"
)

// instState is where an engine instance is in its life. The instances a run starts with are
// running from the start (the zero value); one asked for later starts, runs, and may be drained.
type instState uint8

const (
	// instRunning: serving, and routed to.
	instRunning instState = iota
	// instStarting: asked for, holding its GPU, loading; routed nothing until it is ready.
	instStarting
	// instDraining: being removed; routed nothing new, finishing what it holds.
	instDraining
	// instGone: removed (or its start cancelled); its GPU is free and its cache lost.
	instGone
)

// Role indices of per-role arrays.
const (
	rolePrefill = iota
	roleDecode
)

// fleet is one role's instance count and the instance time charged so far. Allocated instances
// hold a GPU (starting, running or draining); serving ones compute (running or draining).
type fleet struct {
	allocated int
	serving   int
	since     time.Duration // when the counts were last charged to the timeline
}

// charge adds each role's instance time since the last charge to the current minute. It runs
// before every change of the counts and when a minute closes, so a minute's instance time is the
// exact integral of its counts.
func (s *Sim) charge() {
	m := s.minute()
	for i := range s.fleet {
		f := &s.fleet[i]
		dt := s.now - f.since
		m.instTime[i] += time.Duration(f.allocated) * dt
		m.servingTime[i] += time.Duration(f.serving) * dt
		f.since = s.now
	}
}

// pickPrefill is the prefill instance of a session starting now, or moving off an instance being
// removed: the running instances spread sessions by id, the rule a fixed pool has always used, so a
// run that never scales routes exactly as before and a new instance takes its share of new sessions.
// A session then stays on its instance (cache-aware routing) while that instance runs.
func (s *Sim) pickPrefill(id int64) int {
	return s.prefillUp[int(id%int64(len(s.prefillUp)))].idx
}

// reroute moves a session whose prefill instance is draining or gone to a running one before its
// next call, as a router does once the instance leaves its pool. Its prefix stays behind: the call
// recomputes it on the new instance. It has no call in flight, so its entries are unreferenced.
func (s *Sim) reroute(ss *session) *prefillInst {
	old := s.prefill[ss.prefill]
	if old.state == instDraining {
		// The prefix leaves the draining instance's cache now rather than when LRU reaches it:
		// nothing will ask for it there, and the calls the instance still finishes get the room.
		for _, pe := range []struct {
			c *prefixCache
			e *entry
		}{{&old.cache, ss.gpu}, {&old.host, ss.host}} {
			if pe.e == nil {
				continue
			}
			pe.c.unpin(pe.e)
			pe.c.unlinkLRU(pe.e)
			pe.c.setTokens(pe.e, 0)
		}
		if old.waitingMem {
			defer s.tryPrefill(old)
		}
	}
	ss.gpu, ss.host = nil, nil
	ss.prefill = s.pickPrefill(ss.id)
	return s.prefill[ss.prefill]
}

// Instances implements Control: the role's running instances (serving and routed to) and those
// asked for and still starting. Instances being drained are in neither.
func (s *Sim) Instances(role Role) (running, starting int) {
	for _, st := range s.states(role) {
		switch st {
		case instRunning:
			running++
		case instStarting:
			starting++
		}
	}
	return running, starting
}

// states lists the role's instances' states, in creation order.
func (s *Sim) states(role Role) []instState {
	var out []instState
	switch role {
	case RolePrefill:
		for _, p := range s.prefill {
			out = append(out, p.state)
		}
	case RoleDecode:
		for _, d := range s.decode {
			out = append(out, d.state)
		}
	default:
		panic(fmt.Sprintf("sim: unknown role %q", role))
	}
	return out
}

// SetInstances implements Control: it makes n the role's number of running plus starting
// instances. A rise asks for new instances, which hold a GPU at once and serve after
// Deployment.Scaling.StartupDelay with an empty cache. A fall first cancels starting instances
// (the most recently asked for first), then drains running ones (the most recently started
// first, as a Kubernetes ReplicaSet removes its newest pods first): a draining instance takes no
// new session or call, finishes what it holds, then goes, its cache with it. n is clamped at 1: a
// role never loses its last instance. An unknown role panics (there are two, and a typo in a
// controller should not pass silently).
func (s *Sim) SetInstances(role Role, n int) {
	n = max(n, 1)
	running, starting := s.Instances(role)
	s.charge()
	for ; running+starting < n; starting++ {
		s.startInstance(role)
	}
	for ; running+starting > n && starting > 0; starting-- {
		s.cancelNewest(role)
	}
	for ; running > n; running-- {
		s.drainNewest(role)
	}
}

// startInstance asks for one more instance of the role.
func (s *Sim) startInstance(role Role) {
	r := rolePrefill
	at := s.now + s.dep.Scaling.StartupDelay
	switch role {
	case RolePrefill:
		p := s.newPrefill(len(s.prefill))
		p.state, p.cold, p.asked = instStarting, true, s.now
		s.prefill = append(s.prefill, p)
		s.push(event{at: at, kind: evPrefillReady, a: p.idx})
	case RoleDecode:
		r = roleDecode
		d := s.newDecode(len(s.decode))
		d.state, d.asked = instStarting, s.now
		s.decode = append(s.decode, d)
		s.push(event{at: at, kind: evDecodeReady, a: d.idx})
	}
	s.fleet[r].allocated++
	if !s.scaledOut {
		s.scaledOut, s.firstScaleOut = true, s.now
	}
}

// cancelNewest cancels the most recently asked-for starting instance of the role: its GPU is
// released; its ready event will find it gone.
func (s *Sim) cancelNewest(role Role) {
	r := rolePrefill
	var newest *instState
	var asked time.Duration
	switch role {
	case RolePrefill:
		for _, p := range s.prefill {
			if p.state == instStarting && (newest == nil || p.asked >= asked) {
				newest, asked = &p.state, p.asked
			}
		}
	case RoleDecode:
		r = roleDecode
		for _, d := range s.decode {
			if d.state == instStarting && (newest == nil || d.asked >= asked) {
				newest, asked = &d.state, d.asked
			}
		}
	}
	*newest = instGone
	s.fleet[r].allocated--
}

// drainNewest starts draining the most recently started running instance of the role.
func (s *Sim) drainNewest(role Role) {
	switch role {
	case RolePrefill:
		p := s.prefillUp[len(s.prefillUp)-1]
		s.prefillUp = s.prefillUp[:len(s.prefillUp)-1]
		p.state = instDraining
		s.retirePrefill(p)
	case RoleDecode:
		d := s.decodeUp[len(s.decodeUp)-1]
		s.decodeUp = s.decodeUp[:len(s.decodeUp)-1]
		d.state = instDraining
		// Lent KV is a cache for sessions' next calls, which will go elsewhere: it is returned
		// now, and may let queued reservations through.
		d.reclaim(d.lent.tokens, nil)
		s.tryPrealloc(d)
		s.retireDecode(d)
	}
}

// prefillReady and decodeReady bring a started instance into service, unless its start was
// cancelled.
func (s *Sim) prefillReady(p *prefillInst) {
	if p.state != instStarting {
		return
	}
	s.charge()
	p.state = instRunning
	s.prefillUp = append(s.prefillUp, p)
	s.fleet[rolePrefill].serving++
}

func (s *Sim) decodeReady(d *decodeInst) {
	if d.state != instStarting {
		return
	}
	s.charge()
	d.state = instRunning
	d.last = s.now
	s.decodeUp = append(s.decodeUp, d)
	s.fleet[roleDecode].serving++
}

// retirePrefill removes a draining prefill instance once nothing routed to it is left: no request
// queued for decode memory, waiting or prefilling on it. Its caches go with it; sessions that still
// name it move on their next call (reroute).
func (s *Sim) retirePrefill(p *prefillInst) {
	if p.state != instDraining || p.pending > 0 {
		return
	}
	s.charge()
	p.state = instGone
	p.cache, p.host = prefixCache{}, prefixCache{}
	p.waitingMem = false
	s.fleet[rolePrefill].allocated--
	s.fleet[rolePrefill].serving--
}

// retireDecode removes a draining decode instance once it holds nothing: no reservation (a call
// queued for prefill, prefilling, in transfer or decoding) and nothing waiting to reserve.
func (s *Sim) retireDecode(d *decodeInst) {
	if d.state != instDraining || d.reserved > 0 || d.prealloc.Len() > 0 || len(d.running) > 0 || d.transferring > 0 {
		return
	}
	s.charge()
	d.state = instGone
	s.fleet[roleDecode].allocated--
	s.fleet[roleDecode].serving--
}
