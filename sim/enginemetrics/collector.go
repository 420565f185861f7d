package enginemetrics

import (
	"errors"
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/sim"
)

// Label names and values shared by the families.
const (
	labelEngineType  = "engine_type"
	labelMode        = "mode"
	labelCacheSource = "cache_source"

	// rank is the value of tp_rank, pp_rank and moe_ep_rank: a simulated instance is one
	// scheduler, and SGLang reports scheduler metrics from rank 0 only by default.
	rank = "0"
)

// collector exposes one instance of a Source. It holds no mutable state, so concurrent scrapes
// are safe as long as the Source is.
type collector struct {
	src      Source
	instance string
	d        *descs
}

// Describe sends every family the instance can expose, whatever its role, so the registry checks
// each collected metric against a known name, type and label set.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.d.all {
		ch <- d
	}
}

// Collect reads one snapshot and emits the instance's series; nothing if the snapshot has no
// instance of that name.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	stats := c.src()
	for i := range stats {
		if stats[i].Name == c.instance {
			c.d.collect(ch, &stats[i])
			return
		}
	}
}

// descs are the metric descriptors of one collector, built once because the model name is fixed.
// Every family has engine_type as its first variable label: the role is known only from the
// stats, not when the collector is built.
type descs struct {
	all []*prometheus.Desc

	// Tokenizer families (labels engine_type, model_name).
	promptTokens, generationTokens, cachedTokens, numRequests *prometheus.Desc
	ttft, itl, e2e                                            *prometheus.Desc

	// Scheduler families (labels engine_type, model_name, tp_rank, pp_rank, moe_ep_rank).
	realtimeTokens, prefillEffectiveTokens                     *prometheus.Desc
	numRunning, numQueue, tokenUsage, maxTotalTokens, numUsed  *prometheus.Desc
	kvAvailable, kvEvictable, kvUsed                           *prometheus.Desc
	hicacheHostUsed, hicacheHostTotal                          *prometheus.Desc
	prefillBootstrapQueue, prefillInflightQueue, utilization   *prometheus.Desc
	decodePreallocQueue, decodeTransferQueue, decodeSumSeqLens *prometheus.Desc
	lentTokens                                                 *prometheus.Desc
}

func newDescs(model string) (*descs, error) {
	sched := prometheus.Labels{"model_name": model, "tp_rank": rank, "pp_rank": rank, "moe_ep_rank": rank}
	tok := prometheus.Labels{"model_name": model}
	d := &descs{}
	var errs []error
	mk := func(name, help string, constLabels prometheus.Labels, extra ...string) *prometheus.Desc {
		desc := prometheus.NewDesc(name, help, append([]string{labelEngineType}, extra...), constLabels)
		if err := desc.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		d.all = append(d.all, desc)
		return desc
	}

	// HELP texts are SGLang's own (observability/metrics_collector.py), except where noted.
	d.promptTokens = mk("sglang:prompt_tokens_total", "Number of prefill tokens processed.", tok)
	d.generationTokens = mk("sglang:generation_tokens_total", "Number of generation tokens processed.", tok)
	d.cachedTokens = mk("sglang:cached_tokens_total",
		"Number of cached prompt tokens by source (device/host/storage).", tok, labelCacheSource)
	d.numRequests = mk("sglang:num_requests_total", "Number of requests processed.", tok)
	d.ttft = mk("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", tok)
	d.itl = mk("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tok)
	d.e2e = mk("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", tok)

	d.realtimeTokens = mk("sglang:realtime_tokens_total",
		"Total number of tokens processed (updated on each log interval). "+
			"mode: prefill_compute, prefill_cache, decode.", sched, labelMode)
	d.prefillEffectiveTokens = mk("sglang:prefill_effective_tokens_total",
		"Effective prefill tokens with retracted-request re-counts excluded, updated on each log "+
			"interval. mode: device_hit, host_hit, storage_hit, input. Windowed prefix cache hit "+
			"rate = rate(sum of *_hit) / rate(sum of all modes); per-tier rate uses a single *_hit "+
			"mode in the numerator.", sched, labelMode)
	d.numRunning = mk("sglang:num_running_reqs", "The number of running requests.", sched)
	d.numQueue = mk("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sched)
	d.tokenUsage = mk("sglang:token_usage", "The token usage.", sched)
	d.maxTotalTokens = mk("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", sched)
	d.numUsed = mk("sglang:num_used_tokens", "The number of used tokens.", sched)
	d.kvAvailable = mk("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.", sched)
	d.kvEvictable = mk("sglang:kv_evictable_tokens",
		"Number of evictable (radix-cached) token slots in the KV cache pool.", sched)
	d.kvUsed = mk("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.", sched)
	d.hicacheHostUsed = mk("sglang:hicache_host_used_tokens",
		"Number of tokens currently used in the host KV cache.", sched)
	d.hicacheHostTotal = mk("sglang:hicache_host_total_tokens", "Total capacity of the host KV cache in tokens.", sched)
	d.prefillBootstrapQueue = mk("sglang:num_prefill_bootstrap_queue_reqs",
		"The number of requests in the prefill bootstrap queue.", sched)
	d.prefillInflightQueue = mk("sglang:num_prefill_inflight_queue_reqs",
		"The number of requests in the prefill inflight queue.", sched)
	d.utilization = mk("sglang:utilization", "The utilization.", sched)
	d.decodePreallocQueue = mk("sglang:num_decode_prealloc_queue_reqs",
		"The number of requests in the decode prealloc queue.", sched)
	d.decodeTransferQueue = mk("sglang:num_decode_transfer_queue_reqs",
		"The number of requests in the decode transfer queue.", sched)
	d.decodeSumSeqLens = mk("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode.", sched)
	// Not an SGLang series (no SGLang version lends decode KV), hence basin's prefix.
	d.lentTokens = mk("basin_sim_lent_tokens",
		"Number of KV token slots a simulated decode instance keeps for lending back to prefill "+
			"(part of sglang:kv_evictable_tokens).", sched)

	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("metric descriptors: %w", err)
	}
	return d, nil
}

// collect emits the series of one instance.
//
// sglang:cache_hit_rate is deliberately absent on both roles. SGLang sets it to the hit rate of
// the last prefill batch (always 0 on decode): a point sample that basin must never read, since it
// computes hit rates from counter deltas. The simulator does not keep the last batch's hit rate,
// and a made-up value would invite exactly the misuse the gauge is known for.
func (d *descs) collect(ch chan<- prometheus.Metric, st *sim.InstanceStats) {
	role := string(st.Role)
	if st.Role != sim.RolePrefill && st.Role != sim.RoleDecode {
		ch <- prometheus.NewInvalidMetric(d.numRunning,
			fmt.Errorf("instance %s: unknown role %q (want %s or %s)", st.Name, st.Role, sim.RolePrefill, sim.RoleDecode))
		return
	}
	gauge := func(desc *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, role)
	}
	counter := func(desc *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, role)
	}
	counterBy := func(desc *prometheus.Desc, label string, v float64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, role, label)
	}

	// Both roles.
	counter(d.numRequests, st.Requests)
	gauge(d.numRunning, float64(st.Running))
	gauge(d.numQueue, float64(st.Queued))
	gauge(d.maxTotalTokens, float64(st.MaxTotalTokens))
	gauge(d.kvAvailable, float64(st.AvailableTokens))
	gauge(d.kvEvictable, float64(st.EvictableTokens))
	gauge(d.kvUsed, float64(st.UsedTokens))
	gauge(d.numUsed, float64(st.UsedTokens))
	usage := 0.0
	if st.MaxTotalTokens > 0 {
		usage = float64(st.UsedTokens) / float64(st.MaxTotalTokens)
	}
	gauge(d.tokenUsage, usage)
	// SGLang creates the HiCache gauges only with --enable-hierarchical-cache.
	if st.HostTotalTokens > 0 {
		gauge(d.hicacheHostUsed, float64(st.HostUsedTokens))
		gauge(d.hicacheHostTotal, float64(st.HostTotalTokens))
	}
	ch <- histogram(d.ttft, &st.TTFT, role)
	ch <- histogram(d.e2e, &st.E2E, role)

	switch st.Role {
	case sim.RolePrefill:
		hit := st.CachedDevice + st.CachedHost + st.CachedLent
		counter(d.promptTokens, st.PromptTokens)
		counterBy(d.cachedTokens, "device", st.CachedDevice)
		counterBy(d.cachedTokens, "host", st.CachedHost)
		counterBy(d.cachedTokens, "storage_lent", st.CachedLent)
		// input is the computed part, so that the modes add up to the prompt tokens and
		// sum(*_hit)/sum(all modes) is the hit rate, as SGLang documents.
		counterBy(d.prefillEffectiveTokens, "input", st.ComputedTokens)
		counterBy(d.prefillEffectiveTokens, "device_hit", st.CachedDevice)
		counterBy(d.prefillEffectiveTokens, "host_hit", st.CachedHost)
		counterBy(d.prefillEffectiveTokens, "storage_hit", st.CachedLent)
		counterBy(d.realtimeTokens, "prefill_compute", st.ComputedTokens)
		counterBy(d.realtimeTokens, "prefill_cache", hit)
		gauge(d.prefillBootstrapQueue, float64(st.BootstrapQueue))
		// In SGLang a request sits in the prefill inflight queue while its KV is sent to decode.
		// The simulator releases the prefill instance when the forward pass ends and tracks the
		// transfer on the receiving decode instance only (num_decode_transfer_queue_reqs), so a
		// prefill instance has nothing in flight of its own. The family stays, at 0, so the PD
		// queue-depth sum bootstrap + queue + inflight works unchanged and counts no transfer
		// twice.
		gauge(d.prefillInflightQueue, 0)
		// SGLang reports -1 on prefill instances.
		gauge(d.utilization, -1)
	case sim.RoleDecode:
		counter(d.generationTokens, st.GenerationTokens)
		counterBy(d.realtimeTokens, "decode", st.GenerationTokens)
		gauge(d.decodePreallocQueue, float64(st.PreallocQueue))
		gauge(d.decodeTransferQueue, float64(st.TransferQueue))
		gauge(d.decodeSumSeqLens, float64(st.DecodeBatchTokens))
		gauge(d.lentTokens, float64(st.LentTokens))
		ch <- histogram(d.itl, &st.ITL, role)
	}
}

// histogram converts the simulator's non-cumulative float buckets into a Prometheus histogram:
// cumulative counts rounded down, never decreasing and never above the total count, so the
// implicit +Inf bucket (= count) stays the largest.
func histogram(desc *prometheus.Desc, h *sim.Histogram, labelValues ...string) prometheus.Metric {
	count, buckets := cumulative(h)
	return prometheus.MustNewConstHistogram(desc, count, h.Sum, buckets, labelValues...)
}

// cumulative returns floor(h.Count) and the cumulative bucket counts by upper bound. The
// fractional counts are summed in a different order from h.Count, so the floor of a running sum
// can exceed floor(h.Count) by one; it is capped.
func cumulative(h *sim.Histogram) (uint64, map[float64]uint64) {
	count := floorCount(h.Count)
	buckets := make(map[float64]uint64, len(h.Bounds))
	var sum float64
	var prev uint64
	for i, bound := range h.Bounds {
		if i < len(h.Counts) {
			sum += h.Counts[i]
		}
		n := max(prev, min(floorCount(sum), count))
		buckets[bound] = n
		prev = n
	}
	return count, buckets
}

// floorCount rounds a fractional observation count down; negative and NaN counts are 0.
func floorCount(x float64) uint64 {
	switch {
	case !(x >= 1):
		return 0
	case x >= math.MaxUint64:
		return math.MaxUint64
	}
	return uint64(x)
}
