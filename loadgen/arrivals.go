package loadgen

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/basin-dev/basin/sim"
)

// rawPerSession bounds the arrivals drawn (thinned ones included) per session kept, so that an
// absurd rate fails fast instead of looping.
const rawPerSession = 100

// offers lists the sessions the streams offer before o.Duration, in arrival order, as the
// simulator's own arrival process draws them (sim.Arrivals). It fails when they are more than
// maxSessions.
func offers(o sim.Options, maxSessions int) ([]sim.Arrival, error) {
	maxRaw := rawPerSession * maxSessions
	kept, err := sim.Arrivals(o, maxRaw)
	if errors.Is(err, sim.ErrTooManyArrivals) {
		return nil, fmt.Errorf("max_sessions: the scenario's streams draw more than %d arrivals (cap %d sessions)",
			maxRaw, maxSessions)
	}
	if err != nil {
		return nil, err
	}
	if len(kept) > maxSessions {
		return nil, fmt.Errorf("max_sessions: the scenario offers %d sessions, more than the cap of %d",
			len(kept), maxSessions)
	}
	return kept, nil
}

// jitterRNG draws a session's Retry-After jitter: the load generator's own stream, apart from the
// session's (sim.SessionRNG) so that retries change nothing the session sends.
func jitterRNG(seed uint64, stream int, idx uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x717E_0000_0000, uint64(stream)<<40|idx))
}

// seconds converts seconds (a Retry-After) to a duration, rounding to the nanosecond.
func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
