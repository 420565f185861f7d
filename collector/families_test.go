package collector

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFlatPreferredFamily: an SGLang prefill that registers prefill_effective_tokens_total but
// never increments it, while realtime_tokens_total{mode=prefill_*} grows, is a busy engine: the
// prompt-token rate and the hit rate come from the family that advances (they read 0 and nothing
// before), the disagreement is logged once and shown by basin_counter_family_flat while it lasts,
// and once the preferred family advances it is read again.
func TestFlatPreferredFamily(t *testing.T) {
	var logs strings.Builder
	c, reg, clk := newTest(t, Options{Logger: slogTo(&logs)})
	target := Target{Name: "prefill-0", Role: RolePrefill, Dialect: DialectSGLang}
	var cache, compute, effHit, effInput float64
	body := func() string {
		return fmt.Sprintf(`# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="prefill"} 1e6
# TYPE sglang:prefill_effective_tokens_total counter
sglang:prefill_effective_tokens_total{engine_type="prefill",mode="input"} %g
sglang:prefill_effective_tokens_total{engine_type="prefill",mode="device_hit"} %g
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{engine_type="prefill",mode="prefill_cache"} %g
sglang:realtime_tokens_total{engine_type="prefill",mode="prefill_compute"} %g
`, effInput, effHit, cache, compute)
	}
	step := func(effective bool) {
		t.Helper()
		clk.now = clk.now.Add(5 * time.Second)
		cache += 5 * 9_000 // 10k prompt tokens a second, 90% from cache
		compute += 5 * 1_000
		if effective {
			effHit += 5 * 9_000
			effInput += 5 * 1_000
		}
		require.NoError(t, c.IngestText(clk.now, target, strings.NewReader(body())))
	}
	flat := func() float64 {
		v, _ := metricValue(gather(t, reg), "basin_counter_family_flat",
			map[string]string{"target": "prefill-0", "family": sgEffective, "used": sgRealtime})
		return v
	}
	for range 13 { // over a minute: the window holds only flat effective counters
		step(false)
	}
	snap := c.Snapshot()
	rate, ok := snap.Get(PromptTokenRate)
	require.True(t, ok, "prompt_token_rate %s", snap.State(PromptTokenRate))
	assert.InDelta(t, 10_000, rate, 1e-6, "a busy engine reads busy")
	hit, ok := snap.Get(HitRate)
	require.True(t, ok)
	assert.InDelta(t, 0.9, hit, 1e-9)
	assert.Contains(t, snap.Signals[HitRate].Source, sgRealtime)
	assert.Equal(t, 1.0, flat())
	assert.Equal(t, 1, strings.Count(logs.String(), "prompt-token counters disagree"), "logged once:\n%s", logs.String())
	assert.Contains(t, logs.String(), "flat="+sgEffective)

	for range 3 {
		step(true)
	}
	snap = c.Snapshot()
	assert.Contains(t, snap.Signals[HitRate].Source, sgEffective, "the preferred family once it advances")
	rate, _ = snap.Get(PromptTokenRate)
	assert.InDelta(t, 10_000, rate, 1e-6)
	assert.Zero(t, flat(), "the disagreement is over")
	assert.Contains(t, logs.String(), "prompt-token counters agree again")
}

// TestQuietEngineStaysQuiet: with every family flat the engine is quiet — a prompt-token rate of
// 0 from the preferred family, no disagreement.
func TestQuietEngineStaysQuiet(t *testing.T) {
	var logs strings.Builder
	c, _, clk := newTest(t, Options{Logger: slogTo(&logs)})
	target := Target{Name: "prefill-0", Role: RolePrefill, Dialect: DialectSGLang}
	body := `# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens 1e6
# TYPE sglang:prefill_effective_tokens_total counter
sglang:prefill_effective_tokens_total{mode="input"} 100
sglang:prefill_effective_tokens_total{mode="device_hit"} 900
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{mode="prefill_cache"} 900
sglang:realtime_tokens_total{mode="prefill_compute"} 100
`
	for range 4 {
		clk.now = clk.now.Add(5 * time.Second)
		require.NoError(t, c.IngestText(clk.now, target, strings.NewReader(body)))
	}
	snap := c.Snapshot()
	rate, ok := snap.Get(PromptTokenRate)
	require.True(t, ok)
	assert.Zero(t, rate)
	assert.Contains(t, snap.Signals[PromptTokenRate].Source, sgEffective)
	assert.NotContains(t, logs.String(), "disagree")
}
