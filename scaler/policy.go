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
	// DefaultDownCoolDown: no scale-in within 10 minutes of a scale-out of that role. Chosen: a
	// removed instance takes its cache with it and a new one starts cold, so flapping costs
	// recomputes twice; ten minutes is the Basin paper's spike and longer than a session's life.
	// A scale-in after a scale-in is not flapping and does not wait for it.
	DefaultDownCoolDown = 10 * time.Minute
	// DefaultScaleInBelow: scale in only to a size where the live working set is at most 0.8 of
	// the knee (and the reserved decode KV 0.8 of the KV decode may use), and under the knee with
	// the sizing's planned spike on top (Policy.inSize). Chosen: the share the sizing keeps the
	// steady population under (DefaultKneeShare), so that a scale-in goes only to a size the
	// sizing would not grow again.
	DefaultScaleInBelow = DefaultKneeShare
	// DefaultScaleInHold: a scale-in goes to the largest size any step of the last 15 minutes
	// found enough (the HPA's scale-down stabilisation window), and not before the policy has
	// watched 15 minutes. Chosen: longer than the ten-minute spikes the sizing plans for and than
	// a session's lifetime (about 6.5 minutes unloaded), so a lull between bursts does not shrink
	// the pool.
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
	// ChangedAt is when Asked last changed, ScaledOutAt when it last grew.
	ChangedAt   time.Time `json:"changed_at,omitzero"`
	ScaledOutAt time.Time `json:"scaled_out_at,omitzero"`
	// WatchedSince is when the policy began sizing this role without a gap (zero: not yet);
	// Sized holds the sizes each step found enough, as a sliding-window maximum over the last
	// ScaleInHold: the oldest entry is the largest size any step since its time asked for, each
	// later one smaller and newer.
	WatchedSince time.Time `json:"watched_since,omitzero"`
	Sized        []SizeAt  `json:"sized,omitempty"`
}

// SizeAt is one step's size found enough for a role.
type SizeAt struct {
	At   time.Time `json:"at"`
	Size int       `json:"size"`
}

// maxSizingGap is the longest gap between two sized steps that still counts as watching: a
// daemon that could not size (a missing reading, a restart) for longer has not seen the need it
// would scale in under, and watches a whole hold again. A minute: twelve of the daemon's 5-s steps.
const maxSizingGap = time.Minute

// record adds this step's size to the sliding window and drops what has left it (or all of it
// after a gap), returning the largest size in the window.
func (st *RoleState) record(at time.Time, size int, hold time.Duration) int {
	if n := len(st.Sized); st.WatchedSince.IsZero() || n > 0 && at.Sub(st.Sized[n-1].At) > maxSizingGap {
		st.WatchedSince, st.Sized = at, nil
	}
	for len(st.Sized) > 0 && st.Sized[len(st.Sized)-1].Size <= size {
		st.Sized = st.Sized[:len(st.Sized)-1]
	}
	st.Sized = append(st.Sized, SizeAt{At: at, Size: size})
	for at.Sub(st.Sized[0].At) > hold {
		st.Sized = st.Sized[1:]
	}
	return st.Sized[0].Size
}

// Policy decides how many instances of each role to ask for: all the arrivals need at once when it
// rises (after UpCoolDown); back down to the largest size found enough over the last ScaleInHold,
// each step's size being what the arrivals taken high need and what keeps the live sessions well
// under the limits with the planned spike on top (after DownCoolDown from a scale-out); between
// Floor and Ceiling. The daemon and the simulator's harness run this same code; it reads no clock.
// Safe for concurrent use.
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
	// A scale-in sizes the steady population on the arrivals taken high (NeedInputs.ArrivalsHigh),
	// as a scale-out sizes it on them taken low: out when the arrivals surely need it, in when
	// they surely do not. Sized as a scale-out both ways, 1P3D at 1.5 × its peak gave back a warm
	// prefill instance 1.6 minutes into a +100% spike, its λ still reading the rate before it,
	// asked for two cold ones a minute later, and lost sessions waiting for them.
	high := sizing
	high.ArrivalsHigh = true
	needHigh, err := Size(high, p.o.Need)
	if err != nil {
		return Decision{Reasons: []string{"no scaling: " + err.Error()}}
	}
	d := Decision{Need: need, Sized: true, Reasons: slices.Clone(need.Reasons)}
	// Decode is decided first: a prefill scale-in counts the cache decode lends, which a decode
	// scale-in in the same step shrinks (inSize). Changes and reasons keep Roles' order.
	changes, whys := map[Role]*Change{}, map[Role]string{}
	for _, r := range []Role{RoleDecode, RolePrefill} {
		if slices.Contains(p.o.Roles, r) {
			changes[r], whys[r] = p.decideRole(r, in, need, needHigh)
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
func (p *Policy) decideRole(r Role, in Inputs, need, needHigh Need) (*Change, string) {
	st := p.st[r]
	st.Sized = slices.Clone(st.Sized) // the state State returned keeps its own
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
	// Scale in only to a size where what runs now sits well under the limits, and only to the
	// largest such size of the last ScaleInHold: the HPA's scale-down stabilisation window,
	// against a need that dips between bursts.
	live := p.inSize(r, in, need)
	high := min(ceiling, max(floor, needHigh.ForNewArrivals(r)))
	enough := max(want, high, live)
	most := st.record(in.At, enough, p.o.ScaleInHold)
	watched := in.At.Sub(st.WatchedSince)
	var ch *Change
	why := fmt.Sprintf("%s: need %d, asked %d (floor %d, ceiling %d)", r, need.ForNewArrivals(r), st.Asked, floor, ceiling)
	switch {
	case want > st.Asked:
		if since := in.At.Sub(st.ChangedAt); !st.ChangedAt.IsZero() && since < p.o.UpCoolDown {
			why += fmt.Sprintf("; scale-out to %d waits for the cool-down (%s of %s)", want, since.Round(time.Second), p.o.UpCoolDown)
			break
		}
		ch = &Change{Role: r, From: st.Asked, To: want}
		why += fmt.Sprintf("; scaling out %d → %d", st.Asked, want)
		if need.ForNewArrivals(r) > ceiling {
			why += fmt.Sprintf(" (the ceiling; %d would be needed)", need.ForNewArrivals(r))
		}
	case want < st.Asked && live >= st.Asked:
		why += fmt.Sprintf("; no scale-in: the live sessions need %d at %.0f%% of the limit, or with the planned spike", live, 100*p.o.ScaleInBelow)
	case want < st.Asked && high >= st.Asked:
		why += fmt.Sprintf("; no scale-in: the arrivals, taken %g standard errors high, need %d", ArrivalsConfidence, high)
	case want < st.Asked && most >= st.Asked:
		why += fmt.Sprintf("; no scale-in: %d was needed within the last %s", most, p.o.ScaleInHold)
	case want < st.Asked && watched < p.o.ScaleInHold:
		why += fmt.Sprintf("; %d would do, watched for %s of the %s a scale-in needs", most, watched.Round(time.Second), p.o.ScaleInHold)
	case want < st.Asked && !st.ScaledOutAt.IsZero() && in.At.Sub(st.ScaledOutAt) < p.o.DownCoolDown:
		why += fmt.Sprintf("; scale-in to %d waits for the cool-down after the scale-out (%s of %s)", most,
			in.At.Sub(st.ScaledOutAt).Round(time.Second), p.o.DownCoolDown)
	case want < st.Asked:
		ch = &Change{Role: r, From: st.Asked, To: most}
		why += fmt.Sprintf("; scaling in %d → %d: %d has been enough for %s", st.Asked, most, most, p.o.ScaleInHold)
	default:
		why += "; no change"
	}
	if ch != nil {
		st.Asked, st.ChangedAt = ch.To, in.At
		if ch.To > ch.From {
			st.ScaledOutAt = in.At
		}
	}
	p.st[r] = st
	return ch, why
}

// inSize is the fewest instances of role r that hold what runs now as the sizing would size it:
// the live working set under ScaleInBelow of the knee and, with the sizing's planned spike on top
// (need.SpikeSessions at the mean context), under the knee itself (prefill); the reserved decode
// KV under ScaleInBelow of the KV decode may use and, with the spike's calls, under all of it
// (decode). A scale-in to that size is one the sizing would not grow again: scaling in only to
// half the knee, whatever the sizing planned for, kept 1P3D back at 1.2 × its peak after a spike
// on the two prefill instances the spike had brought for the rest of the run — its steady working
// set sat at half of one instance's knee, a size it served as provisioned.
//
// Where the arrivals are not sized yet the spike is the population doubled.
//
// The prefill instances' knee counts the cache decode lends, as the sizing counts it: what decode
// still spares once the live calls (and the spike's) reserve their KV, and nothing while the hit
// rate reads under its plateau. The lent KV stays when a prefill instance goes. Without it, 1P1D
// back at 1.2 × its peak after a spike (879K of working set, 632K of cache lent by its two decode
// instances) read as needing 3 prefill instances where the sizing asked for 1.
func (p *Policy) inSize(r Role, in Inputs, need Need) int {
	s := p.o.ScaleInBelow
	decodePer := p.o.Need.decodePer(in.DecodeKV)
	spike := need.SpikeSessions
	if !need.ForArrivals {
		spike = in.LiveSessions
	}
	spikeWS := spike * need.MeanContext
	spikeKV := spikeWS * need.ServedFraction
	if r == RoleDecode {
		return max(1, ceilPos(in.DecodeReserved/(s*decodePer)), ceilPos((in.DecodeReserved+spikeKV)/decodePer))
	}
	// The decode instances asked for, where fewer than serve: they are going, and their KV with them.
	n := in.NeedInputs
	if a := p.st[RoleDecode].Asked; a > 0 && a < n.Decode {
		n.Decode = a
	}
	steady := n.prefillFor(in.WorkingSet/s, n.spareLent(in.DecodeReserved, decodePer))
	spiked := n.prefillFor(in.WorkingSet+spikeWS, n.spareLent(in.DecodeReserved+spikeKV, decodePer))
	return max(1, steady, spiked)
}
