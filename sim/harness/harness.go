// Package harness wires basin's own policy code into the simulator, in virtual time: the gateway's
// admission core decides when simulated sessions start, exactly as it decides for real clients in
// `basin gateway`. The simulator holds no basin logic; this package is the bridge, and the reason a
// number from `basin sim compare` is a number for the code that ships.
package harness

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/predictor"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/scaler"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

// Policy names basin adds to the simulator's engine baselines.
const (
	// BasinCurrent is the paper's hardware prototype: arrival-order admission by current context,
	// KV lending on, budget control and shedding.
	BasinCurrent = "basin-current"
	// Basin admits by predicted peak context with the size-aware priority p = a + peak/r. In the
	// simulator its predictor is the noisy oracle PeakSignal at the workload's documented rank
	// correlation (Policies.PeakSpearman overrides it).
	Basin = "basin"
	// BasinBlind is Basin with an uninformative predictor (PeakSignal at ρ = 0: every session is
	// predicted at the workload's median peak), which isolates what the predictor adds.
	BasinBlind = "basin-blind"
	// Oracle is Basin with every session's true peak: the bound a perfect predictor reaches.
	Oracle = "oracle"
)

// Knee is the working set, as a multiple of the cache, past which the hit rate collapses; the
// reference budget is min(KneeFraction × knee, cache). Until the detector measures a deployment's
// knee (calibration), the paper's value stands in.
const (
	KneeFactor   = 1.9
	KneeFraction = 0.9
)

// Policies is the scenario.PolicySet of basin's policies.
type Policies struct {
	// Predict estimates a session's peak for the Basin policy; nil uses the noisy-oracle
	// predictor (PeakSignal) at PeakSpearman, or at the workload's own PeakSpearman, or — for a
	// workload with none (trace replay) — the gateway's predictor trained on the task length and
	// first prompt (TrainPredictor).
	Predict func(sim.SessionInfo) int64
	// PeakSpearman, when set, is the noisy-oracle feature's rank correlation with the true peak
	// for the Basin policy, in [0, 1].
	PeakSpearman *float64
	// Calibrate returns the deployment's calibration for the detector in the remediation loop, as
	// an operator runs `basin calibrate` before `basin daemon`; nil leaves the detector to learn
	// the knee passively. It is called from concurrent runs (see CalibrateOnce).
	Calibrate func() (*detector.Calibration, error)
	// Remediate configures the budget controller and shedding (zero: the defaults).
	Remediate remediate.Options
	// Static turns the remediation loop off: admission at the fixed reference budget.
	Static bool
	// Scale, when set, lets the remediation loop scale the deployment, as a daemon with a scaling
	// backend does.
	Scale *scaler.Options
	// Autoscaler, when set, runs the peers' utilisation-based autoscaler beside basin's
	// admission: the baseline basin's own scaling is measured against. Not with Scale.
	Autoscaler *sim.AutoscalerParams
}

// CalibrateOnce returns a Calibrate function that measures the scenario's deployment without its
// spikes on first use and returns the same calibration afterwards.
func CalibrateOnce(sc *scenario.Scenario) func() (*detector.Calibration, error) {
	base := sc.WithoutSpikes()
	return sync.OnceValues(func() (*detector.Calibration, error) { return Calibrate(base, Epoch) })
}

// Names implements scenario.PolicySet.
func (Policies) Names() []string { return []string{BasinCurrent, Basin, BasinBlind, Oracle} }

// Apply implements scenario.PolicySet: a fresh admission core per run, in front of the engine
// baseline (SGLang default), with the engine queues ordered by the gate's priority and lending on.
func (p Policies) Apply(name string, o *sim.Options) (bool, error) {
	// Cache capacity as the collector will count it: prefill GPU and host tiers plus what decode
	// may lend (basin's policies switch lending on).
	dep := o.Deployment
	lendCap := max(dep.Lending.MaxFraction, 0.5)
	cache := int64(dep.Prefill.CacheTokens+dep.Prefill.HostCacheTokens)*int64(dep.Prefill.Instances) +
		int64(lendCap*float64(dep.Decode.KVTokens))*int64(dep.Decode.Instances)
	ref := min(int64(KneeFraction*KneeFactor*float64(cache)), cache)
	ao := admission.Options{Budget: ref, ReferenceBudget: ref}
	predict := func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) * 4 }
	switch name {
	case BasinCurrent:
		ao.Mode, ao.ArrivalOrder = admission.ModeCurrent, true
	case Basin, BasinBlind:
		ao.Mode = admission.ModePeak
		var err error
		if predict, err = p.basinPredictor(name, o); err != nil {
			return true, err
		}
	case Oracle:
		ao.Mode = admission.ModePeak
		predict = func(s sim.SessionInfo) int64 { return int64(s.TruePeak) }
	default:
		return false, nil
	}
	core, err := admission.New(ao)
	if err != nil {
		return true, err
	}
	g := NewGate(core, predict)
	o.Gate = g
	o.PriorityQueues = true
	o.Deployment.Lending = sim.LendingState{Enabled: true, MaxFraction: lendCap}
	if p.Static {
		return true, nil
	}
	var do detector.Options
	if p.Calibrate != nil {
		cal, err := p.Calibrate()
		if err != nil {
			return true, fmt.Errorf("calibrate for %s: %w", name, err)
		}
		do.Calibration = cal
	}
	if p.Autoscaler != nil {
		if p.Scale != nil {
			return true, fmt.Errorf("%s: basin's scaling and the utilisation autoscaler would both size the pools", name)
		}
		if o.Controller != nil {
			return true, fmt.Errorf("%s: the run has a controller already", name)
		}
		a, err := sim.NewUtilisationAutoscaler(*p.Autoscaler)
		if err != nil {
			return true, err
		}
		o.Controller = a.Controller() // the observation loop runs it at its ticks
	}
	if _, err := AttachRemediationFrom(o, g, do, p.Remediate, 0, p.Scale); err != nil {
		return true, err
	}
	return true, nil
}

// PeakSignalSessions is how many sessions PeakSignal's peak distribution is estimated from.
const PeakSignalSessions = 4000

// basinPredictor chooses the Basin policy's peak predictor (see Policies.Predict).
func (p Policies) basinPredictor(name string, o *sim.Options) (func(sim.SessionInfo) int64, error) {
	if name == Basin && p.Predict != nil {
		return p.Predict, nil
	}
	if len(o.Streams) == 0 {
		return func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) * 4 }, nil
	}
	w := o.Streams[0].Workload
	rho, ok := 0.0, true
	switch {
	case name == BasinBlind:
	case p.PeakSpearman != nil:
		rho = *p.PeakSpearman
	default:
		syn, isSyn := w.(*sim.Synthetic)
		ok = isSyn && syn.PeakSpearman > 0
		if ok {
			rho = syn.PeakSpearman
		}
	}
	if !ok {
		m, err := TrainPredictor(w, o.Seed, 2000)
		if err != nil {
			return nil, err
		}
		return func(s sim.SessionInfo) int64 { return m.PredictPeak("", s.TaskChars, s.FirstPrompt) }, nil
	}
	sig, err := NewPeakSignal(w, rho, o.Seed, PeakSignalSessions)
	if err != nil {
		return nil, fmt.Errorf("%s predictor: %w", name, err)
	}
	return sig.Predict, nil
}

// TrainPredictor fits the gateway's peak predictor on n sessions of a workload, drawn from a
// random stream the runs never use. Simulated sessions carry no task text, so the model learns
// from the task length and the first prompt only — a weaker predictor than the paper's, which
// also reads the text (its holdout Spearman is in docs/simulator.md).
func TrainPredictor(w sim.Workload, seed uint64, n int) (*predictor.Model, error) {
	rng := rand.New(rand.NewPCG(seed^0xBEEF_CAFE, 0x7121))
	samples := make([]predictor.Sample, n)
	for i := range samples {
		s := w.Session(rng)
		samples[i] = predictor.Sample{TaskChars: s.TaskChars, FirstPrompt: s.Calls[0].Prompt, Peak: int64(s.PeakContext())}
	}
	m, _, err := predictor.Train(samples, predictor.TrainOptions{Seed: seed, Created: Epoch})
	if err != nil {
		return nil, fmt.Errorf("train the peak predictor on %s: %w", w.Name(), err)
	}
	return m, nil
}

// Epoch anchors virtual time to the admission core's wall-clock time.Time.
var Epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Gate adapts an admission.Core to sim.Gate.
type Gate struct {
	core    *admission.Core
	predict func(sim.SessionInfo) int64
	pending []sim.Release
	// held remembers the fixed priority of queued sessions for their release.
	held map[int64]time.Duration
}

// NewGate is a gate over core that predicts each session's peak with predict.
func NewGate(core *admission.Core, predict func(sim.SessionInfo) int64) *Gate {
	return &Gate{core: core, predict: predict}
}

func key(id int64) string { return strconv.FormatInt(id, 10) }

// Take turns the core's events (admissions, sheds, refusals, resumptions) into the simulator's
// releases, handed over at the next Poll.
func (g *Gate) Take(evs []admission.Event) {
	for _, e := range evs {
		id, err := strconv.ParseInt(e.ID, 10, 64)
		if err != nil {
			continue // not a simulated session
		}
		switch e.Kind {
		case admission.EventAdmitted:
			g.pending = append(g.pending, sim.Release{ID: id, Action: sim.Admit, Priority: g.held[id]})
			delete(g.held, id)
		case admission.EventShed:
			g.pending = append(g.pending, sim.Release{ID: id, Action: sim.Shed})
			delete(g.held, id)
		case admission.EventTooLate:
			// The gateway's retryable refusal; a simulated client does not retry.
			g.pending = append(g.pending, sim.Release{ID: id, Action: sim.Reject})
			delete(g.held, id)
		case admission.EventResumed:
			g.pending = append(g.pending, sim.Release{ID: id, Action: sim.Admit})
		}
	}
}

// Arrive implements sim.Gate.
func (g *Gate) Arrive(now time.Duration, s sim.SessionInfo) sim.Verdict {
	d := g.core.Arrive(Epoch.Add(now), admission.Request{ID: key(s.ID), FirstPrompt: int64(s.FirstPrompt),
		PredictedPeak: g.predict(s)})
	g.Take(d.Events)
	prio := d.Priority.Sub(Epoch)
	switch d.Verdict {
	case admission.Admitted:
		return sim.Verdict{Action: sim.Admit, Priority: prio}
	case admission.Queued:
		if g.held == nil {
			g.held = map[int64]time.Duration{}
		}
		g.held[s.ID] = prio
		return sim.Verdict{Action: sim.Hold, Priority: prio}
	case admission.Refused:
		return sim.Verdict{Action: sim.Shed}
	case admission.TooLate:
		return sim.Verdict{Action: sim.Reject}
	default:
		return sim.Verdict{Action: sim.Reject}
	}
}

// CallStart implements sim.Gate as the gateway does for a live session's call: the call's prompt
// raises the session's tracked context at once (admission.Core.BeginCall), before the answer's
// usage, and a held session's call waits for its EventResumed.
func (g *Gate) CallStart(now time.Duration, id int64, promptTokens int) bool {
	return g.core.BeginCall(Epoch.Add(now), key(id), int64(promptTokens)) != admission.CallHeld
}

// CallDone implements sim.Gate: the response's usage updates the session's context.
func (g *Gate) CallDone(now time.Duration, id int64, contextTokens int) {
	g.Take(g.core.Finish(Epoch.Add(now), key(id), int64(contextTokens)))
}

// SessionDone implements sim.Gate.
func (g *Gate) SessionDone(now time.Duration, id int64) {
	g.Take(g.core.End(Epoch.Add(now), key(id)))
}

// Poll implements sim.Gate: releases carry the priority the core fixed at arrival. Held calls
// that reached the hold bound go here, as the gateway's timers send them.
func (g *Gate) Poll(now time.Duration) []sim.Release {
	g.Take(g.core.ExpireHolds(Epoch.Add(now)))
	g.Take(g.core.ExpireQueued(Epoch.Add(now)))
	out := g.pending
	g.pending = nil
	return out
}

// Core exposes the admission core (the daemon's budget controller drives it in later runs).
func (g *Gate) Core() *admission.Core { return g.core }

// PolicyNames lists every policy `basin sim` accepts, engine baselines first.
func PolicyNames() []string {
	out := []string{}
	for _, p := range sim.Policies() {
		out = append(out, string(p))
	}
	names := Policies{}.Names()
	sort.Strings(names)
	return append(out, names...)
}

// Validate reports an unknown policy name.
func Validate(name string) error {
	for _, n := range PolicyNames() {
		if n == name {
			return nil
		}
	}
	return fmt.Errorf("unknown policy %q (known: %v)", name, PolicyNames())
}
