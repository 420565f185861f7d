package sim

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// The open-loop arrival process of Options.Streams lives here, apart from the event loop, so that
// a client driving a live endpoint (basin loadgen, live calibration) offers exactly the sessions a
// run offers for the same seed, drawn by this code rather than by a copy kept in step by hand:
//
//   - stream i is Poisson: exponential gaps drawn from its own generator (streamRNG), starting at
//     the stream's From and stopping at its To or the run's Duration, whichever is first;
//   - a rate dip (Stream.Thin) keeps an arrival with its probability, drawn from one generator
//     shared by all streams (thinRNG), in the order of the arrivals across streams;
//   - arrival k of stream i, thinned ones counted, draws its SessionSpec from SessionRNG(seed, i,
//     k), so that removing a stream (a spike's twin without it) changes no other stream's sessions.
//
// The seeds of the generators are part of the simulator's results: changing one changes every
// number in docs/results.md.

// streamRNG is the generator of stream i's inter-arrival gaps.
func streamRNG(seed uint64, stream int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0xA11A0000+uint64(stream)))
}

// thinRNG is the one generator that decides which arrivals the rate dips drop.
func thinRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x7417)) }

// SessionRNG is the generator a session's SessionSpec is drawn from: a function of the seed, the
// stream and the session's index in it only (thinned arrivals count), so the same session is drawn
// whatever else arrives. Closed-loop runs use stream 1<<15.
func SessionRNG(seed uint64, stream int, idx uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x5E55_0000_0000, uint64(stream)<<40|idx))
}

// nextArrival draws the arrival of st that follows one at from (st.From for the first) from the
// stream's generator rng. ok is false when the stream has no rate or the arrival falls at or after
// end or st.To; the stream then offers nothing more.
func (st Stream) nextArrival(rng *rand.Rand, from, end time.Duration) (at time.Duration, ok bool) {
	if !(st.RatePerMin > 0) {
		return 0, false
	}
	at = from + seconds(rng.ExpFloat64()/(st.RatePerMin/60))
	if st.To > 0 {
		end = min(end, st.To)
	}
	return at, at < end
}

// keeps draws whether st keeps an arrival at time at: one draw from thin for every rate dip that
// covers at, even once one has dropped it, so that the draws that follow do not depend on the
// outcome.
func (st Stream) keeps(at time.Duration, thin *rand.Rand) bool {
	keep := true
	for _, th := range st.Thin {
		if at >= th.From && at < th.To && thin.Float64() >= th.Keep {
			keep = false
		}
	}
	return keep
}

// Arrival is one session an open-loop stream offers.
type Arrival struct {
	// At is when it arrives, from the start of the run.
	At time.Duration
	// Stream is its index in Options.Streams; Index its place in the stream, thinned arrivals
	// counted: SessionRNG(seed, Stream, Index) draws its SessionSpec.
	Stream int
	Index  uint64
}

// ErrTooManyArrivals is Arrivals' error when the streams draw more arrivals than its bound.
var ErrTooManyArrivals = errors.New("too many arrivals")

// Arrivals lists the sessions o's streams offer before o.Duration, in the order a run meets them
// (by time; the lower stream first at the rare equal instant), the ones a rate dip drops left
// out. It is what a run of o would see arrive, for clients that send the sessions elsewhere. It
// stops with ErrTooManyArrivals once the streams have drawn more than maxDraws arrivals (thinned
// ones included), so that an absurd rate fails fast instead of filling memory.
func Arrivals(o Options, maxDraws int) ([]Arrival, error) {
	var all []Arrival
	for i, st := range o.Streams {
		rng := streamRNG(o.Seed, i)
		at := st.From
		for idx := uint64(0); ; idx++ {
			var ok bool
			if at, ok = st.nextArrival(rng, at, o.Duration); !ok {
				break
			}
			if len(all) >= maxDraws {
				return nil, fmt.Errorf("%w: the streams draw more than %d", ErrTooManyArrivals, maxDraws)
			}
			all = append(all, Arrival{At: at, Stream: i, Index: idx})
		}
	}
	// A run draws the thinning in event order across streams.
	slices.SortStableFunc(all, func(a, b Arrival) int {
		return cmp.Or(cmp.Compare(a.At, b.At), cmp.Compare(a.Stream, b.Stream))
	})
	thin := thinRNG(o.Seed)
	kept := all[:0]
	for _, a := range all {
		if o.Streams[a.Stream].keeps(a.At, thin) {
			kept = append(kept, a)
		}
	}
	return kept, nil
}
