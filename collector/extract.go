package collector

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Metric names the collector reads. SGLang names are current ones with older fallbacks next to
// them; the package README maps them to signals.
const (
	sgMaxTotal        = "sglang:max_total_num_tokens"
	sgHostTotal       = "sglang:hicache_host_total_tokens"
	sgKVAvailable     = "sglang:kv_available_tokens"
	sgKVEvictable     = "sglang:kv_evictable_tokens"
	sgKVUsed          = "sglang:kv_used_tokens"
	sgNumUsed         = "sglang:num_used_tokens" // older name of kv_used_tokens
	sgTokenUsage      = "sglang:token_usage"
	sgQueue           = "sglang:num_queue_reqs"
	sgBootstrapQueue  = "sglang:num_prefill_bootstrap_queue_reqs"
	sgPrefillPrealloc = "sglang:num_prefill_prealloc_queue_reqs" // older name of the bootstrap queue
	sgDecodePrealloc  = "sglang:num_decode_prealloc_queue_reqs"
	sgDecodeTransfer  = "sglang:num_decode_transfer_queue_reqs"
	sgEffective       = "sglang:prefill_effective_tokens_total"
	sgRealtime        = "sglang:realtime_tokens_total"
	sgCached          = "sglang:cached_tokens_total"
	sgPrompt          = "sglang:prompt_tokens_total"
	sgRequests        = "sglang:num_requests_total"
	sgTTFT            = "sglang:time_to_first_token_seconds"
	// simLent is the simulator's decode KV kept for lending (no SGLang counterpart).
	simLent = "basin_sim_lent_tokens"

	vlHits        = "vllm:prefix_cache_hits_total"
	vlQueries     = "vllm:prefix_cache_queries_total"
	vlGPUHits     = "vllm:gpu_prefix_cache_hits_total" // deprecated in 0.9
	vlGPUQueries  = "vllm:gpu_prefix_cache_queries_total"
	vlSuccess     = "vllm:request_success_total"
	vlTTFT        = "vllm:time_to_first_token_seconds"
	vlWaiting     = "vllm:num_requests_waiting" // a prefix of ..._by_reason: names match exactly
	vlKVUsage     = "vllm:kv_cache_usage_perc"
	vlGPUUsage    = "vllm:gpu_cache_usage_perc" // deprecated in 0.9
	vlCacheConfig = "vllm:cache_config_info"

	gwWorkingSet  = "basin_gateway_working_set_tokens"
	gwLive        = "basin_gateway_sessions_live"
	gwInCall      = "basin_gateway_sessions_in_call"
	gwQueued      = "basin_gateway_sessions_queued"
	gwBudget      = "basin_gateway_budget_tokens"
	gwReserved    = "basin_gateway_reserved_tokens"
	gwAffinity    = "basin_gateway_affinity_enabled"
	gwArrivals    = "basin_gateway_session_arrivals_total"
	gwCompletions = "basin_gateway_session_completions_total"
	// The gateway's held sessions (their next calls wait at the gateway) and their contexts:
	// the collector takes them out of the working set and the live sessions it reports, since
	// the cache does not have to carry a held session's prefix.
	gwHeld       = "basin_gateway_sessions_held"
	gwHeldTokens = "basin_gateway_held_tokens"
)

// wantedFamilies are the families a scrape keeps (filterText); wantedHistograms the histogram
// families among them, whose _bucket, _sum and _count series are kept too. Both are read-only.
var (
	wantedHistograms = set(sgTTFT, vlTTFT)
	wantedFamilies   = set(
		sgMaxTotal, sgHostTotal, sgKVAvailable, sgKVEvictable, sgKVUsed, sgNumUsed, sgTokenUsage,
		sgQueue, sgBootstrapQueue, sgPrefillPrealloc, sgDecodePrealloc, sgDecodeTransfer,
		sgEffective, sgRealtime, sgCached, sgPrompt, sgRequests, sgTTFT, simLent,
		vlHits, vlQueries, vlGPUHits, vlGPUQueries, vlSuccess, vlTTFT, vlWaiting, vlKVUsage, vlGPUUsage,
		vlCacheConfig,
		gwWorkingSet, gwLive, gwInCall, gwQueued, gwBudget, gwReserved, gwAffinity, gwArrivals, gwCompletions,
		gwHeld, gwHeldTokens, SpeedMetric,
	)
)

func set(names ...string) map[string]struct{} {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

// opt is a value that may be absent.
type opt struct {
	v  float64
	ok bool
}

func some(v float64) opt { return opt{v: v, ok: true} }

// counterPair is a group of cumulative counters read together, with the metric it came from.
type counterPair struct {
	v      [2]float64
	source string
	// series counts the series summed: when it changes (a series vanished or appeared), the
	// sums are not comparable with the window's earlier ones and the window restarts.
	series int
	ok     bool
}

// reading is what one successful scrape (or ingest) of a target says, reduced to the inputs of
// the signals. Absent inputs stay absent; none is ever defaulted to 0.
type reading struct {
	at      time.Time
	dialect Dialect

	// Engine KV, in tokens.
	capacity     opt    // KV pool: max_total_num_tokens, or vLLM's cache_config_info
	capacitySrc  string // the metric capacity came from
	hostCapacity opt    // HiCache host tier
	lent         opt    // simulator: decode KV kept for lending
	evictable    opt    // retained (radix-cached, unreferenced) KV
	used         opt    // KV held by running requests
	usedSrc      string
	available    opt // free KV
	availableSrc string
	usage        opt // highest KV usage fraction among the instance's series
	usageSrc     string
	queue        opt // requests waiting in engine queues
	queueSrc     string
	prealloc     opt // decode: requests waiting for KV to be pre-allocated (PD)

	// Engine counters and histograms (cumulative).
	// hits are the [hits, total] prompt-token counter families present, in order of preference;
	// hit is the one the signals read, chosen once the windows show which advance (chooseHits).
	hits  []counterPair
	hit   counterPair
	calls counterPair // [finished requests]
	ttft  hist
	// ttftSrc is the TTFT family; empty when absent.
	ttftSrc string

	// Gateway.
	workingSet, live, inCall, queued, budget, reserved, affinity opt
	arrivals, completions                                        counterPair

	// samples and duplicates are bookkeeping for basin_scrape_* metrics.
	samples    int
	duplicates int
}

// extractor reads one target's families; it keeps scratch space between lookups.
type extractor struct {
	fams        map[string]*dto.MetricFamily
	duplicates  int
	dupFamilies []string
	keep        []*dto.Metric
	pairs       []*dto.LabelPair
	key         []byte
}

// extract reduces families to a reading in dialect d (not auto).
func extract(fams map[string]*dto.MetricFamily, d Dialect) reading {
	x := &extractor{fams: fams}
	r := reading{dialect: d}
	switch d {
	case DialectSGLang:
		x.sglang(&r)
	case DialectVLLM:
		x.vllm(&r)
	case DialectGateway:
		x.gateway(&r)
	}
	r.duplicates = x.duplicates
	return r
}

func (x *extractor) sglang(r *reading) {
	if v := x.sum(sgMaxTotal); v.ok {
		r.capacity, r.capacitySrc = v, sgMaxTotal
	}
	r.hostCapacity = x.sum(sgHostTotal)
	r.lent = x.sum(simLent)
	r.evictable = x.sum(sgKVEvictable)
	r.usage, r.usageSrc = x.max(sgTokenUsage), sgTokenUsage

	// Used: kv_used_tokens, else the older num_used_tokens, else token_usage × capacity.
	r.used, r.usedSrc = x.sum(sgKVUsed), sgKVUsed
	if !r.used.ok {
		r.used, r.usedSrc = x.sum(sgNumUsed), sgNumUsed
	}
	if !r.used.ok && r.usage.ok && r.capacity.ok {
		r.used, r.usedSrc = some(x.mean(sgTokenUsage)*r.capacity.v), sgTokenUsage+"×"+sgMaxTotal
	}
	// Free: kv_available_tokens, else (older) capacity − used, which counts evictable KV as free.
	if a := x.sum(sgKVAvailable); a.ok {
		r.available, r.availableSrc = a, sgKVAvailable
	} else if r.capacity.ok && r.used.ok {
		r.available, r.availableSrc = some(max(0, r.capacity.v-r.used.v)), sgMaxTotal+"-"+r.usedSrc
	}

	// Queue: scheduler + PD bootstrap (older: prealloc) + decode prealloc + decode transfer.
	boot := sgBootstrapQueue
	if _, ok := x.fams[boot]; !ok {
		boot = sgPrefillPrealloc
	}
	var q opt
	for _, name := range [...]string{sgQueue, boot, sgDecodePrealloc, sgDecodeTransfer} {
		if v := x.queueSum(name); v.ok {
			q = some(q.v + v.v)
		}
	}
	r.queue, r.queueSrc = q, sgQueue
	r.prealloc = x.queueSum(sgDecodePrealloc)

	r.hits = x.sglangHits()
	if v := x.sum(sgRequests); v.ok {
		r.calls = counterPair{v: [2]float64{v.v}, source: sgRequests, series: x.count(sgRequests), ok: true}
	}
	if h, ok := x.histogram(sgTTFT); ok {
		r.ttft, r.ttftSrc = h, sgTTFT
	}
}

// sglangHits reads the hit-rate counter families the engine exports, in the order of
// preference: effective prefill tokens, then the scheduler's realtime tokens, then the
// tokenizer's cached/prompt tokens. All that are present are returned: a family can be
// registered and never incremented (SGLang's prefill_effective_tokens_total in some builds while
// realtime_tokens_total grows), and only their windows tell which one counts (see chooseHits). A
// family with an unusable series (NaN, ±Inf) gives no reading at all: summing the rest would be a
// hit rate of the wrong tokens (0 or 1 when the hit or the total series is the one lost).
func (x *extractor) sglangHits() []counterPair {
	var out []counterPair
	for _, read := range [...]func() (counterPair, bool){x.sglangEffective, x.sglangRealtime, x.sglangCached} {
		p, usable := read()
		if !usable {
			return nil
		}
		if p.ok {
			out = append(out, p)
		}
	}
	return out
}

// sglangEffective reads prefill_effective_tokens_total: hits are its *_hit modes, the total all
// modes. usable is false when a series is NaN or ±Inf.
func (x *extractor) sglangEffective() (p counterPair, usable bool) {
	var hits, total float64
	n := 0
	for _, m := range x.series(sgEffective) {
		v, ok := sampleValue(m)
		if !ok {
			return counterPair{}, false
		}
		n++
		total += v
		if strings.HasSuffix(labelValue(m, "mode"), "_hit") {
			hits += v
		}
	}
	if n == 0 {
		return counterPair{}, true
	}
	return counterPair{v: [2]float64{hits, total}, source: sgEffective, series: n, ok: true}, true
}

// sglangRealtime reads realtime_tokens_total: prefill_cache over prefill_cache + prefill_compute.
func (x *extractor) sglangRealtime() (p counterPair, usable bool) {
	var cache, compute opt
	for _, m := range x.series(sgRealtime) {
		v, ok := sampleValue(m)
		if !ok {
			return counterPair{}, false
		}
		switch labelValue(m, "mode") {
		case "prefill_cache":
			cache = some(cache.v + v)
		case "prefill_compute":
			compute = some(compute.v + v)
		}
	}
	if !cache.ok && !compute.ok {
		return counterPair{}, true
	}
	return counterPair{v: [2]float64{cache.v, cache.v + compute.v}, source: sgRealtime, series: x.count(sgRealtime), ok: true}, true
}

// sglangCached reads cached_tokens_total over prompt_tokens_total: per cache_source when broken
// down; "total" is the fallback SGLang reports when it has no breakdown, so it counts only when
// alone.
func (x *extractor) sglangCached() (p counterPair, usable bool) {
	var bySource, totalSource, unlabelled opt
	for _, m := range x.series(sgCached) {
		v, ok := sampleValue(m)
		if !ok {
			return counterPair{}, false
		}
		switch src := labelValue(m, "cache_source"); src {
		case "":
			unlabelled = some(unlabelled.v + v)
		case "total":
			totalSource = some(totalSource.v + v)
		default:
			bySource = some(bySource.v + v)
		}
	}
	cached := unlabelled
	switch {
	case bySource.ok:
		cached = some(unlabelled.v + bySource.v)
	case totalSource.ok:
		cached = some(unlabelled.v + totalSource.v)
	}
	prompt := x.sum(sgPrompt)
	if cached.ok && prompt.ok {
		return counterPair{v: [2]float64{cached.v, prompt.v}, source: sgCached, series: x.count(sgCached) + x.count(sgPrompt), ok: true}, true
	}
	return counterPair{}, true
}

func (x *extractor) vllm(r *reading) {
	if c := x.vllmCapacity(); c.ok {
		r.capacity, r.capacitySrc = c, vlCacheConfig
	}
	r.usage, r.usageSrc = x.max(vlKVUsage), vlKVUsage
	if !r.usage.ok {
		r.usage, r.usageSrc = x.max(vlGPUUsage), vlGPUUsage
	}
	if r.usage.ok && r.capacity.ok {
		r.used, r.usedSrc = some(min(1, r.usage.v)*r.capacity.v), r.usageSrc+"×"+vlCacheConfig
		r.available, r.availableSrc = some(r.capacity.v-r.used.v), vlCacheConfig+"-"+r.usedSrc
	}
	r.queue, r.queueSrc = x.sum(vlWaiting), vlWaiting
	for _, p := range [...][2]string{{vlHits, vlQueries}, {vlGPUHits, vlGPUQueries}} {
		h, q := x.sum(p[0]), x.sum(p[1])
		if h.ok && q.ok {
			r.hits = append(r.hits, counterPair{v: [2]float64{h.v, q.v}, source: p[0], series: x.count(p[0]) + x.count(p[1]), ok: true})
		}
	}
	if v := x.sum(vlSuccess); v.ok {
		r.calls = counterPair{v: [2]float64{v.v}, source: vlSuccess, series: x.count(vlSuccess), ok: true}
	}
	if h, ok := x.histogram(vlTTFT); ok {
		r.ttft, r.ttftSrc = h, vlTTFT
	}
}

// vllmCapacity reads the KV pool in tokens from the cache_config_info labels: kv_cache_size_tokens
// (newer vLLM), else num_gpu_blocks × block_size; summed over engines.
func (x *extractor) vllmCapacity() opt {
	var c opt
	for _, m := range x.series(vlCacheConfig) {
		if v, ok := positive(labelValue(m, "kv_cache_size_tokens")); ok {
			c = some(c.v + v)
			continue
		}
		blocks, ok1 := positive(labelValue(m, "num_gpu_blocks"))
		size, ok2 := positive(labelValue(m, "block_size"))
		if ok1 && ok2 {
			c = some(c.v + blocks*size)
		}
	}
	return c
}

func positive(s string) (float64, bool) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

func (x *extractor) gateway(r *reading) {
	r.workingSet = x.sum(gwWorkingSet)
	r.live = x.sum(gwLive)
	// Held sessions are live and their contexts in the working set, but their calls wait at the
	// gateway and their prefixes need not be cached: what the deployment serves is the rest. A
	// gateway that exports no hold metrics (an older one) holds nothing.
	if h := x.sum(gwHeldTokens); h.ok && r.workingSet.ok {
		r.workingSet.v = max(0, r.workingSet.v-h.v)
	}
	if h := x.sum(gwHeld); h.ok && r.live.ok {
		r.live.v = max(0, r.live.v-h.v)
	}
	r.inCall = x.sum(gwInCall)
	r.queued = x.sum(gwQueued)
	r.budget = x.sum(gwBudget)
	r.reserved = x.sum(gwReserved)
	r.affinity = x.max(gwAffinity)
	if v := x.sum(gwArrivals); v.ok {
		r.arrivals = counterPair{v: [2]float64{v.v}, source: gwArrivals, series: x.count(gwArrivals), ok: true}
	}
	if v := x.sum(gwCompletions); v.ok {
		r.completions = counterPair{v: [2]float64{v.v}, source: gwCompletions, series: x.count(gwCompletions), ok: true}
	}
}

// sum adds the values of a family's series; absent when there are none or any is unusable
// (NaN, ±Inf): a sum that lacks one of its inputs is not a reading, it is silently smaller.
func (x *extractor) sum(name string) opt {
	var s opt
	for _, m := range x.series(name) {
		v, ok := sampleValue(m)
		if !ok {
			return opt{}
		}
		s = some(s.v + v)
	}
	return s
}

// count is how many series a family has.
func (x *extractor) count(name string) int { return len(x.series(name)) }

// max is the largest usable value of a family's series.
func (x *extractor) max(name string) opt {
	var s opt
	for _, m := range x.series(name) {
		if v, ok := sampleValue(m); ok && (!s.ok || v > s.v) {
			s = some(v)
		}
	}
	return s
}

// mean is the average usable value of a family's series (0 when none).
func (x *extractor) mean(name string) float64 {
	var s float64
	n := 0
	for _, m := range x.series(name) {
		if v, ok := sampleValue(m); ok {
			s += v
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return s / float64(n)
}

// queueSum sums a queue gauge. With priority scheduling SGLang reports each priority under
// priority="<n>" and the total under priority=""; then only the total counts.
func (x *extractor) queueSum(name string) opt {
	ms := x.series(name)
	var total, per bool
	for _, m := range ms {
		if labelValue(m, "priority") == "" {
			total = true
		} else {
			per = true
		}
	}
	var s opt
	for _, m := range ms {
		if total && per && labelValue(m, "priority") != "" {
			continue
		}
		if v, ok := sampleValue(m); ok {
			s = some(s.v + v)
		}
	}
	return s
}

// histogram merges a histogram family's series into one; ok is false without usable series.
func (x *extractor) histogram(name string) (hist, bool) {
	var h hist
	for _, m := range x.series(name) {
		if s, ok := toHist(m.GetHistogram()); ok {
			h.add(s)
		}
	}
	return h, len(h.bounds) > 0
}

// toHist converts a classic histogram, from text (with a +Inf bucket) or from a Gatherer
// (without one: the count is the +Inf bucket). A NaN count makes it unusable; duplicate bounds
// (duplicate series merged by the parser) keep their first count.
func toHist(dh *dto.Histogram) (hist, bool) {
	if dh == nil || len(dh.GetBucket()) == 0 {
		return hist{}, false
	}
	count := float64(dh.GetSampleCount())
	if dh.SampleCountFloat != nil {
		count = dh.GetSampleCountFloat()
	}
	h := hist{bounds: make([]float64, 0, len(dh.GetBucket())+1), cum: make([]float64, 0, len(dh.GetBucket())+1)}
	for _, b := range dh.GetBucket() {
		c := float64(b.GetCumulativeCount())
		if b.CumulativeCountFloat != nil {
			c = b.GetCumulativeCountFloat()
		}
		ub := b.GetUpperBound()
		if math.IsNaN(ub) || math.IsNaN(c) || math.IsInf(c, 0) {
			return hist{}, false
		}
		if n := len(h.bounds); n > 0 && ub <= h.bounds[n-1] {
			if ub == h.bounds[n-1] {
				continue // a duplicate bucket line
			}
			return hist{}, false // out of order: not a classic histogram
		}
		h.bounds = append(h.bounds, ub)
		h.cum = append(h.cum, c)
	}
	if !math.IsInf(h.bounds[len(h.bounds)-1], 1) {
		if math.IsNaN(count) || math.IsInf(count, 0) {
			return hist{}, false
		}
		h.bounds = append(h.bounds, math.Inf(1))
		h.cum = append(h.cum, count)
	}
	return h, true
}

// rankLabels are the parallelism ranks under which SGLang repeats one instance's scheduler
// values (all TP ranks report the same pool with --enable-metrics-for-all-schedulers; pipeline
// stages process the same batches). dp_rank is not among them: DP-attention ranks have pools of
// their own, which add up.
var rankLabels = [...]string{"tp_rank", "pp_rank", "moe_ep_rank"}

// series returns the series of a family to aggregate. A series with the same labels as an
// earlier one is a duplicate and dropped (counted); a series that differs from an earlier one
// only in its rank labels is another rank's copy of the same value and dropped too. The slice is
// valid until the next call.
func (x *extractor) series(name string) []*dto.Metric {
	mf := x.fams[name]
	if mf == nil {
		return nil
	}
	ms := mf.GetMetric()
	if len(ms) <= 1 {
		return ms
	}
	x.keep = x.keep[:0]
	seenFull := make(map[string]struct{}, len(ms))
	seenInstance := make(map[string]struct{}, len(ms))
	dups := 0
	defer func() {
		// A family can be read more than once; its duplicates count once.
		if dups > 0 && !slices.Contains(x.dupFamilies, name) {
			x.dupFamilies = append(x.dupFamilies, name)
			x.duplicates += dups
		}
	}()
	for _, m := range ms {
		full := x.labelKey(m, false)
		if _, dup := seenFull[full]; dup {
			dups++
			continue
		}
		seenFull[full] = struct{}{}
		inst := x.labelKey(m, true)
		if _, dup := seenInstance[inst]; dup {
			continue
		}
		seenInstance[inst] = struct{}{}
		x.keep = append(x.keep, m)
	}
	return x.keep
}

// labelKey is a canonical form of a series' labels (sorted, empty values dropped since they
// equal absence), optionally without the rank labels.
func (x *extractor) labelKey(m *dto.Metric, withoutRanks bool) string {
	x.pairs = x.pairs[:0]
	for _, lp := range m.GetLabel() {
		if lp.GetValue() == "" {
			continue
		}
		if withoutRanks && slices.Contains(rankLabels[:], lp.GetName()) {
			continue
		}
		x.pairs = append(x.pairs, lp)
	}
	slices.SortFunc(x.pairs, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	x.key = x.key[:0]
	for _, lp := range x.pairs {
		x.key = append(x.key, lp.GetName()...)
		x.key = append(x.key, 0xff)
		x.key = append(x.key, lp.GetValue()...)
		x.key = append(x.key, 0xff)
	}
	return string(x.key)
}

// sampleValue is a counter, gauge or untyped value; NaN and ±Inf are unusable.
func sampleValue(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// labelValue is a series' label value; "" when absent, which Prometheus treats alike.
func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}
