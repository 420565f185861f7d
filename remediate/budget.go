package remediate

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The budget controller's rules, one per mode, as Decide runs them: nextTarget picks the rule
// of the mode the policy is in (or enters), the rule gives the budget this decision moves to, and
// budgetChange says what of it, if anything, is sent to the gateway.

// nextTarget is the budget this decision moves to, from the rule of the mode the policy is in or
// enters; the mode changes are made here (setMode), each with its reason.
func (p *Policy) nextTarget(v view, plan *Plan) int64 {
	a := v.Assessment
	switch {
	case v.unseenTrouble && !v.incident:
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("detector %s, but blind (%s): no action on a state basin cannot see, B held at %s",
			a.State, blindWhy(a, v.Inputs), FormatTokens(v.cur)))
		return v.cur
	case v.incident:
		return p.incidentTarget(v, plan)
	case p.st.Mode == Incident && v.GatewayOK && v.Gateway.Held > 0:
		// The sessions still running are out of the trap, but the held ones are its backlog:
		// the incident lasts until they are all back, and B stays at its cut, so newcomers are
		// admitted up to it and the room above it is the held sessions' (hold.go).
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("detector %s, but %s still held: the incident lasts until every one is resumed, B held at %s",
			a.State, countOf(v.Gateway.Held, "session", "sessions"), FormatTokens(v.cur)))
		return v.cur
	case p.st.Mode == Incident:
		p.setMode(plan, Restoring, fmt.Sprintf("detector %s, no alert firing", a.State), v.At)
		return p.restoringTarget(v, plan)
	case p.st.Mode == Restoring:
		return p.restoringTarget(v, plan)
	}
	return p.normalTarget(v, plan)
}

// setMode moves the policy to mode m at now and says why in the plan's reasons, so every mode
// change is explained where it happens; staying in m says nothing.
func (p *Policy) setMode(plan *Plan, m Mode, why string, now time.Time) {
	if p.st.Mode != m {
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("mode %s → %s: %s", p.st.Mode, m, why))
		p.st.Mode, p.st.ModeSince = m, now
	}
}

// incidentTarget is the incident rule: enter incident mode and cut B at once to
// IncidentFraction × B_ref, so the working set drains while admitted sessions finish. A B
// already at or under the cut stays.
func (p *Policy) incidentTarget(v view, plan *Plan) int64 {
	o, a := p.o, v.Assessment
	why := fmt.Sprintf("detector %s", a.State)
	if len(v.Alerts) > 0 {
		why = fmt.Sprintf("alerts firing: %v (detector %s)", v.Alerts, a.State)
	}
	p.setMode(plan, Incident, why, v.At)
	cut := part(o.IncidentFraction, v.ref)
	if v.cur <= cut {
		return v.cur
	}
	plan.Reasons = append(plan.Reasons, fmt.Sprintf("incident: cut B %s → %s (%.2f × B_ref %s) so the working set drains; admitted sessions finish",
		FormatTokens(v.cur), FormatTokens(cut), o.IncidentFraction, FormatTokens(v.ref)))
	return cut
}

// restoringTarget is the restoring rule: B comes back to B_ref RestoreStep at a time, one
// RestoreInterval apart, while the hit rate holds its plateau, and the policy is back in normal
// mode once B is at B_ref. Off the plateau again it tightens instead; blind, it holds.
func (p *Policy) restoringTarget(v view, plan *Plan) int64 {
	o, a, cur, ref := p.o, v.Assessment, v.cur, v.ref
	sinceChange := v.At.Sub(p.st.LastChange)
	switch {
	case v.blind:
		plan.Reasons = append(plan.Reasons, "restoring, but blind ("+blindWhy(a, v.Inputs)+"): B held")
	case v.left && sinceChange < o.StepInterval:
		// Off the plateau again: tighten, but one step an interval as in normal mode, so a
		// hit rate that needs a window to answer is not read as a reason to cut every tick.
	case v.left:
		target := min(cur, max(part(o.MinFraction, ref), cur-part(o.RestoreStep, ref)))
		if target < cur {
			plan.Reasons = append(plan.Reasons, fmt.Sprintf("restoring: hit rate %.2f < plateau %.2f − %.2f: B %s → %s",
				a.HitRate, a.Plateau, o.LeaveDrop, FormatTokens(cur), FormatTokens(target)))
		}
		return target
	case cur >= ref:
		p.setMode(plan, Normal, fmt.Sprintf("B %s back at B_ref %s", FormatTokens(cur), FormatTokens(ref)), v.At)
	case v.onPlateau && sinceChange >= o.RestoreInterval:
		target := min(ref, cur+part(o.RestoreStep, ref))
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("restoring: hit rate %.2f on plateau %.2f: B %s → %s (B_ref %s)",
			a.HitRate, a.Plateau, FormatTokens(cur), FormatTokens(target), FormatTokens(ref)))
		if target >= ref {
			p.setMode(plan, Normal, "B back at B_ref", v.At)
		}
		return target
	}
	return cur
}

// normalTarget is the normal-mode rule (normalRule) less its negligible moves: B within half a
// step of where the rule sends it counts as there. The rest of a step after B_ref moved (B
// 816.06K → 816.00K), or a loosening clipped at the bound, is an audit record and a gateway call
// that change no admission decision worth the name, so the move and its reasons are dropped.
func (p *Policy) normalTarget(v view, plan *Plan) int64 {
	n := len(plan.Reasons)
	target := p.normalRule(v, plan)
	if negligible(v.cur, target, part(p.o.Step, v.ref)) {
		plan.Reasons = plan.Reasons[:n]
		return v.cur
	}
	return target
}

// negligible reports a move from cur to target of less than half a step (and not none).
func negligible(cur, target, step int64) bool {
	return target != cur && 2*math.Abs(float64(target-cur)) < float64(step)
}

// normalRule moves B in normal mode: back inside [MinFraction, MaxFraction] × B_ref, down a step
// when the hit rate leaves its plateau, up a step while sessions queue on the plateau, and a
// step at a time towards B_ref otherwise — at most one step a StepInterval (the bound above
// excepted), and never up while blind.
func (p *Policy) normalRule(v view, plan *Plan) int64 {
	o, a, cur, ref, g := p.o, v.Assessment, v.cur, v.ref, v.Gateway
	step := part(o.Step, ref)
	lo, hi := part(o.MinFraction, ref), part(o.MaxFraction, ref)
	switch {
	case cur > hi:
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("B %s above %.2f × B_ref %s: B → %s", FormatTokens(cur), o.MaxFraction, FormatTokens(ref), FormatTokens(hi)))
		return hi
	case v.At.Sub(p.st.LastChange) < o.StepInterval:
	case v.left:
		target := min(cur, max(lo, cur-step)) // never up while off the plateau
		if target < cur {
			plan.Reasons = append(plan.Reasons, fmt.Sprintf("hit rate %.2f left its plateau %.2f (− %.2f): tighten B %s → %s",
				a.HitRate, a.Plateau, o.LeaveDrop, FormatTokens(cur), FormatTokens(target)))
		}
		return target
	case v.blind:
		if cur < lo || v.GatewayOK && g.Queued > 0 {
			plan.Reasons = append(plan.Reasons, "blind ("+blindWhy(a, v.Inputs)+"): never loosen, B held at "+FormatTokens(cur))
		}
	case cur < lo:
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("B %s below %.2f × B_ref %s: B → %s", FormatTokens(cur), o.MinFraction, FormatTokens(ref), FormatTokens(lo)))
		return lo
	case g.Queued > 0 && v.onPlateau:
		target := min(hi, cur+step)
		if target > cur {
			plan.Reasons = append(plan.Reasons, fmt.Sprintf("%s queued and hit rate %.2f on its plateau %.2f: loosen B %s → %s (max %s)",
				countOf(g.Queued, "session", "sessions"), a.HitRate, a.Plateau, FormatTokens(cur), FormatTokens(target), FormatTokens(hi)))
		}
		return target
	case gateIdle(v, step) && (cur > ref || cur < ref && v.onPlateau):
		// B only re-centres on B_ref below; while the gateway admits every arrival by the
		// reference test it does not read B, and following B_ref there was a change a minute
		// on rows where the gate held nobody. Once the gate engages the rules below move B a
		// step an interval.
	case g.Queued == 0 && cur > ref:
		target := max(ref, cur-step)
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("nobody queued: B %s back towards B_ref %s → %s", FormatTokens(cur), FormatTokens(ref), FormatTokens(target)))
		return target
	case cur < ref && v.onPlateau:
		target := min(ref, cur+step)
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("hit rate %.2f on its plateau %.2f: B %s up towards B_ref %s → %s",
			a.HitRate, a.Plateau, FormatTokens(cur), FormatTokens(ref), FormatTokens(target)))
		return target
	}
	return cur
}

// gateIdle reports a gateway that admits every arrival by the reference test, not by B: nobody
// queued and the working set a step under its B_ref (the policy's, while the gateway reports
// none). Re-centring B on B_ref then changes no admission, only adds audit records.
func gateIdle(v view, step int64) bool {
	g := v.Gateway
	gwRef := g.Reference
	if gwRef <= 0 {
		gwRef = v.ref
	}
	return v.GatewayOK && !g.CountOnly && g.Queued == 0 && g.WorkingSet+step < gwRef
}

// budgetChange is what this decision sends the gateway, with everything decided so far as its
// reasons: the move to target, or, with B where it is, the budget set again where the gateway
// does not have it (it only counts, or its budget is not the one basin set) or B_ref moved by
// more than one Step (referenceInUse). The policy's state records what was sent.
func (p *Policy) budgetChange(v view, target int64, takeover bool, plan *Plan) {
	cur, ref, g := v.cur, v.ref, v.Gateway
	switch {
	case target != cur:
		// The change is from what the gateway has, when basin acts and can read it: the policy's
		// own target may not be the gateway's (it restarted, someone changed it by hand).
		from, countOnly := cur, false
		switch {
		case v.GatewayOK && g.CountOnly && (!v.DryRun || takeover):
			from, countOnly = 0, true
		case !v.DryRun && v.GatewayOK && g.Budget != cur:
			from = g.Budget
			plan.Reasons = append(plan.Reasons, fmt.Sprintf("the gateway's budget is %s, not the %s basin last set",
				FormatTokens(from), FormatTokens(cur)))
		}
		plan.Budget = &BudgetChange{From: from, FromCountOnly: countOnly, To: target, Reference: ref}
		p.st.Target, p.st.LastChange, p.st.Reference = target, v.At, ref
	case !v.DryRun && v.GatewayOK && g.CountOnly:
		plan.Budget = &BudgetChange{FromCountOnly: true, To: cur, Reference: ref}
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("the gateway only counts (admission.count_only: no budget yet, or it restarted without one): set B %s",
			FormatTokens(cur)))
		p.st.LastChange, p.st.Reference = v.At, ref
	case !v.DryRun && v.GatewayOK && g.Budget != cur:
		plan.Budget = &BudgetChange{From: g.Budget, To: cur, Reference: ref}
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("the gateway's budget %s is not the %s basin last set "+
			"(the gateway restarted with its configured budget, or someone changed it; pause basin to hold a budget by hand): set %s",
			FormatTokens(g.Budget), FormatTokens(cur), FormatTokens(cur)))
		p.st.Reference = ref
	case v.GatewayOK && cur > 0 && ref != p.st.Reference: // moved by more than one Step
		a := v.Assessment
		plan.Budget = &BudgetChange{From: cur, To: cur, Reference: ref}
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("B_ref %s → %s (min(%.2f × knee %.2f × C, C) with C %s)",
			FormatTokens(p.st.Reference), FormatTokens(ref), p.o.ReferenceFraction, a.Knee.Ratio, FormatTokens(int64(a.KneeTokens/a.Knee.Ratio))))
		p.st.Reference = ref
	default:
		return
	}
	plan.Budget.Reasons = slices.Clone(plan.Reasons)
}
