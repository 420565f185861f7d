package collector

import (
	"fmt"
	"strings"
	"time"
)

// acc accumulates one signal's inputs over targets.
type acc struct {
	v float64
	n int
	// at is the time of the oldest contributing reading: a signal is only as fresh as its
	// stalest input.
	at time.Time
	// blocked is set by a contributor whose window has no rate yet (it just restarted or just
	// appeared): a sum without it would dip, so the signal keeps its previous value instead.
	blocked bool
	first   string
	src     string
}

func (a *acc) note(ts *targetState, src string) {
	if a.n == 0 || ts.last.at.Before(a.at) {
		a.at = ts.last.at
	}
	if a.n == 0 {
		a.first = ts.target.Name
	}
	a.n++
	if src != "" && !strings.Contains(a.src, src) {
		if a.src != "" {
			a.src += "+"
		}
		a.src += src
	}
}

func (a *acc) add(ts *targetState, v float64, src string) {
	a.note(ts, src)
	a.v += v
}

func (a *acc) addMax(ts *targetState, v float64, src string) {
	if a.n == 0 || v > a.v {
		a.v = v
	}
	a.note(ts, src)
}

func (a *acc) block(ts *targetState, src string) {
	a.note(ts, src)
	a.blocked = true
}

// merge folds b's contributors into a (for signals summed from two kinds of inputs).
func (a *acc) merge(b acc) {
	if b.n == 0 {
		return
	}
	if a.n == 0 || b.at.Before(a.at) {
		a.at = b.at
	}
	if a.n == 0 {
		a.first = b.first
	}
	a.n += b.n
	a.v += b.v
	a.blocked = a.blocked || b.blocked
	for _, s := range strings.Split(b.src, "+") {
		if s != "" && !strings.Contains(a.src, s) {
			a.src += "+" + s
		}
	}
}

func (a *acc) source() string {
	who := a.first
	if a.n > 1 {
		who = fmt.Sprintf("%d targets", a.n)
	}
	return a.src + " from " + who
}

func (a *acc) value(v float64, estimated bool) Value {
	return Value{V: v, At: a.at, Estimated: estimated, Source: a.source()}
}

// recomputeLocked derives every signal from the targets' latest readings and windows. A signal
// that cannot be computed now keeps its previous value and timestamp (so it turns Stale on its
// own); one never computed stays absent (Missing).
func (c *Collector) recomputeLocked() {
	c.mu.affinity = c.affinityLocked()
	var s sums
	for _, name := range c.mu.order {
		if ts := c.mu.targets[name]; ts.last != nil {
			s.add(ts, c.mu.affinity)
		}
	}
	s.publish(c.mu.values)
}

// affinityLocked is whether a gateway says sticky decode routing is on: decode's retained KV is a
// cache tier only then, so it is settled before any target is summed.
func (c *Collector) affinityLocked() bool {
	for _, name := range c.mu.order {
		if r := c.mu.targets[name].last; r != nil && r.dialect == DialectGateway && r.affinity.ok && r.affinity.v >= 1 {
			return true
		}
	}
	return false
}

// sums are the signals' inputs summed over the targets of one recompute, one accumulator per
// input, so that each target's reading is read once and each signal is decided once from all.
type sums struct {
	ws, wsEst, capEngine, capLent, hits, total                    acc
	live, inCall, queued, budget, reserved, arrivals, completions acc
	calls, free, held, decodeCap, queue, usage, ttftAcc           acc
	ttft                                                          hist
}

// add sums one target's latest reading (not nil) into the inputs its role provides; affinity is
// whether decode's retained KV counts as lent.
func (s *sums) add(ts *targetState, affinity bool) {
	r, role := ts.last, ts.target.Role
	if role == RoleGateway {
		s.addGateway(ts, r)
		return
	}
	if role.prefillSide() {
		s.addPrefillSide(ts, r)
	}
	if role == RoleDecode {
		s.addDecode(ts, r, affinity)
	}
	if role.decodeSide() {
		s.addDecodeSide(ts, r)
	}
	if r.queue.ok {
		s.queue.add(ts, r.queue.v, r.queueSrc)
	}
	if r.usage.ok {
		s.usage.addMax(ts, r.usage.v, r.usageSrc)
	}
}

// addGateway sums the gateway's session gauges and its arrival and completion rates: the
// working set, the population and the flow are the gateway's to tell.
func (s *sums) addGateway(ts *targetState, r *reading) {
	gauge := func(a *acc, o opt, src string) {
		if o.ok {
			a.add(ts, o.v, src)
		}
	}
	gauge(&s.ws, r.workingSet, gwWorkingSet)
	gauge(&s.live, r.live, gwLive)
	gauge(&s.inCall, r.inCall, gwInCall)
	gauge(&s.queued, r.queued, gwQueued)
	gauge(&s.budget, r.budget, gwBudget)
	gauge(&s.reserved, r.reserved, gwReserved)
	rate(&s.arrivals, ts, r.arrivals, ts.arrivals)
	rate(&s.completions, ts, r.completions, ts.completions)
}

// addPrefillSide sums what an instance that holds prompts' prefixes tells: its cache capacity
// (with its host tier), its prompt and cached token rates, and the engines' own estimate of the
// working set for a deployment without a gateway.
func (s *sums) addPrefillSide(ts *targetState, r *reading) {
	if r.capacity.ok {
		v, src := r.capacity.v, r.capacitySrc
		if r.hostCapacity.ok {
			v += r.hostCapacity.v
			src += "+" + sgHostTotal
		}
		s.capEngine.add(ts, v, src)
	}
	if r.hit.ok {
		if ts.hit.ok {
			h, t := ts.hit.r[0], ts.hit.r[1]
			// cached_tokens can exceed prompt_tokens (decode radix double counting in
			// some versions): never more hits than prompt tokens.
			h = min(h, t)
			s.hits.add(ts, h, r.hit.source)
			s.total.add(ts, t, r.hit.source)
		} else {
			s.hits.block(ts, r.hit.source)
		}
	}
	if r.dialect == DialectSGLang && r.used.ok && r.evictable.ok {
		s.wsEst.add(ts, r.used.v+r.evictable.v, "kv_used+kv_evictable")
	}
}

// addDecode sums a PD decode instance's KV: what it lends to the prefix cache, and its free, held
// and total KV for the lender.
func (s *sums) addDecode(ts *targetState, r *reading, affinity bool) {
	switch {
	case r.lent.ok:
		s.capLent.add(ts, r.lent.v, simLent)
	case affinity && r.evictable.ok:
		// With sticky routing a session's next call lands on the decode instance that
		// holds its retained radix KV, which makes that KV a cache tier.
		s.capLent.add(ts, r.evictable.v, sgKVEvictable)
	}
	if r.available.ok {
		s.free.add(ts, r.available.v, r.availableSrc)
	}
	if r.used.ok {
		s.held.add(ts, r.used.v, r.usedSrc)
	}
	if r.capacity.ok {
		s.decodeCap.add(ts, r.capacity.v, r.capacitySrc)
	}
}

// addDecodeSide sums what an instance that finishes model calls tells: the call rate and the
// TTFT histogram's window.
func (s *sums) addDecodeSide(ts *targetState, r *reading) {
	rate(&s.calls, ts, r.calls, ts.calls)
	if r.ttftSrc != "" {
		if ts.ttftOK {
			s.ttft.add(ts.ttftDelta)
			s.ttftAcc.note(ts, r.ttftSrc)
		} else {
			s.ttftAcc.block(ts, r.ttftSrc)
		}
	}
}

// publish writes into values every signal the sums can give now, and leaves the others as they
// were: a signal with no contributor, or one blocked by a contributor whose window has no rate
// yet, keeps its last value (and goes stale) rather than read as a sum that dipped.
func (s sums) publish(values map[Signal]Value) {
	set := func(sig Signal, a acc, estimated bool) {
		if a.n > 0 && !a.blocked {
			values[sig] = a.value(a.v, estimated)
		}
	}
	if s.ws.n > 0 {
		set(WorkingSet, s.ws, false)
	} else {
		set(WorkingSet, s.wsEst, true)
	}
	if s.capEngine.n > 0 {
		s.capEngine.merge(s.capLent)
		set(CacheCapacity, s.capEngine, false)
	}
	if s.hits.n > 0 && !s.hits.blocked {
		// The prompt-token rate is a reading even at 0 (nothing asked); the hit rate of no
		// tokens is not, so it holds and goes stale while the deployment is quiet.
		values[PromptTokenRate] = s.total.value(s.total.v, false)
		if s.total.v > 0 {
			values[HitRate] = s.hits.value(min(1, max(0, s.hits.v/s.total.v)), false)
		}
	}
	set(LiveSessions, s.live, false)
	set(SessionsInCall, s.inCall, false)
	set(QueuedSessions, s.queued, false)
	set(Budget, s.budget, false)
	set(Reserved, s.reserved, false)
	set(ArrivalRate, s.arrivals, false)
	set(CompletionRate, s.completions, false)
	set(CallRate, s.calls, false)
	set(DecodeFree, s.free, false)
	set(DecodeReserved, s.held, false)
	set(DecodeCapacity, s.decodeCap, false)
	set(EngineQueue, s.queue, false)
	set(KVUsageMax, s.usage, false)
	if s.ttftAcc.n > 0 && !s.ttftAcc.blocked {
		p50, ok50 := quantile(0.5, s.ttft)
		p99, ok99 := quantile(0.99, s.ttft)
		if ok50 && ok99 {
			values[TTFTp50] = s.ttftAcc.value(p50, false)
			values[TTFTp99] = s.ttftAcc.value(p99, false)
		}
	}
}

// rate adds a target's windowed counter rate, or blocks the signal while the target's window
// has no rate yet.
func rate(a *acc, ts *targetState, in counterPair, w windowRate) {
	if !in.ok {
		return
	}
	if w.ok {
		a.add(ts, w.r[0], in.source)
	} else {
		a.block(ts, in.source)
	}
}
