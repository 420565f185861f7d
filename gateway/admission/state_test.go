package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// accounting is what a core counts for its live sessions, read under its lock: the totals the
// admission test and the reports use, and each session's own share of them.
type accounting struct {
	WorkingSet, Reserved, HeldCtx, DormantCtx int64
	Held, Dormant                             int
	Tenants                                   map[string]int
	Sessions                                  map[string]sessionAccount
}

type sessionAccount struct {
	Tenant                      string
	Arrival, Admitted, LastDone time.Time
	Priority, HeldSince         time.Time
	Context, Peak, Predicted    int64
	Demand                      int64
	InFlight                    int
	Held, Dormant               bool
}

func accountingOf(c *Core) accounting {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := accounting{WorkingSet: c.mu.workingSet, Reserved: c.mu.reserved, HeldCtx: c.mu.heldCtx,
		DormantCtx: c.mu.dormantCtx, Held: c.mu.nHeld, Dormant: c.mu.nDormant, Tenants: map[string]int{},
		Sessions: map[string]sessionAccount{}}
	for t, n := range c.mu.tenants {
		a.Tenants[t] = n
	}
	for id, s := range c.mu.live {
		a.Sessions[id] = sessionAccount{Tenant: s.tenant, Arrival: s.arrival, Admitted: s.admitted,
			LastDone: s.lastDone, Priority: s.priority, HeldSince: s.heldSince, Context: s.context, Peak: s.peak,
			Predicted: s.predicted, Demand: s.demandCache, InFlight: s.inFlight, Held: s.held, Dormant: s.dormant}
	}
	return a
}

// A session restored after a restart and the same session merged from another replica's table
// are counted alike: the same working set, reserved tokens, hold list, dormant sessions, tenants,
// priorities and listings, so a gateway's admissions do not depend on how it learnt its table.
func TestRestoredAndMergedSessionsAreAccountedAlike(t *testing.T) {
	live := func(id string, ctx, peak, predicted int64) LiveSession {
		return LiveSession{ID: id, Tenant: "t-" + id, Arrival: at(1), Admitted: at(2), LastDone: at(3),
			Context: ctx, Peak: peak, PredictedPeak: predicted}
	}
	held := live("h", 40, 40, 90)
	held.Held = true
	dormant := live("d", 30, 35, 0)
	dormant.Dormant = true
	both := live("hd", 20, 20, 0)
	both.Held, both.Dormant = true, true
	sameTenant := live("s2", 15, 15, 0)
	sameTenant.Tenant = "t-s1"

	cases := []struct {
		name string
		mode Mode
		st   State
		// What the user sees of it: the working set and reserved tokens, and the sessions held
		// and dormant.
		workingSet, reserved int64
		held, dormant        int
	}{
		{name: "empty", mode: ModeCurrent, st: State{}},
		{name: "current demand", mode: ModeCurrent,
			st:         State{Live: []LiveSession{live("a", 60, 70, 200), live("b", 10, 10, 0)}},
			workingSet: 70, reserved: 70},
		{name: "peak demand", mode: ModePeak,
			st:         State{Live: []LiveSession{live("a", 60, 70, 200), live("b", 10, 10, 0)}},
			workingSet: 70, reserved: 210},
		{name: "peak under the context is raised to it", mode: ModePeak,
			st:         State{Live: []LiveSession{live("a", 60, 5, 0)}},
			workingSet: 60, reserved: 60},
		{name: "held", mode: ModePeak,
			st:         State{Live: []LiveSession{held, live("a", 10, 10, 0)}},
			workingSet: 50, reserved: 100, held: 1},
		{name: "dormant", mode: ModeCurrent,
			st:         State{Live: []LiveSession{dormant, live("a", 10, 10, 0)}},
			workingSet: 10, reserved: 10, dormant: 1},
		{name: "held and dormant is held", mode: ModeCurrent,
			st:         State{Live: []LiveSession{both}},
			workingSet: 20, reserved: 20, held: 1},
		{name: "tenants", mode: ModeCurrent,
			st:         State{Live: []LiveSession{live("s1", 5, 5, 0), sameTenant, live("x", 1, 1, 0)}},
			workingSet: 21, reserved: 21},
		{name: "runtime budget", mode: ModeCurrent,
			st:         State{Budget: 500, ReferenceBudget: 400, Live: []LiveSession{live("a", 60, 60, 0)}},
			workingSet: 60, reserved: 60},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Budget: 100, Mode: tc.mode, LiveLog: 100}
			restored, merged := core(t, o), core(t, o)
			require.NoError(t, restored.Restore(at(10), tc.st))
			evs, err := merged.Merge(at(10), tc.st)
			require.NoError(t, err)
			assert.Empty(t, evs, "nothing was queued: merging admits no one")
			check(t, restored)
			check(t, merged)

			ra, ma := accountingOf(restored), accountingOf(merged)
			assert.Equal(t, ra, ma, "accounting")
			assert.Equal(t, tc.workingSet, ra.WorkingSet, "working set")
			assert.Equal(t, tc.reserved, ra.Reserved, "reserved")
			assert.Equal(t, tc.held, ra.Held, "held")
			assert.Equal(t, tc.dormant, ra.Dormant, "dormant")

			assert.Equal(t, restored.Snapshot(at(11), true), merged.Snapshot(at(11), true), "snapshot")
			assert.Equal(t, restored.Export(at(11)), merged.Export(at(11)), "export")
			rc, rl, rok := restored.LiveSince(0)
			mc, ml, mok := merged.LiveSince(0)
			assert.Equal(t, []any{rc, rl, rok}, []any{mc, ml, mok}, "live log")
		})
	}
}

// A session queued here that another replica admitted is counted, once merged, as the same
// session restored, but for the call it was waiting to send, now in flight.
func TestMergedFromTheQueueIsAccountedAsRestored(t *testing.T) {
	o := Options{Budget: 100, Mode: ModePeak}
	ls := LiveSession{ID: "q", Tenant: "t", Arrival: at(2), Admitted: at(3), LastDone: at(3), Context: 50, Peak: 50,
		PredictedPeak: 80}
	full := LiveSession{ID: "a", Arrival: at(0), Admitted: at(0), Context: 100, Peak: 100}

	restored := core(t, o)
	require.NoError(t, restored.Restore(at(5), State{Live: []LiveSession{full, ls}}))

	merged := core(t, o)
	require.NoError(t, merged.Restore(at(1), State{Live: []LiveSession{full}}))
	q := req("q", 50, 80)
	q.Tenant = "t"
	require.Equal(t, Queued, merged.Arrive(at(2), q).Verdict)
	evs, err := merged.Merge(at(5), State{Live: []LiveSession{ls}})
	require.NoError(t, err)
	assert.Equal(t, []string{"q"}, ids(evs, EventAdmitted))
	check(t, merged)

	ra, ma := accountingOf(restored), accountingOf(merged)
	assert.Equal(t, 0, ra.Sessions["q"].InFlight)
	assert.Equal(t, 1, ma.Sessions["q"].InFlight, "its waiting call is sent")
	sq := ma.Sessions["q"]
	sq.InFlight = 0
	ma.Sessions["q"] = sq
	assert.Equal(t, ra, ma)
}
