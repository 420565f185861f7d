package remediate

import (
	"fmt"
	"slices"
	"time"

	"github.com/basin-dev/basin/detector"
)

// Holding admitted sessions' next calls: the lever for a deployment already trapped.
//
// A tighter budget closes the door, but a trapped deployment is held in the trap by the sessions
// already admitted: their working set is past the knee, every call recomputes, and the population
// drains only as fast as trapped calls complete — half an hour to two hours on the Basin paper's
// deployments, goodput near zero meanwhile. Holding is the one lever that acts on that population
// without cutting anyone. The gateway holds the next calls of the lowest-priority live sessions
// (their prefixes age out of the cache), so the others run on a working set under the budget:
// they hit, finish and free room, and the held sessions come back, highest priority first, into
// the room they free — each paying one recompute, which is cheap next to the recomputes of a
// trapped deployment.
//
// The rule, decided on every step from the gateway's live sessions:
//
//   - Hold, in incident mode with the detector trapped for HoldAfter (then, while sessions are
//     held, drifting, trapped or recovering) and the hit rate off its plateau on enough
//     evidence: the live sessions not held, lowest priority first, until the
//     active working set (the contexts of the sessions not held) is at or under B. B is the
//     budget the step just decided — in an incident, the incident cut — so holding and
//     admitting use one number: the active working set the cache can carry.
//   - Resume, once the hit rate is no longer off its plateau (or no reading says it is): the held
//     sessions, highest priority first, while the active working set with them stays under
//     max(B, B_ref, 0.9 × knee·C), at most HoldResumeFraction × B of context a step, so the recomputes arrive
//     a few at a time. While an incident holds B under B_ref, newcomers are admitted only up to
//     B and the band above it is the held sessions'; once B is back at B_ref, newcomers go
//     first: nothing is resumed while sessions queue for admission, because a held session
//     keeps its place (it is live, never cut) while a queued first call that waits misses its
//     deadline. A held call never waits past the gateway's hold bound
//     (admission.DefaultHoldBound), whatever this rule decides.
//   - Blind (a needed signal stale, or the gateway unread): nothing new is held; resuming goes
//     on when the gateway can be read.

// HoldAction changes the gateway's hold list.
type HoldAction struct {
	// Hold are live sessions whose next calls are to wait; Resume those to take off the list.
	Hold   []string `json:"hold_session_ids,omitempty"`
	Resume []string `json:"resume_session_ids,omitempty"`
	// Held is how many sessions the list holds after the action, Active how many live ones it
	// leaves running, and ActiveTokens and HeldTokens their contexts: the numbers an operator
	// reads ("holding 34 sessions' next calls so the other 58 fit the cache").
	Held         int   `json:"held_sessions"`
	Active       int   `json:"active_sessions"`
	HeldTokens   int64 `json:"held_tokens"`
	ActiveTokens int64 `json:"active_tokens"`
	// Text is Summary, kept in the audit record for readers that are not Go (the status page).
	Text string `json:"summary"`
	// Reasons are the hold's own, as BudgetChange.Reasons.
	Reasons []string `json:"-"`
}

// Summary is the action in an operator's words.
func (h *HoldAction) Summary() string {
	switch {
	case len(h.Hold) > 0:
		return fmt.Sprintf("holding %s next calls so the other %d fit the cache (hold %d more)",
			countOf(h.Held, "session's", "sessions'"), h.Active, len(h.Hold))
	case h.Held > 0:
		return fmt.Sprintf("resuming %s; %d still held", countOf(len(h.Resume), "held session", "held sessions"), h.Held)
	}
	if len(h.Resume) == 1 {
		return "resuming the last held session"
	}
	return fmt.Sprintf("resuming the last %d held sessions", len(h.Resume))
}

// countOf is "n things" in an operator's words: one, or many.
func countOf(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// LiveSession is one live session as the hold rule reads it.
type LiveSession struct {
	ID       string
	Admitted time.Time
	Priority time.Time
	Context  int64
	Held     bool
	// HeldCallSeconds is how long the session's held call has waited (0: none waits).
	HeldCallSeconds float64
}

// DefaultHoldResumeFraction: at most 0.1 × B of held context is resumed a step (chosen: at
// the daemon's 5-second step, B's worth comes back in under a minute, while each step's
// recomputes stay a few long sessions' prompts, which one prefill instance does in seconds).
const DefaultHoldResumeFraction = 0.1

// DefaultHoldAfter: holds begin once the detector has been trapped for 3 minutes, in an incident,
// with the hit rate still off its plateau. A held session waits minutes, and a median session's
// deadline is about 6.5 minutes from its start (4 × its unloaded time): a hold costs its session's
// goodput unless the deployment is stuck. Measured on the scenario matrix (docs/results.md), holds
// that began with the incident — on drifting, or on a first trapped reading — held about 20
// sessions in most rows at 0.5–1.2 × peak and left basin short of the best baseline on 32 rows (by
// up to 19.5%), where the incident's cut alone got the cache back within minutes. The first hold
// also needs arrivals under holdArrivalFraction × the peak completion rate.
const DefaultHoldAfter = 3 * time.Minute

// holdArrivalFraction: the first hold needs arrivals under 0.9 × the peak completion rate (see
// holds). The margin is the spare capacity that drains the active sessions and then takes the held
// ones back; at 1.0 × peak a smoothed λ crosses the line both ways on noise alone.
const holdArrivalFraction = 0.9

// holds applies the hold rule (see the top of this file) with B the budget this step decided:
// it holds more sessions (holdMore) or resumes some (resumeSome), or, in a trap that arrivals
// keep up, says why it holds nobody. The hold carries its own reason (BudgetChange.Reasons).
func (p *Policy) holds(in Inputs, plan *Plan, budget int64, blind bool) {
	o, a, g := p.o, in.Assessment, in.Gateway
	if o.DisableHolds || !in.GatewayOK || g.CountOnly || budget <= 0 || g.Sessions == nil {
		return
	}
	off := a.HitEvidence.Enough && a.HitRate < a.Plateau-o.LeaveDrop
	// The first hold waits for a trap that has lasted HoldAfter (DefaultHoldAfter says why): the
	// detector's, so a daemon that starts acting on a deployment trapped for long holds at once.
	// Once sessions are held, drifting and recovering count too: with the held sessions out of
	// the working set the detector reads, it leaves trapped as soon as the first holds land,
	// while the hit rate is still off its plateau and the active sessions' contexts keep growing.
	trouble := a.State == detector.Trapped && !in.At.Before(a.Since.Add(o.HoldAfter)) ||
		g.Held > 0 && (a.State == detector.Drifting || a.State == detector.Trapped || a.State == detector.Recovering)
	active := g.WorkingSet - g.HeldTokens
	var (
		h   *HoldAction
		why string
	)
	switch {
	case p.st.Mode == Incident && trouble && off && !blind && active > budget:
		if g.Held == 0 && !trapOutlivedArrivals(a) {
			plan.Reasons = append(plan.Reasons, fmt.Sprintf("trapped, but arrivals (λ %.2f/min, over the last hour %.2f/min) are not under %.1f × the peak completion rate %.2f/min: holding would only move the wait; no hold",
				a.Lambda*60, a.LongLambda*60, holdArrivalFraction, a.PeakCompletionRate*60))
			return
		}
		h, why = p.holdMore(in, active, budget)
	case g.Held > 0 && !off && (g.Queued == 0 || budget < g.Reference):
		h, why = p.resumeSome(in, active, budget)
	}
	if h == nil {
		return
	}
	h.Reasons = []string{why}
	plan.Hold = h
	plan.Reasons = append(plan.Reasons, why)
}

// trapOutlivedArrivals reports a trap a hold can end: one that outlived its cause, with arrivals
// (λ, the detector's smoothed rate) back under what the deployment completes at its peak, with
// room to spare. Under lasting overload a hold frees nothing — the sessions it makes room for are
// replaced as fast as they finish — and only moves the wait onto admitted sessions: measured on
// the scenario matrix (docs/results.md), holds at 1.0–1.5 × peak left basin short of the best
// baseline on 25 rows (by up to 19.5%), against 6 rows (1.9%) without them. The late-acting
// presets run at 0.61 × peak once the spike is over.
//
// Both the detector's λ and its hour-long rate must be under the line: λ alone, over ten minutes
// of a workload of long sessions (under one a minute), dips that far on Poisson noise at 1.2 ×
// peak; the long-run rate alone stays up for an hour after a spike.
func trapOutlivedArrivals(a detector.Assessment) bool {
	lambda := max(a.Lambda, a.LongLambda)
	return a.PeakCompletionRate > 0 && lambda <= holdArrivalFraction*a.PeakCompletionRate
}

// holdMore holds the live sessions not held, lowest priority first, until the active working set
// (active, the contexts of the sessions not held) is at or under budget; nil when there is no one
// to hold. Only the population that was live when the incident began is held: the sessions
// admitted since came in under the incident's cut, once the population had drained under it, and
// holding them would only move the wait onto the sessions that can still finish in time.
func (p *Policy) holdMore(in Inputs, active, budget int64) (*HoldAction, string) {
	a, g := in.Assessment, in.Gateway
	cands := make([]LiveSession, 0, len(g.Sessions))
	for _, s := range g.Sessions {
		if !s.Held && s.Admitted.Before(p.st.ModeSince) {
			cands = append(cands, s)
		}
	}
	// Lowest priority first: the latest arrivals with the largest predicted peaks, the sessions
	// furthest from finishing; the ones that stay run towards their ends.
	slices.SortFunc(cands, func(x, y LiveSession) int { return y.Priority.Compare(x.Priority) })
	h := &HoldAction{}
	held, from := g.Held, active
	for _, s := range cands {
		if active <= budget {
			break
		}
		h.Hold = append(h.Hold, s.ID)
		active -= s.Context
		held++
	}
	if len(h.Hold) == 0 {
		return nil, ""
	}
	h.settle(g, held, active)
	return h, fmt.Sprintf("detector %s, hit rate %.2f off its plateau %.2f: %s: active working set %s → %s, at or under B %s",
		a.State, a.HitRate, a.Plateau, h.Summary(), FormatTokens(from), FormatTokens(active), FormatTokens(budget))
}

// resumeSome resumes held sessions, highest priority first, while the active working set with
// them stays under the room for resumes, at most HoldResumeFraction × budget of context a step (so
// the recomputes arrive a few at a time); nil when none fits.
//
// The room is measured against what the gateway admits newcomers to at once (its reference
// budget, B_ref, at least B). While an incident holds B under B_ref, newcomers are admitted only
// up to B, so the band from B to B_ref is the held sessions' whatever queues; once B is back at
// B_ref, a resume would take room from a queued newcomer, who goes first (holds does not call
// this then).
func (p *Policy) resumeSome(in Inputs, active, budget int64) (*HoldAction, string) {
	a, g := in.Assessment, in.Gateway
	room := max(budget, g.Reference, int64(p.o.ReferenceFraction*a.KneeTokens))
	var heldS []LiveSession
	for _, s := range g.Sessions {
		if s.Held {
			heldS = append(heldS, s)
		}
	}
	slices.SortFunc(heldS, func(x, y LiveSession) int { return x.Priority.Compare(y.Priority) })
	quota := part(p.o.HoldResumeFraction, budget)
	h := &HoldAction{}
	held := g.Held
	var back int64
	for _, s := range heldS {
		if active+s.Context > room || back+s.Context > quota && len(h.Resume) > 0 {
			break
		}
		h.Resume = append(h.Resume, s.ID)
		active += s.Context
		back += s.Context
		held--
	}
	if len(h.Resume) == 0 {
		return nil, ""
	}
	h.settle(g, held, active)
	why := "hit rate on its plateau"
	if !a.HitEvidence.Enough {
		why = "no hit-rate reading off the plateau"
	}
	if g.Queued == 0 {
		why += ", nobody queued"
	} else {
		why += fmt.Sprintf(", newcomers admitted up to B %s", FormatTokens(budget))
	}
	return h, fmt.Sprintf("%s: %s, highest priority first (%s of context back, active working set %s, at most %s)",
		why, h.Summary(), FormatTokens(back), FormatTokens(active), FormatTokens(room))
}

// settle fills in the numbers an operator reads after the action: held sessions and the active
// working set once it is applied to gateway g, and the summary kept for readers that are not Go.
func (h *HoldAction) settle(g Gateway, held int, active int64) {
	h.Held, h.Active = held, len(g.Sessions)-held
	h.HeldTokens, h.ActiveTokens = g.WorkingSet-active, active
	h.Text = h.Summary()
}
