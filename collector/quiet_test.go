package collector

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// promptBody is a prefill instance's prefix-cache counters.
func promptBody(cached, prompt float64) string {
	return fmt.Sprintf("# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{model_name=\"m\"} %g\n"+
		"# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name=\"m\"} %g\n", cached, prompt)
}

// TestQuietWindow: when no prompt is asked for a whole window, the prompt-token rate reads 0 and
// stays fresh — the deployment is quiet — while the hit rate of no tokens is not computed: it
// keeps its last value and goes stale, never 0.
func TestQuietWindow(t *testing.T) {
	c, _, _ := newTest(t, Options{Interval: 5 * time.Second})
	target := Target{Name: "p", Role: RolePrefill}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * 5 * time.Second) }
	cached, prompt := 0.0, 0.0
	for i := 0; i <= 12; i++ { // a minute of traffic: 1000 prompt tokens per scrape, 900 cached
		require.NoError(t, c.IngestText(at(i), target, strings.NewReader(promptBody(cached, prompt))))
		cached, prompt = cached+900, prompt+1000
	}
	snap := c.SnapshotAt(at(12))
	hit, ok := snap.Get(HitRate)
	require.True(t, ok)
	assert.InDelta(t, 0.9, hit, 1e-9)
	rate, ok := snap.Get(PromptTokenRate)
	require.True(t, ok)
	assert.InDelta(t, 200, rate, 1e-9, "1000 tokens per 5 s")
	assert.Equal(t, time.Minute, snap.Window)

	cached, prompt = cached-900, prompt-1000 // the counters stop where they were
	for i := 13; i <= 30; i++ {
		require.NoError(t, c.IngestText(at(i), target, strings.NewReader(promptBody(cached, prompt))))
	}
	snap = c.SnapshotAt(at(30))
	rate, ok = snap.Get(PromptTokenRate)
	require.True(t, ok, "quiet is a reading")
	assert.Zero(t, rate)
	assert.Equal(t, Stale, snap.State(HitRate), "no hit rate of no tokens")
	assert.InDelta(t, 0.9, snap.Signals[HitRate].V, 1e-9, "the last one kept, not zeroed")
	assert.True(t, snap.CacheRestart.IsZero(), "no restart seen")
}

// TestCacheRestart: counters that go back on the same series mark an engine restart (its cache
// starts empty); a changed metric restarts the window but is no flush.
func TestCacheRestart(t *testing.T) {
	c, _, _ := newTest(t, Options{Interval: 5 * time.Second})
	target := Target{Name: "p", Role: RolePrefill}
	require.NoError(t, c.IngestText(t0, target, strings.NewReader(promptBody(9e5, 1e6))))
	require.NoError(t, c.IngestText(t0.Add(5*time.Second), target, strings.NewReader(promptBody(9.1e5, 1.01e6))))
	assert.True(t, c.SnapshotAt(t0.Add(5*time.Second)).CacheRestart.IsZero())

	require.NoError(t, c.IngestText(t0.Add(10*time.Second), target, strings.NewReader(promptBody(10, 500))))
	assert.Equal(t, t0.Add(10*time.Second), c.SnapshotAt(t0.Add(10*time.Second)).CacheRestart)

	vllm := "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{model_name=\"m\"} 5\n" +
		"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{model_name=\"m\"} 10\n"
	require.NoError(t, c.IngestText(t0.Add(15*time.Second), target, strings.NewReader(vllm)))
	assert.Equal(t, t0.Add(10*time.Second), c.SnapshotAt(t0.Add(15*time.Second)).CacheRestart, "another metric is no restart")
}
