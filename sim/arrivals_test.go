package sim

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// optsArrivals has every feature of the arrival process: a base stream with a rate dip, a spike
// stream inside a window, and an extra stream of another workload killed at its end.
func optsArrivals(t testing.TB, seed uint64) Options {
	o := opts1P1D(t, seed, 3)
	o.Duration, o.MeasureFrom, o.MeasureTo = 40*time.Minute, 10*time.Minute, 35*time.Minute
	o.Streams[0].Thin = []Thinning{{From: 20 * time.Minute, To: 28 * time.Minute, Keep: 0.4}}
	o.Streams = append(o.Streams, Stream{Class: "extra", Workload: workload(t, "short"), RatePerMin: 4,
		From: 22 * time.Minute, To: 30 * time.Minute, KillAt: 30 * time.Minute})
	return o
}

// Arrivals lists exactly the sessions a run meets: same times, streams and specs, in order.
func TestArrivalsAreTheRunsArrivals(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		o := optsArrivals(t, seed)
		want, err := Arrivals(o, 100_000)
		require.NoError(t, err)

		s, err := New(o)
		require.NoError(t, err)
		s.Run()
		var got []Arrival
		next := map[int]uint64{}
		for _, ss := range s.sessions {
			got = append(got, Arrival{At: ss.arrival, Stream: ss.stream})
		}
		require.Len(t, got, len(want), "seed %d", seed)
		streams := map[int]int{}
		skipped := false
		for i, a := range want {
			assert.Equal(t, a.At, got[i].At, "seed %d arrival %d", seed, i)
			assert.Equal(t, a.Stream, got[i].Stream, "seed %d arrival %d", seed, i)
			spec := o.Streams[a.Stream].Workload.Session(SessionRNG(o.Seed, a.Stream, a.Index))
			assert.Equal(t, spec, s.sessions[i].spec, "seed %d arrival %d: the same session", seed, i)
			streams[a.Stream]++
			skipped = skipped || a.Index != next[a.Stream]
			next[a.Stream] = a.Index + 1
		}
		assert.Len(t, streams, 3, "every stream offers sessions")
		assert.True(t, skipped, "the rate dip thinned some arrivals: indexes skip")
	}
}

func TestArrivalsBound(t *testing.T) {
	o := optsArrivals(t, 1)
	all, err := Arrivals(o, 100_000)
	require.NoError(t, err)
	_, err = Arrivals(o, len(all)/2)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrTooManyArrivals))
}

// The generators' seeds are part of every published number: the formulas, written out
// independently, pin them.
func TestGeneratorSeeds(t *testing.T) {
	w := workload(t, "short")
	assert.Equal(t, w.Session(rand.New(rand.NewPCG(42^0x5E55_0000_0000, uint64(2)<<40|7))), w.Session(SessionRNG(42, 2, 7)))

	o := Options{Seed: 42, Duration: time.Hour, Streams: []Stream{{Workload: w, RatePerMin: 6, From: time.Minute}}}
	got, err := Arrivals(o, 1000)
	require.NoError(t, err)
	gaps := rand.New(rand.NewPCG(42, 0xA11A0000))
	at := time.Minute
	for i, a := range got[:5] {
		at += seconds(gaps.ExpFloat64() * 10)
		assert.Equal(t, Arrival{At: at, Index: uint64(i)}, a)
	}

	thin := rand.New(rand.NewPCG(42, 0x7417))
	o.Streams[0].Thin = []Thinning{{From: 0, To: time.Hour, Keep: 0.5}}
	kept, err := Arrivals(o, 1000)
	require.NoError(t, err)
	var want []uint64
	for i := range got {
		if thin.Float64() < 0.5 {
			want = append(want, uint64(i))
		}
	}
	var idx []uint64
	for _, a := range kept {
		idx = append(idx, a.Index)
	}
	assert.Equal(t, want, idx)
}

// A stream without a rate, or whose window closes before its first draw, offers nothing; To and
// Duration both end a stream.
func TestArrivalsWindows(t *testing.T) {
	w := workload(t, "short")
	o := Options{Seed: 5, Duration: 30 * time.Minute, Streams: []Stream{
		{Workload: w, RatePerMin: 0},
		{Workload: w, RatePerMin: 20, From: 10 * time.Minute, To: 12 * time.Minute},
		{Workload: w, RatePerMin: 20, From: 25 * time.Minute},
	}}
	got, err := Arrivals(o, 1000)
	require.NoError(t, err)
	per := map[int]int{}
	for _, a := range got {
		per[a.Stream]++
		switch a.Stream {
		case 1:
			assert.True(t, a.At >= 10*time.Minute && a.At < 12*time.Minute, "%v", a.At)
		case 2:
			assert.True(t, a.At >= 25*time.Minute && a.At < 30*time.Minute, "%v", a.At)
		}
	}
	assert.Zero(t, per[0])
	assert.Positive(t, per[1])
	assert.Positive(t, per[2])
}
