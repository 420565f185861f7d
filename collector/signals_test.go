package collector

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStaleness: a signal is OK while its oldest input is at most StaleAfter intervals old,
// Stale after, OK again with a new reading; a sum is only as fresh as its stalest contributor.
func TestStaleness(t *testing.T) {
	p0 := Target{Name: "prefill-0", Role: RolePrefill}
	p1 := Target{Name: "prefill-1", Role: RolePrefill}
	c, _, _ := newTest(t, Options{Interval: 10 * time.Second, StaleAfter: 2}) // stale after 20 s
	f := fixture(t, "sglang_pd_prefill")
	require.NoError(t, c.Ingest(t0, p0, f))
	require.NoError(t, c.Ingest(t0, p1, f))

	for _, tc := range []struct {
		at   time.Duration
		want State
	}{
		{0, OK},
		{20 * time.Second, OK},
		{20*time.Second + time.Millisecond, Stale},
		{time.Hour, Stale},
	} {
		snap := c.SnapshotAt(t0.Add(tc.at))
		assert.Equal(t, tc.want, snap.State(CacheCapacity), "at %v", tc.at)
		_, isOK := snap.Get(CacheCapacity)
		assert.Equal(t, tc.want == OK, isOK, "at %v", tc.at)
		assert.Equal(t, 2*1_950_000.0, snap.Signals[CacheCapacity].V, "the last value is kept")
	}

	// prefill-1 answers again, prefill-0 does not: the sum stays stale.
	later := t0.Add(time.Minute)
	require.NoError(t, c.Ingest(later, p1, f))
	snap := c.SnapshotAt(later)
	assert.Equal(t, Stale, snap.State(CacheCapacity), "prefill-0's part is a minute old")
	assert.Equal(t, t0, snap.Signals[CacheCapacity].At)
	assert.Equal(t, []string{"cache_capacity_tokens stale", "hit_rate missing"}, snap.Blind([]Signal{CacheCapacity, HitRate}))

	require.NoError(t, c.Ingest(later, p0, f))
	snap = c.SnapshotAt(later)
	assert.Equal(t, OK, snap.State(CacheCapacity))
	assert.Equal(t, later, snap.Signals[CacheCapacity].At)
}

// TestMissingNeverZero: signals nobody provides are Missing and Get says so; an engine that
// reports 0 is OK at 0.
func TestMissingNeverZero(t *testing.T) {
	c, _, _ := newTest(t, Options{})
	snap := c.Snapshot()
	for _, sig := range AllSignals() {
		v, ok := snap.Get(sig)
		assert.False(t, ok, sig)
		assert.Zero(t, v, sig)
		assert.Equal(t, Missing, snap.State(sig), sig)
	}
	require.NoError(t, c.Ingest(t0, Target{Name: "e", Role: RoleUnified}, fixture(t, "sglang_cached_only")))
	v, ok := c.Snapshot().Get(EngineQueue)
	assert.True(t, ok, "a real zero is a value")
	assert.Zero(t, v)
	_, ok = c.Snapshot().Get(CacheCapacity)
	assert.False(t, ok, "no max_total_num_tokens: missing, not 0")
}

// TestUnusableValues: NaN and ±Inf samples are absent, per sample.
func TestUnusableValues(t *testing.T) {
	prefill := Target{Name: "prefill-0", Role: RolePrefill}
	base := fixtureBytes(t, "sglang_pd_prefill")
	const usagePrefix = `sglang:token_usage{`
	const capPrefix = `sglang:max_total_num_tokens{`
	for _, tc := range []struct {
		name            string
		usage, capacity string
		wantUsage       want
		wantCapacity    want
	}{
		{"NaN usage", "NaN", "650000.0", missing, ok(1_950_000)},
		// The host tier alone is not an instance's capacity.
		{"+Inf capacity", "0.12", "+Inf", ok(0.12), missing},
		{"-Inf capacity, NaN usage", "NaN", "-Inf", missing, missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := replaceLine(t, base, usagePrefix, usagePrefix+prefillLabels+"} "+tc.usage)
			body = replaceLine(t, body, capPrefix, capPrefix+prefillLabels+"} "+tc.capacity)
			c, _, _ := newTest(t, Options{})
			require.NoError(t, c.IngestText(t0, prefill, bytes.NewReader(body)))
			assertSignals(t, c.SnapshotAt(t0), map[Signal]want{KVUsageMax: tc.wantUsage, CacheCapacity: tc.wantCapacity})
		})
	}

	t.Run("NaN in one of two series", func(t *testing.T) {
		// One DP rank's pool unreadable: the capacity is not the other rank's alone.
		body := []byte(`# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",engine_type="prefill"} NaN
sglang:max_total_num_tokens{dp_rank="1",engine_type="prefill"} 1000.0
`)
		c, _, _ := newTest(t, Options{})
		require.NoError(t, c.IngestText(t0, prefill, bytes.NewReader(body)))
		assertSignals(t, c.SnapshotAt(t0), map[Signal]want{CacheCapacity: missing})
	})
}

const prefillLabels = `engine_type="prefill",model_name="qwen3-coder",moe_ep_rank="0",pp_rank="0",tp_rank="0"`

// TestSeriesRules: duplicates, ranks, priorities and cache sources are each counted once.
func TestSeriesRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target Target
		body   string
		want   map[Signal]want
		dups   float64
	}{
		{
			name:   "duplicate series: the first counts",
			target: Target{Name: "p", Role: RolePrefill},
			body: `# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="prefill",tp_rank="0"} 1000.0
sglang:max_total_num_tokens{engine_type="prefill",tp_rank="0"} 5000.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="prefill",tp_rank="0"} 0.5
sglang:token_usage{tp_rank="0",engine_type="prefill"} 0.9
`,
			want: map[Signal]want{CacheCapacity: ok(1000), KVUsageMax: ok(0.5)},
			dups: 2,
		},
		{
			name:   "duplicate histogram buckets: the first counts",
			target: Target{Name: "d", Role: RoleDecode},
			body: `# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="1.0"} 10.0
sglang:time_to_first_token_seconds_bucket{le="1.0"} 99.0
sglang:time_to_first_token_seconds_bucket{le="+Inf"} 10.0
sglang:time_to_first_token_seconds_count 10.0
sglang:time_to_first_token_seconds_sum 5.0
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="decode"} 7.0
`,
			want: map[Signal]want{DecodeCapacity: ok(7)},
		},
		{
			name:   "all TP ranks report one pool; DP ranks have their own",
			target: Target{Name: "p", Role: RolePrefill},
			body: `# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",engine_type="prefill",pp_rank="0",tp_rank="0"} 1000.0
sglang:max_total_num_tokens{dp_rank="0",engine_type="prefill",pp_rank="0",tp_rank="1"} 1000.0
sglang:max_total_num_tokens{dp_rank="1",engine_type="prefill",pp_rank="0",tp_rank="2"} 1000.0
sglang:max_total_num_tokens{dp_rank="1",engine_type="prefill",pp_rank="0",tp_rank="3"} 1000.0
`,
			want: map[Signal]want{CacheCapacity: ok(2000)},
		},
		{
			name:   "per-priority queues without a total are summed",
			target: Target{Name: "p", Role: RolePrefill},
			body: `# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{priority="0"} 3.0
sglang:num_queue_reqs{priority="1"} 4.0
# TYPE sglang:num_prefill_prealloc_queue_reqs gauge
sglang:num_prefill_prealloc_queue_reqs 5.0
`,
			// The older prealloc name counts as the bootstrap queue.
			want: map[Signal]want{EngineQueue: ok(12)},
		},
		{
			name:   "bootstrap queue preferred over its older name",
			target: Target{Name: "p", Role: RolePrefill},
			body: `# TYPE sglang:num_prefill_bootstrap_queue_reqs gauge
sglang:num_prefill_bootstrap_queue_reqs 2.0
# TYPE sglang:num_prefill_prealloc_queue_reqs gauge
sglang:num_prefill_prealloc_queue_reqs 2.0
`,
			want: map[Signal]want{EngineQueue: ok(2)},
		},
		{
			name:   "vllm waiting, not waiting_by_reason",
			target: Target{Name: "v", Role: RoleUnified},
			body: `# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0
`,
			want: map[Signal]want{EngineQueue: missing},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, reg, _ := newTest(t, Options{})
			require.NoError(t, c.IngestText(t0, tc.target, strings.NewReader(tc.body)))
			assertSignals(t, c.SnapshotAt(t0), tc.want)
			dups, _ := metricValue(gather(t, reg), "basin_scrape_duplicate_series_total", map[string]string{"target": tc.target.Name})
			assert.Equal(t, tc.dups, dups)
		})
	}
}

// TestCachedTokenSources: cached_tokens_total is summed over cache_source; "total" counts only
// when it is the only source.
func TestCachedTokenSources(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sources map[string]float64 // cache_source → increase; "-" for no label
		want    float64            // hits per 1000 prompt tokens
	}{
		{"device and host", map[string]float64{"device": 300, "host": 200}, 0.5},
		{"total alone", map[string]float64{"total": 400}, 0.4},
		{"breakdown and total: no double count", map[string]float64{"device": 300, "host": 200, "total": 500}, 0.5},
		{"storage backends", map[string]float64{"device": 100, "storage_mooncake": 150}, 0.25},
		{"no label (old)", map[string]float64{"-": 600}, 0.6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := func(scale float64) string {
				var b strings.Builder
				b.WriteString("# TYPE sglang:cached_tokens_total counter\n")
				for _, src := range sortedSources(tc.sources) {
					if src == "-" {
						fmt.Fprintf(&b, "sglang:cached_tokens_total{model_name=\"m\"} %g\n", 1e6+scale*tc.sources[src])
						continue
					}
					fmt.Fprintf(&b, "sglang:cached_tokens_total{cache_source=%q,model_name=\"m\"} %g\n", src, 1e6+scale*tc.sources[src])
				}
				fmt.Fprintf(&b, "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name=\"m\"} %g\n", 1e7+scale*1000)
				return b.String()
			}
			c, _, _ := newTest(t, Options{})
			target := Target{Name: "p", Role: RolePrefill}
			require.NoError(t, c.IngestText(t0, target, strings.NewReader(body(0))))
			require.NoError(t, c.IngestText(t0.Add(5*time.Second), target, strings.NewReader(body(1))))
			assertSignals(t, c.SnapshotAt(t0.Add(5*time.Second)), map[Signal]want{HitRate: ok(tc.want)})
		})
	}
}

func sortedSources(m map[string]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// TestIngestErrors: what Ingest refuses, and that a refused reading leaves the last good one.
func TestIngestErrors(t *testing.T) {
	c, reg, _ := newTest(t, Options{Targets: []Target{{Name: "p", URL: "http://127.0.0.1:1/metrics", Role: RolePrefill, Dialect: DialectSGLang}}})
	prefill := Target{Name: "p", Role: RolePrefill, Dialect: DialectSGLang}
	require.NoError(t, c.Ingest(t0, prefill, fixture(t, "sglang_pd_prefill")), "a configured target without its URL")

	for _, tc := range []struct {
		name   string
		at     time.Time
		target Target
		fix    string
		err    string
		reason string
	}{
		{"older than the last reading", t0.Add(-time.Second), prefill, "sglang_pd_prefill", "older than the last one", reasonOutOfOrder},
		{"redefined target", t0, Target{Name: "p", Role: RoleDecode}, "sglang_pd_prefill", "known as role prefill", ""},
		{"gateway metrics on an engine role", t0, Target{Name: "x", Role: RolePrefill}, "gateway", "a prefill target exposes basin-gateway metrics", reasonDialect},
		{"engine metrics on the gateway role", t0, Target{Name: "g", Role: RoleGateway}, "vllm_v1", "a gateway target exposes vllm metrics", reasonDialect},
		{"invalid role", t0, Target{Name: "y", Role: "router"}, "vllm_v1", "role: must be one of", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Ingest(tc.at, tc.target, fixture(t, tc.fix))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
			assert.Contains(t, err.Error(), tc.target.Name)
			if tc.reason != "" {
				n, _ := metricValue(gather(t, reg), "basin_scrape_errors_total", map[string]string{"target": tc.target.Name, "reason": tc.reason})
				assert.Equal(t, 1.0, n)
			}
		})
	}
	t.Run("unknown dialect", func(t *testing.T) {
		err := c.IngestText(t0, Target{Name: "node", Role: RoleUnified}, strings.NewReader("# TYPE node_load1 gauge\nnode_load1 0.5\n"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "cannot tell the dialect")
	})
	assertSignals(t, c.SnapshotAt(t0), map[Signal]want{CacheCapacity: ok(1_950_000)})
}

// TestCheck: declared signals that the configured targets cannot provide.
func TestCheck(t *testing.T) {
	url := "http://127.0.0.1:1/metrics"
	gw := Target{Name: "gw", URL: url, Role: RoleGateway}
	p := Target{Name: "p", URL: url, Role: RolePrefill}
	pv := Target{Name: "pv", URL: url, Role: RolePrefill, Dialect: DialectVLLM}
	d := Target{Name: "d", URL: url, Role: RoleDecode}
	u := Target{Name: "u", URL: url, Role: RoleUnified}
	for _, tc := range []struct {
		name    string
		targets []Target
		want    []string
	}{
		{"full PD with gateway", []Target{gw, p, d}, nil},
		{"PD without gateway", []Target{p, d}, []string{
			"working_set_tokens (needed by detector, controller): only estimated: no gateway target",
			"live_sessions (needed by controller): missing: no gateway target",
		}},
		{"vLLM prefill without gateway cannot estimate W", []Target{pv, d}, []string{
			"working_set_tokens (needed by detector, controller): missing: no gateway target, and no SGLang prefill",
			"live_sessions (needed by controller): missing: no gateway target",
		}},
		{"gateway only", []Target{gw}, []string{
			"cache_capacity_tokens (needed by detector): missing: no prefill or unified target",
			"hit_rate (needed by detector, alerts): missing: no prefill or unified target",
			"call_completion_rate (needed by detector): missing: no decode or unified target",
			"decode_free_tokens (needed by controller): missing: no decode target",
		}},
		{"unified engine and gateway: no decode KV", []Target{gw, u}, []string{
			"decode_free_tokens (needed by controller): missing: no decode target",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := newTest(t, Options{Targets: tc.targets})
			require.NoError(t, c.Declare("detector", WorkingSet, CacheCapacity, HitRate, CallRate))
			require.NoError(t, c.Declare("controller", LiveSessions, DecodeFree, WorkingSet))
			require.NoError(t, c.Declare("alerts", HitRate))
			var got []string
			for _, p := range c.Check() {
				got = append(got, p.String())
			}
			require.Len(t, got, len(tc.want), "%q", got)
			for i := range tc.want {
				assert.Contains(t, got[i], tc.want[i])
			}
		})
	}
	t.Run("declare checks names", func(t *testing.T) {
		c, _, _ := newTest(t, Options{})
		assert.ErrorContains(t, c.Declare("x", "hit_ratio"), `unknown signal "hit_ratio"`)
		assert.ErrorContains(t, c.Declare("", HitRate), "consumer name is empty")
	})
}

// TestOptions: bad options fail at New with the field's name.
func TestOptions(t *testing.T) {
	good := Target{Name: "p", URL: "http://127.0.0.1:9000/metrics", Role: RolePrefill}
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{"negative interval", Options{Interval: -time.Second}, []string{"Interval: must be > 0"}},
		{"timeout over interval", Options{Interval: time.Second, Timeout: 2 * time.Second}, []string{"Timeout: must be > 0 and at most Interval"}},
		{"short window", Options{Interval: 10 * time.Second, Window: 15 * time.Second}, []string{"Window: must be at least two intervals"}},
		{"negative stale after", Options{StaleAfter: -1}, []string{"StaleAfter"}},
		{"negative body limit", Options{MaxBodyBytes: -1}, []string{"MaxBodyBytes"}},
		{"duplicate names", Options{Targets: []Target{good, good}}, []string{`Targets[1]: name "p" used twice`}},
		{"bad target", Options{Targets: []Target{{Name: "", URL: "ftp://x/metrics", Role: "router", Dialect: "tgi"}}}, []string{
			"Targets[0]", "name: must not be empty", "url: scheme must be http or https", "role: must be one of", "dialect: must be one of"}},
		{"dialect does not fit role", Options{Targets: []Target{{Name: "g", URL: "http://h:1/m", Role: RoleGateway, Dialect: DialectSGLang}}}, []string{
			"dialect: sglang does not fit role gateway"}},
		{"missing target file", Options{TargetFile: "does-not-exist.json"}, []string{"TargetFile", "does-not-exist.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.o)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	t.Run("defaults", func(t *testing.T) {
		c, _, _ := newTest(t, Options{Targets: []Target{good}})
		assert.Equal(t, 5*time.Second, c.opts.Interval)
		assert.Equal(t, 4*time.Second, c.opts.Timeout)
		assert.Equal(t, time.Minute, c.opts.Window)
		assert.Equal(t, 3, c.opts.StaleAfter)
		assert.Equal(t, int64(16<<20), c.opts.MaxBodyBytes)
		assert.Equal(t, DialectAuto, c.Targets()[0].Dialect)
	})
}

// TestExportedMetrics: the basin_signal_* and basin_targets series.
func TestExportedMetrics(t *testing.T) {
	c, reg, clk := newTest(t, Options{})
	require.NoError(t, c.Ingest(t0, Target{Name: "prefill-0", Role: RolePrefill}, fixture(t, "sglang_pd_prefill")))
	require.NoError(t, c.Ingest(t0, Target{Name: "decode-0", Role: RoleDecode, Dialect: DialectSGLang}, fixture(t, "sglang_pd_decode")))
	require.NoError(t, c.Ingest(t0, Target{Name: "vllm-0", Role: RoleUnified}, fixture(t, "vllm_v1")))

	fams := gather(t, reg)
	sig := func(s Signal) map[string]string { return map[string]string{"signal": string(s)} }
	state := func(s Signal, st string) map[string]string {
		return map[string]string{"signal": string(s), "state": st}
	}
	v, found := metricValue(fams, "basin_signal_value", sig(DecodeCapacity))
	assert.True(t, found)
	assert.Equal(t, 800_000.0, v)
	up, _ := metricValue(fams, "basin_signal_up", sig(DecodeCapacity))
	assert.Equal(t, 1.0, up)
	_, found = metricValue(fams, "basin_signal_value", sig(HitRate))
	assert.False(t, found, "no value for a missing signal")
	up, found = metricValue(fams, "basin_signal_up", sig(HitRate))
	assert.True(t, found)
	assert.Zero(t, up)
	for st, w := range map[string]float64{"ok": 0, "stale": 0, "missing": 1} {
		v, _ := metricValue(fams, "basin_signal_state", state(HitRate, st))
		assert.Equal(t, w, v, st)
	}
	assert.Len(t, fams["basin_signal_up"].GetMetric(), len(AllSignals()))
	assert.Len(t, fams["basin_signal_state"].GetMetric(), 3*len(AllSignals()))

	for _, tc := range []struct {
		role, dialect string
		n             float64
	}{{"prefill", "sglang", 1}, {"decode", "sglang", 1}, {"unified", "vllm", 1}} {
		n, _ := metricValue(fams, "basin_targets", map[string]string{"role": tc.role, "dialect": tc.dialect})
		assert.Equal(t, tc.n, n, "%s/%s", tc.role, tc.dialect)
	}
	n, _ := metricValue(fams, "basin_scrape_samples", map[string]string{"target": "vllm-0"})
	assert.Equal(t, float64(countSamples(fixture(t, "vllm_v1"))), n)
	ts, _ := metricValue(fams, "basin_scrape_last_success_timestamp_seconds", map[string]string{"target": "prefill-0"})
	assert.Equal(t, float64(t0.Unix()), ts)

	// Stale: no value, state one-hot on stale.
	clk.now = t0.Add(time.Minute)
	fams = gather(t, reg)
	_, found = metricValue(fams, "basin_signal_value", sig(DecodeCapacity))
	assert.False(t, found, "no value for a stale signal")
	v, _ = metricValue(fams, "basin_signal_state", state(DecodeCapacity, "stale"))
	assert.Equal(t, 1.0, v)
}

// TestDecodeInstances: each decode target's KV is in the snapshot on its own (the pool's signals
// hold the sums), with its pre-allocation queue (the per-priority series add up to the total
// series, which wins), and turns stale with its own last reading.
func TestDecodeInstances(t *testing.T) {
	d0 := Target{Name: "decode-0", Role: RoleDecode}
	d1 := Target{Name: "decode-1", Role: RoleDecode}
	c, _, _ := newTest(t, Options{Interval: 10 * time.Second, StaleAfter: 2})
	f := fixture(t, "sglang_pd_decode")
	require.NoError(t, c.Ingest(t0, d0, f))
	require.NoError(t, c.Ingest(t0.Add(15*time.Second), d1, f))
	require.NoError(t, c.Ingest(t0, Target{Name: "prefill-0", Role: RolePrefill}, fixture(t, "sglang_pd_prefill")))

	snap := c.SnapshotAt(t0.Add(15 * time.Second))
	require.Len(t, snap.Decode, 2, "decode targets only")
	capacity, _ := snap.Get(DecodeCapacity)
	free, _ := snap.Get(DecodeFree)
	held, _ := snap.Get(DecodeReserved)
	for i, d := range snap.Decode {
		assert.Equal(t, []string{"decode-0", "decode-1"}[i], d.Name)
		assert.Equal(t, OK, d.State)
		assert.True(t, d.Complete)
		assert.Equal(t, 800_000.0, d.CapacityTokens)
		assert.InDelta(t, capacity/2, d.CapacityTokens, 1e-9, "each instance is half the pool's sum")
		assert.InDelta(t, free/2, d.FreeTokens, 1e-9)
		assert.InDelta(t, held/2, d.ReservedTokens, 1e-9)
		assert.Equal(t, 4, d.Waiting)
		assert.Zero(t, d.LentTokens, "no lending metric and no sticky routing")
	}

	snap = c.SnapshotAt(t0.Add(25 * time.Second))
	assert.Equal(t, Stale, snap.Decode[0].State, "decode-0 was read 25 s ago")
	assert.Equal(t, OK, snap.Decode[1].State)

	// A configured decode target never read is there, Missing, with no numbers.
	never, _, _ := newTest(t, Options{Targets: []Target{{Name: "decode-9", URL: "http://127.0.0.1:1/metrics", Role: RoleDecode}}})
	require.Len(t, never.Snapshot().Decode, 1)
	assert.Equal(t, DecodeInstance{Name: "decode-9"}, never.Snapshot().Decode[0])
}

// TestPrefillInstances: each prefill target's prefix cache is in the snapshot on its own (sizing
// the prefill pool needs one instance's cache; CacheCapacity sums the pool and any lent KV).
func TestPrefillInstances(t *testing.T) {
	p0 := Target{Name: "prefill-0", Role: RolePrefill}
	c, _, _ := newTest(t, Options{Interval: 10 * time.Second, StaleAfter: 2})
	require.NoError(t, c.Ingest(t0, p0, fixture(t, "sglang_pd_prefill")))
	require.NoError(t, c.Ingest(t0, Target{Name: "decode-0", Role: RoleDecode}, fixture(t, "sglang_pd_decode")))

	snap := c.SnapshotAt(t0.Add(5 * time.Second))
	require.Len(t, snap.Prefill, 1, "prefill targets only")
	p := snap.Prefill[0]
	assert.Equal(t, "prefill-0", p.Name)
	assert.Equal(t, OK, p.State)
	assert.True(t, p.Complete)
	capacity, ok := snap.Get(CacheCapacity)
	require.True(t, ok)
	assert.Positive(t, p.CacheTokens)
	assert.InDelta(t, capacity, p.CacheTokens+p.HostTokens, 1e-9, "one prefill instance and no lending: the pool's capacity")

	assert.Equal(t, Stale, c.SnapshotAt(t0.Add(25 * time.Second)).Prefill[0].State)
	never, _, _ := newTest(t, Options{Targets: []Target{{Name: "prefill-9", URL: "http://127.0.0.1:1/metrics", Role: RolePrefill}}})
	assert.Equal(t, []PrefillInstance{{Name: "prefill-9"}}, never.Snapshot().Prefill)
}

// TestForget: a pushed target the caller drops leaves the sums at once (the pool's capacity
// without it, fresh); a configured target is not dropped.
func TestForget(t *testing.T) {
	c, _, _ := newTest(t, Options{Interval: 10 * time.Second, StaleAfter: 2, Targets: []Target{{Name: "prefill-9", URL: "http://127.0.0.1:1/metrics", Role: RolePrefill}}})
	f := fixture(t, "sglang_pd_prefill")
	p0, p1 := Target{Name: "prefill-0", Role: RolePrefill}, Target{Name: "prefill-1", Role: RolePrefill}
	require.NoError(t, c.Ingest(t0, p0, f))
	require.NoError(t, c.Ingest(t0, p1, f))
	two, ok := c.SnapshotAt(t0).Get(CacheCapacity)
	require.True(t, ok)

	assert.True(t, c.Forget("prefill-1"))
	require.NoError(t, c.Ingest(t0.Add(30*time.Second), p0, f))
	one, ok := c.SnapshotAt(t0.Add(30 * time.Second)).Get(CacheCapacity)
	require.True(t, ok, "fresh: the forgotten target's old reading no longer ages the sum")
	assert.InDelta(t, two/2, one, 1e-9)
	assert.Len(t, c.SnapshotAt(t0.Add(30*time.Second)).Prefill, 2, "prefill-0 and the configured prefill-9")
	assert.False(t, c.Forget("prefill-9"), "a configured target stays")
	assert.False(t, c.Forget("nobody"))
}
