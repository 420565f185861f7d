package collector

import (
	"fmt"
	"sort"
	"time"
)

// Signal names one quantity the collector derives from the engines' and the gateway's metrics.
// Consumers declare the signals they need (Declare) and read them through Snapshot.Get, which never
// turns a missing signal into a zero.
type Signal string

// The signals basin's detector, controller and conventional-alert comparison use.
const (
	// WorkingSet is the sum of the contexts of all live sessions, tool-running ones included, in
	// tokens (gateway basin_gateway_working_set_tokens; estimated from engine metrics without one).
	WorkingSet Signal = "working_set_tokens"
	// CacheCapacity is what can hold prefixes: prefill GPU pools (max_total_num_tokens), host tiers
	// (hicache_host_total_tokens) and KV currently lent by decode.
	CacheCapacity Signal = "cache_capacity_tokens"
	// HitRate is the prefix-cache hit rate over the window, from counter rates on prefill and
	// unified instances — never sglang:cache_hit_rate.
	HitRate Signal = "hit_rate"
	// PromptTokenRate is prompt tokens per second over the window on prefill and unified
	// instances: the denominator of HitRate, fresh (and 0) when nothing was asked, so a quiet
	// deployment reads as quiet rather than as a hit rate gone stale. With CallRate and
	// ArrivalRate it is the evidence behind a hit-rate reading (detector.Evidence).
	PromptTokenRate Signal = "prompt_token_rate"
	// LiveSessions and QueuedSessions come from the gateway.
	LiveSessions   Signal = "live_sessions"
	QueuedSessions Signal = "queued_sessions"
	// SessionsInCall is the live sessions with a model call in flight (gateway); ÷ LiveSessions
	// it is the served fraction of the risk rule.
	SessionsInCall Signal = "sessions_in_call"
	// ArrivalRate and CompletionRate are sessions per second over the window (gateway counters).
	ArrivalRate    Signal = "session_arrival_rate"
	CompletionRate Signal = "session_completion_rate"
	// CallRate is model calls completed per second over the window (X in the fluid model), from
	// decode/unified instances' finished-request counters.
	CallRate Signal = "call_completion_rate"
	// DecodeFree and DecodeReserved are decode KV tokens free and held by requests, summed.
	DecodeFree     Signal = "decode_free_tokens"
	DecodeReserved Signal = "decode_reserved_tokens"
	// DecodeCapacity is decode KV in tokens, summed over decode instances.
	DecodeCapacity Signal = "decode_capacity_tokens"
	// TTFTp50 and TTFTp99 are time-to-first-token quantiles over the window, in seconds.
	TTFTp50 Signal = "ttft_p50_seconds"
	TTFTp99 Signal = "ttft_p99_seconds"
	// EngineQueue is requests waiting in engine queues (scheduler plus PD bootstrap/prealloc
	// queues), summed; KVUsageMax is the highest KV usage fraction of any instance. Both feed the
	// conventional utilisation alerts basin is compared against.
	EngineQueue Signal = "engine_queue_requests"
	KVUsageMax  Signal = "kv_usage_max"
	// Budget and Reserved are the gateway's admission budget and reserved tokens.
	Budget   Signal = "budget_tokens"
	Reserved Signal = "reserved_tokens"
)

// State is the freshness of a signal in a Snapshot.
type State int

// Signal states.
const (
	// Missing: no source has ever provided it (or none is configured).
	Missing State = iota
	// Stale: its last value is older than the staleness limit (default 3 scrape intervals).
	Stale
	// OK: fresh.
	OK
)

func (s State) String() string {
	switch s {
	case OK:
		return "ok"
	case Stale:
		return "stale"
	}
	return "missing"
}

// Value is one signal in a snapshot.
type Value struct {
	V     float64
	State State
	// At is when the value was last computed from a successful scrape.
	At time.Time
	// Estimated marks a value derived indirectly (e.g. the working set from engine metrics when no
	// gateway is scraped); consumers may trust it less.
	Estimated bool
	// Source says where it came from ("gateway", "engines", "prefill-0 …"), for reasons and logs.
	Source string
}

// Snapshot is the collector's view at one instant.
type Snapshot struct {
	At      time.Time
	Signals map[Signal]Value
	// Window is the span the rates (and the hit rate) are taken over: a rate × Window is how
	// many tokens, calls or sessions a reading rests on.
	Window time.Duration
	// CacheRestart is the last time a prefill or unified instance's prefix-cache counters went
	// back — the engine restarted, and its cache with it — or zero if never seen. A cache
	// refilling from empty is below its plateau without having left it.
	CacheRestart time.Time
	// Decode is each decode instance's KV as last read, in target order: the lender grants per
	// instance, where the Signals only hold the pool's sums.
	Decode []DecodeInstance
	// Prefill is each prefill instance's prefix cache as last read, in target order: sizing the
	// prefill pool needs one instance's cache, where CacheCapacity sums the pool and lent KV.
	Prefill []PrefillInstance
}

// PrefillInstance is one prefill instance's prefix cache, in tokens, from its last successful
// scrape.
type PrefillInstance struct {
	// Name is the target's name; At, State as DecodeInstance's.
	Name  string
	At    time.Time
	State State
	// Complete is whether the GPU cache capacity was read.
	Complete bool
	// CacheTokens is the GPU prefix cache (max_total_num_tokens); HostTokens the HiCache host
	// tier (0 without one).
	CacheTokens, HostTokens float64
}

// DecodeInstance is one decode instance's KV, in tokens, from its last successful scrape.
type DecodeInstance struct {
	// Name is the target's name.
	Name string
	// At is when it was read; State is OK or Stale by the same rule as the signals (Missing:
	// never read).
	At    time.Time
	State State
	// Complete is whether capacity, free and reserved KV were all read: without them the
	// instance cannot be judged.
	Complete                                   bool
	CapacityTokens, FreeTokens, ReservedTokens float64
	// LentTokens is KV already kept for lending (the simulator's, or the retained radix KV
	// sticky routing makes a cache tier); 0 when unknown.
	LentTokens float64
	// Waiting is the requests waiting for KV to be pre-allocated (SGLang PD); 0 when unknown.
	Waiting int
}

// Get returns a signal's value and whether it is fresh. A stale or missing signal returns ok false:
// callers must decide what blindness means for them (the controller never loosens while blind).
func (s Snapshot) Get(sig Signal) (v float64, ok bool) {
	val, found := s.Signals[sig]
	if !found || val.State != OK {
		return 0, false
	}
	return val.V, true
}

// State returns a signal's freshness.
func (s Snapshot) State(sig Signal) State {
	return s.Signals[sig].State
}

// Blind lists the signals of need that are not fresh, sorted, for reasons such as "blind: hit_rate
// stale". Empty when every needed signal is ok.
func (s Snapshot) Blind(need []Signal) []string {
	var out []string
	for _, sig := range need {
		if st := s.State(sig); st != OK {
			out = append(out, fmt.Sprintf("%s %s", sig, st))
		}
	}
	sort.Strings(out)
	return out
}

// AllSignals lists every signal the collector knows, in a stable order: the order of the
// exported basin_signal_* series and of Check's problems.
func AllSignals() []Signal {
	return []Signal{
		WorkingSet, CacheCapacity, HitRate, PromptTokenRate, LiveSessions, SessionsInCall, QueuedSessions, ArrivalRate, CompletionRate,
		CallRate, DecodeFree, DecodeReserved, DecodeCapacity, TTFTp50, TTFTp99, EngineQueue, KVUsageMax,
		Budget, Reserved,
	}
}

// Valid reports whether s is one of AllSignals.
func (s Signal) Valid() bool {
	for _, k := range AllSignals() {
		if k == s {
			return true
		}
	}
	return false
}
