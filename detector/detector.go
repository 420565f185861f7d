package detector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/basin-dev/basin/collector"
)

// State is the detector's reading of the deployment.
type State string

// States. See the package documentation for the transitions.
const (
	// Healthy: the working set is well under the knee and the hit rate on its plateau.
	Healthy State = "healthy"
	// Pressure: the working set is near the knee (W ≥ PressureEnter × knee·C), the hit rate still
	// on its plateau — the "vulnerable" state of the metastability literature.
	Pressure State = "pressure"
	// Drifting: heading into the trap — the hit rate has left its plateau, or the population grows
	// near the knee with completions below arrivals.
	Drifting State = "drifting"
	// Trapped: the cache has collapsed or the population is past the unstable equilibrium; the
	// deployment does not come back by itself.
	Trapped State = "trapped"
	// Recovering: out of the collapse, the hit rate not yet back on its plateau for long enough.
	Recovering State = "recovering"
)

// Needs lists the signals the detector reads; while any is not fresh it holds its state. The hit
// rate is not among them: it is needed only while prompts flow (PromptTokenRate > 0), and a quiet
// deployment, whose hit rate of no tokens goes stale, is quiet, not blind.
func Needs() []collector.Signal {
	return []collector.Signal{
		collector.PromptTokenRate, collector.WorkingSet, collector.CacheCapacity, collector.LiveSessions,
		collector.ArrivalRate, collector.CompletionRate, collector.CallRate,
	}
}

// Evidence is what a window's hit rate rests on. The hit rate is a reading — it may move the
// state — only when Enough: a handful of prompt tokens, or a window of sessions' first calls
// (which miss by nature), says nothing about the cache. Without a reading, the conditions that
// need a low hit rate (drift, collapse) are false, and those that need a good one (leaving
// drifting or trapped, recovered) hold only while the working set fits the cache with room.
type Evidence struct {
	// Window is the span the counts are over.
	WindowSeconds float64 `json:"window_seconds"`
	// Calls finished, sessions arrived (an upper bound on first calls) and prompt tokens asked
	// in the window.
	Calls        float64 `json:"calls"`
	FirstCalls   float64 `json:"first_calls"`
	PromptTokens float64 `json:"prompt_tokens"`
	// Enough is whether the window's hit rate is a reading; Why says what falls short.
	Enough bool   `json:"enough"`
	Why    string `json:"why,omitempty"`
}

// Transition is one change of state and the evidence for it, numbers included.
type Transition struct {
	From    State     `json:"from"`
	To      State     `json:"to"`
	At      time.Time `json:"at"`
	Reasons []string  `json:"reasons"`
}

// Assessment is the detector's output for one snapshot. When Blind is not empty the numbers are
// those of the last step that saw every needed signal (ObservedAt) and the state is held.
type Assessment struct {
	At    time.Time `json:"at"`
	State State     `json:"state"`
	// Since is when the current state was entered (or the first step).
	Since   time.Time `json:"since"`
	Reasons []string  `json:"reasons"`
	// Transition is set on the step that changed the state.
	Transition *Transition `json:"transition,omitempty"`
	// ObservedAt is the last step with every needed signal fresh.
	ObservedAt time.Time `json:"observed_at"`

	Knee Knee `json:"knee"`
	// KneeTokens is knee × C: the working set where the hit rate leaves its plateau.
	KneeTokens          float64 `json:"knee_tokens"`
	WorkingSetOverCache float64 `json:"working_set_over_cache"`
	// HitRate is the window's hit rate; it is a reading only when HitEvidence.Enough (when not, it
	// is the last value the collector computed, possibly 0 for a deployment never busy, and
	// nothing may be decided from it).
	HitRate     float64  `json:"hit_rate"`
	HitEvidence Evidence `json:"hit_evidence"`
	Plateau     float64  `json:"plateau_hit"`
	// CollapseHit is the collapse line in use: min(CollapseHit, CollapseFraction × plateau).
	CollapseHit  float64 `json:"collapse_hit"`
	LiveSessions float64 `json:"live_sessions"`

	Equilibria Equilibria `json:"equilibria"`
	// KneeSessions is the population whose working set reaches knee × C at the current mean context.
	KneeSessions *float64 `json:"knee_sessions,omitempty"`
	// DistanceToEdge is the unstable equilibrium (or KneeSessions without one) minus N.
	DistanceToEdge *float64 `json:"distance_to_edge,omitempty"`
	// TimeToTrap is how long until N reaches the edge at its current growth; nil when N does not
	// grow. In JSON: time_to_trap_seconds.
	TimeToTrap *time.Duration `json:"-"`
	// SpikeTolerance is the largest arrival spike (for SpikeWindow) the deployment absorbs now and
	// still comes back by itself; nil while the fluid model cannot say.
	SpikeTolerance *SpikeTolerance `json:"spike_tolerance,omitempty"`

	// Lambda is the smoothed arrival rate, CompletionRate and ArrivalRate the collector's windowed
	// ones, all sessions per second; CallsPerSession is K (0 while unknown).
	Lambda float64 `json:"lambda_per_s"`
	// LongLambda is the arrival rate smoothed over LongLambdaTau (an hour): the long-run rate a
	// trap is weighed against (has it outlived its cause?).
	LongLambda float64 `json:"long_run_lambda_per_s"`
	// SettledLambda is the arrival rate smoothed as Lambda but without its start's bias
	// (Fluid.SettledLambda): what package scaler sizes instances from. MeanContext is the live
	// sessions' mean context smoothed over MeanContextTau, tokens.
	SettledLambda float64 `json:"settled_lambda_per_s"`
	// SettledLambdaSD is SettledLambda's standard error (Fluid.SettledLambdaSD), LongLambdaSD
	// LongLambda's (Fluid.LongLambdaSD); not in JSON, where they are +Inf before a second reading.
	SettledLambdaSD float64 `json:"-"`
	LongLambdaSD    float64 `json:"-"`
	MeanContext     float64 `json:"mean_context_tokens,omitempty"`
	// ServedFraction is the share of live sessions in a model call, smoothed as MeanContext
	// (Fluid.ServedFraction); nil without the gateway's sessions in call. What package scaler
	// sizes decode from.
	ServedFraction  *float64 `json:"served_fraction,omitempty"`
	ArrivalRate     float64  `json:"arrival_rate_per_s"`
	CompletionRate  float64  `json:"completion_rate_per_s"`
	CallsPerSession float64  `json:"calls_per_session,omitempty"`
	// PeakCompletionRate is the peak session completion rate in use, sessions per second: the
	// calibration's, or the learnt curve's once its falling side has been seen; 0 while unknown.
	PeakCompletionRate float64 `json:"peak_completion_rate_per_s,omitempty"`
	// SessionLifetime is how long a session lives under the knee, seconds (Fluid.Lifetime): with
	// an arrival rate, by Little's law, the population a deployment must hold. 0 while unknown.
	SessionLifetime float64 `json:"session_lifetime_s,omitempty"`

	// Blind names the needed signals that are not fresh ("hit_rate stale").
	Blind []string `json:"blind,omitempty"`
}

type assessmentAlias Assessment

type assessmentJSON struct {
	*assessmentAlias
	TimeToTrapSeconds *float64 `json:"time_to_trap_seconds,omitempty"`
}

// MarshalJSON writes TimeToTrap as time_to_trap_seconds. It leaves "<", ">" and "&" in reasons
// unescaped; an enclosing json.Marshal escapes them again, an Encoder with SetEscapeHTML(false)
// keeps them readable.
func (a Assessment) MarshalJSON() ([]byte, error) {
	j := assessmentJSON{assessmentAlias: (*assessmentAlias)(&a)}
	if a.TimeToTrap != nil {
		j.TimeToTrapSeconds = ptr(a.TimeToTrap.Seconds())
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(j); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (a *Assessment) UnmarshalJSON(b []byte) error {
	j := assessmentJSON{assessmentAlias: (*assessmentAlias)(a)}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	a.TimeToTrap = nil
	if j.TimeToTrapSeconds != nil {
		a.TimeToTrap = ptr(time.Duration(*j.TimeToTrapSeconds * float64(time.Second)))
	}
	return nil
}

// cond is a condition whose continuous truth the detector times.
type cond int

const (
	cPressureEnter cond = iota // W ≥ PressureEnter × knee·C
	cPressureExit              // W ≤ PressureExit × knee·C and no overload
	cOverload                  // arrivals above the peak completion rate
	cDriftHit                  // hit < plateau − DriftDrop
	cDriftFlow                 // N rising, completions < arrivals, W ≥ DriftNear × knee·C
	cDriftClear                // no drift sign, hit ≥ collapse + margin, W < knee·C
	cCollapse                  // hit < collapse line
	cPastEdge                  // N past the unstable equilibrium
	cRecoverable               // hit ≥ collapse + margin, W < knee·C, N not past an observed edge
	cOnPlateau                 // hit ≥ plateau − RecoverTolerance
	numConds
)

// Detector turns snapshots into assessments. It is safe for concurrent use; Step calls are
// serialised and meant to come from one loop.
type Detector struct {
	o  Options
	mu struct {
		sync.Mutex
		started bool
		lastAt  time.Time
		state   State
		since   time.Time
		holds   [numConds]time.Time // when each condition became true; zero while false
		passive *Passive
		fluid   *Fluid
		last    Assessment
		// onPlateau is set once the hit rate has held its plateau for PlateauWarmup: a cache
		// warming up from empty has not "left" a plateau it never reached, so drift by hit rate
		// waits for it. (A collapse is judged regardless: basin may start in an incident.)
		onPlateau    bool
		plateauSince time.Time
		// cacheRestart is the last engine restart seen (collector.Snapshot.CacheRestart): the
		// cache starts empty, so the plateau must be reached again before a drop is drift.
		cacheRestart time.Time
		// flowArr and flowDone are the arrival and completion rates smoothed over
		// DriftFlowWindow, for the flow sign of drift.
		flowArr, flowDone float64
		flowAt            time.Time
	}
}

// New validates the options and returns a detector in the healthy state.
func New(o Options) (*Detector, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("detector options: %w", err)
	}
	o = o.withDefaults()
	if o.Calibration != nil {
		c := *o.Calibration // the caller keeps theirs
		c.Points = slices.Clone(c.Points)
		o.Calibration = &c
	}
	d := &Detector{o: o}
	var err error
	if d.mu.passive, err = NewPassive(o.Passive); err != nil {
		return nil, fmt.Errorf("detector options: %w", err)
	}
	if d.mu.fluid, err = NewFluid(o.Fluid); err != nil {
		return nil, fmt.Errorf("detector options: %w", err)
	}
	d.mu.fluid.Seed(o.Calibration)
	d.mu.state = Healthy
	return d, nil
}

// Resume sets the state a restarted daemon persisted, before the first Step: a deployment that
// was trapped when the daemon stopped is still trapped when it comes back, and recovering from it
// must again pass through recovering. Hold timers start afresh (a condition must be seen for its
// hold by this process). It is an error after the first Step or for an unknown state.
func (d *Detector) Resume(s State, since time.Time) error {
	switch s {
	case Healthy, Pressure, Drifting, Trapped, Recovering:
	default:
		return fmt.Errorf("resume: unknown state %q", s)
	}
	if since.IsZero() {
		return fmt.Errorf("resume: state %s without the time it was entered", s)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.started {
		return fmt.Errorf("resume: the detector has already stepped")
	}
	d.mu.state, d.mu.since = s, since
	return nil
}

// Recalibrate replaces the calibration while the detector runs, from the next Step on: the
// daemon's passive re-estimation refits the knee from what it observed and hands the result here
// rather than waiting for a restart. The learnt completion curve is kept (it was seeded by the
// first calibration and has learnt since). It is an error for a detector built without a
// calibration (its knee is learnt all along) or for a calibration that does not validate.
func (d *Detector) Recalibrate(c *Calibration) error {
	if c == nil {
		return errors.New("recalibrate: no calibration")
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("recalibrate: %w", err)
	}
	cc := *c // the caller keeps theirs
	cc.Points = slices.Clone(c.Points)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.o.Calibration == nil {
		return errors.New("recalibrate: the detector runs without a calibration; its knee is learnt")
	}
	d.o.Calibration = &cc
	return nil
}

// CurvePoint is one point of the completion curve in sessions: X(N)/K.
type CurvePoint struct {
	N float64 `json:"n"`
	// SessionsPerS is X(N)/K, sessions completed per second at population N.
	SessionsPerS float64 `json:"sessions_per_s"`
}

// Curve returns the fluid model's completion curve X(N)/K as learnt so far (seeded by the
// calibration), or nil while K is unknown: the picture of the trap, with the arrival rate as a
// horizontal line crossing it at the equilibria.
func (d *Detector) Curve() []CurvePoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, ok := d.mu.fluid.K()
	if !ok {
		return nil
	}
	pts := d.mu.fluid.Curve()
	out := make([]CurvePoint, len(pts))
	for i, p := range pts {
		out[i] = CurvePoint{N: p.N, SessionsPerS: p.CallRate / k}
	}
	return out
}

// Last returns the latest assessment, false before the first Step.
func (d *Detector) Last() (Assessment, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.last, d.mu.started
}

// observation is one snapshot's needed signals, all fresh and sane.
type observation struct {
	w, c, hit, n, arrival, completion, calls, prompt float64
	// inCall is the live sessions in a model call (the gateway's), when inCallOK.
	inCall   float64
	inCallOK bool
	// hitFresh: the collector had a fresh hit rate (it has none while no prompt flows).
	hitFresh bool
	// wEstimated: the working set is the engines' KV estimate (no gateway), which cannot exceed C.
	wEstimated bool
	window     time.Duration
	estimated  []string
}

// read takes the needed signals out of a snapshot; the second result names those not fresh or not
// sane (a zero cache or a hit rate of 1.3 is a broken source, not a reading).
func read(s collector.Snapshot) (observation, []string) {
	blind := s.Blind(Needs())
	var o observation
	get := func(sig collector.Signal, dst *float64, ok func(float64) bool, want string) {
		v, fresh := s.Get(sig)
		if !fresh {
			return
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || !ok(v) {
			blind = append(blind, fmt.Sprintf("%s invalid (%v, want %s)", sig, v, want))
			return
		}
		*dst = v
		if val := s.Signals[sig]; val.Estimated {
			o.estimated = append(o.estimated, fmt.Sprintf("%s estimated (%s)", sig, val.Source))
		}
	}
	nonNeg := func(v float64) bool { return v >= 0 }
	get(collector.WorkingSet, &o.w, nonNeg, "≥ 0")
	get(collector.CacheCapacity, &o.c, func(v float64) bool { return v > 0 }, "> 0")
	get(collector.PromptTokenRate, &o.prompt, nonNeg, "≥ 0")
	if v, fresh := s.Get(collector.HitRate); fresh {
		get(collector.HitRate, &o.hit, func(v float64) bool { return v >= 0 && v <= 1 }, "[0, 1]")
		o.hitFresh = !math.IsNaN(v) && v >= 0 && v <= 1
	} else if o.prompt > 0 || s.State(collector.PromptTokenRate) != collector.OK {
		// Prompts flow (or may: their rate is unseen too) but no hit rate came with them: a
		// broken source, not a quiet one.
		blind = append(blind, fmt.Sprintf("%s %s", collector.HitRate, s.State(collector.HitRate)))
	}
	o.wEstimated = s.Signals[collector.WorkingSet].Estimated
	o.window = s.Window
	if o.window <= 0 {
		o.window = collector.DefaultWindow
	}
	get(collector.LiveSessions, &o.n, nonNeg, "≥ 0")
	get(collector.ArrivalRate, &o.arrival, nonNeg, "≥ 0")
	get(collector.CompletionRate, &o.completion, nonNeg, "≥ 0")
	get(collector.CallRate, &o.calls, nonNeg, "≥ 0")
	if v, fresh := s.Get(collector.SessionsInCall); fresh && v >= 0 && !math.IsInf(v, 0) {
		o.inCall, o.inCallOK = v, true // optional: only the served fraction reads it
	}
	slices.Sort(blind)
	return o, blind
}

// kneeLocked is the knee in use: calibrated, else learnt, else the default.
func (d *Detector) kneeLocked() Knee {
	if c := d.o.Calibration; c != nil {
		return c.Knee()
	}
	def := Knee{Ratio: d.o.KneeRatio, PlateauHit: d.o.PlateauHit, Source: SourceDefault, PlateauSource: SourceDefault}
	if d.o.DisablePassive {
		return def
	}
	return d.mu.passive.Knee(def, d.o.PressureExit*d.o.KneeRatio)
}

// Step assesses one snapshot; its time is s.At. Snapshots not after the previous one are ignored
// (the previous assessment comes back with a reason saying so).
func (d *Detector) Step(s collector.Snapshot) Assessment {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := s.At
	if !d.mu.started {
		d.mu.started = true
		if d.mu.since.IsZero() { // not resumed
			d.mu.state, d.mu.since = Healthy, now
		}
	} else if !now.After(d.mu.lastAt) {
		a := d.mu.last
		a.Transition = nil
		a.Reasons = append(slices.Clone(a.Reasons),
			fmt.Sprintf("snapshot at %s is not after the last step at %s: ignored", stamp(now), stamp(d.mu.lastAt)))
		return a
	}
	d.mu.lastAt = now

	if s.CacheRestart.After(d.mu.cacheRestart) {
		d.mu.cacheRestart = s.CacheRestart
		d.mu.onPlateau, d.mu.plateauSince = false, time.Time{}
	}
	obs, blind := read(s)
	if len(blind) > 0 {
		// No transition on missing data, and no hold survives a gap: a condition must be seen
		// continuously for its hold.
		d.mu.holds = [numConds]time.Time{}
		a := d.mu.last
		a.At, a.State, a.Since, a.Transition, a.Blind = now, d.mu.state, d.mu.since, nil, blind
		a.Knee = d.kneeLocked()
		if a.ObservedAt.IsZero() {
			a.Plateau = a.Knee.PlateauHit
		}
		a.Reasons = []string{fmt.Sprintf("blind (%s): holding %s since %s", strings.Join(blind, ", "), d.mu.state, stamp(d.mu.since))}
		d.mu.last = a
		return a
	}
	return d.assessLocked(now, obs)
}

// evidence weighs what the window's hit rate rests on against the options' minimums.
func (o Options) evidence(obs observation) Evidence {
	win := obs.window.Seconds()
	e := Evidence{WindowSeconds: win, Calls: obs.calls * win, FirstCalls: obs.arrival * win, PromptTokens: obs.prompt * win}
	var short []string
	if !obs.hitFresh {
		short = append(short, "no prompt tokens in the window")
	} else {
		if e.Calls < o.MinHitCalls {
			short = append(short, fmt.Sprintf("%.0f calls < %.0f", e.Calls, o.MinHitCalls))
		}
		if e.FirstCalls > o.MaxFirstCallShare*e.Calls {
			short = append(short, fmt.Sprintf("%.0f of %.0f calls may be sessions' first calls (> %.0f%%)",
				e.FirstCalls, e.Calls, 100*o.MaxFirstCallShare))
		}
		if e.PromptTokens < o.MinHitPromptFraction*obs.c {
			short = append(short, fmt.Sprintf("%s prompt tokens < %.2f × C %s",
				tokens(e.PromptTokens), o.MinHitPromptFraction, tokens(obs.c)))
		}
	}
	e.Enough = len(short) == 0
	if !e.Enough {
		e.Why = fmt.Sprintf("hit rate not a reading over the %s window: %s", dur(obs.window), strings.Join(short, ", "))
	}
	return e
}

// assessLocked is one step on a full reading: learn from it, judge the conditions and time them,
// move the state, and describe where the deployment stands.
func (d *Detector) assessLocked(now time.Time, obs observation) Assessment {
	ratio := obs.w / obs.c
	ev0 := d.o.evidence(obs)
	// Without a calibration the knee in use is the learnt one: the reading is learnt first, by the
	// state the step starts in, so that this step's knee includes it.
	if d.o.Calibration == nil {
		d.learnLocked(ev0.Enough, d.mu.state, ratio, obs.hit)
	}
	d.mu.fluid.Observe(now, FluidObservation{
		LiveSessions: obs.n, CallRate: obs.calls, CompletionRate: obs.completion,
		ArrivalRate: obs.arrival, WorkingSet: obs.w, InCall: obs.inCall, InCallOK: obs.inCallOK,
	})
	knee := d.kneeLocked()
	ev := newEvaluation(d.o, now, obs, knee, d.mu.fluid.Outlook(obs.n, knee.Ratio, obs.c), ev0, d.mu.state)
	d.mu.onPlateau, d.mu.plateauSince = ev.warmPlateau(d.mu.onPlateau, d.mu.plateauSince)
	d.mu.flowArr, d.mu.flowDone = ev.smoothFlow(d.mu.flowArr, d.mu.flowDone, d.mu.flowAt)
	d.mu.flowAt = now
	ev.flowArr, ev.flowDone = d.mu.flowArr, d.mu.flowDone
	ev.peak, ev.peakSource = d.peakLocked()
	if !d.mu.onPlateau && !d.mu.cacheRestart.IsZero() {
		ev.cacheRestart = d.mu.cacheRestart
	}
	d.mu.holds = timeHolds(d.mu.holds, ev.conditions(d.mu.onPlateau), now)
	ev.holds = d.mu.holds

	from := d.mu.state
	to, why := ev.next(from, d.mu.since)
	var tr *Transition
	if to != from {
		tr = &Transition{From: from, To: to, At: now, Reasons: why}
		d.mu.state, d.mu.since = to, now
	}
	// With a calibration the learnt points only feed the daemon's re-estimate of it (LearntPoints),
	// and the reading is learnt by the state the step ends in: the step that enters trapped has
	// read the collapsed branch already, the one that leaves recovering reads the plateau again.
	if d.o.Calibration != nil {
		d.learnLocked(ev0.Enough, d.mu.state, ratio, obs.hit)
	}

	out := ev.out
	a := Assessment{
		At: now, State: d.mu.state, Since: d.mu.since, Transition: tr, ObservedAt: now,
		Knee: knee, KneeTokens: knee.Ratio * obs.c, WorkingSetOverCache: ratio, HitRate: obs.hit, HitEvidence: ev0,
		Plateau: ev.plateau, CollapseHit: ev.collapse, LiveSessions: obs.n,
		Equilibria: out.Equilibria, KneeSessions: out.KneeSessions, DistanceToEdge: out.DistanceToEdge,
		TimeToTrap: out.TimeToTrap, SpikeTolerance: out.SpikeTolerance, Lambda: out.Lambda, LongLambda: out.LongLambda, ArrivalRate: obs.arrival,
		CompletionRate: obs.completion, CallsPerSession: out.K, PeakCompletionRate: ev.peak,
		SessionLifetime: out.Lifetime.Seconds(), SettledLambda: out.SettledLambda, MeanContext: out.MeanContext,
		SettledLambdaSD: out.SettledLambdaSD, LongLambdaSD: out.LongLambdaSD, ServedFraction: out.ServedFraction,
	}
	a.Reasons = slices.Concat(why, ev.describe(d.mu.state, why), obs.estimated)
	d.mu.last = a
	return a
}

// learnLocked gives the passive learner a reading taken in state s, unless learning is off. The
// collapsed branch of the cache hysteresis is not the knee: what is read while trapped or
// recovering is not learnt, only the way up.
func (d *Detector) learnLocked(reading bool, s State, ratio, hit float64) {
	if !reading || d.o.DisablePassive || s == Trapped || s == Recovering {
		return
	}
	d.mu.passive.Observe(ratio, hit)
}

// LearntPoints returns what the passive learner has learnt: one (W/C, hit rate) point per bin
// with enough samples, in W/C order. The detector learns with a calibration too (though it judges
// by the calibration's knee) so that the daemon can refit the knee on them and rewrite a
// calibration the deployment has moved away from; one learner serves both.
func (d *Detector) LearntPoints() []Point {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.passive.Points()
}

// newEvaluation sets up one step's judgement: the lines the hit rate is held to, and the working
// set from which a collapse counts, in state s.
func newEvaluation(o Options, now time.Time, obs observation, knee Knee, out Outlook, ev0 Evidence, s State) evaluation {
	plateau := knee.PlateauHit
	collapse := min(o.CollapseHit, o.CollapseFraction*plateau)
	// Where a trap can be: the working set near the knee (measured), or a cache full to the brim
	// (the engines' estimate, which cannot exceed C). Below it a low hit rate is a cold cache —
	// an engine restart, a burst of new sessions — that refills by itself, not a collapse. A
	// deployment recovering from a trap is the exception: the collapsed branch of the cache's
	// hysteresis reaches below the knee, so a relapse there counts wherever W is.
	nearLine := o.DriftNear * knee.Ratio
	if obs.wEstimated {
		nearLine = min(nearLine, o.DriftNear)
	}
	if s == Recovering {
		nearLine = 0
	}
	return evaluation{
		now: now, o: o, obs: obs, ratio: obs.w / obs.c, knee: knee, out: out, evidence: ev0, nearLine: nearLine,
		plateau: plateau, collapse: collapse, driftLine: plateau - o.DriftDrop, recoverLine: collapse + o.CollapseExitMargin,
	}
}

// warmPlateau counts the plateau warm-up on from (on, since): drift by hit rate waits until the
// hit rate has held its plateau for PlateauWarmup, since a cache warming up from empty has not
// left a plateau it never reached. A quiet window (no reading) keeps the count where it was; a
// hit rate under the drift line starts it again.
func (e *evaluation) warmPlateau(on bool, since time.Time) (bool, time.Time) {
	switch {
	case !e.evidence.Enough:
	case e.obs.hit < e.driftLine:
		since = time.Time{}
	case since.IsZero():
		since = e.now
	case e.now.Sub(since) >= e.o.PlateauWarmup:
		on = true
	}
	return on, since
}

// smoothFlow moves the arrival and completion rates smoothed over DriftFlowWindow (last smoothed
// at at; zero: never) to this step's: the flow sign of drift compares the two, and one step's
// rates are too noisy to. The first reading starts them.
func (e *evaluation) smoothFlow(arr, done float64, at time.Time) (float64, float64) {
	if at.IsZero() {
		return e.obs.arrival, e.obs.completion
	}
	if dt := e.now.Sub(at); dt > 0 {
		a := 1 - math.Exp(-dt.Seconds()/e.o.DriftFlowWindow.Seconds())
		arr += a * (e.obs.arrival - arr)
		done += a * (e.obs.completion - done)
	}
	return arr, done
}

// conditions is the truth of each timed condition on this step, with onPlateau whether the
// plateau warm-up is done. Without a hit-rate reading, a low hit rate is never seen, and only a
// working set that fits the cache with room (under the pressure exit) vouches for a high one.
func (e *evaluation) conditions(onPlateau bool) [numConds]bool {
	o, obs, ratio, knee, out := e.o, e.obs, e.ratio, e.knee, e.out
	reading := e.evidence.Enough
	roomy := ratio <= o.PressureExit*knee.Ratio
	hitAtLeast := func(line float64) bool {
		if reading {
			return obs.hit >= line
		}
		return roomy
	}
	lowHit := func(line float64) bool { return reading && obs.hit < line }
	edgeObserved := out.Equilibria.Unstable != nil && !out.Equilibria.Estimated
	pastEdge := out.Edge != nil && obs.n > *out.Edge && (edgeObserved || lowHit(e.driftLine))
	driftHit := lowHit(e.driftLine) && onPlateau
	// The flow sign needs the hit rate to corroborate it (at least half the drift drop under the
	// plateau): a population growing past the knee with the cache still hitting is pressure, not
	// yet drift.
	driftFlow := out.ObservedSlope > 0 && e.flowDone < (1-o.DriftFlowMargin)*e.flowArr &&
		ratio >= o.DriftNear*knee.Ratio && lowHit(e.plateau-o.DriftDrop/2)
	var truth [numConds]bool
	truth[cPressureEnter] = ratio >= o.PressureEnter*knee.Ratio
	truth[cOverload] = e.peak > 0 && obs.arrival > e.peak
	truth[cPressureExit] = ratio <= o.PressureExit*knee.Ratio && !truth[cOverload]
	truth[cDriftHit] = driftHit
	truth[cDriftFlow] = driftFlow
	truth[cDriftClear] = !driftHit && !driftFlow && hitAtLeast(e.recoverLine) && ratio < knee.Ratio
	truth[cCollapse] = lowHit(e.collapse) && ratio >= e.nearLine
	truth[cPastEdge] = pastEdge
	truth[cRecoverable] = hitAtLeast(e.recoverLine) && ratio < knee.Ratio && !(edgeObserved && obs.n > *out.Edge)
	truth[cOnPlateau] = hitAtLeast(e.plateau - o.RecoverTolerance)
	return truth
}

// timeHolds updates when each condition became true: a condition must be seen continuously for
// its hold, so one that is false restarts, and one that stays true keeps its start.
func timeHolds(holds [numConds]time.Time, truth [numConds]bool, now time.Time) [numConds]time.Time {
	for c, t := range truth {
		switch {
		case !t:
			holds[c] = time.Time{}
		case holds[c].IsZero():
			holds[c] = now
		}
	}
	return holds
}

// peakLocked is the peak session completion rate in use and where it comes from: the
// calibration's, else the learnt curve's once its falling side has been seen (0 while unknown).
func (d *Detector) peakLocked() (float64, string) {
	if c := d.o.Calibration; c != nil {
		return c.PeakCompletionRatePerS, string(SourceCalibration)
	}
	if p, ok := d.mu.fluid.Peak(); ok {
		return p, "learnt"
	}
	return 0, ""
}

// evaluation is one step's numbers, conditions and hold timers.
type evaluation struct {
	now                                       time.Time
	o                                         Options
	obs                                       observation
	ratio                                     float64
	knee                                      Knee
	out                                       Outlook
	plateau, collapse, driftLine, recoverLine float64
	evidence                                  Evidence
	cacheRestart                              time.Time // an engine restart the plateau has not come back from
	nearLine                                  float64   // W/C from which a collapse counts
	flowArr, flowDone                         float64   // smoothed over DriftFlowWindow
	peak                                      float64   // peak completion rate, sessions/s; 0 unknown
	peakSource                                string
	holds                                     [numConds]time.Time
}

// heldFor is how long c has been true (false when it is not).
func (e *evaluation) heldFor(c cond) (time.Duration, bool) {
	if e.holds[c].IsZero() {
		return 0, false
	}
	return e.now.Sub(e.holds[c]), true
}

func (e *evaluation) held(c cond, d time.Duration) bool {
	h, ok := e.heldFor(c)
	return ok && h >= d
}

// next applies the transition rules to the current state; it returns the new state and why.
func (e *evaluation) next(s State, since time.Time) (State, []string) {
	o := e.o
	trapped := func() []string {
		var why []string
		if e.held(cCollapse, o.TrappedHold) {
			why = append(why, e.reason(cCollapse))
		}
		if e.held(cPastEdge, o.TrappedHold) {
			why = append(why, e.reason(cPastEdge))
		}
		return why
	}
	switch s {
	case Healthy, Pressure:
		if why := trapped(); why != nil {
			return Trapped, why
		}
		var why []string
		if e.held(cDriftHit, o.DriftHold) {
			why = append(why, e.reason(cDriftHit))
		}
		if e.held(cDriftFlow, o.DriftFlowHold) {
			why = append(why, e.reason(cDriftFlow))
		}
		if why != nil {
			return Drifting, why
		}
		if s == Healthy {
			if e.held(cPressureEnter, o.MinHold) {
				why = append(why, e.reason(cPressureEnter))
			}
			if e.held(cOverload, o.OverloadHold) {
				why = append(why, e.reason(cOverload))
			}
			if why != nil {
				return Pressure, why
			}
		}
		if s == Pressure && e.held(cPressureExit, o.MinHold) {
			return Healthy, []string{e.reason(cPressureExit)}
		}
	case Drifting:
		if why := trapped(); why != nil {
			return Trapped, why
		}
		if e.held(cDriftClear, o.MinHold) {
			return Recovering, []string{e.reason(cDriftClear)}
		}
	case Trapped:
		if e.held(cRecoverable, o.MinHold) {
			return Recovering, []string{e.reason(cRecoverable)}
		}
	case Recovering:
		if why := trapped(); why != nil {
			return Trapped, why
		}
		// The plateau must hold for RecoverHold inside this state, not merely since some earlier
		// moment: a recovery is never shorter than RecoverHold.
		if h, ok := e.heldFor(cOnPlateau); ok && min(h, e.now.Sub(since)) >= o.RecoverHold {
			back := e.reason(cOnPlateau)
			if e.evidence.Enough {
				back = fmt.Sprintf("hit rate %.2f ≥ plateau %.2f − %.2f for %s",
					e.obs.hit, e.plateau, o.RecoverTolerance, dur(min(h, e.now.Sub(since))))
			}
			if e.held(cPressureExit, o.MinHold) {
				return Healthy, []string{back, e.reason(cPressureExit)}
			}
			return Pressure, []string{back, fmt.Sprintf("W/C %.2f > %.2f × knee %.2f = %.2f: the cache has recovered, the load has not",
				e.ratio, o.PressureExit, e.knee.Ratio, o.PressureExit*e.knee.Ratio)}
		}
	}
	return s, nil
}

// reason states a condition with its numbers and how long it has held.
func (e *evaluation) reason(c cond) string {
	o, k := e.o, e.knee.Ratio
	h, _ := e.heldFor(c)
	for_ := " for " + dur(h)
	switch c {
	case cPressureEnter:
		return fmt.Sprintf("W/C %.2f ≥ %.2f × knee %.2f = %.2f%s", e.ratio, o.PressureEnter, k, o.PressureEnter*k, for_)
	case cPressureExit:
		arr := ""
		if e.peak > 0 {
			arr = fmt.Sprintf(", arrivals %.2f/min ≤ peak completion rate %.2f/min", e.obs.arrival*60, e.peak*60)
		}
		return fmt.Sprintf("W/C %.2f ≤ %.2f × knee %.2f = %.2f%s%s", e.ratio, o.PressureExit, k, o.PressureExit*k, arr, for_)
	case cOverload:
		return fmt.Sprintf("arrivals %.2f/min > peak completion rate %.2f/min (%s): no equilibrium at this rate, "+
			"the population grows towards the knee%s", e.obs.arrival*60, e.peak*60, e.peakSource, for_)
	case cDriftHit:
		return fmt.Sprintf("hit rate %.2f < plateau %.2f − %.2f%s", e.obs.hit, e.plateau, o.DriftDrop, for_)
	case cDriftFlow:
		return fmt.Sprintf("live sessions rising (%+.3f/s) with completions %.4f/s < %.2f × arrivals %.4f/s (%s averages) at W/C %.2f ≥ %.2f × knee %.2f = %.2f%s",
			e.out.ObservedSlope, e.flowDone, 1-o.DriftFlowMargin, e.flowArr, dur(o.DriftFlowWindow), e.ratio, o.DriftNear, k, o.DriftNear*k, for_)
	case cDriftClear, cOnPlateau, cRecoverable:
		if !e.evidence.Enough {
			return fmt.Sprintf("no hit-rate reading (quiet) and W/C %.2f ≤ %.2f × knee %.2f = %.2f: the cache has room for every live context%s",
				e.ratio, o.PressureExit, k, o.PressureExit*k, for_)
		}
	}
	switch c {
	case cDriftClear:
		return fmt.Sprintf("drift stopped: hit rate %.2f ≥ plateau %.2f − %.2f, completions %.4f/s vs arrivals %.4f/s, W/C %.2f < knee %.2f%s",
			e.obs.hit, e.plateau, o.DriftDrop, e.obs.completion, e.obs.arrival, e.ratio, k, for_)
	case cCollapse:
		if e.nearLine == 0 {
			return fmt.Sprintf("hit rate %.2f < collapse %.2f at W/C %.2f, recovering: the collapsed branch reaches below the knee%s",
				e.obs.hit, e.collapse, e.ratio, for_)
		}
		return fmt.Sprintf("hit rate %.2f < collapse %.2f at W/C %.2f ≥ %.2f%s", e.obs.hit, e.collapse, e.ratio, e.nearLine, for_)
	case cPastEdge:
		if e.out.Equilibria.Unstable != nil && !e.out.Equilibria.Estimated {
			return fmt.Sprintf("live sessions %.1f > unstable equilibrium %.1f at λ %.2f/min%s",
				e.obs.n, *e.out.Edge, e.out.Lambda*60, for_)
		}
		return fmt.Sprintf("live sessions %.1f > edge %.1f (estimated from knee %.2f × C at mean context %s tokens) with hit rate %.2f < %.2f%s",
			e.obs.n, *e.out.Edge, k, tokens(e.obs.w/max(e.obs.n, 1)), e.obs.hit, e.driftLine, for_)
	case cOnPlateau:
		return fmt.Sprintf("hit rate %.2f ≥ plateau %.2f − %.2f%s", e.obs.hit, e.plateau, o.RecoverTolerance, for_)
	case cRecoverable:
		return fmt.Sprintf("hit rate %.2f ≥ collapse %.2f + %.2f and W/C %.2f < knee %.2f%s",
			e.obs.hit, e.collapse, o.CollapseExitMargin, e.ratio, k, for_)
	}
	return ""
}

// describe says what the current numbers mean for state s: the evidence behind it and what is
// building up. given are the reasons of a transition into s this step, which open the list: the
// conditions that keep s are not said again (they are those reasons).
func (e *evaluation) describe(s State, given []string) []string {
	o, k := e.o, e.knee.Ratio
	src := e.knee.Source
	if e.knee.BeyondRange {
		src += ", lower bound"
	}
	out := []string{
		fmt.Sprintf("W/C %.2f (knee %.2f %s; pressure from %.2f, clears at %.2f)",
			e.ratio, k, src, o.PressureEnter*k, o.PressureExit*k),
		fmt.Sprintf("hit rate %.2f (plateau %.2f %s; drifting under %.2f, collapse under %.2f from W/C %.2f)",
			e.obs.hit, e.plateau, e.knee.PlateauSource, e.driftLine, e.collapse, e.nearLine),
	}
	if !e.cacheRestart.IsZero() {
		out = append(out, fmt.Sprintf("an engine restarted at %s: its cache refills from empty; a drop is drift only once "+
			"the hit rate has held its plateau again for %s", stamp(e.cacheRestart), dur(o.PlateauWarmup)))
	}
	if !e.evidence.Enough {
		out[1] = e.evidence.Why
	} else if e.obs.hit < e.collapse && e.ratio < e.nearLine {
		out = append(out, fmt.Sprintf("hit rate %.2f under collapse %.2f at W/C %.2f < %.2f: a cold cache (an engine restart, "+
			"new sessions) refilling, not a trap", e.obs.hit, e.collapse, e.ratio, e.nearLine))
	}
	// What keeps the state where it is.
	active := func(cs ...cond) {
		for _, c := range cs {
			if _, ok := e.heldFor(c); ok && !slices.Contains(given, e.reason(c)) {
				out = append(out, e.reason(c))
			}
		}
	}
	switch s {
	case Pressure:
		active(cOverload)
		if _, ok := e.heldFor(cPressureEnter); !ok {
			out = append(out, fmt.Sprintf("W/C %.2f not yet ≤ %.2f: still pressure", e.ratio, o.PressureExit*k))
		}
	case Drifting:
		active(cDriftHit, cDriftFlow)
	case Trapped:
		active(cCollapse, cPastEdge)
	}
	// What is building towards a transition.
	pending := func(c cond, hold time.Duration, to State) {
		if h, ok := e.heldFor(c); ok && h < hold {
			out = append(out, fmt.Sprintf("%s (%s after %s)", e.reason(c), to, dur(hold)))
		}
	}
	switch s {
	case Healthy, Pressure:
		if s == Healthy {
			pending(cOverload, o.OverloadHold, Pressure)
		}
		pending(cCollapse, o.TrappedHold, Trapped)
		pending(cPastEdge, o.TrappedHold, Trapped)
		pending(cDriftHit, o.DriftHold, Drifting)
		pending(cDriftFlow, o.DriftFlowHold, Drifting)
	case Drifting:
		pending(cCollapse, o.TrappedHold, Trapped)
		pending(cPastEdge, o.TrappedHold, Trapped)
		pending(cDriftClear, o.MinHold, Recovering)
	case Recovering:
		pending(cCollapse, o.TrappedHold, Trapped)
		pending(cPastEdge, o.TrappedHold, Trapped)
		if _, ok := e.heldFor(cOnPlateau); !ok {
			out = append(out, fmt.Sprintf("hit rate %.2f not yet back to plateau %.2f − %.2f", e.obs.hit, e.plateau, o.RecoverTolerance))
		} else {
			pending(cOnPlateau, o.RecoverHold, "recovered")
		}
	case Trapped:
		pending(cRecoverable, o.MinHold, Recovering)
	}
	eq := e.out.Equilibria
	switch {
	case eq.NoEquilibrium:
		out = append(out, fmt.Sprintf("λ %.2f/min above the completion curve up to its peak or the knee: no equilibrium, "+
			"the population grows until arrivals fall", e.out.Lambda*60))
	default:
		stable := "no stable point seen yet"
		if eq.Stable != nil {
			stable = fmt.Sprintf("stable N %.1f", *eq.Stable)
		}
		unstable := "no edge known"
		if eq.Unstable != nil {
			unstable = fmt.Sprintf("unstable N %.1f", *eq.Unstable)
			if eq.Estimated {
				unstable += " (estimated, bounded by the knee)"
			}
		}
		k := "K not known yet"
		if e.out.K > 0 {
			k = fmt.Sprintf("K %.1f calls per session", e.out.K)
		}
		out = append(out, fmt.Sprintf("λ %.2f/min, %s: %s, %s, live %.1f", e.out.Lambda*60, k, stable, unstable, e.obs.n))
	}
	if e.out.TimeToTrap != nil && e.out.DistanceToEdge != nil && *e.out.DistanceToEdge > 0 {
		out = append(out, edgeForecast(max(e.out.ModelSlope, e.out.ObservedSlope), *e.out.DistanceToEdge, *e.out.TimeToTrap))
	}
	return out
}

// edgeForecast says when the live population, growing at growth sessions/s and distance sessions
// below the unstable equilibrium, passes it: a forecast within trapHorizon, and beyond it only that
// the population is not drifting toward the edge.
func edgeForecast(growth, distance float64, timeToTrap time.Duration) string {
	if timeToTrap <= trapHorizon {
		return fmt.Sprintf("growing %+.3f sessions/s: past the edge in %s", growth, dur(timeToTrap))
	}
	return fmt.Sprintf("not drifting toward the edge: %.1f sessions below it, at %+.3f sessions/s more than %s away",
		distance, growth, dur(trapHorizon))
}

// trapHorizon is how far ahead a time to the edge is a forecast: an hour, six time constants of
// λ's average (DefaultLambdaTau). The time to the edge extrapolates today's growth; λ and the
// completions it is the difference of move within that time, so an edge further away says only
// that the population is not drifting toward it. An idle deployment's growth of +0.001 sessions/s
// put it "past the edge in 273h".
const trapHorizon = 6 * DefaultLambdaTau

func dur(d time.Duration) string { return d.Round(time.Second).String() }

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
