package sim

import (
	"sort"
	"time"
)

// Histogram accumulates observations into fixed buckets, the way a Prometheus histogram does, so
// the simulator's engine metrics can be exported with the engines' own bucket layouts. Counts are
// float because decode steps are tracked fractionally between batch changes.
type Histogram struct {
	// Bounds are the upper bounds of the buckets, ascending, without +Inf.
	Bounds []float64
	// Counts[i] is the number of observations ≤ Bounds[i] and > Bounds[i-1] (not cumulative);
	// Counts[len(Bounds)] counts the rest.
	Counts []float64
	Sum    float64
	Count  float64
}

func newHistogram(bounds []float64) Histogram {
	return Histogram{Bounds: bounds, Counts: make([]float64, len(bounds)+1)}
}

func (h *Histogram) observe(v, weight float64) {
	i := sort.SearchFloat64s(h.Bounds, v)
	h.Counts[i] += weight
	h.Sum += v * weight
	h.Count += weight
}

func (h Histogram) clone() Histogram {
	h.Counts = append([]float64(nil), h.Counts...)
	return h
}

// Bucket layouts of SGLang's tokenizer metrics (sglang:time_to_first_token_seconds,
// sglang:inter_token_latency_seconds, sglang:e2e_request_latency_seconds).
var (
	ttftBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	itlBuckets  = []float64{0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
		0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0}
	e2eBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
		1200, 1800, 2400}
)

// Role is what an instance does in a prefill/decode-disaggregated deployment.
type Role string

// Roles of simulated instances; the values are SGLang's engine_type label values.
const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// InstanceStats is what one simulated engine instance would report on its /metrics endpoint:
// counters since start, gauges now, and histograms. The exporter in sim/enginemetrics turns it
// into SGLang-named series.
type InstanceStats struct {
	Role  Role
	Index int
	// Name is "prefill-0", "decode-2", …
	Name string

	// Counters (tokens or requests since start).
	Requests         float64 // finished requests (prefill: prefilled; decode: finished decoding)
	PromptTokens     float64
	CachedDevice     float64 // prompt tokens found in the GPU cache
	CachedHost       float64 // prompt tokens loaded back from the host tier
	CachedLent       float64 // prompt tokens written back from decode's lent KV
	ComputedTokens   float64 // prompt tokens computed (not cached)
	GenerationTokens float64

	// Gauges.
	Running           int
	Queued            int // scheduler waiting queue
	BootstrapQueue    int // prefill: waiting for decode to pre-allocate KV
	PreallocQueue     int // decode: waiting for KV slots
	TransferQueue     int // decode: KV being received
	MaxTotalTokens    int
	AvailableTokens   int
	EvictableTokens   int // prefill: unreferenced cached prefixes; decode: lent KV
	UsedTokens        int // locked by requests (and pins)
	LentTokens        int // decode: KV kept for lending
	HostUsedTokens    int
	HostTotalTokens   int
	DecodeBatchTokens int64

	TTFT Histogram // seconds
	ITL  Histogram // seconds per output token
	E2E  Histogram // seconds
}

// Minute is one row of the timeline: what happened in one simulated minute, and the state at its
// end.
type Minute struct {
	Minute         int `json:"minute"`
	Arrivals       int `json:"arrivals"`
	LiveSessions   int `json:"live_sessions"`
	LiveBase       int `json:"live_base_sessions"` // live sessions of the base stream (regular traffic)
	QueuedSessions int `json:"queued_sessions"`
	// HeldCalls is how many live sessions' next calls the gate held at the minute's end.
	HeldCalls        int     `json:"held_calls"`
	WorkingSetTokens int64   `json:"working_set_tokens"`
	CacheCapacity    int64   `json:"cache_capacity_tokens"`
	HitRate          float64 `json:"hit_rate"` // NaN when nothing was prefilled
	TTFTP50          float64 `json:"ttft_p50_s"`
	Completions      int     `json:"completions"`
	GoodCompletions  int     `json:"good_completions"`
	CallsCompleted   int     `json:"calls_completed"`
	// MissedArrivals counts the sessions that arrived in this minute and will not be good: they
	// finished outside the SLO, were refused, shed or killed, or were unfinished at the run's
	// end (after its drain) already past their deadline. Set on the Result only; 0 for a minute
	// whose every session was, or may still be, good.
	MissedArrivals int     `json:"missed_arrivals"`
	PrefillBusy    float64 `json:"prefill_busy"`
	// PromptTokens and HitTokens are the minute's prefilled tokens and the cached part of them,
	// so windows can be token-weighted.
	PromptTokens float64 `json:"prompt_tokens"`
	HitTokens    float64 `json:"hit_tokens"`
	// PrefillInstances and DecodeInstances are the instances holding a GPU at the minute's end
	// (starting, running or draining); the InstanceMinutes fields integrate that count over the
	// minute (Control.SetInstances).
	PrefillInstances       int     `json:"prefill_instances"`
	DecodeInstances        int     `json:"decode_instances"`
	PrefillInstanceMinutes float64 `json:"prefill_instance_minutes"`
	DecodeInstanceMinutes  float64 `json:"decode_instance_minutes"`

	ttftSamples []float64
	busy        time.Duration
	// instTime and servingTime are instance time by role (rolePrefill, roleDecode): allocated
	// instances, and those that can compute (running or draining).
	instTime    [2]time.Duration
	servingTime [2]time.Duration
}
