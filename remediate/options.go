package remediate

import (
	"errors"
	"fmt"
	"time"
)

// Budget controller and shedding defaults. Fractions of B_ref are fractions of the reference
// budget min(ReferenceFraction × knee·C, C).
const (
	// DefaultReferenceFraction: B_ref = min(0.9 × knee·C, C) (the Basin paper's reference budget).
	DefaultReferenceFraction = 0.9
	// DefaultStep: in normal operation B moves 5% of B_ref at a time (basin's design value: the
	// paper says "a little"; 5% of a 1.9·C knee is about one long session's context on the paper's
	// 1P3D box).
	DefaultStep = 0.05
	// DefaultStepInterval: at most one normal-mode step a minute — the collector's rate window, so
	// each step's effect on the hit rate is seen before the next.
	DefaultStepInterval = time.Minute
	// DefaultMinFraction and DefaultMaxFraction bound B to [0.5, 1.1] × B_ref in normal operation
	// (chosen: loosening past 1.1 × B_ref brings W within 0.1 of the knee, where the paper's runs
	// leave the plateau; under 0.5 the deployment idles).
	DefaultMinFraction = 0.5
	DefaultMaxFraction = 1.1
	// DefaultIncidentFraction: in an incident B drops at once to 0.7 × B_ref, so the working set
	// drains through the pressure band's exit (0.7 × knee) instead of hovering at the edge;
	// admitted sessions finish, new ones wait. Chosen, after the metastability literature's
	// "strong corrective push".
	DefaultIncidentFraction = 0.7
	// DefaultRestoreStep and DefaultRestoreInterval: after an incident B comes back 5% of B_ref
	// every 2 minutes while the hit rate holds its plateau (chosen: from 0.7 to 1.0 × B_ref takes
	// 12 minutes, about two session lifetimes in the paper's workload).
	DefaultRestoreStep     = 0.05
	DefaultRestoreInterval = 2 * time.Minute
	// DefaultPlateauTolerance: "on the plateau" means within 0.03 of it (the detector's
	// recovery tolerance); DefaultLeaveDrop: "left the plateau" means 0.05 under it (the
	// detector's drift drop). Entry and exit differ so the budget does not flap.
	DefaultPlateauTolerance = 0.03
	DefaultLeaveDrop        = 0.05
	// DefaultShedHeadWait: shed only when the head of the queue has waited 15 minutes (the Basin
	// paper).
	DefaultShedHeadWait = 15 * time.Minute
	// DefaultShedWindow is the time constant of the long-run arrival rate compared with the peak
	// completion rate (chosen: 15 minutes, longer than the paper's 10-minute spike's effect on a
	// one-minute rate, so a burst alone never sheds).
	DefaultShedWindow = 15 * time.Minute
	// DefaultShedInterval: at most one shed a minute (chosen: one session at a time, each shed's
	// effect seen in the queue before the next).
	DefaultShedInterval = time.Minute
	// DefaultReferenceWindow is the time constant with which B_ref follows a fall of the cache
	// capacity (a rise is taken at once). Chosen: decode lends and reclaims KV from one scrape to
	// the next (the lent part of the capacity moved by ±30% every 5 s on the 1P1D preset under
	// load), and a budget that followed it was re-sent every step and cut on a dip; two minutes
	// is two of the collector's rate windows, so a lasting fall (lending switched off, an
	// instance gone) is 63% followed in two minutes and 95% in six.
	DefaultReferenceWindow = 2 * time.Minute
)

// Options configure a Policy. Zero fields take the defaults; invalid values are errors naming the
// field.
type Options struct {
	// ReferenceFraction sets the reference budget B_ref = min(ReferenceFraction × knee·C, C),
	// in (0, 1].
	ReferenceFraction float64 `yaml:"reference_fraction"`
	// ReferenceWindow is the time constant with which the policy's B_ref follows a fall of the
	// cache capacity (a rise is taken at once), so KV lent and reclaimed from second to second
	// does not move the budget.
	ReferenceWindow time.Duration `yaml:"reference_window"`
	// Step is how far B moves at a time in normal operation, as a fraction of B_ref, in (0, 0.5].
	Step float64 `yaml:"step"`
	// StepInterval is the least time between two normal-mode steps.
	StepInterval time.Duration `yaml:"step_interval"`
	// MinFraction is the lowest B in normal operation, as a fraction of B_ref.
	MinFraction float64 `yaml:"min_fraction"`
	// MaxFraction is the highest B in normal operation, as a fraction of B_ref (≥ 1).
	MaxFraction float64 `yaml:"max_fraction"`
	// IncidentFraction is where B drops at once in an incident, as a fraction of B_ref (not below
	// MinFraction).
	IncidentFraction float64 `yaml:"incident_fraction"`
	// RestoreStep is how far B comes back at a time after an incident, as a fraction of B_ref.
	RestoreStep float64 `yaml:"restore_step"`
	// RestoreInterval is the least time between two restoring steps.
	RestoreInterval time.Duration `yaml:"restore_interval"`
	// PlateauTolerance: the hit rate is on its plateau when within this of it (below LeaveDrop).
	PlateauTolerance float64 `yaml:"plateau_tolerance"`
	// LeaveDrop: the hit rate has left its plateau when this far under it.
	LeaveDrop float64 `yaml:"leave_drop"`
	// DisableShedding turns the shedding rule off; the budget still holds sessions back.
	DisableShedding bool `yaml:"disable_shedding"`
	// ShedHeadWait is how long the head of the gateway's queue must have waited before a session
	// is shed (with the long-run arrival rate above the peak completion rate); the head also waits
	// two session lifetimes (live sessions ÷ peak completion rate) when that is longer, because a
	// long session that has waited 15 minutes can still finish within its deadline.
	ShedHeadWait time.Duration `yaml:"shed_head_wait"`
	// ShedWindow is the time constant of the long-run arrival rate the shedding rule compares with
	// the peak completion rate.
	ShedWindow time.Duration `yaml:"shed_window"`
	// ShedInterval is the least time between two sheds.
	ShedInterval time.Duration `yaml:"shed_interval"`
	// DisableHolds turns the hold rule off (hold.go): a trapped deployment then drains only by
	// its sessions' ends.
	DisableHolds bool `yaml:"disable_holds"`
	// HoldResumeFraction is the most held context resumed a step, as a fraction of B, in
	// (0, 1]: held sessions come back a few at a time, each paying one recompute.
	HoldResumeFraction float64 `yaml:"hold_resume_fraction"`
	// HoldAfter is how long the detector must have been trapped, in an incident with the hit rate
	// off its plateau, before the first hold (hold.go).
	HoldAfter time.Duration `yaml:"hold_after"`
}

// withDefaults fills zero fields with the defaults.
func (o Options) withDefaults() Options {
	f := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	dd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	f(&o.ReferenceFraction, DefaultReferenceFraction)
	f(&o.Step, DefaultStep)
	dd(&o.StepInterval, DefaultStepInterval)
	f(&o.MinFraction, DefaultMinFraction)
	f(&o.MaxFraction, DefaultMaxFraction)
	f(&o.IncidentFraction, DefaultIncidentFraction)
	f(&o.RestoreStep, DefaultRestoreStep)
	dd(&o.RestoreInterval, DefaultRestoreInterval)
	f(&o.PlateauTolerance, DefaultPlateauTolerance)
	f(&o.LeaveDrop, DefaultLeaveDrop)
	dd(&o.ShedHeadWait, DefaultShedHeadWait)
	dd(&o.ShedWindow, DefaultShedWindow)
	dd(&o.ReferenceWindow, DefaultReferenceWindow)
	dd(&o.ShedInterval, DefaultShedInterval)
	f(&o.HoldResumeFraction, DefaultHoldResumeFraction)
	dd(&o.HoldAfter, DefaultHoldAfter)
	return o
}

// Validate checks the options as NewPolicy will use them (zero fields stand for their defaults)
// and names the first bad field of each kind.
func (o Options) Validate() error {
	o = o.withDefaults()
	frac := func(name string, v, lo, hi float64) error {
		if !(v > lo && v <= hi) {
			return fmt.Errorf("%s: %v outside (%v, %v]", name, v, lo, hi)
		}
		return nil
	}
	pos := func(name string, v time.Duration) error {
		if v <= 0 {
			return fmt.Errorf("%s: %v, must be positive", name, v)
		}
		return nil
	}
	err := errors.Join(
		frac("reference_fraction", o.ReferenceFraction, 0, 1),
		frac("step", o.Step, 0, 0.5),
		pos("step_interval", o.StepInterval),
		frac("min_fraction", o.MinFraction, 0, 1),
		frac("max_fraction", o.MaxFraction, 0, 2),
		frac("incident_fraction", o.IncidentFraction, 0, 1),
		frac("restore_step", o.RestoreStep, 0, 0.5),
		pos("restore_interval", o.RestoreInterval),
		frac("plateau_tolerance", o.PlateauTolerance, 0, 0.5),
		frac("leave_drop", o.LeaveDrop, 0, 0.5),
		pos("shed_head_wait", o.ShedHeadWait),
		pos("shed_window", o.ShedWindow),
		pos("reference_window", o.ReferenceWindow),
		pos("shed_interval", o.ShedInterval),
		frac("hold_resume_fraction", o.HoldResumeFraction, 0, 1),
		pos("hold_after", o.HoldAfter),
	)
	if err != nil {
		return err
	}
	switch {
	case o.MaxFraction < 1:
		return fmt.Errorf("max_fraction: %v, must be ≥ 1 so B can reach B_ref", o.MaxFraction)
	case o.IncidentFraction < o.MinFraction:
		return fmt.Errorf("incident_fraction: %v below min_fraction %v", o.IncidentFraction, o.MinFraction)
	case o.PlateauTolerance >= o.LeaveDrop:
		return fmt.Errorf("plateau_tolerance: %v must be below leave_drop %v (leaving the plateau and being on it must differ)",
			o.PlateauTolerance, o.LeaveDrop)
	}
	return nil
}
