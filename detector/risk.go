package detector

import (
	"errors"
	"fmt"
	"math"

	"github.com/basin-dev/basin/collector"
)

// Risk classes.
const (
	// CacheFirst: the cache knee binds before decode memory — the deployment can fall into the
	// trap, and basin's admission matters.
	CacheFirst = "cache-first"
	// DecodeFirst: decode memory runs out first; overload shows as decode queueing, which
	// conventional limits handle, before the working set reaches the knee.
	DecodeFirst = "decode-first"
)

// RiskInputs describe a deployment for the paper's risk rule.
type RiskInputs struct {
	// CacheTokens is the prefill GPU prefix cache, summed over prefill instances; HostTokens the
	// host tier (HiCache), summed. Their sum is the C the knee is measured against.
	CacheTokens, HostTokens float64
	// DecodeKVTokens is the KV memory of one decode instance; DecodeInstances how many there are.
	DecodeKVTokens  float64
	DecodeInstances int
	// MeanContext is the mean context of a live session, tokens.
	MeanContext float64
	// ServedFraction is the fraction of live sessions in a model call rather than a tool; a call
	// waiting for prefill counts as served because SGLang reserves its decode KV before prefill.
	ServedFraction float64
	// KneeFactor is the knee as W/C (DefaultKneeRatio when 0).
	KneeFactor float64
}

// RiskReport says which limit binds first.
type RiskReport struct {
	// CacheLimitSessions is the population whose working set reaches the knee:
	// KneeFactor × C ÷ MeanContext.
	CacheLimitSessions float64 `json:"cache_limit_sessions"`
	// DecodeLimitSessions is the population whose served sessions fill decode KV:
	// DecodeKVTokens × DecodeInstances ÷ MeanContext ÷ ServedFraction.
	DecodeLimitSessions float64 `json:"decode_limit_sessions"`
	// Binding is CacheFirst or DecodeFirst.
	Binding string   `json:"binding"`
	Reasons []string `json:"reasons"`
}

// Risk applies the Basin paper's rule: the cache limit and the decode-memory limit, in sessions,
// and whichever is smaller binds first. A tie counts as cache-first: the paper's model flagged every
// cache-first deployment and erred the other way (8 of 19 decode-first ones called cache-first),
// and the cost of a false cache-first is an admission gate that rarely closes.
func Risk(in RiskInputs) (RiskReport, error) {
	if in.KneeFactor == 0 {
		in.KneeFactor = DefaultKneeRatio
	}
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }
	switch {
	case bad(in.CacheTokens) || in.CacheTokens <= 0:
		return RiskReport{}, fmt.Errorf("risk: CacheTokens %v, must be positive", in.CacheTokens)
	case bad(in.HostTokens) || in.HostTokens < 0:
		return RiskReport{}, fmt.Errorf("risk: HostTokens %v, must not be negative", in.HostTokens)
	case bad(in.DecodeKVTokens) || in.DecodeKVTokens <= 0:
		return RiskReport{}, fmt.Errorf("risk: DecodeKVTokens %v, must be positive", in.DecodeKVTokens)
	case in.DecodeInstances < 1:
		return RiskReport{}, fmt.Errorf("risk: DecodeInstances %d, must be at least 1", in.DecodeInstances)
	case bad(in.MeanContext) || in.MeanContext <= 0:
		return RiskReport{}, fmt.Errorf("risk: MeanContext %v, must be positive", in.MeanContext)
	case bad(in.ServedFraction) || in.ServedFraction <= 0 || in.ServedFraction > 1:
		return RiskReport{}, fmt.Errorf("risk: ServedFraction %v outside (0, 1]", in.ServedFraction)
	case bad(in.KneeFactor) || in.KneeFactor <= 0:
		return RiskReport{}, fmt.Errorf("risk: KneeFactor %v, must be positive", in.KneeFactor)
	}
	c := in.CacheTokens + in.HostTokens
	decode := in.DecodeKVTokens * float64(in.DecodeInstances)
	r := RiskReport{
		CacheLimitSessions:  in.KneeFactor * c / in.MeanContext,
		DecodeLimitSessions: decode / in.MeanContext / in.ServedFraction,
	}
	r.Reasons = []string{
		fmt.Sprintf("cache limit %.2f × %s cache tokens ÷ %s mean context = %.1f sessions",
			in.KneeFactor, tokens(c), tokens(in.MeanContext), r.CacheLimitSessions),
		fmt.Sprintf("decode limit %d × %s decode KV tokens ÷ %s mean context ÷ %.2f served = %.1f sessions",
			in.DecodeInstances, tokens(in.DecodeKVTokens), tokens(in.MeanContext), in.ServedFraction, r.DecodeLimitSessions),
	}
	if r.CacheLimitSessions <= r.DecodeLimitSessions {
		r.Binding = CacheFirst
		r.Reasons = append(r.Reasons, fmt.Sprintf("cache-first: the working set reaches the knee at %.1f sessions, before decode memory fills at %.1f — the deployment can be trapped",
			r.CacheLimitSessions, r.DecodeLimitSessions))
	} else {
		r.Binding = DecodeFirst
		r.Reasons = append(r.Reasons, fmt.Sprintf("decode-first: decode memory fills at %.1f sessions, before the working set reaches the knee at %.1f",
			r.DecodeLimitSessions, r.CacheLimitSessions))
	}
	return r, nil
}

// RiskInputsFrom fills RiskInputs from a snapshot's cache capacity and decode capacity, with the
// mean context W ÷ live sessions. It assumes:
//   - the snapshot's CacheCapacity (prefill GPU + host tier + lent decode KV) is the C the knee is
//     measured against; it is put in CacheTokens whole (HostTokens 0), and lent KV counts as cache;
//   - DecodeCapacity is summed over decode instances, so the pool is described as one instance of
//     that size (the limit is the same);
//   - the mean context of live sessions now is the mean context at the limits, which understates
//     the limits' context when sessions are young (contexts grow) — read the result as of now.
//
// kneeFactor is not in a snapshot; servedFraction is, from a gateway (sessions in a call ÷ live
// sessions, see ServedFractionOf).
func RiskInputsFrom(s collector.Snapshot, servedFraction, kneeFactor float64) (RiskInputs, error) {
	var errs []error
	get := func(sig collector.Signal) float64 {
		v, ok := s.Get(sig)
		if !ok {
			errs = append(errs, fmt.Errorf("%s %s", sig, s.State(sig)))
		}
		return v
	}
	w, c, n, dec := get(collector.WorkingSet), get(collector.CacheCapacity), get(collector.LiveSessions), get(collector.DecodeCapacity)
	if err := errors.Join(errs...); err != nil {
		return RiskInputs{}, fmt.Errorf("risk inputs: %w", err)
	}
	if !(n > 0) || !(w > 0) {
		return RiskInputs{}, fmt.Errorf("risk inputs: no mean context with %v live sessions and a %v-token working set", n, w)
	}
	return RiskInputs{
		CacheTokens: c, DecodeKVTokens: dec, DecodeInstances: 1, MeanContext: w / n,
		ServedFraction: servedFraction, KneeFactor: kneeFactor,
	}, nil
}

// tokens formats a token count compactly: 650K, 1.25M.
func tokens(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gK", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// ServedFractionOf reads the served fraction off a snapshot: the gateway's live sessions with a
// call in flight over its live sessions. One instant is noisy; average several.
func ServedFractionOf(s collector.Snapshot) (float64, error) {
	in, ok1 := s.Get(collector.SessionsInCall)
	live, ok2 := s.Get(collector.LiveSessions)
	switch {
	case !ok1 || !ok2:
		return 0, fmt.Errorf("served fraction: %s %s, %s %s", collector.SessionsInCall, s.State(collector.SessionsInCall),
			collector.LiveSessions, s.State(collector.LiveSessions))
	case !(live > 0):
		return 0, fmt.Errorf("served fraction: no live sessions")
	}
	return in / live, nil
}
