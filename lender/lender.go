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

// Decide applies the rules to one set of readings and returns the decision, updating the switch.
func (l *Lender) Decide(in Inputs) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.o

	rs := make([]reading, len(in.Instances))
	var (
		hottest     *reading // the usable instance with the largest reserved fraction
		waitingOn   *reading // the first usable instance with requests waiting
		blind       []string
		anyGrant    bool
		measurement []string
	)
	for i, inst := range in.Instances {
		r := l.read(inst)
		rs[i] = r
		if !r.usable {
			blind = append(blind, name(inst, i))
			measurement = append(measurement, fmt.Sprintf("%s: unusable reading (capacity %v, free %v, reserved %v, lent %v, waiting %d)",
				name(inst, i), inst.CapacityTokens, inst.FreeTokens, inst.ReservedTokens, inst.LentTokens, inst.Waiting))
			continue
		}
		measurement = append(measurement, fmt.Sprintf("%s: reserved %s / %s = %.2f, free %s, lent %s, %d waiting for decode KV",
			inst.Name, tok(inst.ReservedTokens), tok(inst.CapacityTokens), r.reserved, tok(inst.FreeTokens), tok(inst.LentTokens), inst.Waiting))
		if hottest == nil || r.reserved > hottest.reserved {
			hottest = &rs[i]
		}
		if inst.Waiting > 0 && waitingOn == nil {
			waitingOn = &rs[i]
		}
		if r.grant > 0 {
			anyGrant = true
		}
	}

	// The waiting timer: a blind step resets it, so a gap cannot make a queue look persistent.
	if waitingOn == nil || len(blind) > 0 {
		l.mu.waiting = false
	} else if !l.mu.waiting {
		l.mu.waiting, l.mu.waitingSince = true, in.At
	}
	waitedFor := time.Duration(0)
	if l.mu.waiting {
		waitedFor = in.At.Sub(l.mu.waitingSince)
	}

	binding := "decode-first"
	if in.CacheFirst {
		binding = "cache-first"
	}
	if in.Reason != "" {
		binding += " (" + in.Reason + ")"
	}
	elapsed := in.At.Sub(l.mu.since)
	dwellOK := l.mu.since.IsZero() || elapsed >= o.MinDwell
	dwellNote := func(what string) string {
		return fmt.Sprintf("lending switched %s %v ago; it may switch at %s (min dwell %v)",
			what, elapsed.Round(time.Second), l.mu.since.Add(o.MinDwell).Format(time.RFC3339), o.MinDwell)
	}

	enabled, verdict := l.mu.enabled, ""
	if l.mu.enabled {
		switch {
		case hottest != nil && hottest.reserved >= o.PressureOn:
			// The reclaim bypasses the dwell: decode memory is what serves calls, and a call that
			// cannot reserve its KV waits with its whole latency, while lent KV only saves a
			// recomputation. The dwell guards against flapping, and PressureOff guards the way back.
			enabled = false
			verdict = fmt.Sprintf("lending off (reclaim): %s reserved %.2f ≥ pressure-on %.2f; immediate, not held by the dwell — decode memory serves calls, lent KV only saves recomputation",
				hottest.Name, hottest.reserved, o.PressureOn)
		case l.mu.waiting && waitedFor >= o.WaitingHold:
			enabled = false
			verdict = fmt.Sprintf("lending off (reclaim): %s has had requests waiting for decode KV for %v ≥ %v (%d now); immediate, not held by the dwell — decode memory serves calls, lent KV only saves recomputation",
				waitingOn.Name, waitedFor.Round(time.Second), o.WaitingHold, waitingOn.Waiting)
		case !in.CacheFirst && dwellOK:
			enabled = false
			verdict = fmt.Sprintf("lending off: %s — decode memory binds before the cache, so lent KV would be reclaimed as load grows", binding)
		case !in.CacheFirst:
			verdict = fmt.Sprintf("lending on, held: %s, but %s", binding, dwellNote("on"))
		default:
			verdict = "lending on: " + binding
			if hottest != nil {
				verdict += fmt.Sprintf("; hottest decode %s reserved %.2f < pressure-on %.2f", hottest.Name, hottest.reserved, o.PressureOn)
			}
		}
		if enabled && waitingOn != nil {
			verdict += fmt.Sprintf("; %s has requests waiting for decode KV (%v of %v before a reclaim), its grant is 0",
				waitingOn.Name, waitedFor.Round(time.Second), o.WaitingHold)
		}
		switch {
		case enabled && len(blind) > 0:
			verdict += fmt.Sprintf("; no usable reading from %s: grant 0, the switch holds", strings.Join(blind, ", "))
		case enabled && len(in.Instances) == 0:
			verdict += "; no decode instance reported, the switch holds"
		}
	} else {
		switch {
		case !in.CacheFirst:
			verdict = "lending off: " + binding
		case len(in.Instances) == 0:
			verdict = "lending off: no decode instance reported, cannot confirm headroom"
		case len(blind) > 0:
			verdict = fmt.Sprintf("lending off: no usable reading from %s, cannot confirm headroom", strings.Join(blind, ", "))
		case hottest.reserved > o.PressureOff:
			verdict = fmt.Sprintf("lending off: %s, but hottest decode %s reserved %.2f > pressure-off %.2f",
				binding, hottest.Name, hottest.reserved, o.PressureOff)
		case waitingOn != nil:
			verdict = fmt.Sprintf("lending off: %s, but %s has %d requests waiting for decode KV", binding, waitingOn.Name, waitingOn.Waiting)
		case !anyGrant:
			verdict = fmt.Sprintf("lending off: %s, but no decode instance has memory beyond its headroom", binding)
		case !dwellOK:
			verdict = fmt.Sprintf("lending off, held: %s with decode headroom, but %s", binding, dwellNote("off"))
		default:
			enabled = true
			verdict = fmt.Sprintf("lending on: %s; hottest decode %s reserved %.2f ≤ pressure-off %.2f, nothing waiting for decode KV",
				binding, hottest.Name, hottest.reserved, o.PressureOff)
		}
	}

	d := Decision{At: in.At, Enabled: enabled, Changed: enabled != l.mu.enabled, MaxFraction: o.MaxFraction,
		Grants: make([]Grant, len(rs))}
	if d.Changed {
		l.mu.enabled, l.mu.since = enabled, in.At
	}
	d.Since = l.mu.since
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
		d.Grants[i] = g
	}
	d.Reasons = append([]string{verdict}, measurement...)
	return d
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
