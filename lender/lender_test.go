package lender

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// dec is a decode instance of 150K tokens whose memory adds up: free = capacity − reserved − lent.
func dec(name string, reserved, lent float64, waiting int) Instance {
	const capacity = 150_000
	return Instance{Name: name, CapacityTokens: capacity, FreeTokens: capacity - reserved - lent,
		ReservedTokens: reserved, LentTokens: lent, Waiting: waiting}
}

func newLender(t *testing.T, o Options) *Lender {
	t.Helper()
	l, err := New(o)
	require.NoError(t, err)
	return l
}

func TestGrantArithmetic(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		instances []Instance
		want      []int64
		reason    []string // each grant's exact reason
	}{
		{
			name:      "free minus headroom binds",
			instances: []Instance{dec("decode-0", 98_000, 0, 0)},
			want:      []int64{37_000},
			reason:    []string{"decode-0: free 52000 − headroom 15000 = 37000 < 0.5 × 150000 = 75000 → 37000"},
		},
		{
			name:      "half of capacity caps the grant",
			instances: []Instance{dec("decode-0", 30_000, 0, 0)},
			want:      []int64{75_000},
			reason:    []string{"decode-0: free 120000 − headroom 15000 = 105000 ≥ 0.5 × 150000 = 75000 → 75000"},
		},
		{
			name:      "lent tokens count as lendable, so the grant does not shrink as it fills",
			instances: []Instance{dec("decode-0", 90_000, 20_000, 0)},
			want:      []int64{45_000},
			reason:    []string{"decode-0: free 40000 + lent 20000 − headroom 15000 = 45000 < 0.5 × 150000 = 75000 → 45000"},
		},
		{
			name: "lent counted in free as well is not lent twice",
			instances: []Instance{{Name: "decode-0", CapacityTokens: 150_000, FreeTokens: 60_000,
				ReservedTokens: 90_000, LentTokens: 20_000}},
			want: []int64{45_000},
			reason: []string{"decode-0: free 60000 + lent 20000 (more than capacity 150000 − reserved 90000; using 60000) − " +
				"headroom 15000 = 45000 < 0.5 × 150000 = 75000 → 45000"},
		},
		{
			name: "no room beyond the headroom is a zero grant, never negative",
			instances: []Instance{
				{Name: "decode-0", CapacityTokens: 150_000, FreeTokens: 10_000, ReservedTokens: 100_000},
				dec("decode-1", 30_000, 0, 0),
			},
			want: []int64{0, 75_000},
			reason: []string{"decode-0: free 10000 − headroom 15000 = −5000 ≤ 0 → 0",
				"decode-1: free 120000 − headroom 15000 = 105000 ≥ 0.5 × 150000 = 75000 → 75000"},
		},
		{
			name:      "custom fraction and headroom",
			opts:      Options{MaxFraction: 0.25, HeadroomFraction: 0.2},
			instances: []Instance{dec("decode-0", 30_000, 0, 0), dec("decode-1", 90_000, 0, 0)},
			want:      []int64{37_500, 30_000},
			reason: []string{"decode-0: free 120000 − headroom 30000 = 90000 ≥ 0.25 × 150000 = 37500 → 37500",
				"decode-1: free 60000 − headroom 30000 = 30000 < 0.25 × 150000 = 37500 → 30000"},
		},
		{
			name:      "fractional tokens round down",
			instances: []Instance{{Name: "decode-0", CapacityTokens: 1001, FreeTokens: 901.9, ReservedTokens: 99.1}},
			want:      []int64{500},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLender(t, tt.opts)
			d := l.Decide(Inputs{At: t0, Instances: tt.instances, CacheFirst: true, Reason: "risk rule"})
			require.True(t, d.Enabled, d.Reasons)
			require.Len(t, d.Grants, len(tt.want))
			for i, g := range d.Grants {
				assert.Equal(t, tt.instances[i].Name, g.Instance)
				assert.Equal(t, tt.want[i], g.Tokens, g.Reason)
				if tt.reason != nil {
					assert.Equal(t, tt.reason[i], g.Reason)
				}
			}
		})
	}
}

// step is one Decide call of a scenario, After the scenario's start.
type step struct {
	after       time.Duration
	instances   []Instance
	decodeFirst bool
	enabled     bool
	changed     bool
	verdict     string // a substring of the first reason
}

func TestSwitch(t *testing.T) {
	calm := []Instance{dec("decode-0", 60_000, 0, 0), dec("decode-1", 90_000, 0, 0)}    // hottest 0.60
	warm := []Instance{dec("decode-0", 60_000, 0, 0), dec("decode-1", 120_000, 0, 0)}   // hottest 0.80
	hot := []Instance{dec("decode-0", 60_000, 0, 0), dec("decode-1", 130_000, 0, 0)}    // hottest 0.87
	waiting := []Instance{dec("decode-0", 60_000, 0, 0), dec("decode-1", 90_000, 0, 2)} // a queue on decode-1
	blind := []Instance{dec("decode-0", 60_000, 0, 0), {Name: "decode-1"}}              // decode-1 reports no capacity

	full := []Instance{dec("decode-0", 60_000, 0, 0), dec("decode-1", 150_000, 0, 0)} // hottest 1.00
	sensitive := Options{PressureOn: 0.85}                                            // an engine without on-demand reclaim

	tests := []struct {
		name  string
		opts  Options
		steps []step
	}{
		{"cache-first with headroom switches on", Options{}, []step{
			{0, calm, false, true, true, "lending on: cache-first (risk rule); hottest decode decode-1 reserved 0.60 ≤ pressure-off 0.70"},
			{time.Minute, calm, false, true, false, "lending on: cache-first"},
		}},
		{"decode-first stays off", Options{}, []step{
			{0, calm, true, false, false, "lending off: decode-first (risk rule)"},
		}},
		{"hottest instance above pressure-off stays off", Options{}, []step{
			{0, warm, false, false, false, "hottest decode decode-1 reserved 0.80 > pressure-off 0.70"},
		}},
		{"requests waiting for decode KV keep it off", Options{}, []step{
			{0, waiting, false, false, false, "decode-1 has 2 requests waiting for decode KV"},
		}},
		{"no usable reading keeps it off", Options{}, []step{
			{0, blind, false, false, false, "no usable reading from decode-1, cannot confirm headroom"},
		}},
		{"no instances keep it off", Options{}, []step{
			{0, nil, false, false, false, "no decode instance reported"},
		}},
		{"no memory beyond the headroom keeps it off", Options{}, []step{
			{0, []Instance{{Name: "decode-0", CapacityTokens: 100, FreeTokens: 5, ReservedTokens: 60, LentTokens: 0}},
				false, false, false, "no decode instance has memory beyond its headroom"},
		}},
		{"by default a high reservation alone does not reclaim: the engine reclaims lent pages on demand", Options{}, []step{
			{0, calm, false, true, true, "lending on"},
			{10 * time.Second, hot, false, true, false, "hottest decode decode-1 reserved 0.87 < pressure-on 1.00"},
		}},
		{"a wholly reserved instance reclaims at once", Options{}, []step{
			{0, calm, false, true, true, "lending on"},
			{10 * time.Second, full, false, false, true, "lending off (reclaim): decode-1 reserved 1.00 ≥ pressure-on 1.00; immediate"},
		}},
		{"pressure reclaims at once, bypassing the dwell", sensitive, []step{
			{0, calm, false, true, true, "lending on"},
			{10 * time.Second, hot, false, false, true, "lending off (reclaim): decode-1 reserved 0.87 ≥ pressure-on 0.85; immediate"},
		}},
		{"hysteresis: between pressure-off and pressure-on the switch holds either way", sensitive, []step{
			{0, calm, false, true, true, "lending on"},
			{time.Minute, warm, false, true, false, "hottest decode decode-1 reserved 0.80 < pressure-on 0.85"},
			{2 * time.Minute, hot, false, false, true, "reclaim"},
			{20 * time.Minute, warm, false, false, false, "reserved 0.80 > pressure-off 0.70"},
			{21 * time.Minute, calm, false, true, true, "lending on"},
		}},
		{"the dwell holds switching on again after a reclaim", sensitive, []step{
			{0, calm, false, true, true, "lending on"},
			{time.Minute, hot, false, false, true, "reclaim"},
			{2 * time.Minute, calm, false, false, false,
				"lending off, held: cache-first (risk rule) with decode headroom, but lending switched off 1m0s ago; it may switch at 2026-05-01T12:06:00Z (min dwell 5m0s)"},
			{6*time.Minute - time.Second, calm, false, false, false, "held"},
			{6 * time.Minute, calm, false, true, true, "lending on"},
		}},
		{"decode-first switches off only after the dwell", Options{}, []step{
			{0, calm, false, true, true, "lending on"},
			{time.Minute, calm, true, true, false, "lending on, held: decode-first (risk rule), but lending switched on 1m0s ago"},
			{5 * time.Minute, calm, true, false, true, "lending off: decode-first (risk rule) — decode memory binds before the cache"},
		}},
		{"a queue for decode KV reclaims once it lasts the waiting hold", Options{}, []step{
			{0, calm, false, true, true, "lending on"},
			{10 * time.Second, waiting, false, true, false, "decode-1 has requests waiting for decode KV (0s of 15s before a reclaim), its grant is 0"},
			{20 * time.Second, waiting, false, true, false, "(10s of 15s"},
			{25 * time.Second, waiting, false, false, true, "lending off (reclaim): decode-1 has had requests waiting for decode KV for 15s ≥ 15s (2 now)"},
		}},
		{"the waiting hold starts again when the queue clears", Options{}, []step{
			{0, calm, false, true, true, "lending on"},
			{10 * time.Second, waiting, false, true, false, "(0s of 15s"},
			{20 * time.Second, calm, false, true, false, "lending on"},
			{30 * time.Second, waiting, false, true, false, "(0s of 15s"},
			{40 * time.Second, waiting, false, true, false, "(10s of 15s"},
		}},
		{"a blind reading holds lending on and zeroes that grant", Options{}, []step{
			{0, calm, false, true, true, "lending on"},
			{time.Minute, blind, false, true, false, "no usable reading from decode-1: grant 0, the switch holds"},
			{2 * time.Minute, nil, false, true, false, "lending on: cache-first (risk rule); no decode instance reported, the switch holds"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLender(t, tt.opts)
			for i, s := range tt.steps {
				d := l.Decide(Inputs{At: t0.Add(s.after), Instances: s.instances, CacheFirst: !s.decodeFirst, Reason: "risk rule"})
				require.NotEmpty(t, d.Reasons)
				assert.Equal(t, s.enabled, d.Enabled, "step %d: %v", i, d.Reasons)
				assert.Equal(t, s.changed, d.Changed, "step %d: %v", i, d.Reasons)
				assert.Contains(t, d.Summary(), s.verdict, "step %d", i)
				assert.Equal(t, 0.5, d.MaxFraction)
				require.Len(t, d.Grants, len(s.instances))
				enabled, since := l.State()
				assert.Equal(t, d.Enabled, enabled)
				assert.Equal(t, since, d.Since)
				if d.Changed {
					assert.Equal(t, d.At, since, "step %d: a toggle starts the dwell", i)
				}
				for _, g := range d.Grants {
					assert.GreaterOrEqual(t, g.Tokens, int64(0))
					if !d.Enabled {
						assert.Zero(t, g.Tokens, "step %d: %s", i, g.Reason)
					}
				}
			}
		})
	}
}

func TestGrantsWhileOffShowWhatTheyWouldBe(t *testing.T) {
	l := newLender(t, Options{})
	d := l.Decide(Inputs{At: t0, Instances: []Instance{dec("decode-0", 98_000, 0, 0)}, Reason: "risk rule"})
	require.False(t, d.Enabled)
	require.Len(t, d.Grants, 1)
	assert.Equal(t, Grant{Instance: "decode-0", Tokens: 0,
		Reason: "decode-0: lending off → 0 (on: free 52000 − headroom 15000 = 37000 < 0.5 × 150000 = 75000 → 37000)"}, d.Grants[0])
	assert.Equal(t, []string{"lending off: decode-first (risk rule)",
		"decode-0: reserved 98000 / 150000 = 0.65, free 52000, lent 0, 0 waiting for decode KV"}, d.Reasons)
}

func TestWaitingInstanceGetsNoGrant(t *testing.T) {
	l := newLender(t, Options{})
	l.Restore(true, t0.Add(-time.Hour))
	d := l.Decide(Inputs{At: t0, Instances: []Instance{dec("decode-0", 60_000, 0, 0), dec("decode-1", 60_000, 0, 3)}, CacheFirst: true})
	require.True(t, d.Enabled)
	assert.Equal(t, int64(75_000), d.Grants[0].Tokens)
	assert.Equal(t, Grant{Instance: "decode-1", Reason: "decode-1: 3 requests waiting for decode KV → 0, decode needs its memory"}, d.Grants[1])
}

func TestUnusableReadings(t *testing.T) {
	for name, inst := range map[string]Instance{
		"no name":           {CapacityTokens: 100, FreeTokens: 100},
		"zero capacity":     {Name: "d", CapacityTokens: 0, FreeTokens: 100},
		"NaN free":          {Name: "d", CapacityTokens: 100, FreeTokens: math.NaN()},
		"infinite reserved": {Name: "d", CapacityTokens: 100, ReservedTokens: math.Inf(1)},
		"negative lent":     {Name: "d", CapacityTokens: 100, FreeTokens: 100, LentTokens: -1},
		"negative waiting":  {Name: "d", CapacityTokens: 100, FreeTokens: 100, Waiting: -1},
	} {
		t.Run(name, func(t *testing.T) {
			l := newLender(t, Options{})
			d := l.Decide(Inputs{At: t0, Instances: []Instance{inst}, CacheFirst: true})
			assert.False(t, d.Enabled, "an unusable reading cannot confirm headroom")
			assert.Contains(t, d.Summary(), "no usable reading")
			assert.Zero(t, d.Grants[0].Tokens)
			assert.Contains(t, d.Grants[0].Reason, "unusable reading → 0")
		})
	}
}

func TestRestoreKeepsTheDwell(t *testing.T) {
	l := newLender(t, Options{})
	l.Restore(true, t0)
	enabled, since := l.State()
	assert.True(t, enabled)
	assert.Equal(t, t0, since)

	calm := []Instance{dec("decode-0", 60_000, 0, 0)}
	d := l.Decide(Inputs{At: t0.Add(time.Minute), Instances: calm})
	assert.True(t, d.Enabled, "decode-first a minute after the restored toggle is held by the dwell: %v", d.Reasons)
	assert.False(t, d.Changed)

	d = l.Decide(Inputs{At: t0.Add(5 * time.Minute), Instances: calm})
	assert.False(t, d.Enabled)
	assert.True(t, d.Changed)
	enabled, since = l.State()
	assert.False(t, enabled)
	assert.Equal(t, t0.Add(5*time.Minute), since)
}

// TestGrantsBounded checks on random readings, consistent or not, that no grant is negative or
// above MaxFraction × capacity, and that each reading's grant leaves its headroom.
func TestGrantsBounded(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	l := newLender(t, Options{})
	l.Restore(true, time.Time{})
	for i := range 2000 {
		capacity := 1 + r.Float64()*1e6
		inst := Instance{Name: "d", CapacityTokens: capacity, FreeTokens: r.Float64() * capacity * 1.2,
			ReservedTokens: r.Float64() * capacity * 0.84, LentTokens: r.Float64() * capacity * 0.6}
		d := l.Decide(Inputs{At: t0, Instances: []Instance{inst}, CacheFirst: true})
		require.True(t, d.Enabled, "%d: %v", i, d.Reasons)
		g := float64(d.Grants[0].Tokens)
		require.GreaterOrEqual(t, g, 0.0, "%d: %s", i, d.Grants[0].Reason)
		require.LessOrEqual(t, g, 0.5*capacity, "%d: %s", i, d.Grants[0].Reason)
		require.LessOrEqual(t, g, max(capacity-inst.ReservedTokens-0.1*capacity, 0), "%d: %s", i, d.Grants[0].Reason)
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string // empty: valid
	}{
		{"zero takes the defaults", Options{}, ""},
		{"all of lending", Options{MaxFraction: 1}, ""},
		{"max fraction above 1", Options{MaxFraction: 1.5}, "MaxFraction: 1.5 outside (0, 1]"},
		{"negative max fraction", Options{MaxFraction: -0.5}, "MaxFraction: -0.5 outside (0, 1]"},
		{"NaN max fraction", Options{MaxFraction: math.NaN()}, "MaxFraction: NaN outside (0, 1]"},
		{"headroom of everything", Options{HeadroomFraction: 1}, "HeadroomFraction: 1 outside (0, 1)"},
		{"pressure-on above 1", Options{PressureOn: 1.2}, "PressureOn: 1.2 outside (0, 1]"},
		{"pressure-off negative", Options{PressureOff: -0.1}, "PressureOff: -0.1 outside (0, 1)"},
		{"no hysteresis", Options{PressureOn: 0.8, PressureOff: 0.8}, "PressureOff: 0.8 must be below PressureOn 0.8"},
		{"off above the default on", Options{PressureOff: 1}, "PressureOff: 1 outside (0, 1)"},
		{"off above on", Options{PressureOn: 0.85, PressureOff: 0.9}, "PressureOff: 0.9 must be below PressureOn 0.85"},
		{"negative dwell", Options{MinDwell: -time.Second}, "MinDwell: -1s, must not be negative"},
		{"negative waiting hold", Options{WaitingHold: -time.Second}, "WaitingHold: -1s, must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			_, newErr := New(tt.opts)
			if tt.want == "" {
				assert.NoError(t, err)
				assert.NoError(t, newErr)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			require.Error(t, newErr)
			assert.Contains(t, newErr.Error(), tt.want)
		})
	}

	err := Options{MaxFraction: 2, MinDwell: -1}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "MaxFraction", "every bad field is reported")
	assert.Contains(t, err.Error(), "MinDwell")
}

func TestDefaults(t *testing.T) {
	l := newLender(t, Options{})
	assert.Equal(t, Options{MaxFraction: 0.5, HeadroomFraction: 0.1, PressureOn: 1, PressureOff: 0.7,
		MinDwell: 5 * time.Minute, WaitingHold: 15 * time.Second}, l.Options())
}
