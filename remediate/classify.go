package remediate

import (
	"fmt"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
)

// Classify applies the risk rule (detector.Risk, the code of `basin risk`) to live signals: is the
// deployment cache-first (the working set reaches the knee before decode memory fills)? ok is
// false while a signal it needs is not fresh or no session is live: the lender then holds its
// switch rather than act on a guess.
//
// The cache counted is the collector's capacity (prefill GPU and host tiers plus what decode lends
// now), and decode KV the decode pool's total, as one instance: the rule compares sums, so the
// split between instances does not change its answer.
func Classify(s collector.Snapshot, knee float64) (cacheFirst bool, why string, ok bool) {
	get := func(sig collector.Signal) float64 {
		v, fresh := s.Get(sig)
		if !fresh {
			ok = false
		}
		return v
	}
	ok = true
	c, dec := get(collector.CacheCapacity), get(collector.DecodeCapacity)
	// The deployment's own cache, without the KV decode lends now: lending moves memory from
	// decode to the cache, so counting it here would make the answer depend on the switch it
	// decides — lending on grows the cache and reads decode-first, lending off shrinks it and
	// reads cache-first — and the lender would flap with its dwell.
	for _, d := range s.Decode {
		c -= d.LentTokens
	}
	w, n, inCall := get(collector.WorkingSet), get(collector.LiveSessions), get(collector.SessionsInCall)
	if !ok || n < 1 || inCall <= 0 || w <= 0 {
		return false, "", false
	}
	r, err := detector.Risk(detector.RiskInputs{CacheTokens: c, DecodeKVTokens: dec, DecodeInstances: 1,
		MeanContext: w / n, ServedFraction: min(1, inCall/n), KneeFactor: knee})
	if err != nil {
		return false, "", false
	}
	return r.Binding == detector.CacheFirst, fmt.Sprintf("risk rule: %s (%s; %s)", r.Binding, r.Reasons[0], r.Reasons[1]), true
}
