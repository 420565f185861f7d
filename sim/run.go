package sim

import (
	"math"
	"time"
)

type evKind uint8

const (
	evArrival evKind = iota
	evCall
	evPrefillDone
	evTransferDone
	evDecodeDone
	evKill
	evUnpin
	evMinute
	evControl
	evPrefillReady
	evDecodeReady
)

// event is one thing that happens at a simulated instant. Ties break by insertion order, which
// keeps runs deterministic.
type event struct {
	at   time.Duration
	seq  uint64
	kind evKind
	a    int
	id   int64
	ver  uint64
	r    *request
}

// eventHeap is a binary min-heap by (at, seq), written out rather than through container/heap to
// avoid an interface call per comparison on the simulator's hottest path.
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	q := *h
	i := len(q) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = event{}
	q = q[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

func (s *Sim) push(e event) {
	e.seq = s.seq
	s.seq++
	s.evq.push(e)
}

// Less orders requests in an engine queue by (key, seq); with SetIndex and Index it makes a
// request an indexheap element, so a killed session's request leaves its queue in O(log n).
func (r *request) Less(o *request) bool {
	if r.key != o.key {
		return r.key < o.key
	}
	return r.seq < o.seq
}

// SetIndex implements indexheap.Elem.
func (r *request) SetIndex(i int) { r.heapIdx = i }

// Index implements indexheap.Elem.
func (r *request) Index() int { return r.heapIdx }

// RunUntil processes every event up to and including t, then sets the clock to t.
func (s *Sim) RunUntil(t time.Duration) {
	for len(s.evq) > 0 && s.evq[0].at <= t {
		s.step()
	}
	if t > s.now {
		s.now = t
	}
}

// NextEvent reports when the next event is due.
func (s *Sim) NextEvent() (time.Duration, bool) {
	if len(s.evq) == 0 {
		return 0, false
	}
	return s.evq[0].at, true
}

func (s *Sim) step() {
	e := s.evq.pop()
	s.now = e.at
	switch e.kind {
	case evArrival:
		i := e.a
		st := s.o.Streams[i]
		s.scheduleArrival(i, s.now)
		idx := s.streamSeq[i]
		s.streamSeq[i]++
		if st.keeps(s.now, s.thinRNG) {
			s.arrive(st.Workload.Session(s.sessionRNG(i, idx)), st.Class, i)
		}
	case evCall:
		if ss, ok := s.byID[e.id]; ok && ss.state == stLive {
			s.sendCall(ss)
		}
	case evPrefillDone:
		s.prefillDone(e.r)
	case evTransferDone:
		s.transferDone(e.r)
	case evDecodeDone:
		if d := s.decode[e.a]; d.ver == e.ver {
			s.decodeDone(d)
		}
	case evKill:
		for _, ss := range s.sessions {
			if ss.stream == e.a && (ss.state == stLive || ss.state == stHeld) {
				s.kill(ss)
			}
		}
	case evUnpin:
		if ss, ok := s.byID[e.id]; ok {
			s.unpin(ss, time.Duration(e.ver))
		}
	case evMinute:
		s.closeMinute()
		s.push(event{at: s.now + time.Minute, kind: evMinute})
	case evControl:
		s.o.Controller.Tick(s.now, s)
		s.push(event{at: s.now + s.o.Controller.Every, kind: evControl})
	case evPrefillReady:
		s.prefillReady(s.prefill[e.a])
	case evDecodeReady:
		s.decodeReady(s.decode[e.a])
	}
	if s.o.Gate != nil && (s.held > 0 || s.heldCalls > 0) && e.kind != evMinute {
		s.pollGate()
	}
}

func (s *Sim) pollGate() {
	for _, rel := range s.o.Gate.Poll(s.now) {
		ss, ok := s.byID[rel.ID]
		if ok && ss.state == stLive && ss.callHeld {
			// A held call of a live session goes on (resumed, or the hold's bound passed).
			ss.callHeld = false
			s.heldCalls--
			s.dispatch(ss)
			continue
		}
		if !ok || ss.state != stHeld {
			continue
		}
		s.held--
		ss.prio = rel.Priority
		if rel.Action == Admit {
			s.start(ss)
		} else {
			s.refuse(ss, rel.Action)
		}
	}
}

// Run simulates the whole scenario and returns its result.
func (s *Sim) Run() *Result {
	stop := s.o.Duration
	lastReport := time.Duration(-1)
	report := func() {
		if s.o.Progress != nil && s.now-lastReport >= time.Minute {
			lastReport = s.now
			s.o.Progress(math.Min(1, float64(s.now)/float64(s.o.Duration)))
		}
	}
	for len(s.evq) > 0 && s.evq[0].at <= stop {
		s.step()
		report()
	}
	s.now = stop
	res := s.result()
	if !s.o.NoDrain {
		// Drain: no new arrivals; run until every measured session has finished or passed its
		// deadline, so sessions that arrived late in the window are judged like the others.
		deadline := stop
		for _, ss := range s.sessions {
			if ss.measured && (ss.state == stLive || ss.state == stHeld) {
				deadline = max(deadline, s.deadline(ss))
			}
		}
		s.end = stop
		for len(s.evq) > 0 && s.evq[0].at <= deadline {
			e := s.evq[0]
			if e.kind == evArrival {
				s.evq.pop()
				continue
			}
			s.step()
			if s.now > stop && e.kind == evMinute {
				continue
			}
		}
		s.now = max(s.now, deadline)
	}
	s.fillGoodput(res)
	if s.o.OnResult != nil {
		s.o.OnResult(res)
	}
	if s.o.Progress != nil {
		s.o.Progress(1)
	}
	return res
}
