package remediate

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/basin-dev/basin/detector"
)

// The budget controller's rules (budget.go), each on its own. B_ref is 1M throughout, so with the
// default options a step is 50K, the normal range [500K, 1.1M] and the incident cut 700K.

const testRef = 1_000_000

// ruleCase is one run of a budget rule: the policy's state and the view it decides on, and what
// it must leave.
type ruleCase struct {
	name string
	mode Mode
	// sinceChange is how long ago the policy last changed B.
	sinceChange time.Duration
	in          Inputs
	cur         int64
	want        int64
	wantMode    Mode
	// wantReasons are the prefixes of the reasons the rule adds, in order.
	wantReasons []string
}

// healthy is a fresh reading on an engaged gateway holding B at budget with queued sessions.
func healthy(hit float64, budget int64, queued int) Inputs {
	return Inputs{At: t0, Assessment: assess(t0, detector.Healthy, hit), GatewayOK: true, Gateway: gw(budget, queued)}
}

// as is in with f applied.
func as(in Inputs, f func(*Inputs)) Inputs {
	f(&in)
	return in
}

// run runs rule on the case, from a policy in tc.mode (normal if unset) since an hour.
func (tc ruleCase) run(t *testing.T, rule func(*Policy, view, *Plan) int64) {
	t.Run(tc.name, func(t *testing.T) {
		mode := tc.mode
		if mode == "" {
			mode = Normal
		}
		wantMode := tc.wantMode
		if wantMode == "" {
			wantMode = mode
		}
		p := newPolicy(t, Options{})
		p.st.Mode, p.st.ModeSince = mode, t0.Add(-time.Hour)
		p.st.LastChange = tc.in.At.Add(-tc.sinceChange)
		var plan Plan
		got := rule(p, p.viewOf(tc.in, testRef, tc.cur), &plan)
		assert.Equal(t, tc.want, got, "target: %q", plan.Reasons)
		assert.Equal(t, wantMode, p.st.Mode, "mode")
		if wantMode != mode {
			assert.Equal(t, tc.in.At, p.st.ModeSince, "a mode change is dated")
		}
		if assert.Len(t, plan.Reasons, len(tc.wantReasons), "%q", plan.Reasons) {
			for i, w := range tc.wantReasons {
				assert.True(t, strings.HasPrefix(plan.Reasons[i], w), "reason %d: %q, want %q…", i, plan.Reasons[i], w)
			}
		}
	})
}

func TestNextTarget(t *testing.T) {
	blindTrapped := as(healthy(0.5, 1_000_000, 0), func(in *Inputs) {
		in.Assessment.State, in.Assessment.Blind = detector.Trapped, []string{"hit_rate"}
	})
	held := as(healthy(0.95, 700_000, 0), func(in *Inputs) { in.Gateway.Held = 3 })
	for _, tc := range []ruleCase{
		{name: "trouble the detector cannot see: B held, no incident", in: blindTrapped, cur: 1_000_000, want: 1_000_000,
			wantReasons: []string{"detector trapped, but blind ([hit_rate]): no action on a state basin cannot see, B held at 1.00M"}},
		{name: "an incident: the incident rule", in: as(healthy(0.5, 1_000_000, 0), func(in *Inputs) { in.Assessment.State = detector.Trapped }),
			cur: 1_000_000, want: 700_000, wantMode: Incident, wantReasons: []string{"mode normal → incident", "incident: cut B"}},
		{name: "the incident over but sessions still held: it lasts, B held", mode: Incident, in: held, cur: 700_000, want: 700_000,
			wantReasons: []string{"detector healthy, but 3 sessions still held: the incident lasts until every one is resumed, B held at 700K"}},
		{name: "the incident over: restoring, and the restoring rule at once", mode: Incident, sinceChange: time.Hour,
			in: healthy(0.95, 700_000, 0), cur: 700_000, want: 750_000, wantMode: Restoring,
			wantReasons: []string{"mode incident → restoring: detector healthy, no alert firing", "restoring: hit rate 0.95 on plateau 0.95: B 700K → 750K"}},
		{name: "restoring: the restoring rule", mode: Restoring, sinceChange: time.Hour, in: healthy(0.95, 700_000, 0), cur: 700_000, want: 750_000,
			wantReasons: []string{"restoring: hit rate"}},
		{name: "normal: the normal rule", sinceChange: time.Hour, in: healthy(0.95, 900_000, 0), cur: 900_000, want: 950_000,
			wantReasons: []string{"hit rate 0.95 on its plateau 0.95: B 900K up towards B_ref 1.00M → 950K"}},
	} {
		tc.run(t, (*Policy).nextTarget)
	}
}

func TestSetMode(t *testing.T) {
	p := newPolicy(t, Options{})
	p.st.ModeSince = t0
	var plan Plan
	p.setMode(&plan, Normal, "already", t0.Add(time.Minute))
	assert.Empty(t, plan.Reasons, "staying in a mode says nothing")
	assert.Equal(t, t0, p.st.ModeSince)
	p.setMode(&plan, Incident, "detector trapped", t0.Add(time.Minute))
	assert.Equal(t, []string{"mode normal → incident: detector trapped"}, plan.Reasons)
	assert.Equal(t, Incident, p.st.Mode)
	assert.Equal(t, t0.Add(time.Minute), p.st.ModeSince)
}

func TestIncidentTarget(t *testing.T) {
	trapped := as(healthy(0.5, 1_000_000, 0), func(in *Inputs) { in.Assessment.State = detector.Trapped })
	alert := as(healthy(0.95, 1_000_000, 0), func(in *Inputs) { in.Alerts = []string{"BasinTrapped"} })
	for _, tc := range []ruleCase{
		{name: "cut to 0.7 × B_ref at once", in: trapped, cur: 1_000_000, want: 700_000, wantMode: Incident,
			wantReasons: []string{"mode normal → incident: detector trapped",
				"incident: cut B 1.00M → 700K (0.70 × B_ref 1.00M) so the working set drains; admitted sessions finish"}},
		{name: "an alert says why", in: alert, cur: 1_000_000, want: 700_000, wantMode: Incident,
			wantReasons: []string{"mode normal → incident: alerts firing: [BasinTrapped] (detector healthy)", "incident: cut B"}},
		{name: "already under the cut: B stays", in: trapped, cur: 600_000, want: 600_000, wantMode: Incident,
			wantReasons: []string{"mode normal → incident"}},
		{name: "already in the incident, at the cut: nothing to say", mode: Incident, in: trapped, cur: 700_000, want: 700_000},
		{name: "from restoring: cut again", mode: Restoring, in: trapped, cur: 900_000, want: 700_000, wantMode: Incident,
			wantReasons: []string{"mode restoring → incident", "incident: cut B 900K → 700K"}},
	} {
		tc.run(t, (*Policy).incidentTarget)
	}
}

func TestRestoringTarget(t *testing.T) {
	blind := as(healthy(0.95, 700_000, 0), func(in *Inputs) { in.GatewayOK = false })
	for _, tc := range []ruleCase{
		{name: "blind: B held", mode: Restoring, sinceChange: time.Hour, in: blind, cur: 700_000, want: 700_000,
			wantReasons: []string{"restoring, but blind ([gateway state unread]): B held"}},
		{name: "on the plateau after RestoreInterval: a step up", mode: Restoring, sinceChange: DefaultRestoreInterval,
			in: healthy(0.95, 700_000, 0), cur: 700_000, want: 750_000,
			wantReasons: []string{"restoring: hit rate 0.95 on plateau 0.95: B 700K → 750K (B_ref 1.00M)"}},
		{name: "on the plateau before RestoreInterval: wait", mode: Restoring, sinceChange: DefaultRestoreInterval - time.Second,
			in: healthy(0.95, 700_000, 0), cur: 700_000, want: 700_000},
		{name: "the last step reaches B_ref: normal", mode: Restoring, sinceChange: time.Hour,
			in: healthy(0.95, 980_000, 0), cur: 980_000, want: 1_000_000, wantMode: Normal,
			wantReasons: []string{"restoring: hit rate 0.95 on plateau 0.95: B 980K → 1.00M", "mode restoring → normal: B back at B_ref"}},
		{name: "B already at B_ref: normal", mode: Restoring, in: healthy(0.95, 1_000_000, 0), cur: 1_000_000, want: 1_000_000,
			wantMode: Normal, wantReasons: []string{"mode restoring → normal: B 1.00M back at B_ref 1.00M"}},
		{name: "off the plateau: a step down", mode: Restoring, sinceChange: DefaultStepInterval,
			in: healthy(0.85, 800_000, 0), cur: 800_000, want: 750_000,
			wantReasons: []string{"restoring: hit rate 0.85 < plateau 0.95 − 0.05: B 800K → 750K"}},
		{name: "off the plateau within a step interval: wait", mode: Restoring, sinceChange: DefaultStepInterval - time.Second,
			in: healthy(0.85, 800_000, 0), cur: 800_000, want: 800_000},
		{name: "off the plateau at the floor: B stays, nothing to say", mode: Restoring, sinceChange: time.Hour,
			in: healthy(0.85, 500_000, 0), cur: 500_000, want: 500_000},
		{name: "between the lines: B stays", mode: Restoring, sinceChange: time.Hour,
			in: healthy(0.91, 800_000, 0), cur: 800_000, want: 800_000},
	} {
		tc.run(t, (*Policy).restoringTarget)
	}
}

func TestNormalTarget(t *testing.T) {
	idle := func(hit float64, budget int64) Inputs {
		return Inputs{At: t0, Assessment: assess(t0, detector.Healthy, hit), GatewayOK: true, Gateway: idleGW(budget)}
	}
	blind := func(queued int) Inputs {
		return as(healthy(0.95, 1_000_000, queued), func(in *Inputs) { in.Assessment.Blind = []string{"hit_rate"} })
	}
	due := DefaultStepInterval
	for _, tc := range []ruleCase{
		{name: "above the range: down to its top at once, not waiting for the interval", in: healthy(0.95, 1_300_000, 0),
			cur: 1_300_000, want: 1_100_000, wantReasons: []string{"B 1.30M above 1.10 × B_ref 1.00M: B → 1.10M"}},
		{name: "above the range by less than half a step: negligible", in: healthy(0.95, 1_120_000, 0),
			cur: 1_120_000, want: 1_120_000},
		{name: "within a step interval: no move", sinceChange: due - time.Second, in: healthy(0.85, 1_000_000, 5),
			cur: 1_000_000, want: 1_000_000},
		{name: "off the plateau: a step down", sinceChange: due, in: healthy(0.85, 1_000_000, 5), cur: 1_000_000, want: 950_000,
			wantReasons: []string{"hit rate 0.85 left its plateau 0.95 (− 0.05): tighten B 1.00M → 950K"}},
		{name: "off the plateau under the floor: never up", sinceChange: due, in: healthy(0.85, 100_000, 0), cur: 100_000, want: 100_000},
		{name: "blind with sessions queued: never loosen, and say so", sinceChange: due, in: blind(3), cur: 1_000_000, want: 1_000_000,
			wantReasons: []string{"blind ([hit_rate]): never loosen, B held at 1.00M"}},
		{name: "blind in range, nobody queued: nothing to say", sinceChange: due, in: blind(0), cur: 1_000_000, want: 1_000_000},
		{name: "under the floor: up to it at once", sinceChange: due, in: healthy(0.95, 100_000, 0), cur: 100_000, want: 500_000,
			wantReasons: []string{"B 100K below 0.50 × B_ref 1.00M: B → 500K"}},
		{name: "queued on the plateau: a step up", sinceChange: due, in: healthy(0.95, 1_000_000, 2), cur: 1_000_000, want: 1_050_000,
			wantReasons: []string{"2 sessions queued and hit rate 0.95 on its plateau 0.95: loosen B 1.00M → 1.05M (max 1.10M)"}},
		{name: "queued on the plateau at the top: B stays", sinceChange: due, in: healthy(0.95, 1_100_000, 1), cur: 1_100_000, want: 1_100_000},
		{name: "queued on the plateau, clipped by less than half a step: negligible", sinceChange: due,
			in: healthy(0.95, 1_080_000, 1), cur: 1_080_000, want: 1_080_000},
		{name: "an idle gate: B above B_ref stays", sinceChange: due, in: idle(0.95, 1_080_000), cur: 1_080_000, want: 1_080_000},
		{name: "an idle gate: B under B_ref stays", sinceChange: due, in: idle(0.95, 900_000), cur: 900_000, want: 900_000},
		{name: "nobody queued above B_ref: a step back", sinceChange: due, in: healthy(0.95, 1_080_000, 0), cur: 1_080_000, want: 1_030_000,
			wantReasons: []string{"nobody queued: B 1.08M back towards B_ref 1.00M → 1.03M"}},
		{name: "nobody queued, the rest of a step back: negligible", sinceChange: due, in: healthy(0.95, 1_020_000, 0),
			cur: 1_020_000, want: 1_020_000},
		{name: "under B_ref on the plateau: a step up", sinceChange: due, in: healthy(0.95, 900_000, 0), cur: 900_000, want: 950_000,
			wantReasons: []string{"hit rate 0.95 on its plateau 0.95: B 900K up towards B_ref 1.00M → 950K"}},
		{name: "under B_ref between the lines: B stays", sinceChange: due, in: healthy(0.91, 900_000, 0), cur: 900_000, want: 900_000},
	} {
		tc.run(t, (*Policy).normalTarget)
	}
}

func TestNegligible(t *testing.T) {
	for _, tc := range []struct {
		cur, target, step int64
		want              bool
	}{
		{1_000_000, 1_000_000, 50_000, false}, // no move at all is not a negligible one
		{1_000_000, 1_024_999, 50_000, true},
		{1_000_000, 975_001, 50_000, true},
		{1_000_000, 1_025_000, 50_000, false}, // half a step is a move
		{1_000_000, 950_000, 50_000, false},
	} {
		assert.Equal(t, tc.want, negligible(tc.cur, tc.target, tc.step), "%d → %d, step %d", tc.cur, tc.target, tc.step)
	}
}

func TestGateIdle(t *testing.T) {
	const step = 50_000
	for _, tc := range []struct {
		name string
		ok   bool
		g    Gateway
		want bool
	}{
		{"nobody queued, working set a step under B_ref", true, Gateway{Reference: 1_000_000, WorkingSet: 949_999}, true},
		{"working set within a step of B_ref: engaged", true, Gateway{Reference: 1_000_000, WorkingSet: 950_000}, false},
		{"someone queued: engaged", true, Gateway{Reference: 1_000_000, WorkingSet: 400_000, Queued: 1}, false},
		{"no reference reported: the policy's B_ref", true, Gateway{WorkingSet: 949_999}, true},
		{"a gateway that only counts is not idle by the reference test", true, Gateway{Reference: 1_000_000, CountOnly: true}, false},
		{"unread: not known to be idle", false, Gateway{Reference: 1_000_000}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, gateIdle(view{Inputs: Inputs{GatewayOK: tc.ok, Gateway: tc.g}, ref: testRef}, step))
		})
	}
}

func TestBudgetChange(t *testing.T) {
	at := t0.Add(time.Hour)
	for _, tc := range []struct {
		name        string
		in          Inputs
		cur, target int64
		takeover    bool
		inUse       int64 // the B_ref last sent
		want        *BudgetChange
		wantReasons []string // added to the plan's "decided"
		wantState   PolicyState
	}{
		{name: "a move: from the gateway's budget", in: Inputs{GatewayOK: true, Gateway: gw(1_000_000, 0)},
			cur: 1_000_000, target: 950_000, inUse: testRef,
			want:      &BudgetChange{From: 1_000_000, To: 950_000, Reference: testRef},
			wantState: PolicyState{Target: 950_000, LastChange: at, Reference: testRef}},
		{name: "a move from a budget basin did not set: from the gateway's, and said",
			in: Inputs{GatewayOK: true, Gateway: gw(800_000, 0)}, cur: 1_000_000, target: 950_000, inUse: testRef,
			want:        &BudgetChange{From: 800_000, To: 950_000, Reference: testRef},
			wantReasons: []string{"the gateway's budget is 800K, not the 1.00M basin last set"},
			wantState:   PolicyState{Target: 950_000, LastChange: at, Reference: testRef}},
		{name: "a move in a dry run: from basin's own target", in: Inputs{DryRun: true, GatewayOK: true, Gateway: gw(800_000, 0)},
			cur: 1_000_000, target: 950_000, inUse: testRef,
			want:      &BudgetChange{From: 1_000_000, To: 950_000, Reference: testRef},
			wantState: PolicyState{Target: 950_000, LastChange: at, Reference: testRef}},
		{name: "a move on a gateway that only counts", in: Inputs{GatewayOK: true, Gateway: Gateway{CountOnly: true}},
			cur: 1_100_000, target: 1_000_000, inUse: testRef,
			want:      &BudgetChange{FromCountOnly: true, To: 1_000_000, Reference: testRef},
			wantState: PolicyState{Target: 1_000_000, LastChange: at, Reference: testRef}},
		{name: "a dry run's takeover: from a gateway that only counts",
			in:  Inputs{DryRun: true, GatewayOK: true, Gateway: Gateway{CountOnly: true}},
			cur: 1_100_000, target: 1_000_000, takeover: true,
			want:      &BudgetChange{FromCountOnly: true, To: 1_000_000, Reference: testRef},
			wantState: PolicyState{Target: 1_000_000, LastChange: at, Reference: testRef}},
		{name: "a dry run's later move on a gateway that only counts: from basin's own target",
			in:  Inputs{DryRun: true, GatewayOK: true, Gateway: Gateway{CountOnly: true}},
			cur: 1_100_000, target: 1_000_000, inUse: testRef,
			want:      &BudgetChange{From: 1_100_000, To: 1_000_000, Reference: testRef},
			wantState: PolicyState{Target: 1_000_000, LastChange: at, Reference: testRef}},
		{name: "no move, the gateway only counts: B set again", in: Inputs{GatewayOK: true, Gateway: Gateway{CountOnly: true}},
			cur: 1_000_000, target: 1_000_000, inUse: testRef,
			want:        &BudgetChange{FromCountOnly: true, To: 1_000_000, Reference: testRef},
			wantReasons: []string{"the gateway only counts (admission.count_only: no budget yet, or it restarted without one): set B 1.00M"},
			wantState:   PolicyState{Target: 1_000_000, LastChange: at, Reference: testRef}},
		{name: "no move, the gateway's budget not basin's: set again, the interval not restarted",
			in: Inputs{GatewayOK: true, Gateway: gw(800_000, 0)}, cur: 1_000_000, target: 1_000_000, inUse: testRef,
			want:        &BudgetChange{From: 800_000, To: 1_000_000, Reference: testRef},
			wantReasons: []string{"the gateway's budget 800K is not the 1.00M basin last set (the gateway restarted with its configured budget, or someone changed it; pause basin to hold a budget by hand): set 1.00M"},
			wantState:   PolicyState{Target: 1_000_000, Reference: testRef}},
		{name: "no move in a dry run: the gateway's budget is not basin's to set",
			in: Inputs{DryRun: true, GatewayOK: true, Gateway: gw(800_000, 0)}, cur: 1_000_000, target: 1_000_000, inUse: testRef,
			wantState: PolicyState{Target: 1_000_000, Reference: testRef}},
		{name: "no move, B_ref moved: sent with B as it is", in: Inputs{GatewayOK: true, Gateway: gw(1_000_000, 0)},
			cur: 1_000_000, target: 1_000_000, inUse: 900_000,
			want:        &BudgetChange{From: 1_000_000, To: 1_000_000, Reference: testRef},
			wantReasons: []string{"B_ref 900K → 1.00M (min(0.90 × knee 1.25 × C, C) with C 1.00M)"},
			wantState:   PolicyState{Target: 1_000_000, Reference: testRef}},
		{name: "no move, B_ref moved, the gateway unread: nothing", in: Inputs{Gateway: gw(1_000_000, 0)},
			cur: 1_000_000, target: 1_000_000, inUse: 900_000,
			wantState: PolicyState{Target: 1_000_000, Reference: 900_000}},
		{name: "nothing to change", in: Inputs{GatewayOK: true, Gateway: gw(1_000_000, 0)}, cur: 1_000_000, target: 1_000_000, inUse: testRef,
			wantState: PolicyState{Target: 1_000_000, Reference: testRef}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			p.st.Target, p.st.Reference = tc.cur, tc.inUse
			tc.in.At, tc.in.Assessment = at, assess(at, detector.Healthy, 0.95)
			// A knee that divides the capacity exactly, for the reason's C.
			tc.in.Assessment.Knee.Ratio, tc.in.Assessment.KneeTokens = 1.25, 1.25*testC
			plan := Plan{Reasons: []string{"decided"}}
			p.budgetChange(p.viewOf(tc.in, testRef, tc.cur), tc.target, tc.takeover, &plan)
			wantReasons := append([]string{"decided"}, tc.wantReasons...)
			assert.Equal(t, wantReasons, plan.Reasons)
			if tc.want == nil {
				assert.Nil(t, plan.Budget)
			} else if assert.NotNil(t, plan.Budget) {
				assert.Equal(t, *tc.want, bare(plan.Budget))
				assert.Equal(t, wantReasons, plan.Budget.Reasons, "the change carries everything decided so far")
			}
			assert.Equal(t, tc.wantState, PolicyState{Target: p.st.Target, LastChange: p.st.LastChange, Reference: p.st.Reference})
		})
	}
}
