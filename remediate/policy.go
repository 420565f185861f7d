package remediate

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/adminapi"
)

// Mode is the budget controller's mode.
type Mode string

// Modes.
const (
	// Normal: B moves in small steps around B_ref.
	Normal Mode = "normal"
	// Incident: the detector says drifting or trapped, or a configured alert fires: B is cut and
	// held so the working set drains.
	Incident Mode = "incident"
	// Restoring: the incident is over; B comes back to B_ref step by step while the hit rate holds.
	Restoring Mode = "restoring"
)

// Gateway is what the policy reads of the admission gateway.
type Gateway struct {
	// Budget and Reference are the gateway's current B and reference budget, tokens.
	Budget, Reference int64
	// Reserved is the tokens admitted sessions hold against B; WorkingSet their current contexts.
	Reserved, WorkingSet int64
	Live, Queued         int
	// CountOnly: the gateway admits every session and only counts, no budget set yet
	// (admission.count_only); Budget is then 0 and means nothing.
	CountOnly bool
	// HeadWait is how long the longest-waiting queued session has waited.
	HeadWait time.Duration
	// ShedCandidates are queued session IDs, lowest priority first.
	ShedCandidates []string
	// Held is how many live sessions the gateway holds (their next calls wait), HeldTokens
	// their contexts, part of WorkingSet.
	Held       int
	HeldTokens int64
	// Sessions are the live sessions, for the hold rule; nil when the gateway's state was read
	// without them (the rule then does nothing).
	Sessions []LiveSession
}

// Inputs are one decision's readings.
type Inputs struct {
	At         time.Time
	Assessment detector.Assessment
	// GatewayOK is false when the gateway's state could not be read this step: the policy is then
	// blind and acts on nothing but an incident.
	GatewayOK bool
	Gateway   Gateway
	// Alerts are the firing alerts that put the policy in incident mode (from the webhook).
	Alerts []string
	// ArrivalRate is the windowed session arrival rate (sessions/s); ArrivalOK false when stale.
	ArrivalRate float64
	ArrivalOK   bool
	// DryRun says the plans are not acted on: the gateway's budget is then not expected to follow
	// the policy's target.
	DryRun bool
}

// BudgetChange sets the gateway's budget and reference budget.
type BudgetChange struct {
	From int64 `json:"from_tokens"`
	// FromCountOnly: the gateway had no budget, it only counted (From is then 0).
	FromCountOnly bool  `json:"from_count_only,omitempty"`
	To            int64 `json:"to_tokens"`
	Reference     int64 `json:"reference_tokens"`
	// Reasons are this change's own (the plan's carry every action's); the executor records
	// and sends them with the change.
	Reasons []string `json:"-"`
}

// ShedAction drops queued sessions by ID.
type ShedAction struct {
	IDs []string `json:"session_ids"`
	// Reasons are the shedding's own, as BudgetChange.Reasons.
	Reasons []string `json:"-"`
}

// Plan is one decision: what to change and why, with numbers. An empty plan changes nothing.
type Plan struct {
	// Seq numbers plans in the order the policy made them; it survives restarts.
	Seq    uint64         `json:"seq"`
	At     time.Time      `json:"at"`
	State  detector.State `json:"state"`
	Mode   Mode           `json:"mode"`
	Budget *BudgetChange  `json:"budget,omitempty"`
	Shed   *ShedAction    `json:"shed,omitempty"`
	// Hold changes the gateway's hold list (hold.go).
	Hold *HoldAction `json:"hold,omitempty"`
	// Lending is set by the lender (Lend), not by Decide.
	Lending *LendingPlan `json:"lending,omitempty"`
	// Scale is set by the scaling policy (Scale), not by Decide.
	Scale   *ScalePlan `json:"scale,omitempty"`
	Reasons []string   `json:"reasons"`
}

// Empty reports a plan with nothing to do.
func (p Plan) Empty() bool {
	return p.Budget == nil && p.Shed == nil && p.Hold == nil && p.Lending == nil && p.Scale == nil
}

// PolicyState is what a restarted daemon needs to resume the policy where it stopped.
type PolicyState struct {
	Mode Mode `json:"mode"`
	// Target is the budget the policy last decided (the gateway's, unless in dry run).
	Target int64 `json:"target_tokens"`
	// Reference is the B_ref in use: the one last sent with a budget change, which the policy's
	// decisions keep using until B_ref as computed from HeldCapacity moves by more than one Step.
	// The daemon's status and basin_reference_budget_tokens show this, not a B_ref recomputed
	// from the latest reading.
	Reference  int64     `json:"reference_tokens"`
	ModeSince  time.Time `json:"mode_since"`
	LastChange time.Time `json:"last_change"`
	LastShed   time.Time `json:"last_shed"`
	// ArrivalEWMA is the long-run arrival rate, sessions/s, as of ArrivalAt.
	ArrivalEWMA float64   `json:"arrival_ewma_per_s"`
	ArrivalAt   time.Time `json:"arrival_at"`
	// HeldCapacity is the cache capacity B_ref is computed from, tokens, as of CapacityAt: rises
	// taken at once, falls followed over Options.ReferenceWindow.
	HeldCapacity float64   `json:"held_capacity_tokens,omitempty"`
	CapacityAt   time.Time `json:"capacity_at,omitzero"`
	Seq          uint64    `json:"seq"`
}

// Policy is basin's remediation policy: the budget controller and the shedding rule. The
// simulator's harness and the daemon run this same code; it reads no clock (Inputs.At is now).
// Not safe for concurrent use: one loop owns it.
type Policy struct {
	o  Options
	st PolicyState
	// restoredSeq is the last plan the restored state knew of: Replay applies what came after.
	restoredSeq uint64
}

// NewPolicy validates the options.
func NewPolicy(o Options) (*Policy, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("remediate options: %w", err)
	}
	o = o.withDefaults()
	return &Policy{o: o, st: PolicyState{Mode: Normal}}, nil
}

// Options returns the options in use, defaults filled.
func (p *Policy) Options() Options { return p.o }

// State returns the policy's state for persistence.
func (p *Policy) State() PolicyState { return p.st }

// Restore resumes a persisted state.
func (p *Policy) Restore(s PolicyState) error {
	switch s.Mode {
	case Normal, Incident, Restoring:
	default:
		return fmt.Errorf("restore policy: unknown mode %q", s.Mode)
	}
	if s.Target < 0 {
		return fmt.Errorf("restore policy: target_tokens %d < 0", s.Target)
	}
	p.st, p.restoredSeq = s, s.Seq
	return nil
}

// Replay applies executed actions the persisted state may not include (the daemon stopped
// between recording an action and saving its state, or reconciliation finished one), so the
// policy does not decide them again. It may be called again as the log grows: it applies, in log
// order, every action done after the restored state's last plan.
func (p *Policy) Replay(recs []Record) {
	base := p.restoredSeq
	for _, r := range recs {
		// Every recorded plan's number is used, done or not: a new plan never reuses one.
		p.st.Seq = max(p.st.Seq, r.Seq)
		if r.Phase != PhaseDone || r.Seq <= base {
			continue
		}
		switch {
		case r.Budget != nil:
			p.st.Target = r.Budget.To
			p.st.LastChange = r.At
		case r.Shed != nil:
			p.st.LastShed = r.At
		}
	}
}

// referenceFor is min(ReferenceFraction × knee × c, c), whole tokens.
func (p *Policy) referenceFor(knee, c float64) int64 {
	return int64(math.Round(min(p.o.ReferenceFraction*knee*c, c)))
}

// reference is B_ref from the cache capacity as the policy holds it: a rise is taken at once and a
// fall followed over ReferenceWindow (exponentially). The capacity counts the KV decode lends
// now; decode reclaims lent pages for a call and lends them again when the call ends, so a dip
// lasts about a call, and a budget that followed each reading was re-sent every step and cut on
// every dip. A lasting fall (lending switched off, an instance gone) is 63% followed in one window
// and 95% in three. Measured on the 1P1D overload preset (seeds 1–3), basin served 345, 303 and
// 364 good sessions/h this way; 311, 269 and 340 with a plain two-minute mean, which holds B_ref
// a quarter under the cache decode gives back between calls.
func (p *Policy) reference(a detector.Assessment, now time.Time) int64 {
	if a.Knee.Ratio <= 0 || a.KneeTokens <= 0 {
		return 0
	}
	c := a.KneeTokens / a.Knee.Ratio
	switch dt := now.Sub(p.st.CapacityAt); {
	case p.st.CapacityAt.IsZero() || c >= p.st.HeldCapacity:
		p.st.HeldCapacity = c
	case dt > 0:
		p.st.HeldCapacity += (1 - math.Exp(-dt.Seconds()/p.o.ReferenceWindow.Seconds())) * (c - p.st.HeldCapacity)
	}
	p.st.CapacityAt = now
	return p.referenceFor(a.Knee.Ratio, p.st.HeldCapacity)
}

// Decide makes one decision. It never loosens while blind (a needed signal stale or missing, or
// the gateway unread), cuts at once on an incident, and otherwise moves at most one step per
// interval. The steps run in this order because each reads what the ones before it left: the
// budget rules read the B_ref in use and the budget to start from, the budget change the target
// they give, and the hold rule the budget this decision sets.
func (p *Policy) Decide(in Inputs) Plan {
	plan := Plan{At: in.At, State: in.Assessment.State}
	p.trackArrivals(in)
	ref := p.referenceInUse(in.Assessment, in.At)
	if ref <= 0 {
		return p.undecided(plan, "no capacity or knee yet: the budget is left as it is")
	}
	takeover, ok := p.startTarget(in, ref, &plan)
	if !ok {
		return p.undecided(plan, "the gateway's budget is not known yet: nothing decided")
	}
	v := p.viewOf(in, ref, p.st.Target)
	target := p.nextTarget(v, &plan)
	plan.Mode = p.st.Mode
	p.budgetChange(v, target, takeover, &plan)
	p.shed(in, &plan)
	p.holds(in, &plan, p.st.Target, v.blind)
	return p.finish(plan)
}

// trackArrivals folds the windowed arrival rate into the long-run rate the shedding rule compares
// with the peak completion rate: an exponential average over ShedWindow, so a burst alone never
// sheds. A stale or impossible reading is left out rather than read as no arrivals; the first
// reading starts the average.
func (p *Policy) trackArrivals(in Inputs) {
	if !in.ArrivalOK || in.ArrivalRate < 0 || math.IsInf(in.ArrivalRate, 0) {
		return
	}
	if p.st.ArrivalAt.IsZero() {
		p.st.ArrivalEWMA = in.ArrivalRate
	} else if dt := in.At.Sub(p.st.ArrivalAt); dt > 0 {
		w := 1 - math.Exp(-dt.Seconds()/p.o.ShedWindow.Seconds())
		p.st.ArrivalEWMA += w * (in.ArrivalRate - p.st.ArrivalEWMA)
	}
	p.st.ArrivalAt = in.At
}

// referenceInUse is the B_ref this decision works from (0: no capacity or knee yet). B_ref as
// held drifts a little on every step (the held capacity decays towards each reading); a drift of
// less than one Step is no reason to move anything derived from it — the incident cut, the
// bounds, the level B returns to — or every step would re-send the budget by a fraction of a
// percent (an audit record each). The B_ref in use stays the one last sent until it has moved by
// more than one Step.
func (p *Policy) referenceInUse(a detector.Assessment, now time.Time) int64 {
	ref := p.reference(a, now)
	if ref > 0 && p.st.Reference > 0 && !p.meaningful(p.st.Reference, ref, ref) {
		return p.st.Reference
	}
	return ref
}

// undecided ends a decision that cannot be made, saying why: the plan changes nothing and keeps
// the mode.
func (p *Policy) undecided(plan Plan, why string) Plan {
	plan.Mode = p.st.Mode
	plan.Reasons = append(plan.Reasons, why)
	return p.finish(plan)
}

// startTarget gives the policy a budget to start from when it has none (its first decision, or a
// restored state without one), and says whether it could. It starts from the gateway's budget;
// from the top of the normal range when the gateway only counts, as from an out-of-reach budget
// (takeover: this decision's budget change takes admission over); from B_ref in a dry run, which
// does not need the gateway's budget to say what it would do. Acting for real without the
// gateway's budget, there is nothing to start from.
func (p *Policy) startTarget(in Inputs, ref int64, plan *Plan) (takeover, ok bool) {
	if p.st.Target != 0 {
		return false, true
	}
	switch {
	case in.GatewayOK && in.Gateway.CountOnly:
		p.st.Target = part(p.o.MaxFraction, ref)
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("the gateway only counts (admission.count_only): basin takes admission over from %.2f × B_ref %s",
			p.o.MaxFraction, FormatTokens(ref)))
		return true, true
	case in.GatewayOK:
		p.st.Target = in.Gateway.Budget
	case in.DryRun:
		p.st.Target = ref
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("dry run without the gateway's budget: deciding from B_ref %s", FormatTokens(ref)))
	default:
		return false, false
	}
	return false, true
}

// view is one decision's reading of its inputs, worked out once so that every budget rule reads
// the same answer to the same question: blind or not, on the plateau or off it, an incident or
// not.
type view struct {
	Inputs
	// ref is the B_ref in use; cur the budget the policy last decided, where any change starts.
	ref, cur int64
	// blind: a needed signal stale or missing, or the gateway unread. B is then never loosened.
	blind bool
	// onPlateau and left say where the hit rate stands; both are false on too little evidence (a
	// quiet window, a burst of first calls), which is no reading (detector.Evidence): it neither
	// loosens nor tightens the budget.
	onPlateau, left bool
	// unseenTrouble: drifting or trapped, but from a detector that cannot see (see viewOf).
	// incident: trouble seen on a fresh reading, or a configured alert firing.
	unseenTrouble, incident bool
}

// onPlateau reports whether the assessment's hit rate is a reading within tol of its plateau:
// the budget rules' view and the sizing's lent KV (NeedInputsFrom) read it the same way.
func onPlateau(a detector.Assessment, tol float64) bool {
	return a.HitEvidence.Enough && a.HitRate >= a.Plateau-tol
}

// viewOf reads in for the budget rules, with ref the B_ref in use and cur the budget to start
// from.
func (p *Policy) viewOf(in Inputs, ref, cur int64) view {
	o, a := p.o, in.Assessment
	reading := a.HitEvidence.Enough
	trouble := a.State == detector.Drifting || a.State == detector.Trapped
	// A blind detector holds its last state: a drifting or trapped it can no longer see is not
	// evidence of an incident, and cutting on it would throttle a deployment basin cannot see (all
	// targets down, or restarted into a resumed state before a fresh reading). An incident already
	// under way is held (B is never loosened while blind); a new one needs a fresh reading or a
	// firing alert.
	unseen := trouble && (len(a.Blind) > 0 || a.ObservedAt.IsZero())
	return view{
		Inputs: in, ref: ref, cur: cur,
		blind:         len(a.Blind) > 0 || !in.GatewayOK || a.ObservedAt.IsZero(),
		onPlateau:     onPlateau(a, o.PlateauTolerance),
		left:          reading && a.HitRate < a.Plateau-o.LeaveDrop,
		unseenTrouble: unseen,
		incident:      trouble && !unseen || len(in.Alerts) > 0,
	}
}

// shed applies the shedding rule: the long-run arrival rate above the peak completion rate and the
// head of the queue waiting ShedHeadWait, or two session lifetimes if that is longer — capacity is
// truly short and waiting will not help — drops the lowest-priority queued session, at most once
// per ShedInterval.
//
// The session lifetime L is Little's law on the admitted sessions: live ÷ peak completion rate
// (the deployment completes at about its peak whenever shedding is considered, arrivals being
// above it). A shed session is a certain failure; a queued one fails only if its wait w and its
// run together pass its deadline — the paper's goodput: 4 × its unloaded time U. With L = s·U at a
// slowdown s, it is still good while w ≤ (4 − s)/s · L: two lifetimes at s = 1.33, one at s = 2.
// Waiting is only a possible failure, so the rule sheds past the longer of the two. On short
// sessions this changes nothing (Terminal-Bench on 1P1D: ≈ 40 live ÷ 5.4/min ≈ 7.4 minutes, two
// lifetimes under the 15 minutes); on long ones it does (SWE-bench Pro on 1P1D: ≈ 18 live ÷
// 0.7/min ≈ 26 minutes): with a fixed 15 minutes basin shed 8–10 sessions of the hour that
// Continuum, which never sheds, served within their deadline.
//
// It reads the gateway and the arrival rate only, both checked here, so a blind detector does not
// stop it.
func (p *Policy) shed(in Inputs, plan *Plan) {
	o, a := p.o, in.Assessment
	peak := a.PeakCompletionRate
	switch {
	case o.DisableShedding || !in.GatewayOK || len(in.Gateway.ShedCandidates) == 0:
		return
	case in.Gateway.HeadWait < o.ShedHeadWait:
		return
	case peak <= 0 || p.st.ArrivalAt.IsZero() || !in.ArrivalOK:
		plan.Reasons = append(plan.Reasons, fmt.Sprintf("head of the queue waited %s but the peak completion rate or the arrival rate is unknown: no shedding",
			in.Gateway.HeadWait.Round(time.Second)))
		return
	case p.st.ArrivalEWMA <= peak:
		return
	case in.Gateway.HeadWait < shedLifetimes*sessionLifetime(in.Gateway.Live, peak):
		return
	case in.At.Sub(p.st.LastShed) < o.ShedInterval:
		return
	}
	wait := max(o.ShedHeadWait, shedLifetimes*sessionLifetime(in.Gateway.Live, peak))
	id := in.Gateway.ShedCandidates[0]
	why := fmt.Sprintf("long-run arrivals %.2f/min > peak completion rate %.2f/min and the head of the queue waited %s ≥ %s (the longer of shed_head_wait and two session lifetimes, %d live ÷ the peak): shed the lowest-priority queued session %s",
		p.st.ArrivalEWMA*60, peak*60, in.Gateway.HeadWait.Round(time.Second), wait.Round(time.Second), in.Gateway.Live, id)
	plan.Shed = &ShedAction{IDs: []string{id}, Reasons: []string{why}}
	plan.Reasons = append(plan.Reasons, why)
	p.st.LastShed = in.At
}

// sessionLifetime is Little's law: live sessions ÷ completion rate (sessions/s), the mean time a
// session spends admitted.
func sessionLifetime(live int, rate float64) time.Duration {
	if live <= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(float64(live) / rate * float64(time.Second))
}

func (p *Policy) finish(plan Plan) Plan {
	if !plan.Empty() {
		p.st.Seq++
		plan.Seq = p.st.Seq
	}
	plan.Reasons = slices.Clip(plan.Reasons)
	return plan
}

func blindWhy(a detector.Assessment, in Inputs) string {
	var parts []string
	parts = append(parts, a.Blind...)
	if !in.GatewayOK {
		parts = append(parts, "gateway state unread")
	}
	if a.ObservedAt.IsZero() && len(parts) == 0 {
		parts = append(parts, "no complete observation yet")
	}
	return fmt.Sprint(parts)
}

// meaningful is the policy's one rule for a change worth making to a quantity derived from B_ref:
// from and to differ by more than Step × ref. It is the normal-mode step, the smallest move the
// policy makes on purpose; anything smaller is the held capacity's drift, not a decision.
func (p *Policy) meaningful(from, to, ref int64) bool {
	return math.Abs(float64(to-from)) > p.o.Step*float64(ref)
}

// part is f × ref in whole tokens.
func part(f float64, ref int64) int64 { return int64(math.Round(f * float64(ref))) }

// FormatTokens formats tokens for reasons and logs: 1.20M, 850K, 950, and 1.00T for the
// out-of-reach budget of a gateway that only counts (never "1000000.00M"). The suffixes are the
// status page's axis units (K, M, G, T).
func FormatTokens(v int64) string {
	f := float64(v)
	switch {
	case math.Abs(f) >= 1e12:
		return fmt.Sprintf("%.2fT", f/1e12)
	case math.Abs(f) >= 1e9:
		return fmt.Sprintf("%.2fG", f/1e9)
	case math.Abs(f) >= 1e6:
		return fmt.Sprintf("%.2fM", f/1e6)
	case math.Abs(f) >= 1e4:
		return fmt.Sprintf("%.0fK", f/1e3)
	}
	return fmt.Sprintf("%d", v)
}

// GatewayFrom reads the admission state (what the gateway's GET /admin/state returns, or the
// simulator's core through the same contract, Admission) as the policy's view. Waits are the
// core's own measurements, on the core's clock: the deployment's, as the policy's holds are (a
// gateway in front of a simulated deployment served at a speed is given the deployment's clock
// too).
func GatewayFrom(s adminapi.StateView) Gateway {
	// The listing may be only the queue's tail (GET /admin/state?queue_tail=N): the count and
	// the oldest wait come from their own fields when the gateway reports them.
	g := Gateway{Budget: s.Budget, Reference: s.ReferenceBudget, Reserved: s.Reserved, WorkingSet: s.WorkingSet,
		Live: s.Live, Queued: max(s.Queued, len(s.Queue)), CountOnly: s.CountOnly, Held: s.Held, HeldTokens: s.HeldTokens}
	if s.Sessions != nil {
		// Dormant sessions are listed but are outside W and the live count: not candidates for a
		// hold (there is nothing of theirs in the cache to make room from).
		g.Sessions = make([]LiveSession, 0, len(s.Sessions))
		for _, l := range s.Sessions {
			if l.Dormant {
				continue
			}
			g.Sessions = append(g.Sessions, LiveSession{ID: l.ID, Admitted: l.Admitted, Priority: l.Priority, Context: l.Context,
				Held: l.Held, HeldCallSeconds: l.HeldCallSeconds})
		}
	}
	wait := s.OldestWaitSeconds
	for i := len(s.Queue) - 1; i >= 0; i-- { // listed best first
		q := s.Queue[i]
		g.ShedCandidates = append(g.ShedCandidates, q.ID)
		wait = max(wait, q.WaitedSeconds)
	}
	g.HeadWait = time.Duration(wait * float64(time.Second))
	return g
}

// shedLifetimes is how many session lifetimes the head of the queue waits before it may be shed
// (see shed: the wait a session can afford at the smallest slowdown admitted sessions run at).
const shedLifetimes = 2
