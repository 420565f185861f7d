package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Stream is one arrival process: Poisson arrivals at RatePerMin between From and To (To zero:
// until the end), drawing sessions from Workload. KillAt, when set, aborts the stream's sessions
// that are still live at that time.
type Stream struct {
	Class      string
	Workload   Workload
	RatePerMin float64
	From, To   time.Duration
	KillAt     time.Duration
	// Thin lists intervals in which arrivals are kept only with a probability (rate dips).
	Thin []Thinning
}

// Thinning keeps an arrival in [From, To) with probability Keep.
type Thinning struct {
	From, To time.Duration
	Keep     float64
}

// Options configure one simulation run.
type Options struct {
	Seed       uint64
	Deployment Deployment
	Policy     Policy
	Continuum  ContinuumParams
	SLO        SLO
	// Duration is when arrivals stop. The run then drains until every session that arrived in
	// the measurement window has finished or missed its deadline.
	Duration time.Duration
	// MeasureFrom and MeasureTo bound the window whose arrivals count for goodput.
	MeasureFrom, MeasureTo time.Duration
	Streams                []Stream
	// ClosedLoop, when > 0, replaces the streams: ClosedLoop sessions of ClosedWorkload are live
	// at all times, a new one starting as soon as one ends (for completion curves).
	ClosedLoop     int
	ClosedWorkload Workload
	// Gate, when set, decides when arriving sessions start.
	Gate Gate
	// PriorityQueues orders the decode pre-allocation and prefill queues by the gate's Priority
	// instead of arrival order.
	PriorityQueues bool
	Controller     *Controller
	// NoDrain stops at Duration even if measured sessions are still running.
	NoDrain bool
	// External allows a run with no arrival streams: calls come through Submit (sim serve).
	External bool
	// Forget keeps memory flat in open-ended runs (sim serve): finished sessions are dropped and
	// only the last hour of the timeline is kept. Goodput and Result then cover nothing useful.
	Forget bool
	// Progress, when set, is called with the fraction of the run done.
	Progress func(done float64)
	// OnResult, when set, is called with the result at the end of Run: observers attached by a
	// harness (basin's detector) add what they saw.
	OnResult func(*Result)
}

func (o *Options) validate() error {
	var errs []error
	if err := o.Deployment.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.SLO.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParsePolicy(string(o.Policy)); err != nil {
		errs = append(errs, fmt.Errorf("policy: %w", err))
	}
	if o.Duration <= 0 {
		errs = append(errs, fmt.Errorf("duration: must be > 0, got %v", o.Duration))
	}
	if o.MeasureFrom < 0 || o.MeasureTo <= o.MeasureFrom || o.MeasureTo > o.Duration {
		errs = append(errs, fmt.Errorf("measure: need 0 ≤ from < to ≤ duration, got from %v to %v (duration %v)",
			o.MeasureFrom, o.MeasureTo, o.Duration))
	}
	if o.ClosedLoop > 0 {
		if o.ClosedWorkload == nil {
			errs = append(errs, errors.New("closed loop: workload missing"))
		}
	} else if len(o.Streams) == 0 && !o.External {
		errs = append(errs, errors.New("arrivals: no arrival stream"))
	}
	for i, s := range o.Streams {
		if s.Workload == nil {
			errs = append(errs, fmt.Errorf("stream %d (%s): workload missing", i, s.Class))
		}
		if !(s.RatePerMin >= 0) || math.IsInf(s.RatePerMin, 0) {
			errs = append(errs, fmt.Errorf("stream %d (%s): rate_per_min must be ≥ 0, got %v", i, s.Class, s.RatePerMin))
		}
	}
	if o.Controller != nil && o.Controller.Every <= 0 {
		errs = append(errs, errors.New("controller: every must be > 0"))
	}
	if o.Policy == PolicyContinuum {
		c := o.Continuum
		if !(c.TTLQuantile > 0 && c.TTLQuantile <= 1) || c.TTLMax < c.TTLMin || c.Window <= 0 {
			errs = append(errs, fmt.Errorf("continuum parameters out of range: %+v", c))
		}
	}
	return errors.Join(errs...)
}
