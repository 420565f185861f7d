package lender

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// Defaults of Options. The worked numbers use the paper's 1P1D H100 deployment as the simulator
// presets it (docs/simulator.md): 800K decode KV tokens, Terminal-Bench prompts of about 25K
// tokens, SWE-bench Pro peak contexts of about 107K, tools of about 6 s, an unloaded session of
// about 6.5 minutes.
const (
	// DefaultMaxFraction: at most half of a decode instance's memory is lent. From the Basin
	// paper, and the simulator's lending.max_fraction default.
	DefaultMaxFraction = 0.5
	// DefaultHeadroomFraction: a tenth of decode memory is never lent. Chosen: decode reserves a
	// call's whole KV before prefill starts, so a new call must find free memory at once, not
	// after a reclaim; 0.1 × 800K = 80K tokens holds three median Terminal-Bench prompts or most of
	// one SWE-bench Pro peak context.
	DefaultHeadroomFraction = 0.1
	// DefaultPressureOn: reservation alone reclaims only when the hottest instance is wholly
	// reserved. Chosen: the engine reclaims lent pages on demand (least recently used first), so
	// a high reservation costs decode nothing while the lent KV still serves prefixes; switching
	// lending off throws that cache away for at least MinDwell and shrinks the capacity the
	// budget's reference is computed from. What does mean on-demand reclaim is not keeping up is
	// requests waiting for decode KV (WaitingHold), which still reclaims at once. Measured on
	// the simulator's 1P1D overload preset: at 0.85 lending went off 5–8 times a run and basin
	// served 288, 211 and 307 good sessions/h (seeds 1–3); at 1.0, 311, 269 and 340.
	DefaultPressureOn = 1.0
	// DefaultPressureOff: lending may switch on again only when the hottest instance is back to
	// 0.7 reserved. Chosen: there the grant is still 0.2 of capacity (160K tokens on the 800K
	// decode, worth lending), and the band of 0.15 × capacity (120K tokens, more than one
	// SWE-bench Pro peak context) is wider than one call arriving or leaving, so a single call
	// cannot flip the switch.
	DefaultPressureOff = 0.7
	// DefaultMinDwell: 5 minutes between toggles. Chosen: lent KV pays off on the session's later
	// calls, after tool runs of seconds, over a session lifetime of about 6.5 minutes unloaded;
	// switching more often throws lent KV away before it is used, and an exec backend's switch
	// (a blue/green flip between engine configurations) costs a restart. The same length as the
	// detector's DefaultRecoverHold.
	DefaultMinDwell = 5 * time.Minute
	// DefaultWaitingHold: requests must wait for decode KV for 15 s before that alone reclaims.
	// Chosen: three samples at the daemon's 5 s step, like the detector's DefaultMinHold; a
	// request passes through the pre-allocation queue briefly even with memory to spare, and the
	// engine reclaims lent pages on demand, so only a queue that persists means lending is in the
	// way.
	DefaultWaitingHold = 15 * time.Second
)

// Options configure a Lender. Zero fields take the defaults; out-of-range or inconsistent values
// are errors naming the field. A zero HeadroomFraction means the default, not "no headroom", on
// purpose: decode always needs room for the next reservation.
type Options struct {
	// MaxFraction caps each instance's grant at MaxFraction × capacity (DefaultMaxFraction).
	MaxFraction float64
	// HeadroomFraction of each instance's capacity is kept free for decode (DefaultHeadroomFraction).
	HeadroomFraction float64
	// PressureOn is the reserved/capacity fraction of the hottest instance that reclaims
	// (DefaultPressureOn).
	PressureOn float64
	// PressureOff is the fraction it must be back to before lending switches on
	// (DefaultPressureOff); below PressureOn.
	PressureOff float64
	// MinDwell is the least time between two toggles, except a reclaim for pressure
	// (DefaultMinDwell).
	MinDwell time.Duration
	// WaitingHold is how long requests must wait for decode KV before that reclaims
	// (DefaultWaitingHold).
	WaitingHold time.Duration
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
	def(&o.MaxFraction, DefaultMaxFraction)
	def(&o.HeadroomFraction, DefaultHeadroomFraction)
	def(&o.PressureOn, DefaultPressureOn)
	def(&o.PressureOff, DefaultPressureOff)
	defD(&o.MinDwell, DefaultMinDwell)
	defD(&o.WaitingHold, DefaultWaitingHold)
	return o
}

// Validate reports every field that cannot configure a Lender, after zero fields take their
// defaults, so that a bad config fails at start rather than lending the wrong amount later.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !(o.MaxFraction > 0 && o.MaxFraction <= 1) {
		add("MaxFraction: %v outside (0, 1]", o.MaxFraction)
	}
	if !(o.HeadroomFraction > 0 && o.HeadroomFraction < 1) {
		add("HeadroomFraction: %v outside (0, 1)", o.HeadroomFraction)
	}
	if !(o.PressureOn > 0 && o.PressureOn <= 1) {
		add("PressureOn: %v outside (0, 1]", o.PressureOn)
	}
	switch {
	case !(o.PressureOff > 0 && o.PressureOff < 1):
		add("PressureOff: %v outside (0, 1)", o.PressureOff)
	case o.PressureOff >= o.PressureOn:
		add("PressureOff: %v must be below PressureOn %v, or the switch has no hysteresis and flaps", o.PressureOff, o.PressureOn)
	}
	if o.MinDwell < 0 {
		add("MinDwell: %v, must not be negative", o.MinDwell)
	}
	if o.WaitingHold < 0 {
		add("WaitingHold: %v, must not be negative", o.WaitingHold)
	}
	return errors.Join(errs...)
}

// Instance is one decode instance's memory, in KV tokens, as the collector reads it.
type Instance struct {
	// Name identifies the instance in grants and reasons ("decode-0").
	Name string
	// CapacityTokens is the instance's KV pool (SGLang's max_total_num_tokens).
	CapacityTokens float64
	// FreeTokens is memory neither reserved by calls nor lent. Do not add lent KV here (SGLang's
	// "available" counts evictable pages as available): lent KV goes in LentTokens.
	FreeTokens float64
	// ReservedTokens is KV held for calls: pre-allocated, being received, decoding.
	ReservedTokens float64
	// LentTokens is KV currently lent to the prefix cache.
	LentTokens float64
	// Waiting is how many requests wait for decode KV (SGLang's pre-allocation queue).
	Waiting int
}

// Inputs are what one decision reads.
type Inputs struct {
	// At is the decision's time; the Lender reads no clock.
	At        time.Time
	Instances []Instance
	// CacheFirst is the deployment's binding limit, from the risk rule or the detector: true when
	// the cache knee binds before decode memory.
	CacheFirst bool
	// Reason is why the caller thinks so; it is quoted in the decision's reasons.
	Reason string
}

// Grant is how many KV tokens one decode instance may hold lent.
type Grant struct {
	Instance string `json:"instance"`
	// Tokens is the ceiling of the instance's lent KV, not an increment; never negative, 0 while
	// lending is off.
	Tokens int64 `json:"tokens"`
	// Reason is the arithmetic behind Tokens.
	Reason string `json:"reason"`
}

// Decision is the lending switch and the grants at one instant.
type Decision struct {
	At      time.Time `json:"at"`
	Enabled bool      `json:"enabled"`
	// Changed is set on the decision that toggled Enabled.
	Changed bool `json:"changed"`
	// Since is when lending last toggled; zero (and absent from the JSON) before the first.
	Since time.Time `json:"since,omitzero"`
	// MaxFraction is the cap the grants were computed with; backends that switch lending globally
	// (the simulator) use it instead of per-instance grants.
	MaxFraction float64 `json:"max_fraction"`
	// Grants has one entry per input instance, in input order.
	Grants []Grant `json:"grants"`
	// Reasons explain the decision: the first is the verdict (Summary), then one line of
	// measurements per instance.
	Reasons []string `json:"reasons"`
}

// Summary is the decision's verdict in one line, for logs and the gateway's reason field.
func (d Decision) Summary() string {
	if len(d.Reasons) == 0 {
		return fmt.Sprintf("lending enabled=%t", d.Enabled)
	}
	return d.Reasons[0]
}

// Lender holds the lending switch between decisions. Its methods are safe for concurrent use, so
// a status endpoint may read State while the daemon's loop decides.
type Lender struct {
	o  Options
	mu struct {
		sync.Mutex
		enabled bool
		// since is the last toggle (or the restored one); zero means never, and the dwell is
		// then satisfied.
		since time.Time
		// waiting is set while some instance has had requests waiting for decode KV since
		// waitingSince.
		waiting      bool
		waitingSince time.Time
	}
}

// New returns a Lender with lending off, as a freshly started engine has it; Restore resumes a
// persisted state.
func New(o Options) (*Lender, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("lender options: %w", err)
	}
	return &Lender{o: o.withDefaults()}, nil
}

// Options returns the options in use, defaults filled in.
func (l *Lender) Options() Options { return l.o }

// State is the switch and when it last toggled, for the daemon to persist.
func (l *Lender) State() (enabled bool, since time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.enabled, l.mu.since
}

// Restore resumes a persisted state: the switch as it was and the time of its last toggle, so
// the dwell keeps counting across a daemon restart. The waiting timer starts again: a restart can
// delay a reclaim for waiting requests by WaitingHold, never cause one.
func (l *Lender) Restore(enabled bool, since time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.enabled, l.mu.since = enabled, since
	l.mu.waiting, l.mu.waitingSince = false, time.Time{}
}

// reading is one instance as Decide sees it.
type reading struct {
	Instance
	usable   bool
	reserved float64 // reserved / capacity
	grant    int64   // what the instance would get with lending on
	arith    string  // the grant's arithmetic
}

// Decide applies the rules to one set of readings and returns the decision, updating the switch:
// the readings are surveyed, the waiting timer moved, the rule for the switch as it stands (on:
// stayOn, off: switchOn) gives the verdict, and the grants follow it.
func (l *Lender) Decide(in Inputs) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.situationLocked(in)
	var (
		enabled bool
		verdict string
	)
	if l.mu.enabled {
		enabled, verdict = l.stayOn(s)
	} else {
		enabled, verdict = l.switchOn(s)
	}
	d := Decision{At: in.At, Enabled: enabled, Changed: enabled != l.mu.enabled, MaxFraction: l.o.MaxFraction,
		Grants: grants(s.readings, enabled)}
	if d.Changed {
		l.mu.enabled, l.mu.since = enabled, in.At
	}
	d.Since = l.mu.since
	d.Reasons = append([]string{verdict}, s.measurements...)
	return d
}

// survey is one set of readings as the rules read them.
type survey struct {
	// readings has one entry per input instance, in input order.
	readings []reading
	// hottest is the usable instance with the largest reserved fraction; waitingOn the first
	// usable one with requests waiting for decode KV. Either may be nil.
	hottest, waitingOn *reading
	// blind names the instances without a usable reading.
	blind []string
	// anyGrant: some instance has memory beyond its headroom to lend.
	anyGrant bool
	// measurements are the reasons' lines, one per instance.
	measurements []string
}

// surveyOf reads every instance (read) and finds what the rules compare: the hottest instance, the
// first one with requests waiting, those without a usable reading, and whether any has memory to
// lend.
func (l *Lender) surveyOf(insts []Instance) survey {
	s := survey{readings: make([]reading, len(insts))}
	for i, inst := range insts {
		r := l.read(inst)
		s.readings[i] = r
		if !r.usable {
			s.blind = append(s.blind, name(inst, i))
			s.measurements = append(s.measurements, fmt.Sprintf("%s: unusable reading (capacity %v, free %v, reserved %v, lent %v, waiting %d)",
				name(inst, i), inst.CapacityTokens, inst.FreeTokens, inst.ReservedTokens, inst.LentTokens, inst.Waiting))
			continue
		}
		s.measurements = append(s.measurements, fmt.Sprintf("%s: reserved %s / %s = %.2f, free %s, lent %s, %d waiting for decode KV",
			inst.Name, tok(inst.ReservedTokens), tok(inst.CapacityTokens), r.reserved, tok(inst.FreeTokens), tok(inst.LentTokens), inst.Waiting))
		if s.hottest == nil || r.reserved > s.hottest.reserved {
			s.hottest = &s.readings[i]
		}
		if inst.Waiting > 0 && s.waitingOn == nil {
			s.waitingOn = &s.readings[i]
		}
		if r.grant > 0 {
			s.anyGrant = true
		}
	}
	return s
}

// situation is everything one decision's verdict reads: the inputs, the survey of the
// instances, the waiting timer and where the switch stands against the dwell.
type situation struct {
	in Inputs
	survey
	// binding is the deployment's binding limit as the reasons quote it, with the caller's reason.
	binding string
	// waiting: some instance has had requests waiting for decode KV, without a break, for
	// waitedFor.
	waiting   bool
	waitedFor time.Duration
	// since is the switch's last toggle (zero: never) and elapsed the time from it to in.At.
	since   time.Time
	elapsed time.Duration
}

// situationLocked surveys in and moves the waiting timer; l.mu is held.
func (l *Lender) situationLocked(in Inputs) situation {
	s := situation{in: in, survey: l.surveyOf(in.Instances), binding: binding(in), since: l.mu.since, elapsed: in.At.Sub(l.mu.since)}
	s.waiting, s.waitedFor = l.trackWaitingLocked(s.survey, in.At)
	return s
}

// trackWaitingLocked moves the waiting timer: it starts when an instance first has requests
// waiting for decode KV and runs while some instance has. A step with no usable reading from an
// instance resets it, so a gap cannot make a queue look persistent. l.mu is held.
func (l *Lender) trackWaitingLocked(s survey, at time.Time) (waiting bool, waitedFor time.Duration) {
	if s.waitingOn == nil || len(s.blind) > 0 {
		l.mu.waiting = false
	} else if !l.mu.waiting {
		l.mu.waiting, l.mu.waitingSince = true, at
	}
	if l.mu.waiting {
		waitedFor = at.Sub(l.mu.waitingSince)
	}
	return l.mu.waiting, waitedFor
}

// binding is the deployment's binding limit as the verdicts quote it.
func binding(in Inputs) string {
	b := "decode-first"
	if in.CacheFirst {
		b = "cache-first"
	}
	if in.Reason != "" {
		b += " (" + in.Reason + ")"
	}
	return b
}

// dwellOK reports whether the switch may toggle: MinDwell has passed since the last toggle, or
// there was none.
func (l *Lender) dwellOK(s situation) bool { return s.since.IsZero() || s.elapsed >= l.o.MinDwell }

// dwellNote says why the switch, last switched what, is held by the dwell, and until when.
func (l *Lender) dwellNote(s situation, what string) string {
	return fmt.Sprintf("lending switched %s %v ago; it may switch at %s (min dwell %v)",
		what, s.elapsed.Round(time.Second), s.since.Add(l.o.MinDwell).Format(time.RFC3339), l.o.MinDwell)
}

// stayOn is the rule while lending is on: reclaim at once for decode pressure or requests that
// have waited WaitingHold, switch off when the deployment is decode-first (after the dwell), else
// stay on. The verdict notes what still holds the switch where it is.
func (l *Lender) stayOn(s situation) (enabled bool, verdict string) {
	o, hottest, waitingOn := l.o, s.hottest, s.waitingOn
	enabled = true
	switch {
	case hottest != nil && hottest.reserved >= o.PressureOn:
		// The reclaim bypasses the dwell: decode memory is what serves calls, and a call that
		// cannot reserve its KV waits with its whole latency, while lent KV only saves a
		// recomputation. The dwell guards against flapping, and PressureOff guards the way back.
		enabled = false
		verdict = fmt.Sprintf("lending off (reclaim): %s reserved %.2f ≥ pressure-on %.2f; immediate, not held by the dwell — decode memory serves calls, lent KV only saves recomputation",
			hottest.Name, hottest.reserved, o.PressureOn)
	case s.waiting && s.waitedFor >= o.WaitingHold:
		enabled = false
		verdict = fmt.Sprintf("lending off (reclaim): %s has had requests waiting for decode KV for %v ≥ %v (%d now); immediate, not held by the dwell — decode memory serves calls, lent KV only saves recomputation",
			waitingOn.Name, s.waitedFor.Round(time.Second), o.WaitingHold, waitingOn.Waiting)
	case !s.in.CacheFirst && l.dwellOK(s):
		enabled = false
		verdict = fmt.Sprintf("lending off: %s — decode memory binds before the cache, so lent KV would be reclaimed as load grows", s.binding)
	case !s.in.CacheFirst:
		verdict = fmt.Sprintf("lending on, held: %s, but %s", s.binding, l.dwellNote(s, "on"))
	default:
		verdict = "lending on: " + s.binding
		if hottest != nil {
			verdict += fmt.Sprintf("; hottest decode %s reserved %.2f < pressure-on %.2f", hottest.Name, hottest.reserved, o.PressureOn)
		}
	}
	if enabled && waitingOn != nil {
		verdict += fmt.Sprintf("; %s has requests waiting for decode KV (%v of %v before a reclaim), its grant is 0",
			waitingOn.Name, s.waitedFor.Round(time.Second), o.WaitingHold)
	}
	switch {
	case enabled && len(s.blind) > 0:
		verdict += fmt.Sprintf("; no usable reading from %s: grant 0, the switch holds", strings.Join(s.blind, ", "))
	case enabled && len(s.in.Instances) == 0:
		verdict += "; no decode instance reported, the switch holds"
	}
	return enabled, verdict
}

// switchOn is the rule while lending is off: switch on only for a cache-first deployment whose
// every decode instance is read, the hottest back under PressureOff, nothing waiting for decode
// KV, some memory to lend, and the dwell passed. The verdict names the first condition not met.
func (l *Lender) switchOn(s situation) (enabled bool, verdict string) {
	o, hottest := l.o, s.hottest
	switch {
	case !s.in.CacheFirst:
		return false, "lending off: " + s.binding
	case len(s.in.Instances) == 0:
		return false, "lending off: no decode instance reported, cannot confirm headroom"
	case len(s.blind) > 0:
		return false, fmt.Sprintf("lending off: no usable reading from %s, cannot confirm headroom", strings.Join(s.blind, ", "))
	case hottest.reserved > o.PressureOff:
		return false, fmt.Sprintf("lending off: %s, but hottest decode %s reserved %.2f > pressure-off %.2f",
			s.binding, hottest.Name, hottest.reserved, o.PressureOff)
	case s.waitingOn != nil:
		return false, fmt.Sprintf("lending off: %s, but %s has %d requests waiting for decode KV", s.binding, s.waitingOn.Name, s.waitingOn.Waiting)
	case !s.anyGrant:
		return false, fmt.Sprintf("lending off: %s, but no decode instance has memory beyond its headroom", s.binding)
	case !l.dwellOK(s):
		return false, fmt.Sprintf("lending off, held: %s with decode headroom, but %s", s.binding, l.dwellNote(s, "off"))
	}
	return true, fmt.Sprintf("lending on: %s; hottest decode %s reserved %.2f ≤ pressure-off %.2f, nothing waiting for decode KV",
		s.binding, hottest.Name, hottest.reserved, o.PressureOff)
}

// grants are the instances' grants under the switch as decided, one per reading in its order: an
// instance's grant while lending is on, 0 while it is off (the reason keeps what it would be),
// and 0 for an unusable reading.
func grants(rs []reading, enabled bool) []Grant {
	gs := make([]Grant, len(rs))
	for i, r := range rs {
		g := Grant{Instance: r.Name}
		switch {
		case !r.usable:
			g.Reason = name(r.Instance, i) + ": unusable reading → 0"
		case !enabled:
			g.Reason = fmt.Sprintf("%s: lending off → 0 (on: %s)", r.Name, r.arith)
		default:
			g.Tokens, g.Reason = r.grant, r.Name+": "+r.arith
		}
		gs[i] = g
	}
	return gs
}

// read checks one instance and works out its grant were lending on.
func (l *Lender) read(inst Instance) reading {
	r := reading{Instance: inst}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if inst.Name == "" || !finite(inst.CapacityTokens) || inst.CapacityTokens <= 0 ||
		!finite(inst.FreeTokens) || inst.FreeTokens < 0 || !finite(inst.ReservedTokens) || inst.ReservedTokens < 0 ||
		!finite(inst.LentTokens) || inst.LentTokens < 0 || inst.Waiting < 0 {
		return r
	}
	r.usable = true
	r.reserved = inst.ReservedTokens / inst.CapacityTokens
	if inst.Waiting > 0 {
		r.arith = fmt.Sprintf("%d requests waiting for decode KV → 0, decode needs its memory", inst.Waiting)
		return r
	}

	var b strings.Builder
	avail := inst.FreeTokens + inst.LentTokens
	fmt.Fprintf(&b, "free %s", tok(inst.FreeTokens))
	if inst.LentTokens > 0 {
		fmt.Fprintf(&b, " + lent %s", tok(inst.LentTokens))
	}
	// A reading that counts lent pages in free as well (SGLang's "available") would lend them
	// twice; memory not reserved by calls is the true bound.
	if unreserved := max(inst.CapacityTokens-inst.ReservedTokens, 0); avail > unreserved {
		fmt.Fprintf(&b, " (more than capacity %s − reserved %s; using %s)", tok(inst.CapacityTokens), tok(inst.ReservedTokens), tok(unreserved))
		avail = unreserved
	}
	headroom := l.o.HeadroomFraction * inst.CapacityTokens
	room := avail - headroom
	limit := l.o.MaxFraction * inst.CapacityTokens
	fmt.Fprintf(&b, " − headroom %s = %s", tok(headroom), tok(room))
	switch {
	case room <= 0:
		b.WriteString(" ≤ 0 → 0")
	case room < limit:
		r.grant = int64(math.Floor(room))
		fmt.Fprintf(&b, " < %v × %s = %s → %d", l.o.MaxFraction, tok(inst.CapacityTokens), tok(limit), r.grant)
	default:
		r.grant = int64(math.Floor(limit))
		fmt.Fprintf(&b, " ≥ %v × %s = %s → %d", l.o.MaxFraction, tok(inst.CapacityTokens), tok(limit), r.grant)
	}
	r.arith = b.String()
	return r
}

// name labels an instance in reasons, also when its reading has no name.
func name(inst Instance, i int) string {
	if inst.Name == "" {
		return fmt.Sprintf("instance %d (no name)", i)
	}
	return inst.Name
}

// tok prints a token count whole, as the reasons' arithmetic reads ("52000", "−5000").
func tok(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	if s == "-0" {
		return "0"
	}
	if strings.HasPrefix(s, "-") {
		return "−" + s[1:]
	}
	return s
}
