package collector

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSums: each role's reading feeds the signals it can tell, and a signal is published only
// when every contributor can give it now.
func TestSums(t *testing.T) {
	prefill := func(r reading, hit windowRate) *targetState {
		r.at, r.dialect = t0, DialectSGLang
		return &targetState{target: Target{Name: "prefill-0", Role: RolePrefill}, last: &r, hit: hit}
	}
	decode := func(r reading) *targetState {
		r.at, r.dialect = t0, DialectSGLang
		return &targetState{target: Target{Name: "decode-0", Role: RoleDecode}, last: &r}
	}
	gateway := func(r reading, arrivals windowRate) *targetState {
		r.at, r.dialect = t0, DialectGateway
		return &targetState{target: Target{Name: "gateway", Role: RoleGateway}, last: &r, arrivals: arrivals}
	}
	hitPair := counterPair{source: "sglang:cached_tokens_total", ok: true}
	tests := []struct {
		name      string
		targets   []*targetState
		affinity  bool
		want      map[Signal]float64
		estimated []Signal
	}{
		{name: "prefill capacity with its host tier",
			targets: []*targetState{prefill(reading{capacity: some(100), capacitySrc: sgMaxTotal, hostCapacity: some(50)}, windowRate{})},
			want:    map[Signal]float64{CacheCapacity: 150}},
		{name: "decode KV alone is no cache capacity",
			targets: []*targetState{decode(reading{lent: some(30), available: some(10), used: some(5), capacity: some(40), capacitySrc: sgMaxTotal})},
			want:    map[Signal]float64{DecodeFree: 10, DecodeReserved: 5, DecodeCapacity: 40}},
		{name: "lent decode KV adds to the prefill cache",
			targets: []*targetState{
				prefill(reading{capacity: some(100), capacitySrc: sgMaxTotal}, windowRate{}),
				decode(reading{lent: some(30)}),
			},
			want: map[Signal]float64{CacheCapacity: 130}},
		{name: "retained decode KV is a cache tier with affinity",
			targets: []*targetState{
				prefill(reading{capacity: some(100), capacitySrc: sgMaxTotal}, windowRate{}),
				decode(reading{evictable: some(20)}),
			},
			affinity: true,
			want:     map[Signal]float64{CacheCapacity: 120}},
		{name: "and not without",
			targets: []*targetState{
				prefill(reading{capacity: some(100), capacitySrc: sgMaxTotal}, windowRate{}),
				decode(reading{evictable: some(20)}),
			},
			want: map[Signal]float64{CacheCapacity: 100}},
		{name: "hit rate from the window's rates",
			targets: []*targetState{prefill(reading{hit: hitPair}, windowRate{r: [2]float64{30, 40}, ok: true})},
			want:    map[Signal]float64{HitRate: 0.75, PromptTokenRate: 40}},
		{name: "never more hits than prompt tokens",
			targets: []*targetState{prefill(reading{hit: hitPair}, windowRate{r: [2]float64{50, 40}, ok: true})},
			want:    map[Signal]float64{HitRate: 1, PromptTokenRate: 40}},
		{name: "no prompt tokens: a prompt rate, no hit rate",
			targets: []*targetState{prefill(reading{hit: hitPair}, windowRate{ok: true})},
			want:    map[Signal]float64{PromptTokenRate: 0}},
		{name: "a window with no rate yet holds both",
			targets: []*targetState{
				prefill(reading{hit: hitPair}, windowRate{r: [2]float64{30, 40}, ok: true}),
				prefill(reading{hit: hitPair}, windowRate{}),
			},
			want: map[Signal]float64{}},
		{name: "the engines' working set without a gateway is an estimate",
			targets:   []*targetState{prefill(reading{used: some(60), evictable: some(25)}, windowRate{})},
			want:      map[Signal]float64{WorkingSet: 85},
			estimated: []Signal{WorkingSet}},
		{name: "the gateway's working set wins",
			targets: []*targetState{
				prefill(reading{used: some(60), evictable: some(25)}, windowRate{}),
				gateway(reading{workingSet: some(70), live: some(3)}, windowRate{}),
			},
			want: map[Signal]float64{WorkingSet: 70, LiveSessions: 3}},
		{name: "arrivals wait for the gateway's window",
			targets: []*targetState{gateway(reading{arrivals: counterPair{source: gwArrivals, ok: true}}, windowRate{})},
			want:    map[Signal]float64{}},
		{name: "arrivals from the gateway's window",
			targets: []*targetState{gateway(reading{arrivals: counterPair{source: gwArrivals, ok: true}}, windowRate{r: [2]float64{0.5}, ok: true})},
			want:    map[Signal]float64{ArrivalRate: 0.5}},
		{name: "engine queues add up, KV usage is the highest",
			targets: []*targetState{
				prefill(reading{queue: some(2), usage: some(0.4)}, windowRate{}),
				decode(reading{queue: some(3), usage: some(0.9)}),
			},
			want: map[Signal]float64{EngineQueue: 5, KVUsageMax: 0.9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s sums
			for _, ts := range tc.targets {
				s.add(ts, tc.affinity)
			}
			values := map[Signal]Value{}
			s.publish(values)
			got := map[Signal]float64{}
			var estimated []Signal
			for sig, v := range values {
				got[sig] = v.V
				assert.Equal(t, t0, v.At, "%s", sig)
				if v.Estimated {
					estimated = append(estimated, sig)
				}
			}
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.estimated, estimated)
		})
	}
}

// TestPublishKeeps: a signal the sums cannot give now keeps its last value, so that it goes
// stale rather than read as zero.
func TestPublishKeeps(t *testing.T) {
	old := Value{V: 7, At: t0}
	values := map[Signal]Value{LiveSessions: old, HitRate: old}
	var s sums
	s.publish(values)
	assert.Equal(t, map[Signal]Value{LiveSessions: old, HitRate: old}, values)
}

// TestAffinity: decode's retained KV counts as lent only while a gateway says affinity is on.
func TestAffinity(t *testing.T) {
	tests := []struct {
		name     string
		affinity opt
		dialect  Dialect
		want     bool
	}{
		{"on", some(1), DialectGateway, true},
		{"off", some(0), DialectGateway, false},
		{"not said", opt{}, DialectGateway, false},
		{"not a gateway", some(1), DialectSGLang, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := newTest(t, Options{})
			c.mu.Lock()
			defer c.mu.Unlock()
			c.mu.order = []string{"x"}
			c.mu.targets = map[string]*targetState{"x": {last: &reading{dialect: tc.dialect, affinity: tc.affinity}}}
			assert.Equal(t, tc.want, c.affinityLocked())
		})
	}
}
