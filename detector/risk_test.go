package detector

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
)

func TestRisk(t *testing.T) {
	// The simulator's paper-1p1d-h100: 650K tokens of prefill cache, one decode with 800K of KV,
	// Terminal-Bench sessions of about 25K tokens. Cache limit 1.9 × 650K ÷ 25K = 49.4 sessions.
	p1d1 := RiskInputs{CacheTokens: 650_000, DecodeKVTokens: 800_000, DecodeInstances: 1, MeanContext: 25_000, KneeFactor: 1.9}
	with := func(f func(*RiskInputs)) RiskInputs { in := p1d1; f(&in); return in }
	// The fraction of a session's life in a call: mean call time over call plus tool time.
	served := func(call, tool float64) float64 { return call / (call + tool) }
	tests := []struct {
		name          string
		in            RiskInputs
		cache, decode float64
		binding       string
	}{
		// 800K ÷ 25K = 32 sessions' contexts fit decode; half the sessions in a call → 64.
		{name: "1P1D, tools as long as calls", in: with(func(in *RiskInputs) { in.ServedFraction = served(20, 20) }),
			cache: 49.4, decode: 64, binding: CacheFirst},
		// Short tools: 80% of sessions hold decode KV → 40 < 49.4.
		{name: "1P1D, short tools", in: with(func(in *RiskInputs) { in.ServedFraction = served(20, 5) }),
			cache: 49.4, decode: 40, binding: DecodeFirst},
		// Twice the decode KV flips it back: 80.
		{name: "1P1D, short tools, twice the decode KV", in: with(func(in *RiskInputs) {
			in.ServedFraction = served(20, 5)
			in.DecodeKVTokens = 1_600_000
		}), cache: 49.4, decode: 80, binding: CacheFirst},
		// Three decode instances (1P3D): 3 × 32 ÷ 0.8 = 120.
		{name: "1P3D, short tools", in: with(func(in *RiskInputs) {
			in.ServedFraction = served(20, 5)
			in.DecodeInstances = 3
		}), cache: 49.4, decode: 120, binding: CacheFirst},
		// A host tier as large as the GPU cache doubles the cache limit: 98.8 > 64.
		{name: "1P1D with a host tier", in: with(func(in *RiskInputs) {
			in.ServedFraction = served(20, 20)
			in.HostTokens = 650_000
		}), cache: 98.8, decode: 64, binding: DecodeFirst},
		// 2.0 × 500K ÷ 25K = 40 = 32 ÷ 0.8: a tie is called cache-first.
		{name: "tie", in: with(func(in *RiskInputs) {
			in.CacheTokens, in.KneeFactor, in.ServedFraction = 500_000, 2.0, 0.8
		}), cache: 40, decode: 40, binding: CacheFirst},
		{name: "default knee factor", in: with(func(in *RiskInputs) { in.KneeFactor, in.ServedFraction = 0, 0.5 }),
			cache: 49.4, decode: 64, binding: CacheFirst},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Risk(tc.in)
			require.NoError(t, err)
			assert.InDelta(t, tc.cache, r.CacheLimitSessions, 1e-9)
			assert.InDelta(t, tc.decode, r.DecodeLimitSessions, 1e-9)
			assert.Equal(t, tc.binding, r.Binding)
			require.Len(t, r.Reasons, 3)
			assert.Contains(t, r.Reasons[2], tc.binding)
		})
	}
	r, err := Risk(with(func(in *RiskInputs) { in.ServedFraction = 0.5 }))
	require.NoError(t, err)
	assert.Equal(t, "cache limit 1.90 × 650K cache tokens ÷ 25K mean context = 49.4 sessions", r.Reasons[0])
	assert.Equal(t, "decode limit 1 × 800K decode KV tokens ÷ 25K mean context ÷ 0.50 served = 64.0 sessions", r.Reasons[1])
}

func TestRiskErrors(t *testing.T) {
	good := RiskInputs{CacheTokens: 650_000, DecodeKVTokens: 800_000, DecodeInstances: 1, MeanContext: 25_000, ServedFraction: 0.5}
	for _, tc := range []struct {
		name string
		f    func(*RiskInputs)
	}{
		{"CacheTokens", func(in *RiskInputs) { in.CacheTokens = 0 }},
		{"HostTokens", func(in *RiskInputs) { in.HostTokens = -1 }},
		{"DecodeKVTokens", func(in *RiskInputs) { in.DecodeKVTokens = 0 }},
		{"DecodeInstances", func(in *RiskInputs) { in.DecodeInstances = 0 }},
		{"MeanContext", func(in *RiskInputs) { in.MeanContext = 0 }},
		{"ServedFraction", func(in *RiskInputs) { in.ServedFraction = 1.5 }},
		{"KneeFactor", func(in *RiskInputs) { in.KneeFactor = -1 }},
	} {
		in := good
		tc.f(&in)
		_, err := Risk(in)
		assert.ErrorContains(t, err, tc.name)
	}
	_, err := Risk(good)
	assert.NoError(t, err)
}

func TestRiskInputsFrom(t *testing.T) {
	snap := func(vals map[collector.Signal]float64) collector.Snapshot {
		s := collector.Snapshot{At: t0, Signals: map[collector.Signal]collector.Value{}}
		for k, v := range vals {
			s.Signals[k] = collector.Value{V: v, State: collector.OK, At: t0}
		}
		return s
	}
	full := map[collector.Signal]float64{
		collector.WorkingSet: 1_250_000, collector.LiveSessions: 50, collector.CacheCapacity: 650_000,
		collector.DecodeCapacity: 800_000,
	}
	in, err := RiskInputsFrom(snap(full), 0.5, 1.9)
	require.NoError(t, err)
	assert.Equal(t, RiskInputs{CacheTokens: 650_000, DecodeKVTokens: 800_000, DecodeInstances: 1, MeanContext: 25_000,
		ServedFraction: 0.5, KneeFactor: 1.9}, in)
	r, err := Risk(in)
	require.NoError(t, err)
	assert.Equal(t, CacheFirst, r.Binding)

	noDecode := map[collector.Signal]float64{}
	for k, v := range full {
		if k != collector.DecodeCapacity {
			noDecode[k] = v
		}
	}
	_, err = RiskInputsFrom(snap(noDecode), 0.5, 1.9)
	assert.ErrorContains(t, err, "decode_capacity_tokens missing")

	empty := map[collector.Signal]float64{}
	for k, v := range full {
		empty[k] = v
	}
	empty[collector.LiveSessions] = 0
	_, err = RiskInputsFrom(snap(empty), 0.5, 1.9)
	assert.ErrorContains(t, err, "no mean context")
}
