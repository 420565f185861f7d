package loadgen

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/basin-dev/basin/sim"
)

// offer is one session the scenario offers: when it arrives and which random stream draws it.
type offer struct {
	at     time.Duration // virtual, from the start of the run
	stream int
	idx    uint64 // its index in the stream, thinned arrivals included
}

// rawPerSession bounds the arrivals drawn (thinned ones included) per session kept, so that an
// absurd rate fails fast instead of looping.
const rawPerSession = 100

// offers lists the sessions the streams offer before o.Duration, in arrival order, generated as
// the simulator generates them (see the package documentation). It fails when they are more
// than maxSessions.
func offers(o sim.Options, maxSessions int) ([]offer, error) {
	var all []offer
	maxRaw := rawPerSession * maxSessions
	for i, st := range o.Streams {
		if !(st.RatePerMin > 0) {
			continue
		}
		rng := rand.New(rand.NewPCG(o.Seed, 0xA11A0000+uint64(i)))
		limit := o.Duration
		if st.To > 0 {
			limit = min(limit, st.To)
		}
		at := st.From
		for idx := uint64(0); ; idx++ {
			at += seconds(rng.ExpFloat64() / (st.RatePerMin / 60))
			if at >= limit {
				break
			}
			if len(all) >= maxRaw {
				return nil, fmt.Errorf("max_sessions: the scenario's streams draw more than %d arrivals (cap %d sessions)",
					maxRaw, maxSessions)
			}
			all = append(all, offer{at: at, stream: i, idx: idx})
		}
	}
	// The simulator draws thinning in event order across streams.
	slices.SortStableFunc(all, func(a, b offer) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.stream, b.stream))
	})
	thin := rand.New(rand.NewPCG(o.Seed, 0x7417))
	kept := all[:0]
	for _, of := range all {
		keep := true
		for _, th := range o.Streams[of.stream].Thin {
			if of.at >= th.From && of.at < th.To && thin.Float64() >= th.Keep {
				keep = false
			}
		}
		if keep {
			kept = append(kept, of)
		}
	}
	if len(kept) > maxSessions {
		return nil, fmt.Errorf("max_sessions: the scenario offers %d sessions, more than the cap of %d",
			len(kept), maxSessions)
	}
	return kept, nil
}

// sessionRNG is the random stream a session's spec is drawn from: the simulator's.
func sessionRNG(seed uint64, stream int, idx uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x5E55_0000_0000, uint64(stream)<<40|idx))
}

// jitterRNG draws a session's Retry-After jitter, apart from the spec's stream so that retries
// change nothing the session sends.
func jitterRNG(seed uint64, stream int, idx uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x717E_0000_0000, uint64(stream)<<40|idx))
}

// seconds converts as the simulator does, rounding to the nanosecond.
func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
