package remediate

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

const testC = 1_000_000.0 // cache tokens; knee 1.34 → B_ref = min(0.9 × 1.34 C, C) = C

// assess is an assessment at t with the given state and hit rate (plateau 0.95, knee 1.34).
func assess(t time.Time, st detector.State, hit float64) detector.Assessment {
	return detector.Assessment{At: t, ObservedAt: t, State: st, HitRate: hit, Plateau: 0.95,
		HitEvidence: detector.Evidence{Enough: true},
		Knee:        detector.Knee{Ratio: 1.34}, KneeTokens: 1.34 * testC, PeakCompletionRate: 5.1 / 60}
}

// TestNoReadingNoBudgetChange: a hit rate on too little evidence (two tiny sessions, every call a
// first call's miss) reads 0.00; it must not tighten the budget as a hit rate off its plateau
// would, nor loosen it as one on the plateau would.
func TestNoReadingNoBudgetChange(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hit    float64
		queued int
		budget int64
	}{
		{name: "a low non-reading does not tighten", hit: 0, budget: 1_000_000},
		{name: "a high non-reading does not loosen", hit: 1, queued: 3, budget: 600_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			now := t0
			for i := range 10 {
				a := assess(now, detector.Healthy, tc.hit)
				a.HitEvidence = detector.Evidence{Enough: false, Why: "hit rate not a reading: 2 calls < 20"}
				plan := p.Decide(Inputs{At: now, Assessment: a, Gateway: gw(tc.budget, tc.queued), GatewayOK: true})
				if plan.Budget != nil { // the first plan only sets the reference budget
					require.Equal(t, tc.budget, plan.Budget.To, "step %d: %q", i, plan.Reasons)
				}
				now = now.Add(time.Minute)
			}
		})
	}
}

// bare is a budget change without its reasons, for comparing the numbers.
func bare(b *BudgetChange) BudgetChange {
	c := *b
	c.Reasons = nil
	return c
}

// gw is a gateway whose working set has reached its B_ref (admission engaged): the budget rules
// that re-centre B on B_ref act only then (idleGW is one that admits everyone by the reference
// test).
func gw(budget int64, queued int) Gateway {
	return Gateway{Budget: budget, Reference: 1_000_000, WorkingSet: 1_000_000, Queued: queued}
}

func idleGW(budget int64) Gateway {
	return Gateway{Budget: budget, Reference: 1_000_000, WorkingSet: 400_000}
}

func newPolicy(t *testing.T, o Options) *Policy {
	t.Helper()
	p, err := NewPolicy(o)
	require.NoError(t, err)
	return p
}

// step runs the policy once a minute for n minutes from off with in(minute) and applies each
// budget change to the simulated gateway; it returns the budgets after each step.
func drive(p *Policy, g *Gateway, from, n int, in func(m int) Inputs) []int64 {
	var out []int64
	for m := from; m < from+n; m++ {
		i := in(m)
		i.At = t0.Add(time.Duration(m) * time.Minute)
		i.Assessment.At, i.Assessment.ObservedAt = i.At, i.At
		i.GatewayOK = true
		i.Gateway = *g
		plan := p.Decide(i)
		if plan.Budget != nil {
			g.Budget, g.Reference = plan.Budget.To, plan.Budget.Reference
		}
		out = append(out, g.Budget)
	}
	return out
}

func TestReference(t *testing.T) {
	for _, tc := range []struct {
		name string
		knee float64
		want int64
	}{
		{"0.9 × 1.34 C > C: B_ref = C", 1.34, int64(testC)},
		{"knee 1.0: B_ref = 0.9 C", 1.0, int64(0.9 * testC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			a := assess(t0, detector.Healthy, 0.95)
			a.Knee.Ratio, a.KneeTokens = tc.knee, tc.knee*testC
			plan := p.Decide(Inputs{At: t0, Assessment: a, Gateway: gw(int64(testC), 0), GatewayOK: true})
			require.NotNil(t, plan.Budget, "the first B_ref is sent: %q", plan.Reasons)
			assert.Equal(t, tc.want, plan.Budget.Reference)
			assert.Equal(t, tc.want, p.State().Reference, "the state (status page, metric) shows the B_ref sent")
		})
	}
	p := newPolicy(t, Options{})
	plan := p.Decide(Inputs{At: t0, Assessment: detector.Assessment{At: t0, ObservedAt: t0}, Gateway: gw(int64(testC), 0), GatewayOK: true})
	assert.Nil(t, plan.Budget, "no capacity yet: no B_ref")
	assert.Zero(t, p.State().Reference)
}

// TestNoMicroChangesAsCapacityDecays: the held capacity follows a fall exponentially, so B_ref
// computed from it moves by a fraction of a percent on every 5 s step. The budget derived from
// B_ref — the incident cut, the normal-mode bounds, the level B returns to — must move only when
// B_ref has moved by more than one Step (5%), in one change, not by 0.3% at a time with an audit
// record each (the 1P3D spike run made a "cut 1.97M → 1.97M" and thirteen "B above 1.10 × B_ref"
// cuts in a minute).
func TestNoMicroChangesAsCapacityDecays(t *testing.T) {
	for _, tc := range []struct {
		name   string
		state  detector.State
		hit    float64
		start  int64 // the gateway's budget before the capacity starts to fall
		queued int
		fall   float64 // the capacity falls to this fraction of testC and stays
		// maxChanges bounds the budget changes in the ten minutes of the fall; wantEnd is the
		// budget after it, as a fraction of the final B_ref.
		maxChanges int
		wantEnd    float64
	}{
		// B_ref falls 1.0M → 0.8M: the cut follows it as 0.7 × B_ref in a few > 5% steps.
		{name: "incident: the cut follows B_ref in whole steps", state: detector.Trapped, hit: 0.80, start: 1_000_000, fall: 0.8,
			maxChanges: 6, wantEnd: 0.7},
		// B at 1.1 × B_ref with sessions queued: the bound follows B_ref down.
		{name: "normal, at the upper bound", state: detector.Healthy, hit: 0.95, start: 1_100_000, queued: 5, fall: 0.8,
			maxChanges: 6, wantEnd: 1.1},
		// Nobody queued: B returns to B_ref as it falls, a step at a time.
		{name: "normal, nobody queued", state: detector.Healthy, hit: 0.95, start: 1_000_000, fall: 0.8,
			maxChanges: 6, wantEnd: 1.0},
		// A fall of 3% is within one Step: nothing is re-sent at all.
		{name: "a drift within one step changes nothing", state: detector.Trapped, hit: 0.80, start: 1_000_000, fall: 0.97,
			maxChanges: 1, wantEnd: 0.7 / 0.97},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			g := gw(tc.start, tc.queued)
			at := func(i int) time.Time { return t0.Add(time.Duration(i) * 5 * time.Second) }
			decide := func(i int, c float64) Plan {
				a := assess(at(i), tc.state, tc.hit)
				a.KneeTokens = 1.34 * c
				plan := p.Decide(Inputs{At: at(i), Assessment: a, Gateway: g, GatewayOK: true, ArrivalOK: true})
				if plan.Budget != nil {
					g.Budget, g.Reference = plan.Budget.To, plan.Budget.Reference
				}
				return plan
			}
			for i := range 24 { // two minutes at full capacity: the budget settles
				decide(i, testC)
			}
			changes := 0
			for i := 24; i < 24+120; i++ { // ten minutes after the fall, at the daemon's 5 s step
				if plan := decide(i, tc.fall*testC); plan.Budget != nil {
					changes++
					if plan.Budget.To != plan.Budget.From {
						assert.GreaterOrEqual(t, math.Abs(float64(plan.Budget.To-plan.Budget.From)), 0.025*float64(g.Reference),
							"step %d: a budget change of less than half a step: %q", i, plan.Reasons)
					}
				}
			}
			assert.LessOrEqual(t, changes, tc.maxChanges, "budget changes in ten minutes of a decaying capacity")
			assert.InDelta(t, tc.wantEnd, float64(g.Budget)/(tc.fall*testC), 0.06,
				"B %d against the fallen B_ref %.0f", g.Budget, tc.fall*testC)
		})
	}
}

func TestNormalMode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  int64
		queued int
		hit    float64
		want   []int64
		idle   bool
	}{
		{"queued on the plateau: loosen to 1.1 × B_ref", 1_000_000, 5, 0.95, []int64{1_050_000, 1_100_000, 1_100_000, 1_100_000}, false},
		{"left the plateau: tighten", 1_000_000, 5, 0.89, []int64{950_000, 900_000, 850_000, 800_000}, false},
		{"between the lines: hold", 1_000_000, 5, 0.91, []int64{1_000_000, 1_000_000, 1_000_000, 1_000_000}, false},
		{"nobody queued: back to B_ref", 1_100_000, 0, 0.95, []int64{1_050_000, 1_000_000, 1_000_000, 1_000_000}, false},
		{"under B_ref on the plateau: up to B_ref", 900_000, 0, 0.95, []int64{950_000, 1_000_000, 1_000_000, 1_000_000}, false},
		{"far under the floor on the plateau: floor at once", 100_000, 0, 0.95, []int64{500_000, 550_000, 600_000, 650_000}, false},
		{"under the floor off the plateau: never up", 100_000, 0, 0.5, []int64{100_000, 100_000, 100_000, 100_000}, false},
		// The gateway admits everyone by the reference test (working set 0.4 × B_ref, nobody
		// queued): it does not read B, so B is not re-centred — but still kept in its bounds.
		{"idle gateway: B above B_ref stays", 1_100_000, 0, 0.95, []int64{1_100_000, 1_100_000, 1_100_000, 1_100_000}, true},
		{"idle gateway: B under B_ref stays", 900_000, 0, 0.95, []int64{900_000, 900_000, 900_000, 900_000}, true},
		{"idle gateway: B under the floor still floored", 100_000, 0, 0.95, []int64{500_000, 500_000, 500_000, 500_000}, true},
		{"idle gateway: off the plateau still tightens", 1_000_000, 0, 0.89, []int64{950_000, 900_000, 850_000, 800_000}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			g := gw(tc.start, tc.queued)
			if tc.idle {
				g = idleGW(tc.start)
			}
			got := drive(p, &g, 0, 4, func(int) Inputs {
				return Inputs{Assessment: assess(time.Time{}, detector.Healthy, tc.hit), ArrivalOK: true}
			})
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestIncidentCutHoldRestore(t *testing.T) {
	p := newPolicy(t, Options{})
	g := gw(1_000_000, 0)
	states := map[int]detector.State{}
	for m := 3; m < 8; m++ {
		states[m] = detector.Drifting
	}
	for m := 8; m < 12; m++ {
		states[m] = detector.Trapped
	}
	for m := 12; m < 40; m++ {
		states[m] = detector.Recovering
	}
	got := drive(p, &g, 0, 40, func(m int) Inputs {
		st, ok := states[m]
		if !ok {
			st = detector.Healthy
		}
		hit := 0.95
		if st == detector.Trapped {
			hit = 0.3
		}
		return Inputs{Assessment: assess(time.Time{}, st, hit)}
	})
	assert.Equal(t, int64(1_000_000), got[2])
	assert.Equal(t, int64(700_000), got[3], "incident: cut at once to 0.7 × B_ref")
	for m := 3; m < 12; m++ {
		assert.Equal(t, int64(700_000), got[m], "held through the incident at minute %d", m)
	}
	// restoring: +5% of B_ref every 2 minutes from minute 12
	assert.Equal(t, int64(750_000), got[12])
	assert.Equal(t, int64(750_000), got[13])
	assert.Equal(t, int64(800_000), got[14])
	assert.Equal(t, int64(1_000_000), got[24])
	assert.Equal(t, Normal, p.State().Mode)
}

func TestAlertsCauseIncident(t *testing.T) {
	p := newPolicy(t, Options{})
	g := gw(1_000_000, 0)
	plan := p.Decide(Inputs{At: t0, Assessment: assess(t0, detector.Healthy, 0.95), GatewayOK: true, Gateway: g,
		Alerts: []string{"BasinMetastableDrift"}})
	require.NotNil(t, plan.Budget)
	assert.Equal(t, int64(700_000), plan.Budget.To)
	assert.Equal(t, Incident, plan.Mode)
	assert.Contains(t, strings.Join(plan.Reasons, "\n"), "alerts firing: [BasinMetastableDrift]")
}

func TestBlindNeverLoosens(t *testing.T) {
	p := newPolicy(t, Options{})
	g := gw(900_000, 10)
	got := drive(p, &g, 0, 5, func(int) Inputs {
		a := assess(time.Time{}, detector.Healthy, 0.95)
		a.Blind = []string{"hit_rate stale"}
		return Inputs{Assessment: a}
	})
	assert.Equal(t, []int64{900_000, 900_000, 900_000, 900_000, 900_000}, got)
	// A trapped state the detector holds while blind is not a reading: no cut on it (a daemon
	// whose targets all went down would otherwise throttle a deployment it cannot see)...
	blindTrapped := func(at time.Time) detector.Assessment {
		a := assess(at, detector.Trapped, 0.3)
		a.Blind = []string{"hit_rate stale"}
		return a
	}
	plan := p.Decide(Inputs{At: t0.Add(time.Hour), Assessment: blindTrapped(t0.Add(time.Hour)), GatewayOK: true, Gateway: g})
	assert.Nil(t, plan.Budget, "%q", plan.Reasons)
	assert.Equal(t, Normal, p.State().Mode)
	assert.Contains(t, strings.Join(plan.Reasons, "\n"), "no action on a state basin cannot see")
	// ...nor on a resumed one not yet observed.
	resumed := assess(t0.Add(time.Hour), detector.Trapped, 0.3)
	resumed.ObservedAt = time.Time{}
	plan = p.Decide(Inputs{At: t0.Add(time.Hour + time.Minute), Assessment: resumed, GatewayOK: true, Gateway: g})
	assert.Nil(t, plan.Budget, "%q", plan.Reasons)
	// A firing alert is evidence of its own: it still cuts while blind.
	plan = p.Decide(Inputs{At: t0.Add(time.Hour + 2*time.Minute), Assessment: blindTrapped(t0.Add(time.Hour + 2*time.Minute)),
		GatewayOK: true, Gateway: g, Alerts: []string{"BasinHitRateCollapsed"}})
	require.NotNil(t, plan.Budget)
	assert.Equal(t, int64(700_000), plan.Budget.To)
	// An incident seen before the blindness is held: neither restored nor cut further.
	g.Budget = 700_000
	plan = p.Decide(Inputs{At: t0.Add(2 * time.Hour), Assessment: blindTrapped(t0.Add(2 * time.Hour)), GatewayOK: true, Gateway: g})
	assert.Nil(t, plan.Budget, "%q", plan.Reasons)
	assert.Equal(t, Incident, p.State().Mode, "held, not restoring")

	// the gateway unread: nothing loosens either
	p = newPolicy(t, Options{})
	plan = p.Decide(Inputs{At: t0, Assessment: assess(t0, detector.Healthy, 0.95), GatewayOK: false})
	assert.True(t, plan.Empty())
}

func TestGatewayBudgetReconciled(t *testing.T) {
	p := newPolicy(t, Options{})
	g := gw(1_000_000, 0)
	drive(p, &g, 0, 2, func(int) Inputs { return Inputs{Assessment: assess(time.Time{}, detector.Healthy, 0.95)} })
	// the gateway restarts with its configured budget
	g.Budget = 400_000
	plan := p.Decide(Inputs{At: t0.Add(2 * time.Minute), Assessment: assess(t0.Add(2*time.Minute), detector.Healthy, 0.95),
		GatewayOK: true, Gateway: g})
	require.NotNil(t, plan.Budget)
	assert.Equal(t, BudgetChange{From: 400_000, To: 1_000_000, Reference: 1_000_000}, bare(plan.Budget))
	// A change due while the gateway has another budget is recorded from the gateway's budget,
	// what it really changes.
	p = newPolicy(t, Options{})
	g = gw(1_000_000, 0)
	drive(p, &g, 0, 2, func(int) Inputs { return Inputs{Assessment: assess(time.Time{}, detector.Healthy, 0.95)} })
	g.Budget = 1_000_000_000_000
	plan = p.Decide(Inputs{At: t0.Add(2 * time.Minute), Assessment: assess(t0.Add(2*time.Minute), detector.Trapped, 0.3),
		GatewayOK: true, Gateway: g})
	require.NotNil(t, plan.Budget)
	assert.Equal(t, BudgetChange{From: 1_000_000_000_000, To: 700_000, Reference: 1_000_000}, bare(plan.Budget))
	assert.Contains(t, strings.Join(plan.Reasons, "\n"), "the gateway's budget is 1.00T, not the 1.00M basin last set")
	// in a dry run the gateway is not expected to follow
	p = newPolicy(t, Options{})
	g = gw(1_000_000, 0)
	drive(p, &g, 0, 2, func(int) Inputs { return Inputs{Assessment: assess(time.Time{}, detector.Healthy, 0.95)} })
	g.Budget = 400_000
	plan = p.Decide(Inputs{At: t0.Add(2 * time.Minute), Assessment: assess(t0.Add(2*time.Minute), detector.Healthy, 0.95),
		GatewayOK: true, Gateway: g, DryRun: true})
	assert.Nil(t, plan.Budget)
}

func TestShedding(t *testing.T) {
	base := func(m int) Inputs {
		return Inputs{Assessment: assess(time.Time{}, detector.Healthy, 0.95), ArrivalOK: true, ArrivalRate: 6.0 / 60}
	}
	for _, tc := range []struct {
		name     string
		arrival  float64 // per minute
		headWait time.Duration
		disable  bool
		wantShed int
		live     int // admitted sessions (the lifetime is live ÷ the peak of 5.1/min)
	}{
		{"arrivals over the peak, head waited 15 min: one shed a minute", 6, 16 * time.Minute, false, 5, 0},
		{"head waited 14 min", 6, 14 * time.Minute, false, 0, 0},
		{"arrivals under the peak", 4, 30 * time.Minute, false, 0, 0},
		{"disabled", 6, 30 * time.Minute, true, 0, 0},
		// Short sessions (20 live: a lifetime of 3.9 min, two of them 7.8 min): shed_head_wait binds.
		{"short sessions: 15 min binds", 6, 16 * time.Minute, false, 5, 20},
		// Long sessions (80 live: a lifetime of 15.7 min): a queued session can wait two lifetimes,
		// 31 minutes, and still finish within its deadline, so a 16- or 30-minute wait sheds nobody.
		{"long sessions: 16 min is not hopeless", 6, 16 * time.Minute, false, 0, 80},
		{"long sessions: 30 min is not hopeless", 6, 30 * time.Minute, false, 0, 80},
		{"long sessions: two lifetimes are", 6, 32 * time.Minute, false, 5, 80},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{DisableShedding: tc.disable})
			shed := 0
			for m := range 5 {
				in := base(m)
				in.ArrivalRate = tc.arrival / 60
				in.At = t0.Add(time.Duration(m) * time.Minute)
				in.Assessment.At, in.Assessment.ObservedAt = in.At, in.At
				in.GatewayOK = true
				in.Gateway = Gateway{Budget: 1_000_000, Reference: 1_000_000, Queued: 3, HeadWait: tc.headWait, Live: tc.live,
					ShedCandidates: []string{fmt.Sprintf("low-%d", m), "mid", "high"}}
				plan := p.Decide(in)
				if plan.Shed != nil {
					shed++
					assert.Equal(t, []string{fmt.Sprintf("low-%d", m)}, plan.Shed.IDs, "the lowest priority first")
					assert.Contains(t, strings.Join(plan.Reasons, "\n"), "> peak completion rate 5.10/min")
				}
			}
			assert.Equal(t, tc.wantShed, shed)
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Step: 0.9}, "step: 0.9"},
		{Options{MaxFraction: 0.9}, "max_fraction: 0.9"},
		{Options{IncidentFraction: 0.3}, "incident_fraction: 0.3 below min_fraction"},
		{Options{PlateauTolerance: 0.06}, "plateau_tolerance"},
		{Options{ShedHeadWait: -time.Second}, "shed_head_wait"},
	} {
		_, err := NewPolicy(tc.o)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}

func TestRestoreAndReplay(t *testing.T) {
	p := newPolicy(t, Options{})
	require.Error(t, p.Restore(PolicyState{Mode: "panic"}))
	require.NoError(t, p.Restore(PolicyState{Mode: Incident, Target: 700_000, Seq: 4}))
	p.Replay([]Record{
		{Seq: 3, Kind: "budget", Phase: PhaseDone, Budget: &BudgetChange{To: 1}},               // already in the state
		{Seq: 5, Kind: "budget", Phase: PhaseIntent, Budget: &BudgetChange{To: 2}},             // not done
		{Seq: 6, Kind: "budget", Phase: PhaseDone, Budget: &BudgetChange{To: 650_000}, At: t0}, // done, not saved
	})
	st := p.State()
	assert.Equal(t, int64(650_000), st.Target)
	assert.Equal(t, uint64(6), st.Seq)
	assert.Equal(t, t0, st.LastChange)
}

// TestCountOnlyGatewayTakenOver: a gateway in count-only mode (admission.count_only) has budget 0
// meaning "none". basin's first step takes admission over as from an out-of-reach budget — at the
// top of the normal range, or at the incident cut — never from 0 up or down to the floor; and a
// gateway that restarts count-only gets basin's budget back.
func TestCountOnlyGatewayTakenOver(t *testing.T) {
	countOnly := Gateway{CountOnly: true}
	for _, tc := range []struct {
		name  string
		state detector.State
		hit   float64
		to    int64
	}{
		{"healthy", detector.Healthy, 0.95, 1_050_000}, // 1.1 × B_ref, then nobody queued: one step back towards B_ref
		{"trapped", detector.Trapped, 0.3, 700_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			plan := p.Decide(Inputs{At: t0, Assessment: assess(t0, tc.state, tc.hit), GatewayOK: true, Gateway: countOnly})
			require.NotNil(t, plan.Budget, "%q", plan.Reasons)
			assert.Equal(t, BudgetChange{FromCountOnly: true, To: tc.to, Reference: 1_000_000}, bare(plan.Budget))
			assert.Contains(t, strings.Join(plan.Reasons, "\n"), "admission.count_only")
			assert.Equal(t, "budget count only → "+FormatTokens(tc.to)+" tokens", Record{Budget: plan.Budget}.Change())
		})
	}
	// Acting, then the gateway restarts count-only: basin sets its budget again.
	p := newPolicy(t, Options{})
	g := gw(1_000_000, 0)
	drive(p, &g, 0, 2, func(int) Inputs { return Inputs{Assessment: assess(time.Time{}, detector.Healthy, 0.95)} })
	plan := p.Decide(Inputs{At: t0.Add(2 * time.Minute), Assessment: assess(t0.Add(2*time.Minute), detector.Healthy, 0.95),
		GatewayOK: true, Gateway: countOnly})
	require.NotNil(t, plan.Budget)
	assert.Equal(t, BudgetChange{FromCountOnly: true, To: 1_000_000, Reference: 1_000_000}, bare(plan.Budget))
	assert.Contains(t, strings.Join(plan.Reasons, "\n"), "or it restarted without one): set B 1.00M")
	// In a dry run the gateway is not expected to follow: nothing to set again.
	p = newPolicy(t, Options{})
	p.Decide(Inputs{At: t0, Assessment: assess(t0, detector.Healthy, 0.95), GatewayOK: true, Gateway: countOnly, DryRun: true})
	plan = p.Decide(Inputs{At: t0.Add(5 * time.Second), Assessment: assess(t0.Add(5*time.Second), detector.Healthy, 0.95),
		GatewayOK: true, Gateway: countOnly, DryRun: true})
	assert.Nil(t, plan.Budget, "%q", plan.Reasons)
}

// TestFormatTokens: token counts for people, the out-of-reach budget included.
func TestFormatTokens(t *testing.T) {
	for v, want := range map[int64]string{
		950: "950", 9_999: "9999", 850_000: "850K", 1_200_000: "1.20M", 999_990_000: "999.99M",
		2_500_000_000: "2.50G", 1_000_000_000_000: "1.00T", -700_000: "-700K",
	} {
		assert.Equal(t, want, FormatTokens(v), "%d", v)
	}
}

// TestReferenceFollowsCapacityNotLentJitter: the capacity counts the KV decode lends now, which
// decode reclaims and lends again from one scrape to the next (±30% every 5 s in the simulator's
// 1P1D overload). B_ref must not follow each reading — it was re-sent to the gateway every step and
// the budget cut on every dip — but must follow a lasting change within a few windows.
func TestReferenceFollowsCapacityNotLentJitter(t *testing.T) {
	p := newPolicy(t, Options{})
	g := gw(1_000_000, 0)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * 5 * time.Second) }
	withC := func(i int, c float64) Inputs {
		a := assess(at(i), detector.Healthy, 0.95)
		a.KneeTokens = 1.34 * c
		return Inputs{At: at(i), Assessment: a, Gateway: g, GatewayOK: true}
	}
	refChanges := 0
	for i := range 120 { // ten minutes of readings alternating between 1.0M and 0.7M
		c := testC
		if i%2 == 1 {
			c = 0.7 * testC
		}
		plan := p.Decide(withC(i, c))
		if plan.Budget != nil && plan.Budget.To == plan.Budget.From {
			refChanges++
		}
		if plan.Budget != nil {
			g.Budget = plan.Budget.To
		}
	}
	// A few while the mean settles from the first reading; following each reading sent 119.
	assert.LessOrEqual(t, refChanges, 3, "B_ref re-sent %d times in ten minutes of lent KV coming and going", refChanges)
	assert.InDelta(t, testC, p.State().HeldCapacity, 0.02*testC, "the capacity B_ref uses is what decode gives back between calls")

	// Lending switched off for good: the capacity falls to 0.65M and stays there.
	for i := 120; i < 120+12*8; i++ {
		plan := p.Decide(withC(i, 0.65*testC))
		if plan.Budget != nil {
			g.Budget = plan.Budget.To
		}
	}
	assert.InDelta(t, 0.65*testC, p.State().HeldCapacity, 0.02*testC, "followed within eight minutes (four windows)")
}

// TestRestoringTightensOneStepAnInterval: after an incident, a hit rate still off its plateau
// tightens B, but one step a StepInterval, not one every 5 s step of the daemon (it went from
// 0.7 × B_ref to the 0.5 × B_ref floor in 20 seconds).
func TestRestoringTightensOneStepAnInterval(t *testing.T) {
	p := newPolicy(t, Options{})
	g := gw(1_000_000, 0)
	step := func(at time.Time, st detector.State, hit float64) {
		plan := p.Decide(Inputs{At: at, Assessment: assess(at, st, hit), Gateway: g, GatewayOK: true})
		if plan.Budget != nil {
			g.Budget = plan.Budget.To
		}
	}
	step(t0, detector.Drifting, 0.80)
	require.Equal(t, int64(700_000), g.Budget, "incident cut")
	var budgets []int64
	for i := 1; i <= 36; i++ { // three minutes at the daemon's 5 s step, recovering but off the plateau
		step(t0.Add(time.Duration(i)*5*time.Second), detector.Recovering, 0.85)
		budgets = append(budgets, g.Budget)
	}
	assert.Equal(t, Restoring, p.State().Mode)
	assert.Equal(t, int64(700_000), budgets[10], "none in the minute after the cut")
	assert.Equal(t, int64(650_000), budgets[11], "the first a minute after the cut")
	assert.Equal(t, int64(650_000), budgets[22], "none in the next minute")
	assert.Equal(t, int64(600_000), budgets[23], "the next a minute later")
	assert.Equal(t, int64(550_000), budgets[35], "three steps in three minutes")
}
