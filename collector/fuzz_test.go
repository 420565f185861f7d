package collector

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// FuzzIngestText feeds an arbitrary exposition body, as the second reading of one target of each
// role, through IngestText to a snapshot. It must never panic; no signal is OK with a NaN or
// infinite value, the hit rate is in [0, 1] whenever it is OK, and an IngestText that fails
// leaves every signal exactly as it was: nothing is derived from a body that did not parse.
func FuzzIngestText(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*.prom"))
	require.NoError(f, err)
	require.NotEmpty(f, paths)
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(b)
	}
	for _, s := range []string{
		"# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total 10\n# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total 20\n",
		"# TYPE sglang:num_used_tokens gauge\nsglang:num_used_tokens NaN\nsglang:max_total_num_tokens +Inf\n",
		"# TYPE sglang:time_to_first_token_seconds histogram\nsglang:time_to_first_token_seconds_bucket{le=\"0.1\"} 5\nsglang:time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\nsglang:time_to_first_token_seconds_count 3\nsglang:time_to_first_token_seconds_sum -1\n",
		"# TYPE basin_gateway_budget_tokens gauge\nbasin_gateway_budget_tokens -Inf\nbasin_gateway_live_sessions 1e308\n",
		"sglang:num_used_tokens{a=\"b\" 3\n",
		"# TYPE sglang:num_used_tokens counter\n# TYPE sglang:num_used_tokens gauge\n",
		"vllm:num_requests_running 1\n",
		"",
	} {
		f.Add([]byte(s))
	}

	targets := []struct {
		t    Target
		base string
	}{
		{Target{Name: "prefill-0", Role: RolePrefill, Dialect: DialectSGLang}, "sglang_pd_prefill"},
		{Target{Name: "decode-0", Role: RoleDecode, Dialect: DialectSGLang}, "sglang_pd_decode"},
		{Target{Name: "unified-0", Role: RoleUnified, Dialect: DialectVLLM}, "vllm_v1"},
		{Target{Name: "gateway", Role: RoleGateway, Dialect: DialectGateway}, "gateway"},
	}
	base := make([]map[string]*dto.MetricFamily, len(targets))
	for i, tg := range targets {
		base[i] = fixture(f, tg.base)
	}
	at := t0.Add(5 * time.Second)

	f.Fuzz(func(t *testing.T, body []byte) {
		o := Options{Registerer: prometheus.NewRegistry(), Now: func() time.Time { return at }}
		for _, tg := range targets {
			o.Targets = append(o.Targets, Target{Name: tg.t.Name, URL: "http://127.0.0.1:1/metrics", Role: tg.t.Role, Dialect: tg.t.Dialect})
		}
		c, err := New(o)
		require.NoError(t, err)
		for i, tg := range targets {
			require.NoError(t, c.Ingest(t0, tg.t, base[i]), "the first reading of %s", tg.t.Name)
		}
		check(t, c.SnapshotAt(at))

		for _, tg := range targets {
			before := c.SnapshotAt(at)
			err := c.IngestText(at, tg.t, bytes.NewReader(body))
			after := c.SnapshotAt(at)
			check(t, after)
			if err != nil {
				require.Contains(t, err.Error(), tg.t.Name, "the error names the target")
				sameSignals(t, before, after)
			}
		}
	})
}

// check asserts what every consumer of a snapshot relies on.
func check(t *testing.T, s Snapshot) {
	t.Helper()
	for _, sig := range AllSignals() {
		v, ok := s.Get(sig)
		if !ok {
			continue
		}
		require.False(t, math.IsNaN(v) || math.IsInf(v, 0), "%s is ok with %v (source %s)", sig, v, s.Signals[sig].Source)
		if sig == HitRate {
			require.True(t, v >= 0 && v <= 1, "hit rate %v", v)
		}
	}
}

// sameSignals asserts two snapshots hold the same values (NaN equal to NaN).
func sameSignals(t *testing.T, want, got Snapshot) {
	t.Helper()
	for _, sig := range AllSignals() {
		w, g := want.Signals[sig], got.Signals[sig]
		require.Equal(t, w.State, g.State, "%s: a failed ingest changed its state", sig)
		require.True(t, w.V == g.V || math.IsNaN(w.V) && math.IsNaN(g.V), "%s: a failed ingest changed %v to %v", sig, w.V, g.V)
		require.Equal(t, w.At, g.At, sig)
		require.Equal(t, w.Source, g.Source, sig)
	}
}
