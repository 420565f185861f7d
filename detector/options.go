package detector

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// State-machine defaults. Fractions of the knee are fractions of knee × C in working-set terms.
const (
	// DefaultPressureEnter: pressure from W ≥ 0.8 × knee·C (basin's design value; below the
	// paper's reference budget of 0.9 × knee, so pressure shows before admission holds sessions).
	DefaultPressureEnter = 0.8
	// DefaultPressureExit: back to healthy at W ≤ 0.7 × knee·C (basin's design value; a band of
	// 0.1 × knee, about 0.19 C at the paper's knee, is wider than the working set's minute-to-minute
	// swing of a few sessions' contexts, so the state does not flap).
	DefaultPressureExit = 0.7
	// DefaultDriftDrop: drifting when the hit rate is 0.05 under its plateau (basin's design
	// value; the paper's never-collapsed runs at 1.6–1.7× cache hit 0.81–0.93 against a plateau
	// of 0.95, so a 0.05 drop is the first sign of the working set outgrowing the cache).
	DefaultDriftDrop = 0.05
	// DefaultDriftHold: the hit-rate drop must last 3 min. Chosen: the collector's hit rate is a
	// windowed ratio of counters, and in the simulator's healthy 1P1D runs near the knee it dips
	// under the drift line for a minute or two at a time and comes back; the first warning of a
	// real trap is pressure (W approaching the knee), so a longer hold here costs no lead time.
	DefaultDriftHold = 3 * time.Minute
	// DefaultDriftNear: the flow sign of drift (live sessions rising, completions below arrivals)
	// counts only from W ≥ 0.9 × knee·C, the paper's reference budget (min(0.9 × knee, C)).
	DefaultDriftNear = 0.9
	// DefaultDriftFlowHold: the flow sign must last 2 min. Chosen: in the simulator's healthy runs
	// near the knee, Poisson bursts make completions lag arrivals for a minute or so and then catch
	// up; the trap's imbalance lasts for good.
	DefaultDriftFlowHold = 2 * time.Minute
	// DefaultDriftFlowWindow smooths the arrival and completion rates the flow sign compares
	// (EWMA time constant, 5 min): a trap is a sustained deficit, not one slow minute.
	DefaultDriftFlowWindow = 5 * time.Minute
	// DefaultDriftFlowMargin: completions must fall more than 10% below arrivals. Chosen: smoothed
	// rates still wander by a few per cent around each other in a steady state.
	DefaultDriftFlowMargin = 0.1
	// DefaultOverloadHold: pressure also when arrivals have run above the deployment's peak
	// session completion rate for 15 s (MinHold, the hold of every other way into pressure). At
	// such a rate the fluid model has no equilibrium: the population can only grow until it
	// reaches the knee, so this is the earliest honest sign of a spike that will trap the
	// deployment, minutes before W gets near the knee. Pressure pages no one (a warning is
	// worth the time it leaves to act), so the hold trades lead for pressure's noise, not for
	// false pages. Measured with `basin sim detect --seeds 20` (docs/simulator.md, "What bounds
	// the lead", has the table): median lead over the 32 collapsed +100% runs 4.5 min at a 1 min
	// hold, 4.9 at 30 s and 5.1 at 15 s; in the 67 runs that do not collapse (100 simulated
	// hours), pressure spells of 2 min or more (BasinCacheKneeApproaching's for:) 161 at 1 min
	// and 222 at 15 s, and drifting or trapped in them unchanged (6). The daemon's
	// detector.overload_hold sets it.
	DefaultOverloadHold = 15 * time.Second
	// DefaultPlateauWarmup: the hit rate must have held its plateau for 2 min before a drop counts
	// as leaving it. A cache warming up from empty (or after a restart) is below its plateau
	// without having left it; a collapse is judged regardless.
	DefaultPlateauWarmup = 2 * time.Minute
	// DefaultCollapseHit and DefaultCollapseFraction set the collapse line at
	// min(0.5, 0.6 × plateau). Collapsed deployments hit 0.24–0.37 (paper: 0.27 at 1P1D, 0.26–0.37
	// on 1P3D, HiCache ~0.33; simulator 0.24–0.29), about 0.3 of their plateau, because only the
	// shared prompt prefix still hits; the lowest never-collapsed hit rate is 0.81 (paper 1P3D at
	// 1.6–1.7× cache), 0.85 of the plateau. 0.6 of the plateau sits between the two in ratio terms
	// and follows workloads whose plateau is lower; the 0.5 cap keeps the line well under the
	// never-collapsed branch when the plateau is high (0.6 × 0.96 = 0.58 would leave 0.23 of
	// margin to 0.81, 0.5 leaves 0.31).
	DefaultCollapseHit      = 0.5
	DefaultCollapseFraction = 0.6
	// DefaultCollapseExitMargin: leaving trapped needs the hit rate 0.05 above the collapse line,
	// so entry and exit differ. Chosen: the same size as DriftDrop.
	DefaultCollapseExitMargin = 0.05
	// DefaultTrappedHold: the collapse (or N past the unstable equilibrium) must last 30 s
	// (basin's design value; shorter than DriftHold because a collapse is far from the plateau and
	// noise does not reach it).
	DefaultTrappedHold = 30 * time.Second
	// DefaultRecoverTolerance: recovered means the hit rate back within 0.03 of its plateau
	// (basin's design value; tighter than DriftDrop so entering and leaving the plateau differ).
	// The paper's Continuum runs stayed 10–15 points under pre-spike: not recovered by this measure.
	DefaultRecoverTolerance = 0.03
	// DefaultRecoverHold: the hit rate must stay back for 5 minutes (basin's design value; a
	// trapped deployment's hit rate climbs as sessions finish and may fall again as queued ones
	// start — "recovered" is judged by the hit rate, not the load, per the metastability
	// literature).
	DefaultRecoverHold = 5 * time.Minute
	// DefaultMinHitCalls: a window's hit rate is a reading only when at least 20 model calls
	// finished in it. The hit rate is a token-weighted mean over calls; with fewer, one call's
	// luck moves it by more than the 0.05 drift drop. A busy deployment is far above it: in the
	// simulator's paper spike runs every one-minute window from the fifth minute on held 50–266
	// calls, healthy or trapped (sim/harness TestEvidenceHoldsUnderRealLoad).
	DefaultMinHitCalls = 20
	// DefaultMaxFirstCallShare: and only when at most half of those calls can be sessions' first
	// calls (sessions arrived in the window ≤ 0.5 × calls). A first call misses by nature — its
	// context was never cached, bar the shared system prompt — so a window of mostly new sessions
	// reads low on a perfect cache. Agent sessions make tens of calls, so steady traffic has a
	// small first-call share (at most 0.17 in the same runs, spike included); half is reached by
	// a burst of new sessions on a quiet deployment.
	DefaultMaxFirstCallShare = 0.5
	// DefaultMinHitPromptFraction: and only when the window's prompt tokens reach 5% of the cache
	// capacity C. A collapse is a cache churned by re-sent contexts; prompt traffic under a
	// twentieth of the cache per window cannot churn it, and a deployment in the trap is busy
	// recomputing: at least 1.4 C per window in the same runs. Test calls of a few tokens never
	// reach it.
	DefaultMinHitPromptFraction = 0.05
	// DefaultMinHold is the hold of every transition that names none (pressure in and out, leaving
	// drifting or trapped). Chosen: three samples at the daemon's 5 s step, so one noisy sample
	// never moves the state.
	DefaultMinHold = 15 * time.Second
)

// Options configure a Detector. Zero fields take the defaults; negative or inconsistent values are
// errors naming the field.
type Options struct {
	// Calibration, when set, fixes the knee and the plateau and seeds the fluid model's curve and K.
	Calibration *Calibration
	// KneeRatio is the knee used until one is calibrated or learnt (DefaultKneeRatio).
	KneeRatio float64
	// PlateauHit is the plateau used until one is calibrated or learnt (DefaultPlateauHit).
	PlateauHit float64
	// DisablePassive turns passive knee learning off: the default knee and plateau stay, and
	// nothing is learnt for LearntPoints either.
	DisablePassive bool
	Passive        PassiveOptions
	Fluid          FluidOptions

	PressureEnter      float64       // DefaultPressureEnter
	PressureExit       float64       // DefaultPressureExit
	DriftDrop          float64       // DefaultDriftDrop
	DriftHold          time.Duration // DefaultDriftHold
	DriftNear          float64       // DefaultDriftNear
	DriftFlowHold      time.Duration // DefaultDriftFlowHold
	DriftFlowWindow    time.Duration // DefaultDriftFlowWindow
	DriftFlowMargin    float64       // DefaultDriftFlowMargin
	PlateauWarmup      time.Duration // DefaultPlateauWarmup
	OverloadHold       time.Duration // DefaultOverloadHold
	CollapseHit        float64       // DefaultCollapseHit
	CollapseFraction   float64       // DefaultCollapseFraction
	CollapseExitMargin float64       // DefaultCollapseExitMargin
	TrappedHold        time.Duration // DefaultTrappedHold
	RecoverTolerance   float64       // DefaultRecoverTolerance
	RecoverHold        time.Duration // DefaultRecoverHold
	MinHold            time.Duration // DefaultMinHold

	// The least evidence a window must hold for its hit rate to count (see Evidence).
	MinHitCalls          float64 // DefaultMinHitCalls
	MaxFirstCallShare    float64 // DefaultMaxFirstCallShare
	MinHitPromptFraction float64 // DefaultMinHitPromptFraction
}

func (o Options) withDefaults() Options {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.KneeRatio, DefaultKneeRatio)
	def(&o.PlateauHit, DefaultPlateauHit)
	def(&o.PressureEnter, DefaultPressureEnter)
	def(&o.PressureExit, DefaultPressureExit)
	def(&o.DriftDrop, DefaultDriftDrop)
	defD(&o.DriftHold, DefaultDriftHold)
	def(&o.DriftNear, DefaultDriftNear)
	defD(&o.DriftFlowHold, DefaultDriftFlowHold)
	defD(&o.DriftFlowWindow, DefaultDriftFlowWindow)
	def(&o.DriftFlowMargin, DefaultDriftFlowMargin)
	defD(&o.PlateauWarmup, DefaultPlateauWarmup)
	defD(&o.OverloadHold, DefaultOverloadHold)
	def(&o.CollapseHit, DefaultCollapseHit)
	def(&o.CollapseFraction, DefaultCollapseFraction)
	def(&o.CollapseExitMargin, DefaultCollapseExitMargin)
	defD(&o.TrappedHold, DefaultTrappedHold)
	def(&o.RecoverTolerance, DefaultRecoverTolerance)
	defD(&o.RecoverHold, DefaultRecoverHold)
	defD(&o.MinHold, DefaultMinHold)
	def(&o.MinHitCalls, DefaultMinHitCalls)
	def(&o.MaxFirstCallShare, DefaultMaxFirstCallShare)
	def(&o.MinHitPromptFraction, DefaultMinHitPromptFraction)
	o.Passive = o.Passive.withDefaults()
	o.Fluid = o.Fluid.withDefaults()
	return o
}

// Validate reports the first option New refuses, naming it. Zero fields stand for their
// defaults, so a config can be checked before anything is built.
func (o Options) Validate() error {
	o = o.withDefaults()
	frac := func(name string, v float64) error {
		if !(v > 0 && v < 1) {
			return fmt.Errorf("%s: %v outside (0, 1)", name, v)
		}
		return nil
	}
	hold := func(name string, v time.Duration) error {
		if v <= 0 {
			return fmt.Errorf("%s: %v, must be positive so one sample cannot change the state", name, v)
		}
		return nil
	}
	errs := []error{
		frac("PressureEnter", o.PressureEnter),
		frac("PressureExit", o.PressureExit),
		frac("DriftDrop", o.DriftDrop),
		frac("CollapseHit", o.CollapseHit),
		frac("CollapseFraction", o.CollapseFraction),
		frac("CollapseExitMargin", o.CollapseExitMargin),
		frac("RecoverTolerance", o.RecoverTolerance),
		hold("DriftHold", o.DriftHold),
		hold("DriftFlowHold", o.DriftFlowHold),
		hold("DriftFlowWindow", o.DriftFlowWindow),
		hold("PlateauWarmup", o.PlateauWarmup),
		hold("OverloadHold", o.OverloadHold),
		frac("DriftFlowMargin", o.DriftFlowMargin),
		hold("TrappedHold", o.TrappedHold),
		hold("RecoverHold", o.RecoverHold),
		hold("MinHold", o.MinHold),
		frac("MaxFirstCallShare", o.MaxFirstCallShare),
		frac("MinHitPromptFraction", o.MinHitPromptFraction),
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	switch {
	case !(o.MinHitCalls >= 1) || math.IsInf(o.MinHitCalls, 0):
		return fmt.Errorf("MinHitCalls: %v, must be at least 1 call", o.MinHitCalls)
	case !(o.KneeRatio > 0 && o.KneeRatio <= 100) || math.IsNaN(o.KneeRatio):
		return fmt.Errorf("KneeRatio: %v outside (0, 100]", o.KneeRatio)
	case !(o.PlateauHit > 0 && o.PlateauHit <= 1):
		return fmt.Errorf("PlateauHit: %v outside (0, 1]", o.PlateauHit)
	case o.PressureExit >= o.PressureEnter:
		return fmt.Errorf("PressureExit: %v must be below PressureEnter %v", o.PressureExit, o.PressureEnter)
	case !(o.DriftNear > 0 && o.DriftNear <= 1):
		return fmt.Errorf("DriftNear: %v outside (0, 1]", o.DriftNear)
	case o.RecoverTolerance >= o.DriftDrop:
		return fmt.Errorf("RecoverTolerance: %v must be below DriftDrop %v (leaving the plateau and coming back must differ)",
			o.RecoverTolerance, o.DriftDrop)
	}
	if o.Calibration != nil {
		if err := o.Calibration.Validate(); err != nil {
			return fmt.Errorf("Calibration: %w", err)
		}
	}
	if err := o.Passive.Validate(); err != nil {
		return err
	}
	return o.Fluid.Validate()
}
