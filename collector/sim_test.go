package collector

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/enginemetrics"
)

// TestSimulator feeds a simulated 1P1D deployment with KV lending through both pure paths
// (gathered families, and their text rendering) every 5 simulated seconds, and checks the
// signals against the simulator's own numbers.
func TestSimulator(t *testing.T) {
	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	require.NoError(t, err)
	dep.Lending.Enabled = true
	w, err := sim.SyntheticWorkload("terminal-bench")
	require.NoError(t, err)
	s, err := sim.New(sim.Options{
		Seed: 1, Deployment: dep,
		Streams:  []sim.Stream{{Class: "base", Workload: w, RatePerMin: 3.3}},
		Duration: 30 * time.Minute, MeasureFrom: 5 * time.Minute, MeasureTo: 25 * time.Minute, NoDrain: true,
	})
	require.NoError(t, err)
	// The harness is single-threaded here: Stats runs only from Gather below.
	src := func() []sim.InstanceStats { return s.Stats() }
	regs, err := enginemetrics.Registries(src, []string{"prefill-0", "decode-0"}, enginemetrics.Options{})
	require.NoError(t, err)
	targets := map[string]Target{
		"prefill-0": {Name: "prefill-0", Role: RolePrefill, Dialect: DialectSGLang},
		"decode-0":  {Name: "decode-0", Role: RoleDecode}, // auto
	}

	gathered, _, _ := newTest(t, Options{})
	texted, _, _ := newTest(t, Options{})
	stats := map[time.Duration]map[string]sim.InstanceStats{}
	const from, to = 15 * time.Minute, 20 * time.Minute
	for at := from; at <= to; at += 5 * time.Second {
		s.RunUntil(at)
		now := t0.Add(at)
		stats[at] = map[string]sim.InstanceStats{}
		for _, st := range s.Stats() {
			stats[at][st.Name] = st
		}
		for name, reg := range regs {
			fams, err := reg.Gather()
			require.NoError(t, err)
			require.NoError(t, gathered.IngestGathered(now, targets[name], fams))
			require.NoError(t, texted.IngestText(now, targets[name], bytes.NewReader(gatheredText(t, fams))))
		}
	}
	snap := gathered.SnapshotAt(t0.Add(to))
	assert.Equal(t, snap, texted.SnapshotAt(t0.Add(to)), "gathered and text paths agree")

	p, d := stats[to]["prefill-0"], stats[to]["decode-0"]
	p0, d0 := stats[to-time.Minute]["prefill-0"], stats[to-time.Minute]["decode-0"]
	require.Positive(t, d.LentTokens, "the run lends decode KV")
	obs := s.Observe()
	hits := (p.CachedDevice + p.CachedHost + p.CachedLent) - (p0.CachedDevice + p0.CachedHost + p0.CachedLent)
	computed := p.ComputedTokens - p0.ComputedTokens
	require.Positive(t, hits+computed, "traffic in the last minute")
	assertSignals(t, snap, map[Signal]want{
		CacheCapacity:  ok(float64(obs.CacheCapacity)),
		HitRate:        ok(hits / (hits + computed)),
		CallRate:       ok((d.Requests - d0.Requests) / 60),
		DecodeCapacity: ok(float64(d.MaxTotalTokens)),
		DecodeFree:     ok(float64(d.AvailableTokens)),
		DecodeReserved: ok(float64(d.UsedTokens)),
		EngineQueue:    ok(float64(p.Queued + p.BootstrapQueue + d.Queued + d.PreallocQueue + d.TransferQueue)),
		KVUsageMax:     ok(max(float64(p.UsedTokens)/float64(p.MaxTotalTokens), float64(d.UsedTokens)/float64(d.MaxTotalTokens))),
		WorkingSet:     okEstimated(float64(p.UsedTokens + p.EvictableTokens)),
		LiveSessions:   missing,
	})
	p50, p99 := snap.Signals[TTFTp50], snap.Signals[TTFTp99]
	assert.Equal(t, OK, p50.State)
	assert.Equal(t, OK, p99.State)
	assert.Positive(t, p50.V)
	assert.LessOrEqual(t, p50.V, p99.V)
	t.Logf("simulated W %d, estimated %.0f; capacity %.0f; hit rate %.3f; TTFT p50 %.2fs p99 %.2fs",
		obs.WorkingSetTokens, snap.Signals[WorkingSet].V, snap.Signals[CacheCapacity].V, snap.Signals[HitRate].V, p50.V, p99.V)
}

func gatheredText(t testing.TB, fams []*dto.MetricFamily) []byte {
	t.Helper()
	m := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	return text(t, m)
}

// TestGatewayOutput reads a real gateway's /metrics (served by its admin handler) and its
// registry.
func TestGatewayOutput(t *testing.T) {
	cfg, err := gateway.ParseConfig([]byte(`
upstreams: [http://127.0.0.1:9]
admission:
  budget_tokens: 1234567
affinity:
  enabled: true
`))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	g, err := gateway.New(gateway.Options{Config: cfg, Registerer: reg, Getenv: func(k string) string {
		if k == gateway.AdminTokenEnv {
			return "test-token"
		}
		return ""
	}})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", acceptHeader)
	g.AdminHandler().ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.True(t, isText(rec.Header().Get("Content-Type")), rec.Header().Get("Content-Type"))

	gw := Target{Name: "gateway", Role: RoleGateway}
	c, _, _ := newTest(t, Options{})
	require.NoError(t, c.IngestText(t0, gw, bytes.NewReader(rec.Body.Bytes())))
	require.NoError(t, c.Ingest(t0, Target{Name: "decode-0", Role: RoleDecode}, fixture(t, "sglang_pd_decode")))
	require.NoError(t, c.Ingest(t0, Target{Name: "prefill-0", Role: RolePrefill}, fixture(t, "sglang_pd_prefill")))
	expect := map[Signal]want{
		Budget: ok(1_234_567), WorkingSet: ok(0), LiveSessions: ok(0), QueuedSessions: ok(0), Reserved: ok(0),
		// Affinity is on: decode's 100k retained tokens are capacity.
		CacheCapacity: ok(1_950_000 + 100_000),
	}
	assertSignals(t, c.SnapshotAt(t0), expect)

	fams, err := reg.Gather()
	require.NoError(t, err)
	c2, _, _ := newTest(t, Options{})
	require.NoError(t, c2.IngestGathered(t0, gw, fams))
	require.NoError(t, c2.IngestGathered(t0.Add(10*time.Second), gw, fams))
	assertSignals(t, c2.SnapshotAt(t0.Add(10*time.Second)), map[Signal]want{Budget: ok(1_234_567), ArrivalRate: ok(0), CompletionRate: ok(0)})
}

// A gateway that holds sessions reports them in its working set and live count; the collector
// reads the rest, the active working set the cache must carry. A gateway that exports no hold
// metrics (an older one) holds nothing.
func TestGatewayHeldSessionsLeaveTheWorkingSet(t *testing.T) {
	body := func(held string) string {
		return `# TYPE basin_gateway_working_set_tokens gauge
basin_gateway_working_set_tokens 2.1e+06
# TYPE basin_gateway_sessions_live gauge
basin_gateway_sessions_live 92
` + held
	}
	gw := Target{Name: "gateway", Role: RoleGateway}
	for _, tc := range []struct {
		name     string
		held     string
		ws, live float64
	}{
		{"holding", `# TYPE basin_gateway_sessions_held gauge
basin_gateway_sessions_held 34
# TYPE basin_gateway_held_tokens gauge
basin_gateway_held_tokens 1.4e+06
`, 700_000, 58},
		{"nothing held", `# TYPE basin_gateway_sessions_held gauge
basin_gateway_sessions_held 0
# TYPE basin_gateway_held_tokens gauge
basin_gateway_held_tokens 0
`, 2_100_000, 92},
		{"an older gateway", "", 2_100_000, 92},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := newTest(t, Options{})
			require.NoError(t, c.IngestText(t0, gw, strings.NewReader(body(tc.held))))
			assertSignals(t, c.SnapshotAt(t0), map[Signal]want{WorkingSet: ok(tc.ws), LiveSessions: ok(tc.live)})
		})
	}
}
