package enginemetrics_test

import (
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/enginemetrics"
)

// Bucket layouts of SGLang's tokenizer histograms, as the simulator uses them.
var (
	ttftBounds = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	itlBounds  = []float64{0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
		0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0}
	e2eBounds = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
		1200, 1800, 2400}
)

// spread builds a histogram over bounds with fractional counts in every bucket.
func spread(bounds []float64) sim.Histogram {
	h := sim.Histogram{Bounds: bounds, Counts: make([]float64, len(bounds)+1)}
	for i := range h.Counts {
		c := 1.3 * float64(i%4)
		h.Counts[i] = c
		h.Count += c
		if i < len(bounds) {
			h.Sum += c * bounds[i]
		} else {
			h.Sum += c * 2 * bounds[len(bounds)-1]
		}
	}
	return h
}

func prefillStats() sim.InstanceStats {
	return sim.InstanceStats{
		Role: sim.RolePrefill, Index: 0, Name: "prefill-0",
		Requests:     40,
		PromptTokens: 100_000, CachedDevice: 60_000, CachedHost: 15_000, CachedLent: 5_000, ComputedTokens: 20_000,
		// Counters prefill never exports: they must not leak.
		GenerationTokens: 777,
		Running:          1, Queued: 3, BootstrapQueue: 2,
		MaxTotalTokens: 650_000, AvailableTokens: 100_000, EvictableTokens: 500_000, UsedTokens: 50_000,
		HostUsedTokens: 700_000, HostTotalTokens: 1_300_000,
		TTFT: sim.Histogram{Bounds: []float64{0.1, 0.2, 0.4}, Counts: []float64{0.5, 1.7, 2.9, 0.4}, Sum: 1.5, Count: 5.5},
		ITL:  spread(itlBounds),
		E2E:  spread(e2eBounds),
	}
}

func decodeStats() sim.InstanceStats {
	return sim.InstanceStats{
		Role: sim.RoleDecode, Index: 0, Name: "decode-0",
		Requests:         30,
		GenerationTokens: 12_345.5,
		// Prompt counters decode never exports: they must not leak.
		PromptTokens: 999, CachedDevice: 555,
		Running: 7, PreallocQueue: 4, TransferQueue: 2,
		MaxTotalTokens: 800_000, AvailableTokens: 500_000, EvictableTokens: 100_000, LentTokens: 100_000,
		UsedTokens: 200_000, DecodeBatchTokens: 300_000,
		HostUsedTokens: 0, HostTotalTokens: 0,
		TTFT: spread(ttftBounds),
		ITL:  spread(itlBounds),
		E2E:  spread(e2eBounds),
	}
}

func fixed(st ...sim.InstanceStats) enginemetrics.Source {
	return func() []sim.InstanceStats { return slices.Clone(st) }
}

// serve exposes every instance at /<name>/metrics, as a deployment of real engines would.
func serve(t testing.TB, src enginemetrics.Source, names []string, o enginemetrics.Options) *httptest.Server {
	t.Helper()
	regs, err := enginemetrics.Registries(src, names, o)
	require.NoError(t, err)
	mux := http.NewServeMux()
	for name, reg := range regs {
		mux.Handle("/"+name+"/metrics", enginemetrics.Handler(reg))
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// scrape fetches one instance's endpoint the way basin's collector does and parses the text.
func scrape(t testing.TB, srv *httptest.Server, instance string) map[string]*dto.MetricFamily {
	t.Helper()
	body, status := get(t, srv, instance)
	require.Equal(t, http.StatusOK, status, body)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err, body)
	return fams
}

func get(t testing.TB, srv *httptest.Server, instance string) (string, int) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/"+instance+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode == http.StatusOK {
		require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	}
	return string(b), resp.StatusCode
}

var (
	schedulerLabels = []string{"engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}
	tokenizerLabels = []string{"engine_type", "model_name"}
)

// family describes one expected family: its type and its label names besides le.
type family struct {
	typ    dto.MetricType
	labels []string
}

func withLabel(base []string, l string) []string { return append(slices.Clone(base), l) }

var (
	counter   = dto.MetricType_COUNTER
	gauge     = dto.MetricType_GAUGE
	histogram = dto.MetricType_HISTOGRAM
)

func commonFamilies() map[string]family {
	return map[string]family{
		"sglang:num_requests_total":          {counter, tokenizerLabels},
		"sglang:time_to_first_token_seconds": {histogram, tokenizerLabels},
		"sglang:e2e_request_latency_seconds": {histogram, tokenizerLabels},
		"sglang:num_running_reqs":            {gauge, schedulerLabels},
		"sglang:num_queue_reqs":              {gauge, schedulerLabels},
		"sglang:token_usage":                 {gauge, schedulerLabels},
		"sglang:max_total_num_tokens":        {gauge, schedulerLabels},
		"sglang:kv_available_tokens":         {gauge, schedulerLabels},
		"sglang:kv_evictable_tokens":         {gauge, schedulerLabels},
		"sglang:kv_used_tokens":              {gauge, schedulerLabels},
		"sglang:num_used_tokens":             {gauge, schedulerLabels},
	}
}

func prefillFamilies(hicache bool) map[string]family {
	f := commonFamilies()
	f["sglang:prompt_tokens_total"] = family{counter, tokenizerLabels}
	f["sglang:cached_tokens_total"] = family{counter, withLabel(tokenizerLabels, "cache_source")}
	f["sglang:prefill_effective_tokens_total"] = family{counter, withLabel(schedulerLabels, "mode")}
	f["sglang:realtime_tokens_total"] = family{counter, withLabel(schedulerLabels, "mode")}
	f["sglang:num_prefill_bootstrap_queue_reqs"] = family{gauge, schedulerLabels}
	f["sglang:num_prefill_inflight_queue_reqs"] = family{gauge, schedulerLabels}
	f["sglang:utilization"] = family{gauge, schedulerLabels}
	if hicache {
		f["sglang:hicache_host_used_tokens"] = family{gauge, schedulerLabels}
		f["sglang:hicache_host_total_tokens"] = family{gauge, schedulerLabels}
	}
	return f
}

func decodeFamilies() map[string]family {
	f := commonFamilies()
	f["sglang:generation_tokens_total"] = family{counter, tokenizerLabels}
	f["sglang:realtime_tokens_total"] = family{counter, withLabel(schedulerLabels, "mode")}
	f["sglang:num_decode_prealloc_queue_reqs"] = family{gauge, schedulerLabels}
	f["sglang:num_decode_transfer_queue_reqs"] = family{gauge, schedulerLabels}
	f["sglang:decode_sum_seq_lens"] = family{gauge, schedulerLabels}
	f["basin_sim_lent_tokens"] = family{gauge, schedulerLabels}
	f["sglang:inter_token_latency_seconds"] = family{histogram, tokenizerLabels}
	return f
}

// sample is one expected value: a family, the labels that pick one series, and its value.
type sample struct {
	family string
	match  map[string]string
	value  float64
}

func TestExposition(t *testing.T) {
	noHost := prefillStats()
	noHost.Name, noHost.HostUsedTokens, noHost.HostTotalTokens = "prefill-1", 0, 0
	src := fixed(prefillStats(), noHost, decodeStats())

	tests := []struct {
		name     string
		opts     enginemetrics.Options
		instance string
		role     string
		model    string
		families map[string]family
		samples  []sample
	}{
		{
			name: "prefill with host tier", opts: enginemetrics.Options{ModelName: "qwen3-coder"},
			instance: "prefill-0", role: "prefill", model: "qwen3-coder",
			families: prefillFamilies(true),
			samples: []sample{
				{"sglang:prompt_tokens_total", nil, 100_000},
				{"sglang:num_requests_total", nil, 40},
				{"sglang:cached_tokens_total", map[string]string{"cache_source": "device"}, 60_000},
				{"sglang:cached_tokens_total", map[string]string{"cache_source": "host"}, 15_000},
				{"sglang:cached_tokens_total", map[string]string{"cache_source": "storage_lent"}, 5_000},
				{"sglang:prefill_effective_tokens_total", map[string]string{"mode": "input"}, 20_000},
				{"sglang:prefill_effective_tokens_total", map[string]string{"mode": "device_hit"}, 60_000},
				{"sglang:prefill_effective_tokens_total", map[string]string{"mode": "host_hit"}, 15_000},
				{"sglang:prefill_effective_tokens_total", map[string]string{"mode": "storage_hit"}, 5_000},
				{"sglang:realtime_tokens_total", map[string]string{"mode": "prefill_compute"}, 20_000},
				{"sglang:realtime_tokens_total", map[string]string{"mode": "prefill_cache"}, 80_000},
				{"sglang:num_running_reqs", nil, 1},
				{"sglang:num_queue_reqs", nil, 3},
				{"sglang:num_prefill_bootstrap_queue_reqs", nil, 2},
				{"sglang:num_prefill_inflight_queue_reqs", nil, 0},
				{"sglang:utilization", nil, -1},
				{"sglang:max_total_num_tokens", nil, 650_000},
				{"sglang:kv_available_tokens", nil, 100_000},
				{"sglang:kv_evictable_tokens", nil, 500_000},
				{"sglang:kv_used_tokens", nil, 50_000},
				{"sglang:num_used_tokens", nil, 50_000},
				{"sglang:token_usage", nil, 50_000.0 / 650_000},
				{"sglang:hicache_host_used_tokens", nil, 700_000},
				{"sglang:hicache_host_total_tokens", nil, 1_300_000},
			},
		},
		{
			name: "prefill without host tier", instance: "prefill-1", role: "prefill", model: "basin-sim",
			families: prefillFamilies(false),
			samples: []sample{
				{"sglang:prompt_tokens_total", nil, 100_000},
				{"sglang:prefill_effective_tokens_total", map[string]string{"mode": "host_hit"}, 15_000},
			},
		},
		{
			name: "decode", instance: "decode-0", role: "decode", model: "basin-sim",
			families: decodeFamilies(),
			samples: []sample{
				{"sglang:generation_tokens_total", nil, 12_345.5},
				{"sglang:realtime_tokens_total", map[string]string{"mode": "decode"}, 12_345.5},
				{"sglang:num_requests_total", nil, 30},
				{"sglang:num_running_reqs", nil, 7},
				{"sglang:num_queue_reqs", nil, 0},
				{"sglang:num_decode_prealloc_queue_reqs", nil, 4},
				{"sglang:num_decode_transfer_queue_reqs", nil, 2},
				{"sglang:decode_sum_seq_lens", nil, 300_000},
				{"basin_sim_lent_tokens", nil, 100_000},
				{"sglang:max_total_num_tokens", nil, 800_000},
				{"sglang:kv_available_tokens", nil, 500_000},
				{"sglang:kv_evictable_tokens", nil, 100_000},
				{"sglang:kv_used_tokens", nil, 200_000},
				{"sglang:num_used_tokens", nil, 200_000},
				{"sglang:token_usage", nil, 0.25},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := serve(t, src, []string{"prefill-0", "prefill-1", "decode-0"}, tc.opts)
			fams := scrape(t, srv, tc.instance)

			assert.Equal(t, wantTypes(tc.families), types(fams), "family names and types")
			assert.NotContains(t, fams, "sglang:cache_hit_rate")

			for name, mf := range fams {
				f, ok := tc.families[name]
				if !ok {
					continue
				}
				for _, m := range mf.GetMetric() {
					labels := labelMap(m)
					assert.ElementsMatch(t, f.labels, slices.Collect(maps.Keys(labels)), "%s label names", name)
					assert.Equal(t, tc.role, labels["engine_type"], "%s engine_type", name)
					assert.Equal(t, tc.model, labels["model_name"], "%s model_name", name)
					if slices.Contains(f.labels, "tp_rank") {
						for _, l := range []string{"tp_rank", "pp_rank", "moe_ep_rank"} {
							assert.Equal(t, "0", labels[l], "%s %s", name, l)
						}
					}
				}
			}
			for _, s := range tc.samples {
				assert.InDelta(t, s.value, value(t, fams, s.family, s.match), 1e-9, "%s%v", s.family, s.match)
			}
		})
	}
}

func TestHitRateFromEffectiveTokens(t *testing.T) {
	tests := []struct {
		name                        string
		device, host, lent, compute float64
	}{
		{"all tiers", 60_000, 15_000, 5_000, 20_000},
		{"device only", 90_000, 0, 0, 10_000},
		{"lent only", 0, 0, 30_000, 70_000},
		{"cold", 0, 0, 0, 50_000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := prefillStats()
			st.CachedDevice, st.CachedHost, st.CachedLent, st.ComputedTokens = tc.device, tc.host, tc.lent, tc.compute
			st.PromptTokens = tc.device + tc.host + tc.lent + tc.compute
			srv := serve(t, fixed(st), []string{"prefill-0"}, enginemetrics.Options{})
			fams := scrape(t, srv, "prefill-0")

			hits, all := effectiveTokens(t, fams)
			want := (st.CachedDevice + st.CachedHost + st.CachedLent) / st.PromptTokens
			assert.InDelta(t, want, hits/all, 1e-12)
			assert.InDelta(t, st.PromptTokens, all, 1e-9, "modes add up to the prompt tokens")
			// The tokenizer's view agrees: cached (all sources) over prompt tokens.
			var cached float64
			for _, m := range fams["sglang:cached_tokens_total"].GetMetric() {
				cached += m.GetCounter().GetValue()
			}
			assert.InDelta(t, want, cached/value(t, fams, "sglang:prompt_tokens_total", nil), 1e-12)
		})
	}
}

func TestHistograms(t *testing.T) {
	tests := []struct {
		name        string
		h           sim.Histogram
		wantCount   uint64
		wantBuckets []uint64 // cumulative, finite bounds only
	}{
		{
			name:      "fractional counts round down",
			h:         sim.Histogram{Bounds: []float64{0.1, 0.2, 0.4}, Counts: []float64{0.5, 1.7, 2.9, 0.4}, Sum: 1.5, Count: 5.5},
			wantCount: 5, wantBuckets: []uint64{0, 2, 5},
		},
		{
			// 0.1+0.2+0.7 sums to 1.0000000000000002 while Count was accumulated as just below 1:
			// the bucket must not exceed the count.
			name:      "running sum above count is capped",
			h:         sim.Histogram{Bounds: []float64{1, 2, 3}, Counts: []float64{0.1, 0.2, 0.7, 0}, Sum: 1, Count: 0.9999999999999999},
			wantCount: 0, wantBuckets: []uint64{0, 0, 0},
		},
		{
			name:      "everything above the last bound",
			h:         sim.Histogram{Bounds: []float64{1, 2}, Counts: []float64{0, 0, 3}, Sum: 30, Count: 3},
			wantCount: 3, wantBuckets: []uint64{0, 0},
		},
		{
			name:      "empty",
			h:         sim.Histogram{Bounds: []float64{1, 2}, Counts: []float64{0, 0, 0}},
			wantCount: 0, wantBuckets: []uint64{0, 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := decodeStats()
			st.ITL = tc.h
			srv := serve(t, fixed(st), []string{"decode-0"}, enginemetrics.Options{})
			fams := scrape(t, srv, "decode-0")
			mf := fams["sglang:inter_token_latency_seconds"]
			require.NotNil(t, mf)
			require.Len(t, mf.GetMetric(), 1)
			h := mf.GetMetric()[0].GetHistogram()

			assert.Equal(t, tc.wantCount, h.GetSampleCount())
			assert.InDelta(t, tc.h.Sum, h.GetSampleSum(), 1e-9)
			var bounds []float64
			var counts []uint64
			for _, b := range h.GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
				counts = append(counts, b.GetCumulativeCount())
			}
			assert.Equal(t, append(slices.Clone(tc.h.Bounds), math.Inf(1)), bounds)
			assert.Equal(t, append(slices.Clone(tc.wantBuckets), tc.wantCount), counts)
			assertMonotone(t, h)
		})
	}

	t.Run("every histogram of the fixtures", func(t *testing.T) {
		srv := serve(t, fixed(prefillStats(), decodeStats()), []string{"prefill-0", "decode-0"}, enginemetrics.Options{})
		for _, inst := range []string{"prefill-0", "decode-0"} {
			for name, mf := range scrape(t, srv, inst) {
				if mf.GetType() != dto.MetricType_HISTOGRAM {
					continue
				}
				for _, m := range mf.GetMetric() {
					require.NotEmpty(t, m.GetHistogram().GetBucket(), "%s %s", inst, name)
					assertMonotone(t, m.GetHistogram())
				}
			}
		}
	})
}

// assertMonotone checks that cumulative bucket counts never decrease and that the +Inf bucket
// equals the sample count.
func assertMonotone(t *testing.T, h *dto.Histogram) {
	t.Helper()
	buckets := h.GetBucket()
	require.NotEmpty(t, buckets)
	for i := 1; i < len(buckets); i++ {
		assert.LessOrEqual(t, buckets[i-1].GetCumulativeCount(), buckets[i].GetCumulativeCount(),
			"bucket le=%v", buckets[i].GetUpperBound())
	}
	last := buckets[len(buckets)-1]
	assert.True(t, math.IsInf(last.GetUpperBound(), 1), "last bucket is +Inf")
	assert.Equal(t, h.GetSampleCount(), last.GetCumulativeCount(), "+Inf bucket = count")
}

func TestAbsentInstance(t *testing.T) {
	tests := []struct {
		name     string
		src      enginemetrics.Source
		instance string
	}{
		{"source returns nothing", fixed(), "prefill-0"},
		{"source returns nil", func() []sim.InstanceStats { return nil }, "prefill-0"},
		{"source lacks the instance", fixed(decodeStats()), "prefill-0"},
		{"names are exact", fixed(prefillStats()), "prefill-00"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			regs, err := enginemetrics.Registries(tc.src, []string{tc.instance}, enginemetrics.Options{})
			require.NoError(t, err)
			require.Contains(t, regs, tc.instance)
			fams, err := regs[tc.instance].Gather()
			require.NoError(t, err)
			assert.Empty(t, fams, "no samples, not zeros")

			srv := serve(t, tc.src, []string{tc.instance}, enginemetrics.Options{})
			body, status := get(t, srv, tc.instance)
			assert.Equal(t, http.StatusOK, status)
			assert.Empty(t, body)
		})
	}

	t.Run("unlisted instance has no registry", func(t *testing.T) {
		regs, err := enginemetrics.Registries(fixed(prefillStats(), decodeStats()), []string{"decode-0"}, enginemetrics.Options{})
		require.NoError(t, err)
		assert.NotContains(t, regs, "prefill-0")
		assert.Len(t, regs, 1)
		fams, err := regs["decode-0"].Gather()
		require.NoError(t, err)
		for _, mf := range fams {
			for _, m := range mf.GetMetric() {
				assert.Equal(t, "decode", labelMap(m)["engine_type"], mf.GetName())
			}
		}
	})
}

func TestInvalid(t *testing.T) {
	src := fixed(prefillStats())
	tests := []struct {
		name  string
		src   enginemetrics.Source
		names []string
		opts  enginemetrics.Options
	}{
		{"nil source", nil, []string{"prefill-0"}, enginemetrics.Options{}},
		{"empty instance name", src, []string{""}, enginemetrics.Options{}},
		{"instance listed twice", src, []string{"prefill-0", "prefill-0"}, enginemetrics.Options{}},
		{"model name not UTF-8", src, []string{"prefill-0"}, enginemetrics.Options{ModelName: "\xff"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			regs, err := enginemetrics.Registries(tc.src, tc.names, tc.opts)
			assert.Error(t, err)
			assert.Nil(t, regs)
		})
	}

	t.Run("unknown role fails the scrape", func(t *testing.T) {
		st := prefillStats()
		st.Role = "unified"
		srv := serve(t, fixed(st), []string{"prefill-0"}, enginemetrics.Options{})
		body, status := get(t, srv, "prefill-0")
		assert.Equal(t, http.StatusInternalServerError, status)
		assert.Contains(t, body, `unknown role "unified"`)
	})
}

// TestSimulator scrapes a real simulated 1P1D deployment twice, five simulated minutes apart.
func TestSimulator(t *testing.T) {
	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	require.NoError(t, err)
	w, err := sim.SyntheticWorkload("terminal-bench")
	require.NoError(t, err)
	s, err := sim.New(sim.Options{
		Seed:        1,
		Deployment:  dep,
		Streams:     []sim.Stream{{Class: "base", Workload: w, RatePerMin: 3.3}},
		Duration:    30 * time.Minute,
		MeasureFrom: 5 * time.Minute,
		MeasureTo:   25 * time.Minute,
		NoDrain:     true,
	})
	require.NoError(t, err)

	// The simulator is not safe for concurrent use: the scrape handlers and the test goroutine
	// share it under one lock, as a real harness would.
	var mu sync.Mutex
	src := func() []sim.InstanceStats {
		mu.Lock()
		defer mu.Unlock()
		return s.Stats()
	}
	run := func(to time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		s.RunUntil(to)
	}
	var names []string
	for _, st := range src() {
		names = append(names, st.Name)
	}
	require.ElementsMatch(t, []string{"prefill-0", "decode-0"}, names)
	srv := serve(t, src, names, enginemetrics.Options{})

	run(20 * time.Minute)
	p1, d1 := scrape(t, srv, "prefill-0"), scrape(t, srv, "decode-0")
	run(25 * time.Minute)
	p2, d2 := scrape(t, srv, "prefill-0"), scrape(t, srv, "decode-0")

	for inst, fams := range map[string]map[string]*dto.MetricFamily{"prefill-0": p2, "decode-0": d2} {
		assert.NotContains(t, fams, "sglang:cache_hit_rate", inst)
	}
	// The preset has no host tier, so no hicache gauges.
	assert.Equal(t, wantTypes(prefillFamilies(false)), types(p2), "prefill families")
	assert.Equal(t, wantTypes(decodeFamilies()), types(d2), "decode families")

	for _, c := range []struct {
		fams  [2]map[string]*dto.MetricFamily
		name  string
		match map[string]string
	}{
		{[2]map[string]*dto.MetricFamily{p1, p2}, "sglang:prompt_tokens_total", nil},
		{[2]map[string]*dto.MetricFamily{p1, p2}, "sglang:num_requests_total", nil},
		{[2]map[string]*dto.MetricFamily{p1, p2}, "sglang:realtime_tokens_total", map[string]string{"mode": "prefill_cache"}},
		{[2]map[string]*dto.MetricFamily{p1, p2}, "sglang:prefill_effective_tokens_total", map[string]string{"mode": "device_hit"}},
		{[2]map[string]*dto.MetricFamily{d1, d2}, "sglang:generation_tokens_total", nil},
		{[2]map[string]*dto.MetricFamily{d1, d2}, "sglang:realtime_tokens_total", map[string]string{"mode": "decode"}},
		{[2]map[string]*dto.MetricFamily{d1, d2}, "sglang:num_requests_total", nil},
	} {
		before, after := value(t, c.fams[0], c.name, c.match), value(t, c.fams[1], c.name, c.match)
		assert.Greater(t, before, 0.0, "%s%v at 20m", c.name, c.match)
		assert.Greater(t, after, before, "%s%v grew", c.name, c.match)
	}
	for _, name := range []string{"sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"} {
		before := d1[name].GetMetric()[0].GetHistogram().GetSampleCount()
		after := d2[name].GetMetric()[0].GetHistogram().GetSampleCount()
		assert.Greater(t, after, before, "decode %s count grew", name)
		assertMonotone(t, d2[name].GetMetric()[0].GetHistogram())
	}

	// The windowed hit rate basin computes: deltas of the effective-token counters.
	h1, a1 := effectiveTokens(t, p1)
	h2, a2 := effectiveTokens(t, p2)
	require.Greater(t, a2-a1, 0.0)
	rate := (h2 - h1) / (a2 - a1)
	t.Logf("windowed hit rate 20m–25m: %.4f over %.0f prompt tokens", rate, a2-a1)
	assert.Greater(t, rate, 0.85, "a healthy run keeps its prefixes cached")
	assert.LessOrEqual(t, rate, 1.0)
	// The realtime counters carry the same split.
	cache := value(t, p2, "sglang:realtime_tokens_total", map[string]string{"mode": "prefill_cache"}) -
		value(t, p1, "sglang:realtime_tokens_total", map[string]string{"mode": "prefill_cache"})
	assert.InDelta(t, rate, cache/(a2-a1), 1e-12)
}

func BenchmarkGather(b *testing.B) {
	for _, st := range []sim.InstanceStats{prefillStats(), decodeStats()} {
		b.Run(string(st.Role), func(b *testing.B) {
			regs, err := enginemetrics.Registries(fixed(prefillStats(), decodeStats()), []string{st.Name}, enginemetrics.Options{})
			require.NoError(b, err)
			reg := regs[st.Name]
			b.ReportAllocs()
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func types(fams map[string]*dto.MetricFamily) map[string]dto.MetricType {
	out := map[string]dto.MetricType{}
	for name, mf := range fams {
		out[name] = mf.GetType()
	}
	return out
}

func wantTypes(fs map[string]family) map[string]dto.MetricType {
	out := map[string]dto.MetricType{}
	for name, f := range fs {
		out[name] = f.typ
	}
	return out
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// value returns the value of the one counter or gauge series of family name whose labels include
// match.
func value(t testing.TB, fams map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	t.Helper()
	mf, ok := fams[name]
	require.True(t, ok, "family %s missing", name)
	var found []float64
	for _, m := range mf.GetMetric() {
		labels := labelMap(m)
		ok := true
		for k, v := range match {
			ok = ok && labels[k] == v
		}
		if !ok {
			continue
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			found = append(found, m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			found = append(found, m.GetGauge().GetValue())
		default:
			t.Fatalf("%s is a %s", name, mf.GetType())
		}
	}
	require.Len(t, found, 1, "series %s%v", name, match)
	return found[0]
}

// effectiveTokens returns the hit tokens (all *_hit modes) and all tokens (all modes) of
// sglang:prefill_effective_tokens_total, the way SGLang documents the windowed hit rate.
func effectiveTokens(t testing.TB, fams map[string]*dto.MetricFamily) (hits, all float64) {
	t.Helper()
	mf, ok := fams["sglang:prefill_effective_tokens_total"]
	require.True(t, ok)
	for _, m := range mf.GetMetric() {
		v := m.GetCounter().GetValue()
		all += v
		if strings.HasSuffix(labelMap(m)["mode"], "_hit") {
			hits += v
		}
	}
	return hits, all
}
