package scaler

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

// base is a deployment of four prefill instances of the simulator's 1P1D preset (560K tokens of
// cache each) and two of its decode instances (800K KV each), at a healthy moment: 60 live
// sessions of 20K tokens, 0.15 arrivals a second, sessions of 400 s.
func base() NeedInputs {
	return NeedInputs{
		Arrivals: 0.15, Lifetime: 400 * time.Second, LiveSessions: 60, WorkingSet: 1_200_000,
		ServedFraction: 0.5, KneeRatio: 1.25, PrefillCache: 560_000, DecodeKV: 800_000,
		DecodeReserved: 500_000, Prefill: 4, Decode: 2,
	}
}

func TestSize(t *testing.T) {
	for _, tc := range []struct {
		name          string
		in            func(*NeedInputs)
		o             NeedOptions
		prefill, dec  int
		forArrivals   bool
		binding       string
		population    float64
		reasonContain string
	}{
		// λT = 0.15 × 400 = 60 sessions; the spike adds 0.5 × 0.15 × 400 = 30 (T < 10 min): 90.
		// Prefill: max(60 × 20K ÷ 0.8, 90 × 20K) = 1.8M over 1.25 × 560K = 700K each → 3.
		// Decode: 90 × 0.5 = 45 in a call, 54.5 with two binomial standard deviations (2 ×
		// √(90 × 0.5 × 0.5)); 54.5 × 20K = 1.09M over 0.9 × 800K = 720K each → 2.
		{name: "the arrivals with a +50% spike", prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90,
			reasonContain: "90 with a +50% spike"},
		// T > the spike's 10 minutes: the spike adds 0.5 × 0.15 × 600 = 45 to 0.15 × 1200 = 180;
		// prefill max(180 × 20K ÷ 0.8, 225 × 20K) = 4.5M ÷ 700K → 7, decode (112.5 + 2 × 7.5) ×
		// 20K = 2.55M ÷ 720K → 4.
		{name: "a spike shorter than a lifetime adds its own length", in: func(in *NeedInputs) { in.Lifetime = 1200 * time.Second },
			prefill: 7, dec: 4, forArrivals: true, binding: detector.CacheFirst, population: 225},
		// Steady 60 × 20K ÷ 0.8 = 1.5M > spike 60 × 20K: 1.5M ÷ 700K → 3. Decode: (30 + 2 ×
		// √15) × 20K = 755K → 2.
		{name: "no spike: the steady population under 0.8 of the knee", o: NeedOptions{SpikeSize: 1e-9},
			prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 60},
		{name: "a +100% spike", o: NeedOptions{SpikeSize: 1}, prefill: 4, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 120},
		// A trapped deployment: 8M tokens live need 8M ÷ 700K = 12 prefill whatever the arrivals.
		{name: "the live working set binds", in: func(in *NeedInputs) { in.WorkingSet = 8_000_000; in.LiveSessions = 400 },
			prefill: 12, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90},
		{name: "the reserved decode KV binds", in: func(in *NeedInputs) { in.DecodeReserved = 3_000_000 },
			prefill: 3, dec: 5, forArrivals: true, binding: detector.CacheFirst, population: 90},
		{name: "no lifetime: only the live sessions", in: func(in *NeedInputs) { in.Lifetime = 0 },
			prefill: 2, dec: 1, forArrivals: false, binding: detector.CacheFirst, reasonContain: "not sized yet"},
		{name: "idle: one of each", in: func(in *NeedInputs) {
			*in = NeedInputs{KneeRatio: 1.25, PrefillCache: 560_000, DecodeKV: 800_000, Prefill: 1, Decode: 1}
		},
			prefill: 1, dec: 1},
		// Large contexts all in calls: decode fills first (risk rule), and decode needs more.
		{name: "decode-first", in: func(in *NeedInputs) { in.ServedFraction = 1; in.PrefillCache = 4_000_000 },
			prefill: 1, dec: 3, forArrivals: true, binding: detector.DecodeFirst, population: 90},
		// The arrivals sized two standard errors low: (0.17 − 2 × 0.01) = 0.15, as the base.
		{name: "the arrivals less twice their noise", in: func(in *NeedInputs) { in.Arrivals, in.ArrivalsSD = 0.17, 0.01 },
			prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90, reasonContain: "9.00/min (10.20 less 2 × its 0.60 noise)"},
		// A spike under way: λ (0.15) is above the long-run rate (0.12), and only what is left of
		// the +50% over the long-run rate comes on top: (1.5 × 0.12 − 0.15) × 400 = 12 sessions,
		// 72. Prefill: the steady 1.5M still needs 3; decode (36 + 2 × √18) × 20K = 890K needs 2
		// (the mean, 720K, would need 1; it takes +100% to need 2 without the margin).
		{name: "a spike under way is not planned twice", in: func(in *NeedInputs) { in.LongArrivals = 0.12 },
			prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 72, reasonContain: "spike over 7.20/min"},
		// λ past the +50% over the long-run rate (1.5 × 0.08 < 0.15): nothing on top, 60.
		{name: "past the planned spike, nothing on top", in: func(in *NeedInputs) { in.LongArrivals = 0.08 },
			prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 60},
		// The long-run rate sized two standard errors low too: 0.14 − 2 × 0.01 = 0.12, 72.
		{name: "the long-run rate less twice its noise", in: func(in *NeedInputs) { in.LongArrivals, in.LongArrivalsSD = 0.14, 0.01 },
			prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 72},
		// Arrivals falling (the long-run rate above λ): the whole spike over λ, 90.
		{name: "a long-run rate above λ", in: func(in *NeedInputs) { in.LongArrivals = 0.3 },
			prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90},
		// A noisy estimate (0.25 ± 0.1): sized at 0.05/s, 20 sessions and 30 with the spike; the
		// live sessions' 1.2M then bind prefill at 2.
		{name: "a noisy rate is sized low", in: func(in *NeedInputs) { in.Arrivals, in.ArrivalsSD = 0.25, 0.1 },
			prefill: 2, dec: 1, forArrivals: true, binding: detector.CacheFirst, population: 30},
		{name: "a rate not known yet is not sized", in: func(in *NeedInputs) { in.ArrivalsSD = math.Inf(1) },
			prefill: 2, dec: 1, forArrivals: false, binding: detector.CacheFirst, reasonContain: "not sized yet"},
		// The smoothed mean context (30K) replaces W/live (20K): prefill max(60 × 30K ÷ 0.8,
		// 90 × 30K) = 2.7M ÷ 700K → 4; decode 54.5 × 30K = 1.64M ÷ 720K → 3.
		{name: "the smoothed mean context", in: func(in *NeedInputs) { in.MeanContext = 30_000 },
			prefill: 4, dec: 3, forArrivals: true, binding: detector.CacheFirst, population: 90, reasonContain: "at 30K mean context"},
		// Decode lends 1.2M on top of the four instances' 2.24M: 1.5M at the knee. Without a
		// spike, the steady 60 × 20K ÷ 0.8 = 1.5M margin fits in it; the population itself
		// (1.2M) reserves 600K of decode's 2 × 720K, which leaves 840K to lend (1.05M at the
		// knee), and the other 150K fits one prefill instance (3 without the lent KV).
		{name: "the cache decode lends holds the steady margin", in: func(in *NeedInputs) { in.CacheCapacity = 4*560_000 + 1_200_000 },
			o: NeedOptions{SpikeSize: 1e-9}, prefill: 1, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 60},
		// With a spike, only what decode still spares is lent: 90 sessions reserve 900K, 540K
		// stays lent (675K at the knee), and the spike's 1.8M less that needs 2 prefill.
		{name: "a spike keeps only what decode spares", in: func(in *NeedInputs) { in.CacheCapacity = 4*560_000 + 1_200_000 },
			prefill: 2, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90},
		// Decode with no KV to spare for the spike's calls (1 instance: 720K against 900K
		// reserved) lends nothing then: the spike's 1.8M is sized without it, 3.
		{name: "a spike decode cannot spare KV for", in: func(in *NeedInputs) {
			in.CacheCapacity, in.Decode = 4*560_000+1_200_000, 1
		}, prefill: 3, dec: 2, forArrivals: true, binding: detector.DecodeFirst, population: 90},
		// Three decode instances lend 1.2M, and with the spike's 900K reserved could spare
		// 1.26M: the spike's 1.8M less 1.5M at the knee fits one prefill instance ...
		{name: "three decode instances lend for the spike", in: func(in *NeedInputs) {
			in.CacheCapacity, in.Decode = 4*560_000+1_200_000, 3
		}, prefill: 1, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90},
		// ... but the decode need is 2, and where only one is kept whatever the need (a policy's
		// floor), the third may go: two lend at most 2 × 720K − 500K = 940K now, 540K once the
		// spike reserves its 900K, and the spike's 1.8M less 675K needs 2 prefill.
		{name: "only the decode instances kept lend", in: func(in *NeedInputs) {
			in.CacheCapacity, in.Decode, in.DecodeKept = 4*560_000+1_200_000, 3, 1
		}, prefill: 2, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90},
		// Three kept (the floor at the pool): as if all stay, 1.
		{name: "a floor at the pool keeps its lending", in: func(in *NeedInputs) {
			in.CacheCapacity, in.Decode, in.DecodeKept = 4*560_000+1_200_000, 3, 3
		}, prefill: 1, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90},
		// The hit rate under its plateau: the lent KV is not counted on for the spike, 3.
		{name: "a cache that misses under the knee", in: func(in *NeedInputs) {
			in.CacheCapacity, in.OffPlateau = 4*560_000+1_200_000, true
		}, prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 90},
		// A +100% spike's 2.4M asks for 4 prefill; at 3, the fluid model says the deployment
		// absorbs +150%: no scale-out for it (the steady 1.5M needs 3) ...
		{name: "a spike the fluid model absorbs", in: func(in *NeedInputs) {
			in.Prefill, in.SpikeTolerance = 3, &detector.SpikeTolerance{Ratio: 2.5}
		}, o: NeedOptions{SpikeSize: 1}, prefill: 3, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 120,
			reasonContain: "absorbs +150% as it is"},
		// ... and one it does not (+50% < +100%): 4.
		{name: "a spike the fluid model does not absorb", in: func(in *NeedInputs) {
			in.Prefill, in.SpikeTolerance = 3, &detector.SpikeTolerance{Ratio: 1.5}
		}, o: NeedOptions{SpikeSize: 1}, prefill: 4, dec: 2, forArrivals: true, binding: detector.CacheFirst, population: 120},
		// Every session served: 1.6M of decode KV over 20K is 80 sessions, under the knee's 140.
		{name: "unknown served fraction counts every session", in: func(in *NeedInputs) { in.ServedFraction = 0 },
			prefill: 3, dec: 3, forArrivals: true, binding: detector.DecodeFirst, population: 90},
		// Nobody in a call at this instant, read as such: the arrivals' calls hold no decode KV,

		{name: "a served fraction read as 0 is not unknown", in: func(in *NeedInputs) { in.ServedFraction, in.ServedKnown = 0, true },
			prefill: 3, dec: 1, forArrivals: true, binding: "", population: 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base()
			if tc.in != nil {
				tc.in(&in)
			}
			n, err := Size(in, tc.o)
			require.NoError(t, err)
			assert.Equal(t, tc.prefill, n.Prefill, "prefill: %q", n.Reasons)
			assert.Equal(t, tc.dec, n.Decode, "decode: %q", n.Reasons)
			assert.Equal(t, tc.forArrivals, n.ForArrivals)
			assert.Equal(t, tc.binding, n.Binding)
			assert.InDelta(t, tc.population, n.Population, 1e-6)
			if tc.reasonContain != "" {
				assert.Contains(t, n.Reasons[len(n.Reasons)-1], tc.reasonContain)
			}
		})
	}
}

func TestSizeRejects(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		in         func(*NeedInputs)
		o          NeedOptions
	}{
		{"negative arrivals", "negative or non-finite", func(in *NeedInputs) { in.Arrivals = -1 }, NeedOptions{}},
		{"negative noise", "negative or non-finite", func(in *NeedInputs) { in.ArrivalsSD = -0.1 }, NeedOptions{}},
		{"negative long-run arrivals", "negative or non-finite", func(in *NeedInputs) { in.LongArrivals = -1 }, NeedOptions{}},
		{"long-run noise not a number", "negative or non-finite", func(in *NeedInputs) { in.LongArrivalsSD = math.NaN() }, NeedOptions{}},
		{"infinite cache", "cache capacity +Inf", func(in *NeedInputs) { in.CacheCapacity = math.Inf(1) }, NeedOptions{}},
		{"NaN mean context", "mean context NaN", func(in *NeedInputs) { in.MeanContext = math.NaN() }, NeedOptions{}},
		{"no knee", "knee ratio", func(in *NeedInputs) { in.KneeRatio = 0 }, NeedOptions{}},
		{"no prefill read", "no prefill instance read", func(in *NeedInputs) { in.PrefillCache = 0 }, NeedOptions{}},
		{"no decode read", "no decode instance read", func(in *NeedInputs) { in.DecodeKV = 0 }, NeedOptions{}},
		{"served over one", "served fraction", func(in *NeedInputs) { in.ServedFraction = 1.5 }, NeedOptions{}},
		{"negative spike", "spike_size", nil, NeedOptions{SpikeSize: -1}},
		{"knee share over one", "knee_share", nil, NeedOptions{KneeShare: 1.5}},
		{"headroom of one", "decode_headroom", nil, NeedOptions{DecodeHeadroom: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base()
			if tc.in != nil {
				tc.in(&in)
			}
			_, err := Size(in, tc.o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestSizeParts: the need is the larger of its two parts, and basin's own scale-out follows the
// arrivals' part once it is known.
func TestSizeParts(t *testing.T) {
	in := base()
	in.WorkingSet, in.LiveSessions = 8_000_000, 400 // trapped: 8M live
	n, err := Size(in, NeedOptions{})
	require.NoError(t, err)
	assert.Equal(t, 12, n.Prefill)
	assert.Equal(t, 12, n.LivePrefill)
	assert.Equal(t, 3, n.ArrivalsPrefill)
	assert.Equal(t, 3, n.ForNewArrivals(RolePrefill))

	in.Lifetime = 0
	n, err = Size(in, NeedOptions{})
	require.NoError(t, err)
	assert.False(t, n.ForArrivals)
	assert.Equal(t, 12, n.ForNewArrivals(RolePrefill), "without the arrivals' part, the live sessions'")
	assert.Equal(t, 1, n.ForNewArrivals(RoleDecode), "at least one")
}

// TestSizeArrivalsHigh: a scale-in's sizing takes the steady population on the arrivals two
// standard errors high and plans the spike on top of it as the scale-out's does.
func TestSizeArrivalsHigh(t *testing.T) {
	in := base()
	in.ArrivalsSD = 0.02
	// Low: λ = 0.15 − 2 × 0.02 = 0.11/s × 400 s = 44 sessions, the spike 0.5 × 0.11 × 400 = 22 more.
	low, err := Size(in, NeedOptions{})
	require.NoError(t, err)
	assert.InDelta(t, 66, low.Population, 1e-9)
	assert.InDelta(t, 22, low.SpikeSessions, 1e-9)
	// High: 0.19/s × 400 s = 76 sessions, and the same 22 on top.
	in.ArrivalsHigh = true
	high, err := Size(in, NeedOptions{})
	require.NoError(t, err)
	assert.InDelta(t, 98, high.Population, 1e-9)
	assert.InDelta(t, 22, high.SpikeSessions, 1e-9)
	assert.Greater(t, high.ArrivalsPrefill, low.ArrivalsPrefill)
}
