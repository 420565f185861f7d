package admission

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDormantAfter: the idleness that makes a session dormant is twice the 0.99 quantile of the
// tool gaps seen, within [DormantFloor, IdleTimeout]; the idle timeout (no session dormant) until
// minToolGaps gaps are seen, and with dormancy off.
func TestDormantAfter(t *testing.T) {
	gaps := func(n int, d time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = d
		}
		return out
	}
	cases := []struct {
		name  string
		floor time.Duration
		gaps  []time.Duration
		want  time.Duration
	}{
		{"nothing seen: the idle timeout", 0, nil, DefaultIdleTimeout},
		{"too few gaps: the idle timeout", 0, gaps(minToolGaps-1, 5*time.Second), DefaultIdleTimeout},
		{"quick tools: the floor", 0, gaps(minToolGaps, 5*time.Second), DefaultDormantFloor},
		{"a lower floor", 30 * time.Second, gaps(minToolGaps, 5*time.Second), 30 * time.Second},
		{"twice the 0.99 quantile", 0, append(gaps(99, 30*time.Second), 3*time.Minute), 2 * 30 * time.Second * 2},
		{"the tail counts once it is 1%", 0, append(gaps(98, 30*time.Second), 3*time.Minute, 3*time.Minute), 6 * time.Minute},
		{"long tools: the idle timeout caps it", 0, gaps(100, 8*time.Minute), DefaultIdleTimeout},
		{"off", -1, gaps(100, 5*time.Second), DefaultIdleTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := core(t, Options{Budget: 1, DormantFloor: tc.floor})
			for _, g := range tc.gaps {
				c.mu.gaps.add(g)
			}
			s := c.Snapshot(t0, false)
			assert.Equal(t, tc.want.Seconds(), s.DormantAfterSeconds)
			assert.Equal(t, len(tc.gaps), s.ToolGaps)
		})
	}
}

// The gap window keeps the last toolGapWindow gaps: old ones leave the quantile.
func TestToolGapsWindow(t *testing.T) {
	var g toolGaps
	for range toolGapWindow {
		g.add(time.Hour)
	}
	for range toolGapWindow {
		g.add(time.Second)
	}
	q, ok := g.quantile(1)
	require.True(t, ok)
	assert.Equal(t, time.Second, q)
	assert.Len(t, g.sorted, toolGapWindow)
}

// Sessions whose client stopped calling without ending them: once the core has learnt the
// workload's tool time, they go dormant past it — out of the working set and the admission
// test, so a queued session takes their room, reported apart — and the idle timeout still ends
// them. One that calls again is active again at once, over the budget if need be (never cut),
// and a held session is never dormant.
func TestAbandonedSessionsGoDormant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := core(t, Options{Budget: 100_000})
		now := time.Now
		// A workload of five-second tools: ten sessions of six calls, then they end.
		for i := range 10 {
			id := fmt.Sprint("w", i)
			require.Equal(t, Admitted, c.Arrive(now(), req(id, 1_000, 0)).Verdict)
		}
		for range 6 {
			time.Sleep(time.Second)
			for i := range 10 {
				c.Finish(now(), fmt.Sprint("w", i), 2_000)
			}
			time.Sleep(5 * time.Second)
			for i := range 10 {
				require.Equal(t, CallPass, c.BeginCall(now(), fmt.Sprint("w", i), 2_000))
			}
		}
		for i := range 10 {
			c.End(now(), fmt.Sprint("w", i))
		}
		s := c.Snapshot(now(), false)
		assert.Equal(t, 60, s.ToolGaps, "six gaps a session: each finish to the next call")
		assert.Equal(t, DefaultDormantFloor.Seconds(), s.DormantAfterSeconds, "2 × 5 s is under the floor")

		// A client starts five sessions of 19K, finishes their first calls and leaves; one
		// more session runs, and a newcomer queues behind them all.
		for i := range 5 {
			id := fmt.Sprint("left", i)
			require.Equal(t, Admitted, c.Arrive(now(), req(id, 19_000, 0)).Verdict)
			c.Finish(now(), id, 19_000)
		}
		require.Equal(t, Admitted, c.Arrive(now(), req("busy", 4_000, 0)).Verdict)
		c.Finish(now(), "busy", 4_000)
		require.Equal(t, Queued, c.Arrive(now(), req("new", 20_000, 0)).Verdict)
		require.Equal(t, 1, c.Hold(now(), []string{"left4"}), "the policy holds one of them")
		check(t, c)

		time.Sleep(time.Minute)
		require.Equal(t, CallPass, c.BeginCall(now(), "busy", 5_000))
		c.Finish(now(), "busy", 5_000)
		assert.Empty(t, c.Expire(now()), "a minute idle is not dormant")
		time.Sleep(time.Minute)
		evs := c.Expire(now())
		assert.Equal(t, []string{"new"}, ids(evs, EventAdmitted), "the dormant sessions' room admits the queued one")
		s = c.Snapshot(now(), true)
		assert.Equal(t, 4, s.Dormant, "the held one is not dormant: its idleness is the hold's")
		assert.Equal(t, int64(4*19_000), s.DormantTokens)
		assert.Equal(t, int64(19_000+5_000+20_000), s.WorkingSet, "held left4, busy (a minute idle) and new")
		assert.Equal(t, int64(19_000+5_000+20_000), s.Reserved)
		assert.Equal(t, 3, s.Live, "the dormant sessions are apart")
		assert.Equal(t, uint64(4), s.Counters.Dormant)
		dormant := 0
		for _, l := range s.Sessions {
			if l.Dormant {
				dormant++
				assert.Contains(t, []string{"left0", "left1", "left2", "left3"}, l.ID)
			}
		}
		assert.Equal(t, 4, dormant, "listed with the live sessions, marked")
		assert.Zero(t, c.Hold(now(), []string{"left0"}), "a dormant session is not held")
		check(t, c)

		// left0 calls again: active at once and its call passes, over the budget (never cut).
		_, err := c.SetBudget(now(), 30_000, 0)
		require.NoError(t, err)
		assert.Equal(t, CallPass, c.BeginCall(now(), "left0", 19_500))
		s = c.Snapshot(now(), false)
		assert.Equal(t, 3, s.Dormant)
		assert.Equal(t, int64(19_000+5_000+20_000+19_500), s.WorkingSet)
		assert.Equal(t, uint64(1), s.Counters.Woken)
		assert.Equal(t, 62, s.ToolGaps, "busy's minute and left0's two minutes of silence count: they called again")
		check(t, c)

		// The idle timeout still ends them, dormant (left1–3) or held (left4); busy, quiet since
		// its call nine minutes ago, is dormant now; left0 is in its call.
		time.Sleep(DefaultIdleTimeout - 2*time.Minute)
		evs = c.Expire(now())
		assert.ElementsMatch(t, []string{"left1", "left2", "left3", "left4"}, ids(evs, EventEnded))
		s = c.Snapshot(now(), false)
		assert.Equal(t, 1, s.Dormant)
		assert.Equal(t, int64(5_000), s.DormantTokens)
		assert.Equal(t, 2, s.Live, "left0 and new")
		check(t, c)
	})
}

// Before the core has seen enough tool gaps (a fresh or restarted gateway) nobody is dormant:
// sessions count until they end or idle out, as without the rule.
func TestNoDormancyBeforeTheToolTimeIsKnown(t *testing.T) {
	c := core(t, Options{Budget: 100_000})
	c.Arrive(at(0), req("a", 10_000, 0))
	c.Finish(at(1), "a", 10_000)
	assert.Empty(t, c.Expire(at(9*60)))
	s := c.Snapshot(at(9*60), false)
	assert.Zero(t, s.Dormant)
	assert.Equal(t, int64(10_000), s.WorkingSet)
	assert.Equal(t, []string{"a"}, ids(c.Expire(at(10*60+1)), EventEnded))
}

// A dormant session stays dormant across a restart and in a merged table; a merged state that
// saw it call since wakes it.
func TestDormantSurvivesRestoreAndMerge(t *testing.T) {
	c := core(t, Options{Budget: 100_000})
	for range minToolGaps {
		c.mu.gaps.add(time.Second)
	}
	c.Arrive(at(0), req("a", 10_000, 0))
	c.Finish(at(1), "a", 10_000)
	c.Arrive(at(0), req("b", 5_000, 0))
	c.Finish(at(1), "b", 5_000)
	c.Expire(at(1 + 3*60))
	require.Equal(t, 2, c.Snapshot(at(200), false).Dormant)
	st := c.Export(at(200))

	r := core(t, Options{Budget: 100_000})
	require.NoError(t, r.Restore(at(201), st))
	s := r.Snapshot(at(201), false)
	assert.Equal(t, 2, s.Dormant)
	assert.Zero(t, s.WorkingSet)
	assert.Zero(t, s.Counters.Dormant, "it went dormant before the restart")
	check(t, r)

	st.Live[0].LastDone = at(300) // a called elsewhere since
	st.Live[0].Dormant = false
	_, err := r.Merge(at(301), st)
	require.NoError(t, err)
	s = r.Snapshot(at(301), false)
	assert.Equal(t, 1, s.Dormant)
	assert.Equal(t, int64(10_000), s.WorkingSet)
	check(t, r)
}

func TestCollectorExportsDormant(t *testing.T) {
	c := core(t, Options{Budget: 100_000})
	for range minToolGaps {
		c.mu.gaps.add(90 * time.Second)
	}
	c.Arrive(at(0), req("gone", 10_000, 0))
	c.Finish(at(1), "gone", 12_000)
	c.Arrive(at(0), req("busy", 5_000, 0))
	c.Expire(at(1 + 3*60))
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(NewCollector(c, func() time.Time { return at(200) }, nil)))
	want := map[string]float64{
		"basin_gateway_sessions_dormant": 1, "basin_gateway_dormant_tokens": 12_000, "basin_gateway_dormant_after_seconds": 180,
		"basin_gateway_sessions_dormant_total": 1, "basin_gateway_sessions_woken_total": 0,
		"basin_gateway_working_set_tokens": 5_000, "basin_gateway_sessions_live": 1,
	}
	fams, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range fams {
		if _, ok := want[f.GetName()]; ok {
			m := f.GetMetric()[0]
			got[f.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	assert.Equal(t, want, got)
}
