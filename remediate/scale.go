package remediate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/scaler"
)

// ScalePlan asks for instances of some roles.
type ScalePlan struct {
	Changes []scaler.Change `json:"changes"`
	// Reasons are the scaling policy's (the plan's carry every action's), as BudgetChange.Reasons.
	Reasons []string `json:"-"`
}

// Summary is the change in a few words: "scale prefill 4 → 6, decode 2 → 3".
func (p ScalePlan) Summary() string {
	parts := make([]string, 0, len(p.Changes))
	for _, c := range p.Changes {
		parts = append(parts, fmt.Sprintf("%s %d → %d", c.Role, c.From, c.To))
	}
	return "scale " + strings.Join(parts, ", ")
}

// Scale runs the scaling policy on a step's readings and adds its changes to the plan (numbered
// if the plan had nothing else). The daemon and the simulator's harness both step scaling through
// here (by Loop.Step).
func (p *Policy) Scale(plan Plan, s *scaler.Policy, in scaler.Inputs) (Plan, scaler.Decision) {
	d := s.Decide(in)
	if !d.Changed() {
		return plan, d
	}
	plan.Scale = &ScalePlan{Changes: slices.Clone(d.Changes), Reasons: slices.Clone(d.Reasons)}
	plan.Reasons = append(slices.Clone(plan.Reasons), d.Reasons...)
	if plan.Seq == 0 {
		p.st.Seq++
		plan.Seq = p.st.Seq
	}
	return plan, d
}

// SizeFrom is what the deployment needs now, from a step's snapshot and assessment (Size on
// NeedInputsFrom): the daemon exports it for autoscalers every step, acting or not. decodeKept is
// scaler.NeedInputs.DecodeKept: the fewest decode instances whatever scales the decode pool keeps
// (0: it is not scaled, every decode instance serving now stays and lends).
func (p *Policy) SizeFrom(s collector.Snapshot, a detector.Assessment, o scaler.NeedOptions, decodeKept int) (scaler.Need, error) {
	in, err := p.NeedInputsFrom(s, a)
	if err != nil {
		return scaler.Need{}, err
	}
	in.DecodeKept = decodeKept
	return scaler.Size(in, o)
}

// NeedInputsFrom reads the sizing's inputs off a step's snapshot and assessment, the one way the
// daemon and the simulator's harness both do: the arrival rate to serve is the detector's settled λ,
// smoothed over ten minutes from zero — the collector's windowed rate carries a minute's Poisson
// noise (at 8 sessions a minute it read 14–18 for minutes at a time in the simulator), and a λ
// started at the first reading keeps a cold start's noisy first minute for minutes; since a
// scale-out asks for all of the need at once while a scale-in waits, noise would ratchet the pools
// up; what λ lags behind a real rise, the spike headroom covers. The mean context is the
// detector's smoothed one, the lifetime the detector's, each role's instance size the mean over
// the instances read fresh and whole, the served fraction the gateway's smoothed by the detector
// (the instant's before the detector has one; unknown without a gateway), and whether the hit
// rate is off its plateau by the policy's own rule (onPlateau). An error names what is missing.
func (p *Policy) NeedInputsFrom(s collector.Snapshot, a detector.Assessment) (scaler.NeedInputs, error) {
	in := scaler.NeedInputs{Lifetime: secondsDuration(a.SessionLifetime), KneeRatio: a.Knee.Ratio}
	var missing []string
	get := func(sig collector.Signal) float64 {
		v, ok := s.Get(sig)
		if !ok {
			missing = append(missing, fmt.Sprintf("%s %s", sig, s.State(sig)))
		}
		return v
	}
	get(collector.ArrivalRate) // λ is smoothed from it: a stale rate is a stale λ
	in.Arrivals, in.ArrivalsSD, in.MeanContext = a.SettledLambda, a.SettledLambdaSD, a.MeanContext
	in.LongArrivals, in.LongArrivalsSD = a.LongLambda, a.LongLambdaSD
	in.SpikeTolerance = a.SpikeTolerance
	in.OffPlateau = a.HitEvidence.Enough && a.Plateau > 0 && !onPlateau(a, p.o.PlateauTolerance)
	if c, ok := s.Get(collector.CacheCapacity); ok {
		in.CacheCapacity = c // optional: without it, nothing counts as lent
	}
	in.LiveSessions, in.WorkingSet = get(collector.LiveSessions), get(collector.WorkingSet)
	in.DecodeReserved = get(collector.DecodeReserved)
	if a.ServedFraction != nil {
		in.ServedFraction, in.ServedKnown = *a.ServedFraction, true
	} else if f, err := detector.ServedFractionOf(s); err == nil && f >= 0 && f <= 1 {
		in.ServedFraction, in.ServedKnown = f, true // a first step: the detector has not smoothed one yet
	}
	var cache float64
	for _, p := range s.Prefill {
		if p.State == collector.OK && p.Complete {
			in.Prefill++
			cache += p.CacheTokens + p.HostTokens
		}
	}
	var kv float64
	for _, d := range s.Decode {
		if d.State == collector.OK && d.Complete {
			in.Decode++
			kv += d.CapacityTokens
		}
	}
	if in.Prefill == 0 {
		missing = append(missing, "no prefill instance read")
	} else {
		in.PrefillCache = cache / float64(in.Prefill)
	}
	if in.Decode == 0 {
		missing = append(missing, "no decode instance read")
	} else {
		in.DecodeKV = kv / float64(in.Decode)
	}
	if len(missing) > 0 {
		return in, fmt.Errorf("sizing inputs: %s", strings.Join(missing, ", "))
	}
	return in, nil
}

// secondsDuration turns seconds into a Duration (0 for what is not positive).
func secondsDuration(s float64) time.Duration {
	if !(s > 0) {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}

// BackendScaling is a scaler backend behind the executor's Scaling interface: each change of the
// plan is one level-triggered request, in the plan's order; a failed one does not stop the next
// (a role's instances do not depend on the other's), and the errors are joined.
type BackendScaling struct {
	Backend    scaler.Backend
	Deployment string
}

// ApplyScale implements Scaling.
func (b BackendScaling) ApplyScale(ctx context.Context, seq uint64, p ScalePlan, reason string) error {
	var errs []error
	for _, c := range p.Changes {
		r := scaler.Request{Deployment: b.Deployment, Role: c.Role, Replicas: c.To, Reason: reason, Seq: seq}
		if err := b.Backend.Apply(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("%s to %d: %w", c.Role, c.To, err))
		}
	}
	return errors.Join(errs...)
}
