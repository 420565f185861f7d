package collector

import (
	"bytes"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var fixtureNames = []string{"sglang_pd_prefill", "sglang_pd_decode", "sglang_unified_old", "sglang_cached_only", "vllm_v1", "gateway"}

// TestParseFixtures checks that the scrape path's line filter keeps exactly the families the
// collector reads, unchanged, counts every sample and detects the dialect.
func TestParseFixtures(t *testing.T) {
	dialects := map[string]Dialect{
		"sglang_pd_prefill": DialectSGLang, "sglang_pd_decode": DialectSGLang, "sglang_unified_old": DialectSGLang,
		"sglang_cached_only": DialectSGLang, "vllm_v1": DialectVLLM, "gateway": DialectGateway,
	}
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			full := fixture(t, name)
			var kept bytes.Buffer
			filtered, info, err := parseScrape(fixtureBytes(t, name), &kept)
			require.NoError(t, err)
			assert.Equal(t, dialects[name], info.dialect())
			assert.Equal(t, dialects[name], detectFamilies(full))
			assert.Equal(t, countSamples(full), info.samples, "samples")
			assert.Less(t, kept.Len(), len(fixtureBytes(t, name)), "the filter drops something")
			for fname, mf := range full {
				_, wanted := wantedFamilies[fname]
				got, kept := filtered[fname]
				if !wanted {
					assert.False(t, kept, "%s is not read and must be dropped", fname)
					continue
				}
				require.True(t, kept, "%s is read and must be kept", fname)
				assert.Equal(t, familyText(t, mf), familyText(t, got), fname)
			}
		})
	}

	t.Run("vllm _created families are separate gauges", func(t *testing.T) {
		fams := fixture(t, "vllm_v1")
		assert.Equal(t, dto.MetricType_COUNTER, fams[vlHits].GetType())
		assert.Equal(t, dto.MetricType_GAUGE, fams["vllm:prefix_cache_hits_created"].GetType())
		assert.Equal(t, dto.MetricType_GAUGE, fams["vllm:time_to_first_token_seconds_created"].GetType())
		assert.Equal(t, dto.MetricType_HISTOGRAM, fams[vlTTFT].GetType())
		// num_requests_waiting is a prefix of ..._by_reason; both are families of their own.
		assert.Len(t, fams[vlWaiting].GetMetric(), 1)
		assert.Len(t, fams["vllm:num_requests_waiting_by_reason"].GetMetric(), 2)
	})
}

func familyText(t testing.TB, mf *dto.MetricFamily) string {
	t.Helper()
	var b strings.Builder
	_, err := expfmt.MetricFamilyToText(&b, mf)
	require.NoError(t, err)
	return b.String()
}

// want is an expected signal: a value (ok), or a state that is not ok.
type want struct {
	v         float64
	state     State
	estimated bool
}

func ok(v float64) want          { return want{v: v, state: OK} }
func okEstimated(v float64) want { return want{v: v, state: OK, estimated: true} }

var missing = want{state: Missing}

// feed is one target's reading in a table test.
type feed struct {
	target  Target
	fixture string
}

// TestFixtureSignals derives the gauge signals of single scrapes of each engine and version.
func TestFixtureSignals(t *testing.T) {
	prefill := Target{Name: "prefill-0", Role: RolePrefill}
	decode := Target{Name: "decode-0", Role: RoleDecode}
	gw := Target{Name: "gateway", Role: RoleGateway}
	unified := Target{Name: "engine", Role: RoleUnified}
	for _, tc := range []struct {
		name  string
		feeds []feed
		want  map[Signal]want
	}{
		{
			name:  "sglang pd without gateway",
			feeds: []feed{{prefill, "sglang_pd_prefill"}, {decode, "sglang_pd_decode"}},
			want: map[Signal]want{
				// 650k GPU + 1.3M host; decode's retained KV counts only with sticky routing.
				CacheCapacity: ok(1_950_000),
				// used + evictable on prefill.
				WorkingSet:     okEstimated(78_000 + 490_000),
				DecodeFree:     ok(372_000),
				DecodeReserved: ok(328_000),
				DecodeCapacity: ok(800_000),
				// priority="" totals only: prefill 7 + 2 (bootstrap; inflight not counted),
				// decode 1 + 4 + 2.
				EngineQueue: ok(16),
				KVUsageMax:  ok(0.41),
				// Rates need two readings.
				HitRate: missing, CallRate: missing, TTFTp50: missing, TTFTp99: missing,
				LiveSessions: missing, Budget: missing, ArrivalRate: missing,
			},
		},
		{
			name:  "sglang pd with gateway and sticky routing",
			feeds: []feed{{prefill, "sglang_pd_prefill"}, {decode, "sglang_pd_decode"}, {gw, "gateway"}},
			want: map[Signal]want{
				CacheCapacity:  ok(1_950_000 + 100_000),
				WorkingSet:     ok(1_412_000),
				LiveSessions:   ok(38),
				QueuedSessions: ok(6),
				Budget:         ok(1_800_000),
				Reserved:       ok(1_412_000),
				ArrivalRate:    missing,
				CompletionRate: missing,
			},
		},
		{
			name:  "sglang unified, old names",
			feeds: []feed{{unified, "sglang_unified_old"}},
			want: map[Signal]want{
				CacheCapacity: ok(442_354),
				// Without kv_evictable_tokens nothing tells what the cache retains.
				WorkingSet:  missing,
				EngineQueue: ok(2826),
				KVUsageMax:  ok(0.28),
				// Decode KV is for PD decode instances only.
				DecodeFree: missing, DecodeReserved: missing, DecodeCapacity: missing,
			},
		},
		{
			name:  "sglang old, cached and prompt tokens only",
			feeds: []feed{{unified, "sglang_cached_only"}},
			want: map[Signal]want{
				CacheCapacity: missing,
				EngineQueue:   ok(0),
				KVUsageMax:    ok(0.09),
				HitRate:       missing,
			},
		},
		{
			name:  "vllm unified",
			feeds: []feed{{unified, "vllm_v1"}},
			want: map[Signal]want{
				CacheCapacity: ok(27298 * 16),
				// num_requests_waiting only, not ..._by_reason.
				EngineQueue: ok(12),
				KVUsageMax:  ok(0.6342),
				WorkingSet:  missing,
			},
		},
		{
			name:  "vllm decode",
			feeds: []feed{{decode, "vllm_v1"}},
			want: map[Signal]want{
				DecodeCapacity: ok(27298 * 16),
				DecodeReserved: ok(0.6342 * 27298 * 16),
				DecodeFree:     ok((1 - 0.6342) * 27298 * 16),
				CacheCapacity:  missing,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := newTest(t, Options{})
			for _, f := range tc.feeds {
				require.NoError(t, c.Ingest(t0, f.target, fixture(t, f.fixture)))
			}
			assertSignals(t, c.SnapshotAt(t0), tc.want)
		})
	}
}

func assertSignals(t testing.TB, snap Snapshot, want map[Signal]want) {
	t.Helper()
	for sig, w := range want {
		got := snap.Signals[sig]
		v, isOK := snap.Get(sig)
		if !assert.Equal(t, w.state, got.State, "%s state (%+v)", sig, got) {
			continue
		}
		if w.state != OK {
			assert.False(t, isOK, "%s: Get must not be ok", sig)
			assert.Zero(t, v, "%s: Get returns no value", sig)
			continue
		}
		assert.True(t, isOK, sig)
		assert.InDelta(t, w.v, v, 1e-9*max(1, w.v), "%s (source %s)", sig, got.Source)
		assert.Equal(t, w.estimated, got.Estimated, "%s estimated", sig)
		assert.NotEmpty(t, got.Source, sig)
	}
}
