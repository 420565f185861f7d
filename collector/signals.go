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
	var (
		ws, wsEst, capEngine, capLent, hits, total                    acc
		live, inCall, queued, budget, reserved, arrivals, completions acc
		calls, free, held, decodeCap, queue, usage, ttftAcc           acc
		ttft                                                          hist
	)
	affinity := false
	for _, name := range c.mu.order {
		ts := c.mu.targets[name]
		if r := ts.last; r != nil && r.dialect == DialectGateway && r.affinity.ok && r.affinity.v >= 1 {
			affinity = true
		}
	}
	c.mu.affinity = affinity
	for _, name := range c.mu.order {
		ts := c.mu.targets[name]
		r := ts.last
		if r == nil {
			continue
		}
		role := ts.target.Role
		if role == RoleGateway {
			gauge := func(a *acc, o opt, src string) {
				if o.ok {
					a.add(ts, o.v, src)
				}
			}
			gauge(&ws, r.workingSet, gwWorkingSet)
			gauge(&live, r.live, gwLive)
			gauge(&inCall, r.inCall, gwInCall)
			gauge(&queued, r.queued, gwQueued)
			gauge(&budget, r.budget, gwBudget)
			gauge(&reserved, r.reserved, gwReserved)
			rate(&arrivals, ts, r.arrivals, ts.arrivals)
			rate(&completions, ts, r.completions, ts.completions)
			continue
		}

		if role.prefillSide() {
			if r.capacity.ok {
				v, src := r.capacity.v, r.capacitySrc
				if r.hostCapacity.ok {
					v += r.hostCapacity.v
					src += "+" + sgHostTotal
				}
				capEngine.add(ts, v, src)
			}
			if r.hit.ok {
				if ts.hit.ok {
					h, t := ts.hit.r[0], ts.hit.r[1]
					// cached_tokens can exceed prompt_tokens (decode radix double counting in
					// some versions): never more hits than prompt tokens.
					h = min(h, t)
					hits.add(ts, h, r.hit.source)
					total.add(ts, t, r.hit.source)
				} else {
					hits.block(ts, r.hit.source)
				}
			}
			if r.dialect == DialectSGLang && r.used.ok && r.evictable.ok {
				wsEst.add(ts, r.used.v+r.evictable.v, "kv_used+kv_evictable")
			}
		}
		if role == RoleDecode {
			switch {
			case r.lent.ok:
				capLent.add(ts, r.lent.v, simLent)
			case affinity && r.evictable.ok:
				// With sticky routing a session's next call lands on the decode instance that
				// holds its retained radix KV, which makes that KV a cache tier.
				capLent.add(ts, r.evictable.v, sgKVEvictable)
			}
			if r.available.ok {
				free.add(ts, r.available.v, r.availableSrc)
			}
			if r.used.ok {
				held.add(ts, r.used.v, r.usedSrc)
			}
			if r.capacity.ok {
				decodeCap.add(ts, r.capacity.v, r.capacitySrc)
			}
		}
		if role.decodeSide() {
			rate(&calls, ts, r.calls, ts.calls)
			if r.ttftSrc != "" {
				if ts.ttftOK {
					ttft.add(ts.ttftDelta)
					ttftAcc.note(ts, r.ttftSrc)
				} else {
					ttftAcc.block(ts, r.ttftSrc)
				}
			}
		}
		if r.queue.ok {
			queue.add(ts, r.queue.v, r.queueSrc)
		}
		if r.usage.ok {
			usage.addMax(ts, r.usage.v, r.usageSrc)
		}
	}

	set := func(sig Signal, a acc, estimated bool) {
		if a.n > 0 && !a.blocked {
			c.mu.values[sig] = a.value(a.v, estimated)
		}
	}
	if ws.n > 0 {
		set(WorkingSet, ws, false)
	} else {
		set(WorkingSet, wsEst, true)
	}
	if capEngine.n > 0 {
		capEngine.merge(capLent)
		set(CacheCapacity, capEngine, false)
	}
	if hits.n > 0 && !hits.blocked {
		// The prompt-token rate is a reading even at 0 (nothing asked); the hit rate of no
		// tokens is not, so it holds and goes stale while the deployment is quiet.
		c.mu.values[PromptTokenRate] = total.value(total.v, false)
		if total.v > 0 {
			c.mu.values[HitRate] = hits.value(min(1, max(0, hits.v/total.v)), false)
		}
	}
	set(LiveSessions, live, false)
	set(SessionsInCall, inCall, false)
	set(QueuedSessions, queued, false)
	set(Budget, budget, false)
	set(Reserved, reserved, false)
	set(ArrivalRate, arrivals, false)
	set(CompletionRate, completions, false)
	set(CallRate, calls, false)
	set(DecodeFree, free, false)
	set(DecodeReserved, held, false)
	set(DecodeCapacity, decodeCap, false)
	set(EngineQueue, queue, false)
	set(KVUsageMax, usage, false)
	if ttftAcc.n > 0 && !ttftAcc.blocked {
		p50, ok50 := quantile(0.5, ttft)
		p99, ok99 := quantile(0.99, ttft)
		if ok50 && ok99 {
			c.mu.values[TTFTp50] = ttftAcc.value(p50, false)
			c.mu.values[TTFTp99] = ttftAcc.value(p99, false)
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
