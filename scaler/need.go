package scaler

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/basin-dev/basin/detector"
)

// Sizing defaults. Worked numbers use the simulator's 1P1D preset (docs/simulator.md): one prefill
// instance with a 560K-token cache, an 800K-token decode instance, sessions of about 6.5 minutes.
const (
	// DefaultSpikeSize: the deployment is sized to take arrivals 50% above the long-run rate for
	// DefaultSpikeDuration with its population still under the knee. Chosen between the Basin
	// paper's two spikes: +33% for ten minutes recovers by itself on its 1P1D deployment, +100% is
	// trapped; sizing for +100% would double every deployment's instances for a spike most never
	// see, and under the knee (not the edge past it) already leaves the margin the +33% one shows.
	DefaultSpikeSize = 0.5
	// DefaultSpikeDuration: the paper's spikes last ten minutes (detector.SpikeWindow).
	DefaultSpikeDuration = detector.SpikeWindow
	// DefaultKneeShare: without a spike, the population's working set stays under 0.8 of the
	// knee. The same share as the detector's pressure entry (detector.DefaultPressureEnter): a
	// deployment sized to sit there would read as under pressure.
	DefaultKneeShare = 0.8
	// DefaultDecodeHeadroom: a tenth of each decode instance's KV is left free, as the lender
	// keeps it (lender.DefaultHeadroomFraction): decode reserves a call's whole KV before prefill
	// starts, so a new call must find room at once.
	DefaultDecodeHeadroom = 0.1
)

// ArrivalsConfidence is how many standard errors the arrival rate is sized below its estimate:
// two, so that the arrivals exceed the rate sized for with about 98% confidence. Chosen from the
// simulator's quiet rows (0.5 × peak): a λ started at a cold start's first minute read 11.7/min
// on a deployment receiving 5.5, and a ten-minute Poisson burst read 3.56/min against 2.79 — each
// asked for an instance nobody needed; at 1.2 × peak the estimate clears the sizing's threshold
// by more than two standard errors within minutes of the start.
const ArrivalsConfidence = 2.0

// NeedOptions configure the sizing. Zero fields take the defaults.
type NeedOptions struct {
	// SpikeSize is the spike to absorb, as a fraction of the long-run arrival rate (0.5: +50%),
	// held for SpikeDuration.
	SpikeSize     float64
	SpikeDuration time.Duration
	// KneeShare is the share of the knee the steady population's working set may reach.
	KneeShare float64
	// DecodeHeadroom is the share of each decode instance's KV kept free.
	DecodeHeadroom float64
}

func (o NeedOptions) withDefaults() NeedOptions {
	if o.SpikeSize == 0 {
		o.SpikeSize = DefaultSpikeSize
	}
	if o.SpikeDuration == 0 {
		o.SpikeDuration = DefaultSpikeDuration
	}
	if o.KneeShare == 0 {
		o.KneeShare = DefaultKneeShare
	}
	if o.DecodeHeadroom == 0 {
		o.DecodeHeadroom = DefaultDecodeHeadroom
	}
	return o
}

// Validate reports every field out of range, each by its YAML key.
func (o NeedOptions) Validate() error {
	var errs []error
	if !(o.SpikeSize >= 0) || math.IsInf(o.SpikeSize, 0) {
		errs = append(errs, fmt.Errorf("spike_size: %v, must be ≥ 0 (0.5 is +50%%)", o.SpikeSize))
	}
	if o.SpikeDuration < 0 {
		errs = append(errs, fmt.Errorf("spike_duration: %v, must not be negative", o.SpikeDuration))
	}
	if !(o.KneeShare >= 0 && o.KneeShare <= 1) {
		errs = append(errs, fmt.Errorf("knee_share: %v, must be in (0, 1]", o.KneeShare))
	}
	if !(o.DecodeHeadroom >= 0 && o.DecodeHeadroom < 1) {
		errs = append(errs, fmt.Errorf("decode_headroom: %v, must be in [0, 1)", o.DecodeHeadroom))
	}
	return errors.Join(errs...)
}

// NeedInputs are one step's readings for the sizing.
type NeedInputs struct {
	// Arrivals is the arrival rate to serve, sessions per second (the detector's smoothed λ:
	// remediate.Policy.NeedInputsFrom says why).
	Arrivals float64
	// ArrivalsSD is Arrivals' standard error (the detector's Assessment.SettledLambdaSD): the
	// arrivals are sized at Arrivals − ArrivalsConfidence × ArrivalsSD. 0: taken as exact; +Inf:
	// not known yet, the arrivals are not sized.
	ArrivalsSD float64
	// ArrivalsHigh sizes the steady population on Arrivals ArrivalsConfidence standard errors
	// high instead of low; the spike on top is still planned on the low estimate. What a scale-in
	// sizes on (Policy.Decide): that the arrivals surely do not need the instances it removes.
	ArrivalsHigh bool
	// LongArrivals is the long-run arrival rate (the detector's Assessment.LongLambda, an hour's
	// average) and LongArrivalsSD its standard error (LongLambdaSD): the spike is planned on the
	// lower of it and Arrivals, each taken ArrivalsConfidence standard errors low. 0: unknown,
	// the spike is planned on Arrivals.
	LongArrivals, LongArrivalsSD float64
	// Lifetime is how long a session lives under the knee (detector.Assessment.SessionLifetime);
	// 0 when unknown.
	Lifetime time.Duration
	// LiveSessions and WorkingSet are now.
	LiveSessions, WorkingSet float64
	// MeanContext is the live sessions' mean context, tokens, smoothed (the detector's
	// Assessment.MeanContext); 0: WorkingSet/LiveSessions now, which a few long sessions coming
	// and going move by half on a quiet deployment.
	MeanContext float64
	// ServedFraction is the share of live sessions in a model call (decode holds their KV).
	// ServedKnown says it is a reading even where it is 0 (nobody in a call at that instant);
	// without it a 0 is unknown (no gateway to read) and taken as 1. Read as unknown, a moment
	// with nobody in a call sized 1P1D's decode for every session in one: it asked for a third
	// decode instance five minutes after a spike, and kept it for 19.
	ServedFraction float64
	ServedKnown    bool
	// KneeRatio is the knee as W/C.
	KneeRatio float64
	// PrefillCache is one prefill instance's prefix cache (GPU and host tier), DecodeKV one
	// decode instance's KV, tokens.
	PrefillCache, DecodeKV float64
	// CacheCapacity is the cache the detector reads now, tokens: the prefill instances' and the
	// KV decode lends (collector.CacheCapacity). What it holds beyond Prefill × PrefillCache is
	// lent, and stays when a prefill instance is added or removed. 0: unknown, nothing lent.
	CacheCapacity float64
	// SpikeTolerance is the largest spike the deployment absorbs now, by the detector's fluid
	// model (Assessment.SpikeTolerance); nil while it cannot say.
	SpikeTolerance *detector.SpikeTolerance
	// DecodeReserved is the KV decode holds for running calls now, over the pool, tokens.
	DecodeReserved float64
	// OffPlateau says the hit rate reads under its plateau (by more than the remediation
	// policy's plateau tolerance): the cache misses though the knee says the working set fits, so
	// the cache decode lends is not counted on to hold a spike (remediate.Policy.NeedInputsFrom;
	// false when the hit rate is not a reading).
	OffPlateau bool
	// Prefill and Decode are the instances serving now.
	Prefill, Decode int
	// DecodeKept is the fewest decode instances that stay whatever the sizing asks for (a scaling
	// policy's floor); 0: every decode instance serving now stays. Where the sizing's own decode
	// need is smaller, the decode instances above it may go, and the KV they lend with them: the
	// arrivals' prefill is then sized on what the instances that stay can lend.
	DecodeKept int
}

// Need is what the deployment needs now, in instances of each role.
type Need struct {
	// Prefill and Decode are the instances needed: the larger of what the arrivals need (with the
	// spike) and what the live sessions hold now — what an autoscaler may scale to both ways
	// without evicting what runs.
	Prefill, Decode int
	// ArrivalsPrefill and ArrivalsDecode are what the arrivals need (0 unless ForArrivals);
	// LivePrefill and LiveDecode what the live sessions hold now: their working set under the
	// knee, their reserved decode KV.
	ArrivalsPrefill, ArrivalsDecode int
	LivePrefill, LiveDecode         int
	// ForArrivals is false when the arrivals' part could not be computed (no lifetime or mean
	// context yet): the need is then only what the live sessions hold.
	ForArrivals bool
	// Population is the sessions the arrivals bring at the session lifetime, spike included.
	Population float64
	// SpikeSessions is what the planned spike adds on top of the sessions live now, the spike
	// part of Population (0 unless ForArrivals): a scale-in goes only to a size that holds the
	// live sessions and these beside them (Policy.inSize).
	SpikeSessions float64
	// MeanContext and ServedFraction are the mean context (tokens) and the share of live sessions
	// in a call the sizing used (0 with no live session).
	MeanContext, ServedFraction float64
	// Binding is the limit reached first at today's instances: detector.CacheFirst or
	// detector.DecodeFirst ("" when the risk rule could not be applied).
	Binding string
	// ServingPrefill and ServingDecode are the instances serving when it was sized.
	ServingPrefill, ServingDecode int
	Reasons                       []string
}

// Of returns the instances of role r needed.
func (n Need) Of(r Role) int {
	if r == RoleDecode {
		return n.Decode
	}
	return n.Prefill
}

// ForNewArrivals is what basin's own scaling scales out to: what the arrivals need once they can
// be sized (the live sessions' part alone would ask for an instance whenever a steady population
// brushes the knee; the policy keeps it as the floor of a scale-in instead), else what the live
// sessions hold; at least 1.
func (n Need) ForNewArrivals(r Role) int {
	switch {
	case !n.ForArrivals && r == RoleDecode:
		return max(1, n.LiveDecode)
	case !n.ForArrivals:
		return max(1, n.LivePrefill)
	case r == RoleDecode:
		return max(1, n.ArrivalsDecode)
	}
	return max(1, n.ArrivalsPrefill)
}

// Serving returns the instances of role r serving when it was sized.
func (n Need) Serving(r Role) int {
	if r == RoleDecode {
		return n.ServingDecode
	}
	return n.ServingPrefill
}

// Size computes what the deployment needs now. By Little's law the arrivals keep λ × T sessions
// live (T the session lifetime under the knee); a spike of SpikeSize for SpikeDuration adds
// SpikeSize × λ × min(SpikeDuration, T) on top (a session that arrived in the spike has left by T).
// Prefill instances must hold that population's working set under the knee (the steady one under
// KneeShare of it); decode instances the KV of its served share, with DecodeHeadroom left free.
// Neither may fall under what the live sessions hold now (their working set under the knee, their
// reserved KV): scaling in must not evict what runs.
func Size(in NeedInputs, o NeedOptions) (Need, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return Need{}, err
	}
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) || v < 0 }
	switch {
	case bad(in.Arrivals), bad(in.LiveSessions), bad(in.WorkingSet), bad(in.DecodeReserved), in.Lifetime < 0,
		math.IsNaN(in.ArrivalsSD) || in.ArrivalsSD < 0, bad(in.LongArrivals), math.IsNaN(in.LongArrivalsSD) || in.LongArrivalsSD < 0,
		math.IsNaN(in.MeanContext) || in.MeanContext < 0 || math.IsInf(in.MeanContext, 0):
		return Need{}, fmt.Errorf("sizing: negative or non-finite reading (arrivals %v ± %v, long-run arrivals %v ± %v, live %v, working set %v, mean context %v, decode reserved %v, lifetime %v)",
			in.Arrivals, in.ArrivalsSD, in.LongArrivals, in.LongArrivalsSD, in.LiveSessions, in.WorkingSet, in.MeanContext, in.DecodeReserved, in.Lifetime)
	case !(in.KneeRatio > 0) || math.IsInf(in.KneeRatio, 0):
		return Need{}, fmt.Errorf("sizing: knee ratio %v, must be positive", in.KneeRatio)
	case !(in.PrefillCache > 0) || math.IsInf(in.PrefillCache, 0):
		return Need{}, fmt.Errorf("sizing: prefill cache %v tokens, must be positive (no prefill instance read)", in.PrefillCache)
	case math.IsNaN(in.CacheCapacity) || math.IsInf(in.CacheCapacity, 0) || in.CacheCapacity < 0:
		return Need{}, fmt.Errorf("sizing: cache capacity %v tokens, must be ≥ 0", in.CacheCapacity)
	case !(in.DecodeKV > 0) || math.IsInf(in.DecodeKV, 0):
		return Need{}, fmt.Errorf("sizing: decode KV %v tokens, must be positive (no decode instance read)", in.DecodeKV)
	case in.ServedFraction < 0 || in.ServedFraction > 1 || math.IsNaN(in.ServedFraction):
		return Need{}, fmt.Errorf("sizing: served fraction %v outside [0, 1]", in.ServedFraction)
	}
	served := in.ServedFraction
	if served == 0 && !in.ServedKnown {
		served = 1
	}
	prefillFor := in.prefillFor
	decodePer := o.decodePer(in.DecodeKV)

	// What the live sessions hold now.
	liveP := prefillFor(in.WorkingSet, in.lent())
	liveD := ceilPos(in.DecodeReserved / decodePer)
	n := Need{Prefill: max(1, liveP), Decode: max(1, liveD), LivePrefill: liveP, LiveDecode: liveD,
		ServingPrefill: in.Prefill, ServingDecode: in.Decode}
	n.Reasons = append(n.Reasons, fmt.Sprintf("live: working set %s under the knee needs %d prefill; %s reserved decode KV needs %d decode",
		tok(in.WorkingSet), liveP, tok(in.DecodeReserved), liveD))
	if l := in.lent(); l > 0 {
		n.Reasons = append(n.Reasons, fmt.Sprintf("lent: decode lends %s of cache now, counted for the steady population's margin", tok(l)))
	}

	if in.LiveSessions > 0 && in.WorkingSet > 0 {
		m := in.WorkingSet / in.LiveSessions
		if in.MeanContext > 0 {
			m = in.MeanContext
		}
		n.MeanContext, n.ServedFraction = m, served
		if r, err := detector.Risk(detector.RiskInputs{
			CacheTokens: in.PrefillCache * float64(max(1, in.Prefill)), DecodeKVTokens: in.DecodeKV,
			DecodeInstances: max(1, in.Decode), MeanContext: m, ServedFraction: served, KneeFactor: in.KneeRatio,
		}); err == nil {
			n.Binding = r.Binding
		}
		if in.Lifetime > 0 && !math.IsInf(in.ArrivalsSD, 0) {
			t := in.Lifetime.Seconds()
			// The rate the arrivals surely reach: a scale-out asks for all of its need at once,
			// and a cold start's few arrivals, or a quiet deployment's Poisson burst, read high.
			lambda := max(0, in.Arrivals-ArrivalsConfidence*in.ArrivalsSD)
			steady := lambda * t
			if in.ArrivalsHigh {
				steady = (in.Arrivals + ArrivalsConfidence*in.ArrivalsSD) * t
			}
			// The spike planned for is arrivals SpikeSize over the long-run rate (base) for
			// SpikeDuration. λ, smoothed over ten minutes, reads a spike under way as arrivals: its
			// sessions are in the steady population already, and only what is left of the planned
			// spike above λ comes on top. Planned on λ, the spike was planned twice: 1P1D at half
			// its peak, at the end of a ten-minute +100% spike it was absorbing as it was, read λ
			// 1.4 × its long-run rate, and +50% of that on top asked for a second prefill instance
			// that served once the spike was over. On a steady rate the two rates agree and the
			// whole spike comes on top.
			base := lambda
			if in.LongArrivals > 0 && !math.IsInf(in.LongArrivalsSD, 0) {
				base = min(base, max(0, in.LongArrivals-ArrivalsConfidence*in.LongArrivalsSD))
			}
			spike := steady + max(0, (1+o.SpikeSize)*base-lambda)*min(o.SpikeDuration.Seconds(), t)
			n.ForArrivals, n.Population, n.SpikeSessions = true, spike, spike-steady
			steadyP := prefillFor(steady*m/o.KneeShare, in.lent())
			// The lent KV holds the steady population's margin (KneeShare) whole; with the spike,
			// only what decode can still spare: the spike puts more sessions into calls, and the
			// lender takes back for decode the KV their calls reserve (on 1P1D nearly all of it;
			// 1P3D's three decode instances kept lending 1.2M while a spike's calls reserved
			// under 0.4M, and sized without it basin asked for a prefill instance nobody waited
			// for). Only while the hit rate confirms it: 1P3D at 2 × its peak on two prefill
			// instances read 0.86–0.91 against its plateau of 0.96 at a working set the knee
			// said fitted, and its sessions missed their deadlines for half an hour.
			// Decode holds the calls in flight, and how many of the population are in a call at
			// once swings about its mean (the served fraction, smoothed): sized for the mean,
			// 1P1D at 1.5 × its peak kept one decode instance and left sessions waiting at the
			// gateway for 11 minutes of the hour. Taken as binomial, the calls are sized
			// ArrivalsConfidence standard deviations above it.
			inCall := spike*served + ArrivalsConfidence*math.Sqrt(spike*served*(1-served))
			arrD := ceilPos(inCall * m / decodePer)
			lend := in
			if in.DecodeKept > 0 {
				// Only the decode instances that stay lend. With the scale-in guard at 2/3 of the
				// limits, 1P1D at 1.5 × its peak sized one prefill instance on the KV of two decode
				// instances while its decode need was one; decode scaled in, the lent KV went, and
				// sessions waited until a prefill instance, asked for again, served.
				if kept := max(1, arrD, liveD, in.DecodeKept); kept < in.Decode {
					lend.Decode = kept
					lend.CacheCapacity = float64(in.Prefill)*in.PrefillCache +
						min(in.lent(), max(0, float64(kept)*decodePer-in.DecodeReserved))
					steadyP = prefillFor(steady*m/o.KneeShare, lend.lent())
				}
			}
			lentSpike := lend.spareLent(spike*m*served, decodePer)
			arrP := max(steadyP, prefillFor(spike*m, lentSpike))
			absorbs := in.SpikeTolerance != nil && in.SpikeTolerance.Ratio-1 >= o.SpikeSize && arrP > in.Prefill
			if absorbs {
				// Sized under the knee, the spike asks for more prefill than the fluid model says
				// it needs: the population may cross the knee for the spike's ten minutes and come
				// back by itself (the spike tolerance). No scale-out for it, then — but no scale-in
				// below the spike's size either, so a pool grown for it is not shrunk into a size
				// that would ask again.
				arrP = max(steadyP, in.Prefill)
			}
			n.Prefill, n.Decode, n.ArrivalsPrefill, n.ArrivalsDecode = max(n.Prefill, arrP), max(n.Decode, arrD), arrP, arrD
			n.Reasons = append(n.Reasons, fmt.Sprintf(
				"arrivals: %.2f/min (%.2f less %g × its %.2f noise) × %s lifetime = %.0f sessions, %.0f with a +%.0f%% spike over %.2f/min for %s; at %s mean context they need %d prefill (%s cache each, knee %.2f) and %d decode (%s KV each, %.0f%% served)",
				lambda*60, in.Arrivals*60, ArrivalsConfidence, in.ArrivalsSD*60, in.Lifetime.Round(time.Second), steady, spike, 100*o.SpikeSize, base*60, o.SpikeDuration,
				tok(m), arrP, tok(in.PrefillCache), in.KneeRatio, arrD, tok(in.DecodeKV), 100*served))
			if absorbs {
				n.Reasons = append(n.Reasons, fmt.Sprintf("spike: the fluid model says the deployment absorbs +%.0f%% as it is (≥ the +%.0f%% planned for): no scale-out for it",
					100*(in.SpikeTolerance.Ratio-1), 100*o.SpikeSize))
			}
		}
	}
	if !n.ForArrivals {
		n.Reasons = append(n.Reasons, "arrivals: not sized yet (no session lifetime, arrival rate or mean context): the need is what the live sessions hold")
	}
	return n, nil
}

// prefillFor is the prefill instances that hold working set ws under the knee beside lent tokens
// of lent KV: a decode-first deployment lends its spare KV to the cache, and 1P3D at 1.2 × its
// peak ran with 2.8M of cache on one 1.25M prefill instance; sized without it, basin asked for a
// second instance nobody waited for.
func (in NeedInputs) prefillFor(ws, lent float64) int {
	return ceilPos((ws - in.KneeRatio*lent) / (in.KneeRatio * in.PrefillCache))
}

// decodePer is the KV one decode instance of kv tokens may hold, its headroom kept free.
func (o NeedOptions) decodePer(kv float64) float64 { return (1 - o.DecodeHeadroom) * kv }

// spareLent is the cache decode lends now that it can still spare once its calls reserve
// reserve tokens: the lender takes back for decode what the calls reserve, out of the KV decode
// keeps free of its headroom (decodePer an instance). 0 while the hit rate reads under its
// plateau (OffPlateau): the cache misses then though the knee says the working set fits.
func (in NeedInputs) spareLent(reserve, decodePer float64) float64 {
	if in.OffPlateau {
		return 0
	}
	return min(in.lent(), max(0, float64(max(1, in.Decode))*decodePer-reserve))
}

// lent is the cache decode lends now: what the detector reads beyond the prefill instances' own.
func (in NeedInputs) lent() float64 {
	return max(0, in.CacheCapacity-float64(in.Prefill)*in.PrefillCache)
}

// ceilPos is ⌈v⌉ for v > 0 (with a small tolerance so 2.0000001 is 2), 0 otherwise.
func ceilPos(v float64) int {
	if !(v > 0) {
		return 0
	}
	return int(math.Ceil(v - 1e-9))
}

// tok formats a token count compactly: 650K, 1.25M.
func tok(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gK", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
