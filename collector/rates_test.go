package collector

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type fams = map[string]*dto.MetricFamily

// step is a change to one target's families between two readings.
type step struct {
	target Target
	base   string // fixture
	// change is applied to the second reading only, prepare (if set) to both.
	change, prepare func(t testing.TB, f fams)
}

// TestWindowedSignals takes two readings 20 s apart and checks the rates, the hit rate's source
// preference and the TTFT quantiles.
func TestWindowedSignals(t *testing.T) {
	prefill := Target{Name: "prefill-0", Role: RolePrefill}
	prefill1 := Target{Name: "prefill-1", Role: RolePrefill}
	decode := Target{Name: "decode-0", Role: RoleDecode}
	unified := Target{Name: "engine", Role: RoleUnified}
	gw := Target{Name: "gateway", Role: RoleGateway}
	mode := func(m string) map[string]string { return map[string]string{"mode": m} }
	const dt = 20.0

	for _, tc := range []struct {
		name  string
		steps []step
		want  map[Signal]want
	}{
		{
			name: "sglang effective tokens preferred over realtime and cached",
			steps: []step{{prefill, "sglang_pd_prefill", func(t testing.TB, f fams) {
				bump(t, f, sgEffective, mode("input"), 1000)
				bump(t, f, sgEffective, mode("device_hit"), 3000)
				bump(t, f, sgEffective, mode("host_hit"), 1000)
				// Other sources disagree: they must not be read.
				bump(t, f, sgRealtime, mode("prefill_cache"), 100)
				bump(t, f, sgRealtime, mode("prefill_compute"), 900)
				bump(t, f, sgCached, nil, 10)
				bump(t, f, sgPrompt, nil, 5000)
				// The gauge says something else again.
				setValue(t, f, "sglang:cache_hit_rate", nil, 0.01)
			}, nil}},
			want: map[Signal]want{HitRate: ok(4000.0 / 5000)},
		},
		{
			name: "sglang realtime tokens preferred over cached",
			steps: []step{{unified, "sglang_unified_old", func(t testing.TB, f fams) {
				bump(t, f, sgRealtime, mode("prefill_cache"), 600)
				bump(t, f, sgRealtime, mode("prefill_compute"), 400)
				bump(t, f, sgRealtime, mode("decode"), 5000)
				bump(t, f, sgCached, nil, 100)
				bump(t, f, sgPrompt, nil, 1000)
				bump(t, f, sgRequests, nil, 80)
			}, nil}},
			want: map[Signal]want{HitRate: ok(0.6), CallRate: ok(80 / dt)},
		},
		{
			name: "sglang cached over prompt tokens",
			steps: []step{{unified, "sglang_cached_only", func(t testing.TB, f fams) {
				bump(t, f, sgCached, nil, 700)
				bump(t, f, sgPrompt, nil, 1000)
			}, nil}},
			want: map[Signal]want{HitRate: ok(0.7)},
		},
		{
			name: "cached above prompt is clamped",
			steps: []step{{unified, "sglang_cached_only", func(t testing.TB, f fams) {
				bump(t, f, sgCached, nil, 1500)
				bump(t, f, sgPrompt, nil, 1000)
			}, nil}},
			want: map[Signal]want{HitRate: ok(1)},
		},
		{
			name: "an instance's cached tokens never exceed its prompt tokens",
			steps: []step{
				{unified, "sglang_cached_only", func(t testing.TB, f fams) {
					bump(t, f, sgCached, nil, 1500)
					bump(t, f, sgPrompt, nil, 1000)
				}, nil},
				{Target{Name: "engine-1", Role: RoleUnified}, "sglang_cached_only", func(t testing.TB, f fams) {
					bump(t, f, sgPrompt, nil, 1000)
				}, nil},
			},
			// 1000 of 2000, not 1500 of 2000.
			want: map[Signal]want{HitRate: ok(0.5)},
		},
		{
			name: "hits and totals are summed over instances before dividing",
			steps: []step{
				{prefill, "sglang_pd_prefill", func(t testing.TB, f fams) {
					bump(t, f, sgEffective, mode("device_hit"), 900)
					bump(t, f, sgEffective, mode("input"), 100)
				}, nil},
				{prefill1, "sglang_pd_prefill", func(t testing.TB, f fams) {
					bump(t, f, sgEffective, mode("device_hit"), 1000)
					bump(t, f, sgEffective, mode("input"), 8000)
				}, nil},
			},
			// Not the mean of 0.9 and 0.111.
			want: map[Signal]want{HitRate: ok(1900.0 / 10000)},
		},
		{
			name: "vllm prefix cache, request success, ttft",
			steps: []step{{unified, "vllm_v1", func(t testing.TB, f fams) {
				bump(t, f, vlHits, nil, 300)
				bump(t, f, vlQueries, nil, 1000)
				bump(t, f, vlSuccess, map[string]string{"finished_reason": "stop"}, 50)
				bump(t, f, vlSuccess, map[string]string{"finished_reason": "length"}, 10)
				observe(t, f, vlTTFT, nil, 0.03, 100) // bucket (0.02, 0.04]
			}, nil}},
			want: map[Signal]want{
				HitRate:  ok(0.3),
				CallRate: ok(60 / dt),
				TTFTp50:  ok(0.02 + 0.02*0.5),
				TTFTp99:  ok(0.02 + 0.02*0.99),
			},
		},
		{
			name: "vllm deprecated gpu_prefix_cache names",
			steps: []step{{target: unified, base: "vllm_v1",
				prepare: func(t testing.TB, f fams) {
					renameFamily(f, vlHits, vlGPUHits)
					renameFamily(f, vlQueries, vlGPUQueries)
				},
				change: func(t testing.TB, f fams) {
					bump(t, f, vlGPUHits, nil, 250)
					bump(t, f, vlGPUQueries, nil, 1000)
				}}},
			want: map[Signal]want{HitRate: ok(0.25)},
		},
		{
			name: "decode ttft and call rate; prefill ttft ignored",
			steps: []step{
				{prefill, "sglang_pd_prefill", func(t testing.TB, f fams) {
					observe(t, f, sgTTFT, nil, 300, 1000) // must not count
					bump(t, f, sgRequests, nil, 1000)     // prefill requests are not calls
				}, nil},
				{decode, "sglang_pd_decode", func(t testing.TB, f fams) {
					observe(t, f, sgTTFT, map[string]string{"is_streaming": "true"}, 0.3, 100)
					observe(t, f, sgTTFT, map[string]string{"is_streaming": "false"}, 0.7, 100)
					bump(t, f, sgRequests, map[string]string{"is_streaming": "true"}, 300)
					bump(t, f, sgRequests, map[string]string{"is_streaming": "false"}, 100)
				}, nil},
			},
			want: map[Signal]want{
				// 100 in (0.2, 0.4], 100 in (0.6, 0.8].
				TTFTp50:  ok(0.4),
				TTFTp99:  ok(0.6 + 0.2*0.98),
				CallRate: ok(400 / dt),
			},
		},
		{
			name: "gateway arrivals and completions",
			steps: []step{{gw, "gateway", func(t testing.TB, f fams) {
				bump(t, f, gwArrivals, nil, 20)
				bump(t, f, gwCompletions, nil, 10)
			}, nil}},
			want: map[Signal]want{ArrivalRate: ok(1), CompletionRate: ok(0.5)},
		},
		{
			name: "cache_hit_rate alone is never a hit rate",
			steps: []step{{target: prefill, base: "sglang_pd_prefill",
				prepare: func(t testing.TB, f fams) {
					for _, name := range []string{sgEffective, sgRealtime, sgCached, sgPrompt} {
						delete(f, name)
					}
				},
				change: func(t testing.TB, f fams) {
					setValue(t, f, "sglang:cache_hit_rate", nil, 0.5)
				}}},
			want: map[Signal]want{HitRate: missing},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := newTest(t, Options{})
			for _, s := range tc.steps {
				f := fixture(t, s.base)
				if s.prepare != nil {
					s.prepare(t, f)
				}
				require.NoError(t, c.Ingest(t0, s.target, f))
			}
			for _, s := range tc.steps {
				f := fixture(t, s.base)
				if s.prepare != nil {
					s.prepare(t, f)
				}
				s.change(t, f)
				require.NoError(t, c.Ingest(t0.Add(dt*time.Second), s.target, f))
			}
			assertSignals(t, c.SnapshotAt(t0.Add(dt*time.Second)), tc.want)
		})
	}
}

// renameFamily moves a family to another name.
func renameFamily(f fams, from, to string) {
	mf := f[from]
	delete(f, from)
	mf.Name = &to
	f[to] = mf
}

// TestCounterReset restarts an engine mid-window: the rate never goes negative, never spikes,
// holds its last value while the window restarts and then follows the post-reset counter.
func TestCounterReset(t *testing.T) {
	decode := Target{Name: "decode-0", Role: RoleDecode}
	prefill := Target{Name: "prefill-0", Role: RolePrefill}
	c, _, _ := newTest(t, Options{})

	// 10 calls/s and a 0.75 hit rate until the restart at reading 8; then 4 calls/s and 0.25.
	var calls, hits, input float64 = 5000, 7e6, 3e6
	type obs struct {
		call, hit float64
		callOK    bool
		callAt    time.Time
	}
	var seen []obs
	for i := range 16 {
		now := t0.Add(time.Duration(i) * 5 * time.Second)
		switch {
		case i == 8:
			calls, hits, input = 3, 10, 30 // the engine restarted: counters from ~0
		case i > 8:
			calls, hits, input = calls+20, hits+250, input+750
		case i > 0:
			calls, hits, input = calls+50, hits+7500, input+2500
		}
		d := fixture(t, "sglang_pd_decode")
		setValue(t, d, sgRequests, map[string]string{"is_streaming": "true"}, calls)
		setValue(t, d, sgRequests, map[string]string{"is_streaming": "false"}, 0)
		p := fixture(t, "sglang_pd_prefill")
		setValue(t, p, sgEffective, map[string]string{"mode": "device_hit"}, hits)
		setValue(t, p, sgEffective, map[string]string{"mode": "host_hit"}, 0)
		setValue(t, p, sgEffective, map[string]string{"mode": "input"}, input)
		require.NoError(t, c.Ingest(now, decode, d))
		require.NoError(t, c.Ingest(now, prefill, p))
		snap := c.SnapshotAt(now)
		call, callOK := snap.Get(CallRate)
		hit, _ := snap.Get(HitRate)
		seen = append(seen, obs{call: call, hit: hit, callOK: callOK, callAt: snap.Signals[CallRate].At})
	}
	for i, o := range seen {
		if i == 0 {
			assert.False(t, o.callOK, "one reading is no rate")
			continue
		}
		require.True(t, o.callOK, "reading %d", i)
		assert.GreaterOrEqual(t, o.call, 0.0, "reading %d: never negative", i)
		assert.LessOrEqual(t, o.call, 10.0, "reading %d: never a spike", i)
		switch {
		case i < 8:
			assert.InDelta(t, 10, o.call, 1e-9, "reading %d", i)
			assert.InDelta(t, 0.75, o.hit, 1e-9, "reading %d", i)
		case i == 8:
			// The restarted window has one sample: the last rate holds, with its old time.
			assert.InDelta(t, 10, o.call, 1e-9)
			assert.InDelta(t, 0.75, o.hit, 1e-9)
			assert.Equal(t, seen[7].callAt, o.callAt, "held value keeps its timestamp")
		default:
			assert.InDelta(t, 4, o.call, 1e-9, "reading %d: post-reset rate", i)
			assert.InDelta(t, 0.25, o.hit, 1e-9, "reading %d: post-reset hit rate", i)
		}
	}

	t.Run("histogram reset", func(t *testing.T) {
		c, _, _ := newTest(t, Options{})
		d := fixture(t, "sglang_pd_decode")
		require.NoError(t, c.Ingest(t0, decode, d))
		d = fixture(t, "sglang_pd_decode")
		observe(t, d, sgTTFT, map[string]string{"is_streaming": "true"}, 0.15, 10)
		require.NoError(t, c.Ingest(t0.Add(5*time.Second), decode, d))
		p50, ok := c.SnapshotAt(t0.Add(5 * time.Second)).Get(TTFTp50)
		require.True(t, ok)
		assert.InDelta(t, 0.15, p50, 1e-9)

		// Restart: all buckets drop. Then observations at 3 s.
		restarted := fixture(t, "sglang_pd_decode")
		for _, m := range restarted[sgTTFT].GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				b.CumulativeCountFloat, b.CumulativeCount = nil, ptr(uint64(0))
			}
			m.Histogram.SampleCount = ptr(uint64(0))
		}
		require.NoError(t, c.Ingest(t0.Add(10*time.Second), decode, restarted))
		p50, ok = c.SnapshotAt(t0.Add(10 * time.Second)).Get(TTFTp50)
		require.True(t, ok)
		assert.InDelta(t, 0.15, p50, 1e-9, "held over the restart")
		observe(t, restarted, sgTTFT, map[string]string{"is_streaming": "true"}, 3, 10)
		require.NoError(t, c.Ingest(t0.Add(15*time.Second), decode, restarted))
		p50, ok = c.SnapshotAt(t0.Add(15 * time.Second)).Get(TTFTp50)
		require.True(t, ok)
		assert.InDelta(t, 3, p50, 1e-9, "rank 5 of 10, all in (2, 4]")
	})
}

// TestNoTraffic: a window without prompt tokens keeps the last hit rate with its old time, so it
// turns stale on its own instead of reading 0 or NaN.
func TestNoTraffic(t *testing.T) {
	prefill := Target{Name: "prefill-0", Role: RolePrefill}
	c, _, _ := newTest(t, Options{}) // interval 5 s, window 60 s, stale after 15 s
	f := fixture(t, "sglang_pd_prefill")
	require.NoError(t, c.Ingest(t0, prefill, f))
	bump(t, f, sgEffective, map[string]string{"mode": "device_hit"}, 500)
	bump(t, f, sgEffective, map[string]string{"mode": "input"}, 500)
	last := t0.Add(5 * time.Second)
	require.NoError(t, c.Ingest(last, prefill, f))
	// No traffic from now on: the counters stay, the scrapes go on.
	for i := 2; i <= 30; i++ {
		now := t0.Add(time.Duration(i) * 5 * time.Second)
		require.NoError(t, c.Ingest(now, prefill, f))
		v := c.SnapshotAt(now).Signals[HitRate]
		windowHasTraffic := now.Sub(last) < 60*time.Second+5*time.Second
		switch {
		case windowHasTraffic:
			assert.Equal(t, OK, v.State, "at %v", now.Sub(t0))
			assert.InDelta(t, 0.5, v.V, 1e-9)
		case now.Sub(v.At) > 15*time.Second:
			assert.Equal(t, Stale, v.State, "at %v", now.Sub(t0))
			assert.InDelta(t, 0.5, v.V, 1e-9, "the last value is kept")
		}
		// Capacity keeps being fresh: the target answers.
		assert.Equal(t, OK, c.SnapshotAt(now).State(CacheCapacity))
	}
	assert.Equal(t, Stale, c.SnapshotAt(t0.Add(150*time.Second)).State(HitRate))
}
