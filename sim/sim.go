package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/basin-dev/basin/internal/indexheap"
)

// session is a live (or finished) agent session.
type session struct {
	id       int64
	class    string
	stream   int
	spec     SessionSpec
	arrival  time.Duration
	started  time.Duration // first call's prefill start; -1 before
	end      time.Duration
	next     int // index of the next call to send
	ctx      int // context tokens now (what the working set counts)
	unloaded time.Duration
	prio     time.Duration

	state     sessionState
	measured  bool
	steps     float64
	goodSteps float64

	gpu      *entry
	host     *entry
	lent     *lentEntry
	prefill  int
	inFlight *request
	// callHeld: the gate holds the session's next call (Gate.CallStart said no).
	callHeld bool

	extKey string          // external sessions (sim serve): the client's session key
	notify func(CallEvent) // external sessions: the current call's listener
}

type sessionState uint8

const (
	stHeld sessionState = iota
	stLive
	stDone
	stRejected
	stShed
	stKilled
)

type stage uint8

const (
	stagePrealloc stage = iota
	stagePrefillQueue
	stagePrefill
	stageTransfer
	stageDecode
)

// request is one call in flight.
type request struct {
	s        *session
	spec     CallSpec
	arrive   time.Duration
	key      time.Duration // queue order
	seq      uint64
	d        *decodeInst
	p        *prefillInst
	stage    stage
	heapIdx  int
	reserved int
	lentHave int // tokens of this session's KV that decode kept and may write back
	steps    float64
	killed   bool
	prefillT time.Duration
	cached   int
}

type prefillInst struct {
	idx   int
	state instState
	asked time.Duration // when a scaled-out instance was asked for
	// cold: the instance was added during the run and starts with nothing cached, not even the
	// shared prefix (see tryPrefill).
	cold bool
	// pending counts the requests routed here that have not finished their prefill (in decode's
	// pre-allocation queue, in the queue, prefilling): a draining instance goes when it is zero.
	pending    int
	cache      prefixCache
	host       prefixCache
	queue      indexheap.Heap[*request]
	busy       *request
	busySince  time.Duration
	waitingMem bool
	st         InstanceStats
}

type decodeInst struct {
	idx          int
	state        instState
	asked        time.Duration // when a scaled-out instance was asked for
	kv           int
	reserved     int
	lent         lentList
	prealloc     indexheap.Heap[*request]
	transferring int
	running      []*request
	batchTokens  int64
	step         time.Duration
	last         time.Duration
	ver          uint64
	st           InstanceStats
}

// Sim is one simulation run. It is not safe for concurrent use.
type Sim struct {
	o   Options
	dep Deployment
	now time.Duration
	evq eventHeap
	seq uint64

	// prefill and decode are every instance the run has had, by index (an instance keeps its
	// index for life: sessions and events name it); prefillUp and decodeUp the running ones, in
	// the order they came up, which routing chooses among.
	prefill   []*prefillInst
	decode    []*decodeInst
	prefillUp []*prefillInst
	decodeUp  []*decodeInst
	fleet     [2]fleet // instance counts by role (rolePrefill, roleDecode)
	// scaledOut says an instance was asked for (SetInstances), first at firstScaleOut.
	scaledOut     bool
	firstScaleOut time.Duration
	lending       LendingState

	sessions   []*session
	byID       map[int64]*session
	nextID     int64
	live       int
	liveBase   int // live sessions of stream 0, the base traffic
	held       int
	heldCalls  int // live sessions whose next call the gate holds
	workingSet int64
	calls      int64

	streamRNG  []*rand.Rand
	streamSeq  []uint64
	thinRNG    *rand.Rand
	closedSeq  uint64
	toolGaps   []time.Duration // Continuum: recent tool durations
	toolGapIdx int
	ttl        time.Duration // Continuum: current time-to-live
	ttlStale   int           // Continuum: samples until the TTL is re-estimated

	ext map[string]*session // external sessions by client key

	minutes    []Minute
	minuteBase int           // index of minutes[0] (non-zero once Forget trims the timeline)
	end        time.Duration // when arrivals stop
	firstW     []float64     // first-call waits of measured sessions
}

// New prepares a run.
func New(o Options) (*Sim, error) {
	if o.SLO == (SLO{}) {
		o.SLO = DefaultSLO()
	}
	if o.Policy == "" {
		o.Policy = PolicyNone
	}
	if o.Policy == PolicyContinuum && o.Continuum == (ContinuumParams{}) {
		o.Continuum = DefaultContinuum()
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Sim{o: o, dep: o.Deployment, lending: o.Deployment.Lending, byID: map[int64]*session{}, end: o.Duration}
	if o.Policy == PolicyHiCache && s.dep.Prefill.HostCacheTokens == 0 {
		// SGLang's --hicache-ratio default of 2: the host pool is twice the GPU pool.
		s.dep.Prefill.HostCacheTokens = 2 * s.dep.Prefill.CacheTokens
	}
	if s.dep.Scaling.StartupDelay == 0 {
		s.dep.Scaling.StartupDelay = DefaultStartupDelay
	}
	for i := range s.dep.Prefill.Instances {
		s.prefill = append(s.prefill, s.newPrefill(i))
	}
	for i := range s.dep.Decode.Instances {
		s.decode = append(s.decode, s.newDecode(i))
	}
	s.prefillUp = slices.Clone(s.prefill)
	s.decodeUp = slices.Clone(s.decode)
	s.fleet[rolePrefill] = fleet{allocated: len(s.prefill), serving: len(s.prefill)}
	s.fleet[roleDecode] = fleet{allocated: len(s.decode), serving: len(s.decode)}
	s.thinRNG = thinRNG(o.Seed)
	for i := range o.Streams {
		s.streamRNG = append(s.streamRNG, streamRNG(o.Seed, i))
		s.streamSeq = append(s.streamSeq, 0)
		s.scheduleArrival(i, o.Streams[i].From)
		if k := o.Streams[i].KillAt; k > 0 {
			s.push(event{at: k, kind: evKill, a: i})
		}
	}
	s.minutes = append(s.minutes, Minute{})
	s.push(event{at: time.Minute, kind: evMinute})
	if o.Controller != nil {
		s.push(event{at: o.Controller.Every, kind: evControl})
	}
	for range o.ClosedLoop {
		s.closedArrival()
	}
	return s, nil
}

// newPrefill and newDecode make instance i of the deployment's pools, empty and running.
func (s *Sim) newPrefill(i int) *prefillInst {
	p := &prefillInst{idx: i}
	p.cache.capacity = s.dep.Prefill.CacheTokens
	p.host.capacity = s.dep.Prefill.HostCacheTokens
	p.st = InstanceStats{Role: RolePrefill, Index: i, Name: fmt.Sprintf("prefill-%d", i),
		TTFT: newHistogram(ttftBuckets), ITL: newHistogram(itlBuckets), E2E: newHistogram(e2eBuckets)}
	return p
}

func (s *Sim) newDecode(i int) *decodeInst {
	d := &decodeInst{idx: i, kv: s.dep.Decode.KVTokens}
	d.st = InstanceStats{Role: RoleDecode, Index: i, Name: fmt.Sprintf("decode-%d", i),
		TTFT: newHistogram(ttftBuckets), ITL: newHistogram(itlBuckets), E2E: newHistogram(e2eBuckets)}
	return d
}

// sessionRNG is the random stream of one session (see SessionRNG).
func (s *Sim) sessionRNG(stream int, idx uint64) *rand.Rand {
	return SessionRNG(s.o.Seed, stream, idx)
}

// scheduleArrival puts stream i's next arrival after from on the event queue (see arrivals.go).
func (s *Sim) scheduleArrival(i int, from time.Duration) {
	if at, ok := s.o.Streams[i].nextArrival(s.streamRNG[i], from, s.end); ok {
		s.push(event{at: at, kind: evArrival, a: i})
	}
}

func (s *Sim) closedArrival() {
	rng := s.sessionRNG(1<<15, s.closedSeq)
	s.closedSeq++
	s.arrive(s.o.ClosedWorkload.Session(rng), "closed", -1)
}

// arrive creates a session and asks the gate about it.
func (s *Sim) arrive(spec SessionSpec, class string, stream int) *session {
	ss := &session{id: s.nextID, class: class, stream: stream, spec: spec, arrival: s.now, started: -1}
	s.nextID++
	ss.prefill = s.pickPrefill(ss.id)
	ss.unloaded = s.dep.UnloadedTime(spec)
	ss.measured = s.now >= s.o.MeasureFrom && s.now < s.o.MeasureTo && s.o.ClosedLoop == 0 && !s.o.Forget
	s.sessions = append(s.sessions, ss)
	s.byID[ss.id] = ss
	s.minute().Arrivals++
	v := Verdict{Action: Admit, Priority: s.now}
	if s.o.Gate != nil {
		v = s.o.Gate.Arrive(s.now, SessionInfo{ID: ss.id, Arrival: s.now, FirstPrompt: spec.Calls[0].Prompt,
			TaskChars: spec.TaskChars, Class: class, TruePeak: spec.PeakContext(), SignalNoise: spec.SignalNoise()})
	}
	ss.prio = v.Priority
	switch v.Action {
	case Admit:
		s.start(ss)
	case Hold:
		ss.state = stHeld
		s.held++
	default:
		s.refuse(ss, v.Action)
	}
	return ss
}

func (s *Sim) refuse(ss *session, a Action) {
	if a == Shed {
		ss.state = stShed
	} else {
		ss.state = stRejected
	}
	ss.end = s.now
	delete(s.byID, ss.id)
	if s.o.ClosedLoop > 0 {
		s.closedArrival()
	}
}

func (s *Sim) start(ss *session) {
	ss.state = stLive
	s.live++
	if ss.stream == 0 {
		s.liveBase++
	}
	s.sendCall(ss)
}

// sendCall makes the session's next call arrive at the engines.
func (s *Sim) sendCall(ss *session) {
	c := ss.spec.Calls[ss.next]
	s.workingSet += int64(c.Prompt - ss.ctx)
	ss.ctx = c.Prompt
	if s.o.Gate != nil && ss.next > 0 && !s.o.Gate.CallStart(s.now, ss.id, c.Prompt) {
		ss.callHeld = true
		s.heldCalls++
		return
	}
	s.dispatch(ss)
}

// dispatch sends the session's next call to the engines.
func (s *Sim) dispatch(ss *session) {
	c := ss.spec.Calls[ss.next]
	r := &request{s: ss, spec: c, arrive: s.now, seq: s.seq}
	s.seq++
	switch {
	case s.o.PriorityQueues:
		r.key = ss.prio
	case s.o.Policy == PolicyContinuum:
		r.key = ss.arrival // program-level FCFS
	default:
		r.key = s.now
	}
	ss.inFlight = r
	r.p = s.prefill[ss.prefill]
	if r.p.state != instRunning {
		r.p = s.reroute(ss)
	}
	r.p.pending++
	r.d = s.routeDecode(ss, c)
	r.stage = stagePrealloc
	r.d.prealloc.Push(r)
	s.tryPrealloc(r.d)
}

// routeDecode sends a call to the decode instance holding the session's lent KV, else to the
// running one with the most free memory (reclaimable lent KV counts as free). Lent KV is only ever
// on a running instance: draining returns it.
func (s *Sim) routeDecode(ss *session, c CallSpec) *decodeInst {
	if ss.lent != nil {
		return ss.lent.d
	}
	best := s.decodeUp[0]
	for _, d := range s.decodeUp[1:] {
		if d.kv-d.reserved > best.kv-best.reserved {
			best = d
		}
	}
	return best
}

// tryPrealloc reserves decode KV for queued requests in order (SGLang pre-allocates decode memory
// before prefill may start); the head blocks those behind it.
func (s *Sim) tryPrealloc(d *decodeInst) {
	for d.prealloc.Len() > 0 {
		r := d.prealloc.Peek()
		need := r.spec.Prompt + r.spec.Output
		own := 0
		if le := r.s.lent; le != nil && le.d == d {
			own = le.tokens
		}
		newNeed := max(0, need-own)
		if free := d.kv - d.reserved - d.lent.tokens; free < newNeed {
			d.reclaim(newNeed-free, r.s)
			if d.kv-d.reserved-d.lent.tokens < newNeed && (d.reserved > 0 || d.lent.tokens > own) {
				return
			}
		}
		d.prealloc.Pop()
		if own > 0 {
			r.lentHave = own
			d.lent.remove(r.s.lent)
			r.s.lent = nil
		}
		r.reserved = newNeed + own
		d.reserved += r.reserved
		r.stage = stagePrefillQueue
		r.p.queue.Push(r)
		s.tryPrefill(r.p)
	}
}

// tryPrefill starts the next prefill on an idle instance.
func (s *Sim) tryPrefill(p *prefillInst) {
	if p.busy != nil || p.queue.Len() == 0 {
		return
	}
	r := p.queue.Peek()
	ss, c := r.s, r.spec
	shared := min(ss.spec.Shared, c.Prompt)
	// A deployment's own instances count the shared prefix as resident from the first request (it
	// is in every prompt); one added during the run starts empty, so what it misses of the shared
	// prefix, and everything after it, is computed.
	sharedHit := shared
	if p.cold {
		sharedHit = min(shared, p.cache.shared)
	}
	p.cache.growShared(shared)
	if p.host.capacity > 0 {
		p.host.growShared(shared)
	}
	// What of the prompt the caches still hold.
	valid := max(0, c.Reused-shared) // session tokens that repeat earlier context
	if ss.gpu == nil {
		ss.gpu = &entry{s: ss}
	}
	e := ss.gpu
	if e.tokens > valid { // the conversation diverged (compaction, edits): the tail is garbage
		p.cache.setTokens(e, valid)
	}
	device := min(c.Prompt, shared+e.tokens)
	if sharedHit < shared {
		device = sharedHit
	}
	lentHit := 0
	if r.lentHave > 0 {
		lentHit = max(0, min(r.lentHave, c.Reused)-device)
	}
	hostHit := 0
	if p.host.capacity > 0 && ss.host != nil && sharedHit == shared {
		if ss.host.tokens > valid {
			p.host.setTokens(ss.host, valid)
		}
		hostHit = max(0, min(shared+ss.host.tokens, c.Reused)-device-lentHit)
	}
	u := c.Prompt - device - lentHit - hostHit
	// Room for the whole prompt on the GPU: the new part of this session's prefix.
	need := max(0, c.Prompt-shared-e.tokens)
	reachable := p.cache.free() + p.cache.lruTokens
	if e.inLRU {
		reachable -= e.tokens
	}
	if reachable < need && p.cache.pinned > 0 {
		// Pinned prefixes hold the memory (Continuum): wait for a pin to expire or be used.
		p.waitingMem = true
		return
	}
	p.waitingMem = false
	p.queue.Pop()
	if e.pinUntil != 0 {
		p.cache.unpin(e)
	}
	p.cache.acquire(e)
	if !p.cache.makeRoom(need) {
		need = p.cache.free() // a prompt larger than the cache: keep what fits
	}
	p.cache.setTokens(e, e.tokens+need)
	if p.host.capacity > 0 {
		if ss.host == nil {
			ss.host = &entry{s: ss}
			p.host.pushLRU(ss.host)
		}
		h := ss.host
		p.host.unlinkLRU(h)
		hneed := max(0, c.Prompt-shared-h.tokens)
		p.host.makeRoom(hneed)
		p.host.setTokens(h, h.tokens+min(hneed, p.host.free()))
		h.lastUse = s.now
		p.host.pushLRU(h)
	}
	r.stage = stagePrefill
	p.busy, p.busySince = r, s.now
	if ss.started < 0 {
		ss.started = s.now
		if ss.measured {
			s.firstW = append(s.firstW, (s.now - ss.arrival).Seconds())
		}
	}
	hit := device + lentHit + hostHit
	r.cached = hit
	st := &p.st
	st.PromptTokens += float64(c.Prompt)
	st.CachedDevice += float64(device)
	st.CachedHost += float64(hostHit)
	st.CachedLent += float64(lentHit)
	st.ComputedTokens += float64(u)
	m := s.minute()
	m.PromptTokens += float64(c.Prompt)
	m.HitTokens += float64(hit)
	r.prefillT = s.dep.prefillTime(u, hit, hostHit, lentHit)
	s.push(event{at: s.now + r.prefillT, kind: evPrefillDone, r: r})
}

func (s *Sim) prefillDone(r *request) {
	p := r.p
	s.addBusy(p, s.now)
	p.busy = nil
	p.pending--
	p.cache.release(r.s.gpu, s.now)
	p.st.Requests++
	if r.killed {
		s.releaseDecode(r)
	} else {
		r.stage = stageTransfer
		r.d.transferring++
		s.push(event{at: s.now + s.dep.transferTime(r.spec.Prompt), kind: evTransferDone, r: r})
	}
	s.tryPrefill(p)
	s.retirePrefill(p)
}

// addBusy charges prefill busy time to the minutes it spans.
func (s *Sim) addBusy(p *prefillInst, now time.Duration) {
	from := p.busySince
	for from < now {
		mi := int(from / time.Minute)
		edge := time.Duration(mi+1) * time.Minute
		to := min(now, edge)
		if i := mi - s.minuteBase; i >= 0 && i < len(s.minutes) {
			s.minutes[i].busy += to - from
		}
		from = to
	}
	p.busySince = now
}

func (s *Sim) transferDone(r *request) {
	d := r.d
	d.transferring--
	if r.killed {
		s.releaseDecode(r)
		return
	}
	ttft := (s.now - r.arrive).Seconds()
	d.st.TTFT.observe(ttft, 1)
	r.p.st.TTFT.observe((r.p.busySince-r.arrive).Seconds()+r.prefillT.Seconds(), 1)
	m := s.minute()
	m.ttftSamples = append(m.ttftSamples, ttft)
	s.notify(r, FirstToken)
	s.advance(d)
	r.stage = stageDecode
	r.steps = float64(r.spec.Output)
	d.running = append(d.running, r)
	s.reschedule(d)
}

// advance brings a decode instance's batch up to now: every running request decoded as many
// steps as fit since the last change, at the step time of that batch.
func (s *Sim) advance(d *decodeInst) {
	el := s.now - d.last
	d.last = s.now
	if len(d.running) == 0 || el <= 0 {
		return
	}
	steps := float64(el) / float64(d.step)
	good := d.step <= time.Duration(s.o.SLO.TPOTMs*float64(time.Millisecond))
	stepS := d.step.Seconds()
	var gen float64
	for _, r := range d.running {
		take := min(steps, r.steps)
		r.steps -= take
		r.s.steps += take
		if good {
			r.s.goodSteps += take
		}
		gen += take
	}
	d.st.GenerationTokens += gen
	d.st.ITL.observe(stepS, gen)
	if s.ext != nil {
		for _, r := range d.running {
			s.notify(r, Progress)
		}
	}
}

// reschedule recomputes the step time of the batch and the next completion.
func (s *Sim) reschedule(d *decodeInst) {
	d.ver++
	if len(d.running) == 0 {
		d.batchTokens = 0
		return
	}
	least := math.Inf(1)
	var tokens float64
	for _, r := range d.running {
		least = min(least, r.steps)
		tokens += float64(r.spec.Prompt+r.spec.Output) - r.steps
	}
	d.batchTokens = int64(tokens)
	d.step = max(time.Microsecond, s.dep.stepTime(len(d.running), d.batchTokens))
	at := s.now + time.Duration(math.Ceil(least*float64(d.step)))
	s.push(event{at: max(at, s.now+1), kind: evDecodeDone, a: d.idx, ver: d.ver})
}

func (s *Sim) decodeDone(d *decodeInst) {
	s.advance(d)
	kept := d.running[:0]
	var done []*request
	for _, r := range d.running {
		if r.steps <= 1e-6 {
			done = append(done, r)
		} else {
			kept = append(kept, r)
		}
	}
	clear(d.running[len(kept):])
	d.running = kept
	for _, r := range done {
		s.finishCall(r)
	}
	s.reschedule(d)
	s.tryPrealloc(d)
	s.retireDecode(d)
}

func (s *Sim) releaseDecode(r *request) {
	r.d.reserved -= r.reserved
	r.reserved = 0
	s.tryPrealloc(r.d)
	s.retireDecode(r.d)
}

// finishCall ends a call: decode frees (or lends) its KV and the session runs its tool.
func (s *Sim) finishCall(r *request) {
	d, ss, c := r.d, r.s, r.spec
	d.reserved -= r.reserved
	r.reserved = 0
	d.st.Requests++
	d.st.E2E.observe((s.now - r.arrive).Seconds(), 1)
	s.calls++
	s.minute().CallsCompleted++
	ss.inFlight = nil
	ctx := c.Prompt + c.Output
	s.workingSet += int64(ctx - ss.ctx)
	ss.ctx = ctx
	ss.next++
	s.notify(r, Done)
	if s.o.Gate != nil {
		s.o.Gate.CallDone(s.now, ss.id, ctx)
	}
	if ss.extKey != "" {
		// External sessions end when their client says so (EndSession), not after a known count.
		if s.lending.Enabled && d.state == instRunning {
			s.lend(d, ss, ctx)
		}
		return
	}
	if ss.next >= len(ss.spec.Calls) {
		s.endSession(ss, stDone)
		return
	}
	if s.lending.Enabled && d.state == instRunning {
		s.lend(d, ss, ctx)
	}
	gap := ss.spec.Calls[ss.next].GapBefore
	if s.o.Policy == PolicyContinuum {
		s.continuumPin(ss, gap)
	}
	s.push(event{at: s.now + gap, kind: evCall, id: ss.id})
}

func (s *Sim) endSession(ss *session, st sessionState) {
	ss.state = st
	ss.end = s.now
	if ss.callHeld {
		ss.callHeld = false
		s.heldCalls--
	}
	s.live--
	if ss.stream == 0 {
		s.liveBase--
	}
	s.workingSet -= int64(ss.ctx)
	if e := ss.lent; e != nil {
		e.d.lent.remove(e)
		ss.lent = nil
	}
	if e := ss.gpu; e != nil && e.pinUntil != 0 && s.prefill[ss.prefill].state != instGone {
		p := s.prefill[ss.prefill]
		p.cache.unpin(e)
		if p.waitingMem {
			defer s.tryPrefill(p)
		}
	}
	delete(s.byID, ss.id)
	if st == stDone {
		m := s.minute()
		m.Completions++
		if s.good(ss) {
			m.GoodCompletions++
		}
	}
	if s.o.Gate != nil {
		s.o.Gate.SessionDone(s.now, ss.id)
	}
	if s.o.ClosedLoop > 0 {
		s.closedArrival()
	}
}

// kill aborts a session wherever it is (the intervention experiment's kill at minute 25).
func (s *Sim) kill(ss *session) {
	switch ss.state {
	case stHeld:
		s.held--
		ss.state = stKilled
		ss.end = s.now
		delete(s.byID, ss.id)
		return
	case stLive:
	default:
		return
	}
	if r := ss.inFlight; r != nil {
		r.killed = true
		defer s.notify(r, Aborted)
		switch r.stage {
		case stagePrealloc:
			r.d.prealloc.Remove(r)
			r.p.pending--
			s.tryPrealloc(r.d)
			s.retireDecode(r.d)
			s.retirePrefill(r.p)
		case stagePrefillQueue:
			r.p.queue.Remove(r)
			r.p.pending--
			s.releaseDecode(r)
			if r.p.waitingMem {
				s.tryPrefill(r.p)
			}
			s.retirePrefill(r.p)
		case stageDecode:
			d := r.d
			s.advance(d)
			d.running = slices.DeleteFunc(d.running, func(x *request) bool { return x == r })
			s.releaseDecode(r)
			s.reschedule(d)
		}
		// stagePrefill and stageTransfer finish and then release (r.killed).
	}
	s.endSession(ss, stKilled)
}

// good is the paper's goodput test for a finished session.
func (s *Sim) good(ss *session) bool {
	if ss.state != stDone {
		return false
	}
	late, slow := s.missed(ss)
	return !late && !slow
}

// deadline is when an unfinished session becomes late: Slowdown × its unloaded time after its
// arrival (the drain runs to the last measured one; countMissed judges the unfinished by it).
func (s *Sim) deadline(ss *session) time.Duration {
	return ss.arrival + time.Duration(s.o.SLO.Slowdown*float64(ss.unloaded))
}

// missed reports which clauses of the SLO a finished session missed: late when it took longer than
// Slowdown × its unloaded time, slow when too few of its decode steps were within TPOTMs.
func (s *Sim) missed(ss *session) (late, slow bool) {
	late = float64(ss.end-ss.arrival) > s.o.SLO.Slowdown*float64(ss.unloaded)
	slow = ss.steps > 0 && ss.goodSteps/ss.steps < s.o.SLO.TPOTFraction
	return late, slow
}

func (s *Sim) minute() *Minute { return &s.minutes[len(s.minutes)-1] }

func (s *Sim) closeMinute() {
	s.charge()
	m := s.minute()
	m.Minute = s.minuteBase + len(s.minutes) - 1
	m.LiveSessions = s.live
	m.LiveBase = s.liveBase
	m.QueuedSessions = s.held
	m.HeldCalls = s.heldCalls
	m.WorkingSetTokens = s.workingSet
	m.CacheCapacity = s.cacheCapacity()
	if m.PromptTokens > 0 {
		m.HitRate = m.HitTokens / m.PromptTokens
	} else {
		m.HitRate = math.NaN()
	}
	m.TTFTP50 = median(slices.Clone(m.ttftSamples))
	for _, p := range s.prefill {
		if p.busy != nil {
			s.addBusy(p, s.now)
		}
	}
	// Busy time over the time prefill instances could compute (running or draining): exactly
	// busy ÷ 60 s ÷ instances while the pool does not change.
	m.PrefillBusy = m.busy.Seconds() / 60 / (float64(m.servingTime[rolePrefill]) / float64(time.Minute))
	m.PrefillInstances = s.fleet[rolePrefill].allocated
	m.DecodeInstances = s.fleet[roleDecode].allocated
	m.PrefillInstanceMinutes = float64(m.instTime[rolePrefill]) / float64(time.Minute)
	m.DecodeInstanceMinutes = float64(m.instTime[roleDecode]) / float64(time.Minute)
	s.minutes = append(s.minutes, Minute{})
	if s.o.Forget {
		s.forget()
	}
}

// forget drops finished sessions and timeline rows older than an hour (Options.Forget).
func (s *Sim) forget() {
	if n := len(s.minutes) - 60; n > 0 {
		s.minutes = append(s.minutes[:0], s.minutes[n:]...)
		s.minuteBase += n
	}
	s.sessions = slices.DeleteFunc(s.sessions, func(ss *session) bool {
		return ss.state != stLive && ss.state != stHeld
	})
}

// cacheCapacity is what can hold prefixes for the calls to come: the running prefill instances'
// GPU and host tiers, plus KV lent by decode.
func (s *Sim) cacheCapacity() int64 {
	var c int64
	for _, p := range s.prefillUp {
		c += int64(p.cache.capacity + p.host.capacity)
	}
	for _, d := range s.decode {
		c += int64(d.lent.tokens)
	}
	return c
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
