package scaler

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Policy defaults.
const (
	// DefaultUpCoolDown: a role is scaled out at most once a minute. Chosen: the need is an
	// absolute count computed from the arrivals, not a step, so a scale-out asks for all it needs
	// at once; the cool-down only keeps a reading's noise from asking twice in two 5-s steps.
	DefaultUpCoolDown = time.Minute
	// DefaultDownCoolDown: no scale-in within 10 minutes of any change of that role. Chosen: a
	// removed instance takes its cache with it and a new one starts cold, so flapping costs
	// recomputes twice; ten minutes is the Basin paper's spike and longer than a session's life.
	DefaultDownCoolDown = 10 * time.Minute
	// DefaultScaleInBelow: scale in only to a size where the live working set is at most half the
	// knee (and the reserved decode KV half the remaining decode KV). Chosen: "well under the knee"
	// — after the removal the deployment still absorbs a +100% population spike before the knee.
	DefaultScaleInBelow = 0.5
	// DefaultScaleInHold: the smaller size must be enough for 15 minutes running before scaling
	// in. Chosen: longer than the ten-minute spikes the sizing plans for and than a session's
	// lifetime (about 6.5 minutes unloaded), so a lull between bursts does not shrink the pool.
	DefaultScaleInHold = 15 * time.Minute
)

// Options configure a Policy. Zero fields take the defaults; Ceiling is required for each scaled
// role: basin never asks for more GPUs than the operator set aside.
type Options struct {
	Need NeedOptions
	// Roles are the roles scaled (those the backend has a target for).
	Roles []Role
	// Floor and Ceiling bound each role's instances (Floor default 1).
	Floor, Ceiling map[Role]int
	UpCoolDown     time.Duration
	DownCoolDown   time.Duration
	ScaleInBelow   float64
	ScaleInHold    time.Duration
}

func (o Options) withDefaults() Options {
	if o.UpCoolDown == 0 {
		o.UpCoolDown = DefaultUpCoolDown
	}
	if o.DownCoolDown == 0 {
		o.DownCoolDown = DefaultDownCoolDown
	}
	if o.ScaleInBelow == 0 {
		o.ScaleInBelow = DefaultScaleInBelow
	}
	if o.ScaleInHold == 0 {
		o.ScaleInHold = DefaultScaleInHold
	}
	o.Floor = maps.Clone(o.Floor)
	if o.Floor == nil {
		o.Floor = map[Role]int{}
	}
	for _, r := range o.Roles {
		if o.Floor[r] == 0 {
			o.Floor[r] = 1
		}
	}
	o.Need = o.Need.withDefaults()
	return o
}

// Validate reports every problem at once, each by its YAML key.
func (o Options) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := o.Need.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(o.Roles) == 0 {
		add("roles: none scaled; give the backend a target for prefill, decode or both")
	}
	seen := map[Role]bool{}
	for _, r := range o.Roles {
		switch {
		case r != RolePrefill && r != RoleDecode:
			add("roles: unknown role %q, want %s or %s", r, RolePrefill, RoleDecode)
		case seen[r]:
			add("roles: %s named twice", r)
		}
		seen[r] = true
		floor, ceiling := o.Floor[r], o.Ceiling[r]
		switch {
		case floor < 0:
			add("floor.%s: %d, must be ≥ 1 (0 takes 1)", r, floor)
		case ceiling < 1:
			add("ceiling.%s: required, the most instances basin may ask for", r)
		case floor > ceiling:
			add("floor.%s: %d above ceiling.%s %d", r, floor, r, ceiling)
		}
	}
	for _, m := range []struct {
		key    string
		values map[Role]int
	}{{"floor", o.Floor}, {"ceiling", o.Ceiling}} {
		for _, r := range slices.Sorted(maps.Keys(m.values)) {
			if !slices.Contains(o.Roles, r) && m.values[r] != 0 {
				add("%s.%s: set for a role that is not scaled", m.key, r)
			}
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"up_cool_down", o.UpCoolDown}, {"down_cool_down", o.DownCoolDown}, {"scale_in_hold", o.ScaleInHold}} {
		if d.v < 0 {
			add("%s: %v, must not be negative", d.key, d.v)
		}
	}
	if !(o.ScaleInBelow >= 0 && o.ScaleInBelow <= 1) {
		add("scale_in_below: %v, must be in (0, 1]", o.ScaleInBelow)
	}
	return errors.Join(errs...)
}

// Inputs are one step's readings.
type Inputs struct {
	At time.Time
	NeedInputs
}

// Change asks for a role's instances.
type Change struct {
	Role Role `json:"role"`
	From int  `json:"from"`
	To   int  `json:"to"`
}

// Decision is one step's sizing and what it changes.
type Decision struct {
	// Need is the sizing (Sized false when it could not be computed: nothing changes).
	Need  Need
	Sized bool
	// Changes are the roles whose instances change, in Roles order.
	Changes []Change
	Reasons []string
}

// Changed reports a decision that asks for instances.
func (d Decision) Changed() bool { return len(d.Changes) > 0 }

// RoleState is what the policy keeps of one role across steps (and restarts).
type RoleState struct {
	// Asked is the instances last asked for (0: none yet, the serving count is taken).
	Asked int `json:"asked"`
	// ChangedAt is when Asked last changed.
	ChangedAt time.Time `json:"changed_at,omitzero"`
	// SmallerSince is when a smaller size first became enough, continuously (zero: it is not);
	// SmallerMost is the largest of those smaller sizes since then, where a scale-in goes.
	SmallerSince time.Time `json:"smaller_since,omitzero"`
	SmallerMost  int       `json:"smaller_most,omitempty"`
}

// Policy decides how many instances of each role to ask for: all the arrivals need at once when it
// rises (after UpCoolDown), back down only when a smaller size has kept the working set well under the
// knee for ScaleInHold (after DownCoolDown), between Floor and Ceiling. The daemon and the
// simulator's harness run this same code; it reads no clock. Safe for concurrent use.
type Policy struct {
	o  Options
	mu sync.Mutex
	st map[Role]RoleState
}

// New checks the options.
func New(o Options) (*Policy, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("scaling: %w", err)
	}
	return &Policy{o: o, st: map[Role]RoleState{}}, nil
}

// Options returns the options in use, defaults filled.
func (p *Policy) Options() Options { return p.o }

// State returns each role's state, for the daemon's state file.
func (p *Policy) State() map[Role]RoleState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.st)
}

// Restore sets the state a restarted daemon saved.
func (p *Policy) Restore(st map[Role]RoleState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st = maps.Clone(st)
	if p.st == nil {
		p.st = map[Role]RoleState{}
	}
}

// Decide sizes the deployment and says which roles to scale.
func (p *Policy) Decide(in Inputs) Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	sizing := in.NeedInputs
	if slices.Contains(p.o.Roles, RoleDecode) {
		sizing.DecodeKept = p.o.Floor[RoleDecode] // the decode instances above it may go
	}
	need, err := Size(sizing, p.o.Need)
	if err != nil {
		return Decision{Reasons: []string{"no scaling: " + err.Error()}}
	}
	d := Decision{Need: need, Sized: true, Reasons: slices.Clone(need.Reasons)}
	// Decode is decided first: a prefill scale-in counts the cache decode lends, which a decode
	// scale-in in the same step shrinks (inSize). Changes and reasons keep Roles' order.
	changes, whys := map[Role]*Change{}, map[Role]string{}
	for _, r := range []Role{RoleDecode, RolePrefill} {
		if slices.Contains(p.o.Roles, r) {
			changes[r], whys[r] = p.decideRole(r, in, need)
		}
	}
	for _, r := range p.o.Roles {
		d.Reasons = append(d.Reasons, whys[r])
		if c := changes[r]; c != nil {
			d.Changes = append(d.Changes, *c)
		}
	}
	return d
}

// decideRole is one role's step.
func (p *Policy) decideRole(r Role, in Inputs, need Need) (*Change, string) {
	st := p.st[r]
	serving := in.Prefill
	if r == RoleDecode {
		serving = in.Decode
	}
	if st.Asked == 0 {
		if serving < 1 {
			return nil, fmt.Sprintf("%s: no instance read yet, nothing asked", r)
		}
		st.Asked = serving
	}
	floor, ceiling := p.o.Floor[r], p.o.Ceiling[r]
	want := min(ceiling, max(floor, need.ForNewArrivals(r)))
	since := in.At.Sub(st.ChangedAt)
	var ch *Change
	why := fmt.Sprintf("%s: need %d, asked %d (floor %d, ceiling %d)", r, need.ForNewArrivals(r), st.Asked, floor, ceiling)
	switch {
	case want > st.Asked:
		st.SmallerSince, st.SmallerMost = time.Time{}, 0
		if !st.ChangedAt.IsZero() && since < p.o.UpCoolDown {
			why += fmt.Sprintf("; scale-out to %d waits for the cool-down (%s of %s)", want, since.Round(time.Second), p.o.UpCoolDown)
			break
		}
		ch = &Change{Role: r, From: st.Asked, To: want}
		why += fmt.Sprintf("; scaling out %d → %d", st.Asked, want)
		if need.ForNewArrivals(r) > ceiling {
			why += fmt.Sprintf(" (the ceiling; %d would be needed)", need.ForNewArrivals(r))
		}
	case want < st.Asked:
		// Scale in only to a size where what runs now sits well under the limits.
		in2 := p.inSize(r, in)
		target := max(want, in2)
		if target >= st.Asked {
			st.SmallerSince, st.SmallerMost = time.Time{}, 0
			why += fmt.Sprintf("; no scale-in: the live sessions need %d at %.0f%% of the limit", in2, 100*p.o.ScaleInBelow)
			break
		}
		if st.SmallerSince.IsZero() {
			st.SmallerSince, st.SmallerMost = in.At, 0
		}
		// A scale-in goes to the largest size needed over the hold, not this step's: the HPA's
		// scale-down stabilisation, against a need that dips between bursts.
		st.SmallerMost = max(st.SmallerMost, target)
		target = st.SmallerMost
		held := in.At.Sub(st.SmallerSince)
		switch {
		case held < p.o.ScaleInHold:
			why += fmt.Sprintf("; %d would do for %s of the %s a scale-in needs", target, held.Round(time.Second), p.o.ScaleInHold)
		case !st.ChangedAt.IsZero() && since < p.o.DownCoolDown:
			why += fmt.Sprintf("; scale-in to %d waits for the cool-down (%s of %s)", target, since.Round(time.Second), p.o.DownCoolDown)
		default:
			ch = &Change{Role: r, From: st.Asked, To: target}
			why += fmt.Sprintf("; scaling in %d → %d: %d has been enough for %s", st.Asked, target, target, held.Round(time.Second))
		}
	default:
		st.SmallerSince, st.SmallerMost = time.Time{}, 0
		why += "; no change"
	}
	if ch != nil {
		st.Asked, st.ChangedAt, st.SmallerSince, st.SmallerMost = ch.To, in.At, time.Time{}, 0
	}
	p.st[r] = st
	return ch, why
}

// inSize is the fewest instances of role r that keep what runs now under ScaleInBelow of the
// limit: the working set under that share of the knee (prefill), the reserved KV under that share
// of the KV (decode).
//
// The prefill instances' knee counts the cache decode lends, as the sizing counts it for a spike:
// what decode still spares with the population grown to the margin kept (the reserved KV over
// ScaleInBelow), and nothing while the hit rate reads under its plateau. The lent KV stays when a
// prefill instance goes. Without it, 1P1D back at 1.2 × its peak after a spike (879K of working
// set, 632K of cache lent by its two decode instances) read as needing 3 prefill instances at
// half the knee where the sizing asked for 1, and both deployments kept the instances a spike had
// brought for the rest of the run.
func (p *Policy) inSize(r Role, in Inputs) int {
	s := p.o.ScaleInBelow
	if r == RoleDecode {
		return max(1, ceilPos(in.DecodeReserved/(s*in.DecodeKV)))
	}
	// The decode instances asked for, where fewer than serve: they are going, and their KV with them.
	n := in.NeedInputs
	if a := p.st[RoleDecode].Asked; a > 0 && a < n.Decode {
		n.Decode = a
	}
	lent := n.spareLent(in.DecodeReserved/s, (1-p.o.Need.DecodeHeadroom)*in.DecodeKV)
	return max(1, ceilPos((in.WorkingSet/s-in.KneeRatio*lent)/(in.KneeRatio*in.PrefillCache)))
}
