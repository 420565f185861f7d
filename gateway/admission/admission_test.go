package admission

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func core(t testing.TB, o Options) *Core {
	t.Helper()
	c, err := New(o)
	require.NoError(t, err)
	return c
}

func req(id string, first, peak int64) Request {
	return Request{ID: id, FirstPrompt: first, PredictedPeak: peak}
}

// check verifies the core's bookkeeping against its sessions.
func check(t testing.TB, c *Core) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws, res, dctx int64
	nd := 0
	for _, s := range c.mu.live {
		assert.Equal(t, c.demandLocked(s), s.demandCache, "cached demand of %s", s.id)
		if s.dormant {
			// Dormant: out of the working set and the admission test, counted apart; never held
			// and never in a call (a call wakes it).
			dctx += s.context
			nd++
			assert.False(t, s.held, "dormant %s is not held", s.id)
			assert.Zero(t, s.inFlight, "dormant %s has no call in flight", s.id)
			continue
		}
		ws += s.context
		res += c.demandLocked(s)
	}
	assert.Equal(t, ws, c.mu.workingSet, "working set")
	assert.Equal(t, res, c.mu.reserved, "reserved")
	assert.Equal(t, dctx, c.mu.dormantCtx, "dormant context")
	assert.Equal(t, nd, c.mu.nDormant, "dormant sessions")
	var hctx int64
	var nh, waiting int
	for _, s := range c.mu.live {
		if s.held {
			hctx += s.context
			nh++
		}
		if !s.waitSince.IsZero() {
			waiting++
			assert.True(t, s.inFlight > 0, "a waiting call of %s counts in flight", s.id)
		}
	}
	assert.Equal(t, hctx, c.mu.heldCtx, "held context")
	assert.Equal(t, nh, c.mu.nHeld, "held sessions")
	assert.Equal(t, waiting, c.mu.waiting, "waiting calls")
	assert.Equal(t, len(c.mu.queued), c.mu.queue.Len())
	tenants := map[string]int{}
	for _, s := range c.mu.live {
		tenants[s.tenant]++
	}
	stale := 0
	for _, s := range c.mu.queued {
		tenants[s.tenant]++
		assert.True(t, s.queued)
		if s.stale {
			stale++
		}
	}
	assert.Equal(t, stale, c.mu.stale, "stale count")
	assert.Equal(t, tenants, c.mu.tenants)
}

func ids(evs []Event, kind EventKind) []string {
	var out []string
	for _, e := range evs {
		if e.Kind == kind {
			out = append(out, e.ID)
		}
	}
	return out
}

func TestUnderReferenceEverythingIsAdmitted(t *testing.T) {
	c := core(t, Options{Budget: 100, ReferenceBudget: 100})
	for i := range 5 {
		d := c.Arrive(at(float64(i)), req(fmt.Sprint(i), 20, 500))
		assert.Equal(t, Admitted, d.Verdict, "session %d", i)
	}
	check(t, c)
	// W = 100 = reference: the next one engages admission and queues.
	d := c.Arrive(at(10), req("x", 20, 20))
	assert.Equal(t, Queued, d.Verdict)
	assert.Equal(t, "budget", d.Reason)
	evs := c.End(at(11), "0")
	assert.Equal(t, []string{"x"}, ids(evs, EventAdmitted))
	assert.Equal(t, []string{"0"}, ids(evs, EventEnded))
	check(t, c)
}

func TestAdmittedSessionsAreNeverCut(t *testing.T) {
	c := core(t, Options{Budget: 100})
	require.Equal(t, Admitted, c.Arrive(at(0), req("a", 90, 0)).Verdict)
	// The session grows far past the budget: its calls still pass.
	for i := range 5 {
		assert.True(t, c.Begin(at(float64(i+1)), "a", int64(200*(i+1))))
		c.Finish(at(float64(i+1)), "a", int64(210*(i+1)))
	}
	assert.Equal(t, Admitted, c.Arrive(at(9), req("a", 5000, 0)).Verdict, "a live session's call is admitted")
	assert.Equal(t, Queued, c.Arrive(at(10), req("b", 10, 0)).Verdict)
	snap := c.Snapshot(at(10), true)
	assert.Equal(t, int64(1050), snap.WorkingSet)
	assert.Len(t, snap.Queue, 1)
	check(t, c)
	// Tightening the budget never ends anyone.
	_, err := c.SetBudget(at(11), 10, 0)
	require.NoError(t, err)
	assert.True(t, c.Live("a"))
}

func TestNothingLiveAdmitsHeadOverBudget(t *testing.T) {
	c := core(t, Options{Budget: 100, Mode: ModePeak})
	d := c.Arrive(at(0), req("huge", 100, 10_000))
	assert.Equal(t, Admitted, d.Verdict, "nothing live: the head goes in even over budget")
	assert.Equal(t, Queued, c.Arrive(at(1), req("next", 10, 20)).Verdict)
	evs := c.End(at(2), "huge")
	assert.Equal(t, []string{"next"}, ids(evs, EventAdmitted))
	check(t, c)
}

func TestPriorityOrder(t *testing.T) {
	cases := []struct {
		name         string
		arrivalOrder bool
		want         []string
	}{
		// p = arrival + peak/30: "small" (arrived 10 s later, peak 300 → +10 s) beats "big"
		// (peak 3000 → +100 s); "late" arrived 200 s later and cannot jump ahead of anyone.
		{"size aware", false, []string{"small", "big", "late"}},
		{"arrival order", true, []string{"big", "small", "late"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := core(t, Options{Budget: 100, Mode: ModePeak, ArrivalOrder: tc.arrivalOrder})
			require.Equal(t, Admitted, c.Arrive(at(0), req("blocker", 100, 100)).Verdict)
			require.Equal(t, Queued, c.Arrive(at(1), req("big", 10, 3000)).Verdict)
			require.Equal(t, Queued, c.Arrive(at(11), req("small", 10, 300)).Verdict)
			require.Equal(t, Queued, c.Arrive(at(201), req("late", 10, 30)).Verdict)
			snap := c.Snapshot(at(202), true)
			var order []string
			for _, q := range snap.Queue {
				order = append(order, q.ID)
			}
			assert.Equal(t, tc.want, order)
			// Strict head of line: the budget admits one at a time as sessions end.
			var admitted []string
			evs := c.End(at(300), "blocker")
			admitted = append(admitted, ids(evs, EventAdmitted)...)
			for len(admitted) < 3 {
				evs = c.End(at(300), admitted[len(admitted)-1])
				admitted = append(admitted, ids(evs, EventAdmitted)...)
			}
			assert.Equal(t, tc.want, admitted)
			check(t, c)
		})
	}
}

func TestModes(t *testing.T) {
	// Same sessions: current mode counts contexts (10 each), peak mode predicted peaks (60 each).
	for _, tc := range []struct {
		mode  Mode
		admit int
	}{{ModeCurrent, 10}, {ModePeak, 1}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			c := core(t, Options{Budget: 100, ReferenceBudget: 1, Mode: tc.mode})
			n := 0
			for i := range 10 {
				if c.Arrive(at(float64(i)), req(fmt.Sprint(i), 10, 60)).Verdict == Admitted {
					n++
				}
			}
			assert.Equal(t, tc.admit, n)
			check(t, c)
		})
	}
}

func TestRetryKeepsArrival(t *testing.T) {
	c := core(t, Options{Budget: 100, Mode: ModePeak})
	require.Equal(t, Admitted, c.Arrive(at(0), req("blocker", 100, 100)).Verdict)
	d := c.Arrive(at(5), req("r", 10, 300))
	require.Equal(t, Queued, d.Verdict)
	first := d.Priority
	assert.Empty(t, c.Cancel(at(35), "r"), "the client timed out")
	assert.Equal(t, 0, c.QueueLen())
	// A newcomer arrives, then the old session retries: it keeps its earlier place.
	require.Equal(t, Queued, c.Arrive(at(40), req("new", 10, 300)).Verdict)
	d = c.Arrive(at(60), req("r", 10, 300))
	assert.Equal(t, Queued, d.Verdict)
	assert.Equal(t, first, d.Priority, "priority did not reset")
	assert.Equal(t, at(5), d.Arrival)
	evs := c.End(at(61), "blocker")
	assert.Equal(t, []string{"r", "new"}, ids(evs, EventAdmitted), "r first; then the working set is small again")
	check(t, c)

	// Past the retry memory a retry is a new arrival.
	c2 := core(t, Options{Budget: 100, RetryMemory: time.Minute})
	c2.Arrive(at(0), req("blocker", 100, 0))
	c2.Arrive(at(1), req("r", 10, 0))
	c2.Cancel(at(2), "r")
	d = c2.Arrive(at(200), req("r", 10, 0))
	assert.Equal(t, at(200), d.Arrival)
}

func TestShed(t *testing.T) {
	c := core(t, Options{Budget: 100, Mode: ModePeak, ShedMemory: time.Minute})
	require.Equal(t, Admitted, c.Arrive(at(0), req("blocker", 100, 100)).Verdict)
	for i, peak := range []int64{300, 3000, 30} {
		require.Equal(t, Queued, c.Arrive(at(float64(i+1)), req(fmt.Sprint("q", i), 10, peak)).Verdict)
	}
	evs := c.Shed(at(10), 1, nil, "capacity short")
	assert.Equal(t, []string{"q1"}, ids(evs, EventShed), "the lowest priority (largest p) goes first")
	assert.Equal(t, "capacity short", evs[0].Reason)
	d := c.Arrive(at(20), req("q1", 10, 3000))
	assert.Equal(t, Refused, d.Verdict, "a shed session's retry is refused")
	assert.Equal(t, 50*time.Second, d.RetryAfter)
	evs = c.Shed(at(21), 0, []string{"q0", "nope"}, "by id")
	assert.Equal(t, []string{"q0"}, ids(evs, EventShed))
	assert.Equal(t, 1, c.QueueLen())
	assert.Equal(t, Queued, c.Arrive(at(100), req("q1", 10, 3000)).Verdict, "shed memory expired")
	snap := c.Snapshot(at(100), false)
	assert.Equal(t, uint64(2), snap.Counters.Shed)
	assert.Equal(t, uint64(1), snap.Counters.Refused)
	check(t, c)
}

func TestTenantQuota(t *testing.T) {
	c := core(t, Options{Budget: 1000, TenantQuota: 2, Quotas: map[string]int{"big": 3}})
	r := func(id, tenant string) Request { return Request{ID: id, Tenant: tenant, FirstPrompt: 10} }
	assert.Equal(t, Admitted, c.Arrive(at(0), r("a1", "a")).Verdict)
	assert.Equal(t, Admitted, c.Arrive(at(0), r("a2", "a")).Verdict)
	d := c.Arrive(at(0), r("a3", "a"))
	assert.Equal(t, OverQuota, d.Verdict)
	assert.Equal(t, "tenant_quota", d.Reason)
	assert.Positive(t, d.RetryAfter)
	for i := range 3 {
		assert.Equal(t, Admitted, c.Arrive(at(0), r(fmt.Sprint("b", i), "big")).Verdict)
	}
	assert.Equal(t, OverQuota, c.Arrive(at(0), r("b3", "big")).Verdict)
	c.End(at(1), "a1")
	assert.Equal(t, Admitted, c.Arrive(at(2), r("a3", "a")).Verdict, "ending a session frees quota")
	check(t, c)
}

func TestBudgetChangeAdmits(t *testing.T) {
	c := core(t, Options{Budget: 100})
	c.Arrive(at(0), req("a", 90, 0))
	c.Arrive(at(1), req("b", 30, 0))
	c.Arrive(at(2), req("c", 50, 0))
	evs, err := c.SetBudget(at(3), 160, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"b"}, ids(evs, EventAdmitted), "90+30 fits 160; c would need 170")
	evs, err = c.SetBudget(at(4), 200, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"c"}, ids(evs, EventAdmitted))
	_, err = c.SetBudget(at(5), 0, 0)
	assert.ErrorContains(t, err, "budget")
	check(t, c)
}

// TestAllowance: sessions admitted under an allowance reserve at most it in all, whatever ends
// meanwhile free; the progress rule still admits when nothing is live; lifting it admits by the
// budget alone.
func TestAllowance(t *testing.T) {
	c := core(t, Options{Budget: 100})
	for _, id := range []string{"a", "b", "c"} {
		require.Equal(t, Admitted, c.Arrive(at(0), req(id, 30, 0)).Verdict)
	}
	assert.Empty(t, c.SetAllowance(at(1), 40))
	require.Equal(t, Queued, c.Arrive(at(2), req("d", 30, 0)).Verdict, "90 + 30 is over the budget")
	require.Equal(t, Queued, c.Arrive(at(3), req("e", 30, 0)).Verdict)
	assert.Equal(t, []string{"d"}, ids(c.End(at(4), "a"), EventAdmitted), "30 of the 40 allowed")
	assert.Empty(t, ids(c.End(at(5), "b"), EventAdmitted), "the budget has room; the allowance has 10 left")
	check(t, c)
	// Nothing live: the progress rule admits the head however little allowance is left.
	c.End(at(6), "c")
	c.End(at(7), "d")
	assert.True(t, c.Live("e"), "admitted by the progress rule when d ended")
	require.Equal(t, Queued, c.Arrive(at(8), req("f", 30, 0)).Verdict)
	assert.Equal(t, []string{"f"}, ids(c.SetAllowance(at(9), -1), EventAdmitted), "lifted: the budget alone decides")
	check(t, c)
}

func TestIdleExpiry(t *testing.T) {
	c := core(t, Options{Budget: 100, IdleTimeout: time.Minute})
	c.Arrive(at(0), req("a", 60, 0))
	c.Finish(at(1), "a", 70)
	c.Arrive(at(2), req("busy", 30, 0))
	c.Arrive(at(3), req("q", 30, 0))
	assert.Empty(t, c.Expire(at(60)), "not idle for a minute yet")
	evs := c.Expire(at(70))
	assert.Equal(t, []string{"a"}, ids(evs, EventEnded), "busy has a call in flight and is not idle")
	assert.Equal(t, []string{"q"}, ids(evs, EventAdmitted))
	assert.Equal(t, int64(70), evs[0].Peak)
	check(t, c)
}

// In front of a deployment served at 60× its time, a 10-minute idle timeout is 10 s of the
// core's clock; a bad speed changes nothing.
func TestIdleTimeoutInTheDeploymentsTime(t *testing.T) {
	c := core(t, Options{Budget: 100, IdleTimeout: 10 * time.Minute})
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		assert.False(t, c.SetDeploymentSpeed(bad), "%v", bad)
	}
	assert.Equal(t, 10*time.Minute, c.IdleTimeout())
	require.True(t, c.SetDeploymentSpeed(60))
	assert.Equal(t, 10*time.Second, c.IdleTimeout())
	c.Arrive(at(0), req("a", 60, 0))
	c.Finish(at(1), "a", 70)
	assert.Empty(t, c.Expire(at(10)), "9 s idle: 9 minutes of the deployment's")
	assert.Equal(t, []string{"a"}, ids(c.Expire(at(11)), EventEnded))
	check(t, c)
}

func TestExportRestore(t *testing.T) {
	c := core(t, Options{Budget: 100, Mode: ModePeak})
	c.Arrive(at(0), req("a", 90, 80))
	c.Finish(at(1), "a", 100)
	require.Equal(t, Queued, c.Arrive(at(2), req("q", 10, 500)).Verdict)
	c.Shed(at(3), 0, []string{"q"}, "test")
	c.Arrive(at(4), req("q2", 10, 500))
	st := c.Export(at(5))

	d := core(t, Options{Budget: 100, Mode: ModePeak})
	require.NoError(t, d.Restore(at(6), st))
	assert.True(t, d.Live("a"))
	assert.Equal(t, Admitted, d.Arrive(at(7), req("a", 60, 0)).Verdict, "not treated as new after a restart")
	assert.Equal(t, Refused, d.Arrive(at(7), req("q", 10, 500)).Verdict, "still shed")
	dq := d.Arrive(at(8), req("q2", 10, 500))
	assert.Equal(t, at(4), dq.Arrival, "a queued session keeps its place in time across the restart")
	snap := d.Snapshot(at(8), false)
	assert.Equal(t, int64(100), snap.WorkingSet)
	check(t, d)

	assert.Error(t, d.Restore(at(9), st), "restoring into a core with sessions")
	bad := st
	bad.Live = append([]LiveSession(nil), st.Live...)
	bad.Live = append(bad.Live, LiveSession{ID: ""})
	assert.ErrorContains(t, core(t, Options{Budget: 1}).Restore(at(9), bad), "live[1].id")
}

func TestOptionsValidation(t *testing.T) {
	cases := map[string]Options{
		"budget_tokens":           {},
		"mode":                    {Budget: 1, Mode: "magic"},
		"reference_budget_tokens": {Budget: 1, ReferenceBudget: -1},
		"priority_tokens_per_sec": {Budget: 1, TokensPerSecond: -3},
		"tenant_quota":            {Budget: 1, TenantQuota: -1},
		`quotas["x"]`:             {Budget: 1, Quotas: map[string]int{"x": -1}},
		"idle_timeout":            {Budget: 1, IdleTimeout: -time.Second},
	}
	for want, o := range cases {
		t.Run(want, func(t *testing.T) {
			_, err := New(o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), want)
		})
	}
}

func TestRetryAfterFollowsDrainRate(t *testing.T) {
	c := core(t, Options{Budget: 100})
	assert.Equal(t, time.Minute, c.RetryAfter(at(0), "nobody"), "no admissions yet: a minute")
	// Ten admissions over 100 s: 0.1/s, so the fifth in line waits about 50 s.
	for i := range 10 {
		c.Arrive(at(float64(i*10)), req(fmt.Sprint(i), 1, 0))
	}
	c.SetBudget(at(100), 10, 1)
	for i := range 5 {
		c.Arrive(at(100), req(fmt.Sprint("w", i), 1, 0))
	}
	assert.InDelta(t, 50, c.RetryAfter(at(100), "w4").Seconds(), 6)
}

// TestRandomOperations runs a long random mix of operations and checks the books after each.
func TestRandomOperations(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mode := range []Mode{ModeCurrent, ModePeak} {
		// A low dormant floor, and a client that leaves one session in ten behind, calling it
		// again only now and then: sessions go dormant, wake and idle out among the other
		// operations.
		c := core(t, Options{Budget: 5000, ReferenceBudget: 3000, Mode: mode, TenantQuota: 20, DormantFloor: 2 * time.Second})
		for range minToolGaps {
			c.mu.gaps.add(time.Second) // it has seen a workload of one-second tools
		}
		now := t0
		var live, queued []string
		left := map[string]bool{}
		pick := func() (string, bool) {
			id := live[rng.IntN(len(live))]
			return id, !left[id] || rng.IntN(100) == 0
		}
		n := 0
		for range 5000 {
			now = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
			var evs []Event
			switch op := rng.IntN(12); {
			case op < 3:
				id := fmt.Sprint("s", n)
				n++
				d := c.Arrive(now, Request{ID: id, Tenant: fmt.Sprint(rng.IntN(3)), FirstPrompt: int64(100 + rng.IntN(500)),
					PredictedPeak: int64(rng.IntN(3000))})
				evs = d.Events
				left[id] = rng.IntN(10) == 0
				switch d.Verdict {
				case Admitted:
					live = append(live, id)
				case Queued:
					queued = append(queued, id)
				}
			case op < 6 && len(live) > 0:
				id, ok := pick()
				if !ok {
					break
				}
				if rng.IntN(4) > 0 {
					c.Begin(now, id, int64(rng.IntN(3000)))
				} // else: finish the call in flight (an admission's first call), so sessions idle
				evs = c.Finish(now, id, int64(rng.IntN(3000)))
			case op < 8 && len(live) > 0:
				if id, ok := pick(); ok {
					evs = c.End(now, id)
				}
			case op < 9 && len(queued) > 0:
				evs = c.Cancel(now, queued[rng.IntN(len(queued))])
			case op < 10:
				evs = c.Expire(now)
			case op < 11 && len(live) > 0:
				c.Hold(now, []string{live[rng.IntN(len(live))]})
				evs = c.Resume(now, []string{live[rng.IntN(len(live))]})
			default:
				evs = c.Shed(now, 1, nil, "random")
			}
			for _, e := range evs {
				switch e.Kind {
				case EventAdmitted:
					live = append(live, e.ID)
					queued = slices.DeleteFunc(queued, func(s string) bool { return s == e.ID })
				case EventShed:
					queued = slices.DeleteFunc(queued, func(s string) bool { return s == e.ID })
				case EventEnded:
					live = slices.DeleteFunc(live, func(s string) bool { return s == e.ID })
				}
			}
			// Keep the test's own view in step with cancels (no event for the cancelled one).
			queued = slices.DeleteFunc(queued, func(s string) bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				_, ok := c.mu.queued[s]
				return !ok
			})
			check(t, c)
		}
		snap := c.Snapshot(now, false)
		assert.Equal(t, len(live), snap.Live+snap.Dormant, "mode %s: every admission was reported exactly once", mode)
		assert.Positive(t, snap.Counters.Dormant, "mode %s: sessions went dormant", mode)
		assert.Positive(t, snap.Counters.Woken, "mode %s: dormant sessions woke", mode)
	}
}

// BenchmarkArriveWith10kQueued measures the admission decision with 10,000 sessions waiting and
// reports its p99 (target ≤ 50 µs).
func BenchmarkArriveWith10kQueued(b *testing.B) {
	c := core(b, Options{Budget: 1000, Mode: ModePeak})
	c.Arrive(t0, req("blocker", 1000, 1000))
	for i := range 10_000 {
		c.Arrive(t0, req(fmt.Sprint("q", i), 100, int64(100+i%5000)))
	}
	lat := make([]time.Duration, 0, b.N)
	i := 0
	for b.Loop() {
		id := fmt.Sprint("n", i)
		i++
		start := time.Now()
		c.Arrive(t0.Add(time.Second), req(id, 100, int64(100+i%5000)))
		c.Cancel(t0.Add(time.Second), id) // keep the queue at 10k
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	}
}

func TestCollectorExportsTheCore(t *testing.T) {
	c := core(t, Options{Budget: 100})
	c.Arrive(at(0), req("a", 90, 0))
	c.Arrive(at(1), req("b", 30, 0))
	c.Hold(at(1), []string{"a"})
	c.Finish(at(1), "a", 90)
	require.Equal(t, CallHeld, c.BeginCall(at(1.5), "a", 95))
	reg := prometheus.NewRegistry()
	on := true
	require.NoError(t, reg.Register(NewCollector(c, func() time.Time { return at(2) }, func() bool { return on })))
	fams, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			name := f.GetName()
			if len(m.GetLabel()) > 0 {
				name += "{" + m.GetLabel()[0].GetValue() + "}"
			}
			got[name] = v
		}
	}
	assert.Equal(t, map[string]float64{
		// b stays queued when a is held: a's context stays in the admission test.
		"basin_gateway_sessions_live": 1, "basin_gateway_sessions_in_call": 1, "basin_gateway_sessions_queued": 1,
		"basin_gateway_working_set_tokens": 95, "basin_gateway_reserved_tokens": 95,
		"basin_gateway_budget_tokens": 100, "basin_gateway_sessions_queued_stale": 0, "basin_gateway_sessions_staled_total": 0, "basin_gateway_reference_budget_tokens": 100,
		"basin_gateway_affinity_enabled": 1, "basin_gateway_session_arrivals_total": 2,
		"basin_gateway_session_completions_total": 0, "basin_gateway_admissions_total{immediate}": 1,
		"basin_gateway_admissions_total{queued}": 0, "basin_gateway_queue_oldest_wait_seconds": 1,
		"basin_gateway_admission_count_only": 0,
		"basin_gateway_sessions_held":        1, "basin_gateway_held_tokens": 95, "basin_gateway_held_calls": 1,
		"basin_gateway_sessions_too_late_total": 0,
		"basin_gateway_calls_held_total":        1, "basin_gateway_hold_bound_releases_total": 0,
		"basin_gateway_sessions_dormant": 0, "basin_gateway_dormant_tokens": 0, "basin_gateway_dormant_after_seconds": 600,
		"basin_gateway_sessions_dormant_total": 0, "basin_gateway_sessions_woken_total": 0,
	}, got)
}

func TestCountOnly(t *testing.T) {
	t.Run("admits everything and counts until a budget is set", func(t *testing.T) {
		c := core(t, Options{CountOnly: true})
		for i := range 20 {
			d := c.Arrive(at(float64(i)), req(fmt.Sprint("s", i), 100_000, 500_000))
			require.Equal(t, Admitted, d.Verdict, "session %d", i)
		}
		s := c.Snapshot(at(20), false)
		assert.True(t, s.CountOnly)
		assert.False(t, s.Engaged, "counting only is never engaged")
		assert.Equal(t, int64(2_000_000), s.WorkingSet)
		assert.Equal(t, int64(0), s.Budget, "no budget yet, none made up")
		check(t, c)

		_, err := c.SetBudget(at(21), 1_000_000, 0)
		require.NoError(t, err)
		s = c.Snapshot(at(21), false)
		assert.False(t, s.CountOnly)
		assert.Equal(t, int64(1_000_000), s.ReferenceBudget, "the reference is the budget when none was given")
		assert.True(t, s.Engaged)
		assert.Equal(t, Queued, c.Arrive(at(22), req("late", 100, 100)).Verdict, "the budget binds at once")
		check(t, c)
	})
	t.Run("a reference given with the first budget is kept", func(t *testing.T) {
		c := core(t, Options{CountOnly: true})
		_, err := c.SetBudget(at(0), 1000, 5000)
		require.NoError(t, err)
		s := c.Snapshot(at(0), false)
		assert.Equal(t, int64(5000), s.ReferenceBudget)
		assert.False(t, s.CountOnly)
	})
	t.Run("survives a restart until a budget is set", func(t *testing.T) {
		c := core(t, Options{CountOnly: true})
		c.Arrive(at(0), req("a", 10, 10))
		st := c.Export(at(1))
		assert.True(t, st.CountOnly)
		// A gateway restarted with a configured budget still counts only: nobody set one.
		c2 := core(t, Options{Budget: 50})
		require.NoError(t, c2.Restore(at(2), st))
		assert.True(t, c2.Snapshot(at(2), false).CountOnly)
		// And a budget set at runtime outlives a count-only config.
		_, err := c.SetBudget(at(3), 700, 0)
		require.NoError(t, err)
		c3 := core(t, Options{CountOnly: true})
		require.NoError(t, c3.Restore(at(4), c.Export(at(3))))
		s := c3.Snapshot(at(4), false)
		assert.False(t, s.CountOnly)
		assert.Equal(t, int64(700), s.Budget)
	})
	t.Run("options", func(t *testing.T) {
		assert.NoError(t, Options{CountOnly: true}.Validate())
		err := Options{CountOnly: true, Budget: -1}.Validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "budget_tokens: must be ≥ 0")
		err = Options{}.Validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "budget_tokens: must be > 0")
	})
}

// TestStaleSessionsGoBehind: a queued session that has waited StaleAfter goes behind every fresh
// one, the stale ones newest first (size ordering kept: peak/r − arrival); the oldest are then the
// lowest priority (what the shedding rule drops).
func TestStaleSessionsGoBehind(t *testing.T) {
	queue := func(c *Core, now time.Time) (order []string, stale int) {
		snap := c.Snapshot(now, true)
		for _, q := range snap.Queue {
			order = append(order, q.ID)
		}
		return order, snap.Stale
	}
	// Admission engaged from the first token (reference 1), so only the budget decides.
	c := core(t, Options{Budget: 100, ReferenceBudget: 1, Mode: ModePeak, StaleAfter: time.Minute})
	require.Equal(t, Admitted, c.Arrive(at(0), req("blocker", 100, 100)).Verdict)
	for _, q := range []struct {
		id   string
		at   float64
		peak int64
	}{{"a", 1, 30}, {"b", 10, 30}, {"big", 20, 3000}, {"d", 30, 30}} {
		require.Equal(t, Queued, c.Arrive(at(q.at), req(q.id, 10, q.peak)).Verdict)
	}
	order, stale := queue(c, at(40))
	assert.Equal(t, []string{"a", "b", "d", "big"}, order, "priority order: p = arrival + peak/30")
	assert.Zero(t, stale)

	// At 75 s a (74 s) and b (65 s) have waited a minute; big (55 s) has not, d is fresh.
	require.Equal(t, Queued, c.Arrive(at(75), req("e", 10, 30)).Verdict)
	order, stale = queue(c, at(75))
	assert.Equal(t, []string{"d", "e", "big", "b", "a"}, order, "fresh in priority order, then the stale ones newest first")
	assert.Equal(t, 2, stale)
	// At 90 s d (60 s) reaches the head and goes stale; big (70 s) is behind the fresh e and f
	// by its +100 s, and goes stale only when it reaches the head (the check is O(log n)).
	require.Equal(t, Queued, c.Arrive(at(90), req("f", 10, 30)).Verdict)
	order, stale = queue(c, at(90))
	assert.Equal(t, []string{"e", "f", "big", "d", "b", "a"}, order)
	assert.Equal(t, 3, stale)
	assert.Equal(t, uint64(3), c.Snapshot(at(90), false).Counters.Staled)

	evs := c.Shed(at(91), 2, nil, "capacity short")
	assert.Equal(t, []string{"a", "b"}, ids(evs, EventShed), "the lowest priority: the oldest stale ones")
	_, stale = queue(c, at(91))
	assert.Equal(t, 1, stale)

	// The blocker ends: its 100 tokens admit e and f (30 each); big's 3000 does not fit.
	evs = c.End(at(95), "blocker")
	assert.Equal(t, []string{"e", "f"}, ids(evs, EventAdmitted))
	order, stale = queue(c, at(95))
	assert.Equal(t, []string{"big", "d"}, order)
	assert.Equal(t, 1, stale)
	check(t, c)

	never := core(t, Options{Budget: 100, ReferenceBudget: 1, Mode: ModePeak, StaleAfter: -1})
	require.Equal(t, Admitted, never.Arrive(at(0), req("blocker", 100, 100)).Verdict)
	require.Equal(t, Queued, never.Arrive(at(1), req("a", 10, 30)).Verdict)
	require.Equal(t, Queued, never.Arrive(at(3600), req("b", 10, 30)).Verdict)
	order, stale = queue(never, at(3600))
	assert.Equal(t, []string{"a", "b"}, order, "a negative StaleAfter keeps the priority order")
	assert.Zero(t, stale)
}

func TestMerge(t *testing.T) {
	// A leader's table: a live (ctx 60), its queue holding q.
	leader := core(t, Options{Budget: 100})
	leader.Arrive(at(0), req("a", 60, 0))
	leader.Finish(at(1), "a", 60)
	require.Equal(t, Queued, leader.Arrive(at(2), req("q", 50, 0)).Verdict)

	// What a replica admitted while it could not reach the leader: b, and q (queued here).
	other := State{Live: []LiveSession{
		{ID: "b", Tenant: "t", Arrival: at(1), Admitted: at(1), LastDone: at(3), Context: 30, Peak: 30},
		{ID: "q", Arrival: at(2), Admitted: at(3), LastDone: at(3), Context: 50, Peak: 50},
		{ID: "a", Arrival: at(0), Admitted: at(0), LastDone: at(4), Context: 70, Peak: 70},
	}, Retry: map[string]time.Time{"r": at(0)}, Shed: map[string]time.Time{"s": at(1000)}}
	evs, err := leader.Merge(at(5), other)
	require.NoError(t, err)
	assert.Equal(t, []string{"q"}, ids(evs, EventAdmitted), "the queued session was admitted elsewhere: its waiter goes")
	snap := leader.Snapshot(at(5), true)
	assert.Equal(t, 3, snap.Live)
	assert.Equal(t, int64(70+30+50), snap.WorkingSet, "merged sessions are live whatever the budget; a takes the larger context")
	assert.Equal(t, 0, snap.Queued)
	assert.Equal(t, int64(100), snap.Budget, "no budget in the merged state: unchanged")
	assert.Equal(t, Refused, leader.Arrive(at(6), req("s", 1, 0)).Verdict, "shed memory merged")
	assert.Equal(t, at(0), leader.Arrive(at(6), req("r", 1, 0)).Arrival, "retry memory merged: r keeps its place")
	check(t, leader)

	// A budget in the state replaces the core's.
	_, err = leader.Merge(at(7), State{Budget: 500, ReferenceBudget: 400})
	require.NoError(t, err)
	snap = leader.Snapshot(at(7), false)
	assert.Equal(t, int64(500), snap.Budget)
	assert.Equal(t, int64(400), snap.ReferenceBudget)

	_, err = leader.Merge(at(8), State{Live: []LiveSession{{ID: "x", Context: -1}}})
	assert.ErrorContains(t, err, "live[0] (x)")
}

func TestArrivalGivenByTheCaller(t *testing.T) {
	c := core(t, Options{Budget: 100})
	c.Arrive(at(0), req("a", 100, 0))
	r := req("held", 10, 0)
	r.Arrival = at(5)
	d := c.Arrive(at(9), r)
	assert.Equal(t, Queued, d.Verdict)
	assert.Equal(t, at(5), d.Arrival, "a call held across a change of leader keeps its place in time")
	c.Cancel(at(10), "held")
	r.Arrival = at(8)
	assert.Equal(t, at(5), c.Arrive(at(11), r).Arrival, "the retry memory's earlier arrival wins")
	r2 := req("future", 10, 0)
	r2.Arrival = at(50)
	assert.Equal(t, at(12), c.Arrive(at(12), r2).Arrival, "never later than now")
}

func TestCancelAllAdmitsNoOne(t *testing.T) {
	c := core(t, Options{Budget: 100, ArrivalOrder: true})
	c.Arrive(at(0), req("a", 100, 0))
	require.Equal(t, Queued, c.Arrive(at(1), req("q1", 60, 0)).Verdict)
	require.Equal(t, Queued, c.Arrive(at(2), req("q2", 30, 0)).Verdict)
	c.Finish(at(3), "a", 50) // room for q2 (30) but not for q1 (60), which is first: nothing moves
	require.Equal(t, 2, c.Snapshot(at(3), false).Queued)
	assert.ElementsMatch(t, []string{"q1", "q2"}, c.CancelAll(at(4)))
	snap := c.Snapshot(at(4), false)
	assert.Equal(t, 1, snap.Live, "taking q1 out did not let q2 in")
	assert.Equal(t, 0, snap.Queued)
	assert.Equal(t, at(1), c.Arrive(at(5), req("q1", 60, 0)).Arrival, "each keeps its place in time")
	check(t, c)
}

// TestLiveLog: the live log numbers every change of the live set (admission, merge, end), gives
// the changes since a number while it reaches back that far, and says so when it does not.
func TestLiveLog(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c, err := New(Options{Budget: 1 << 40, LiveLog: 2})
	require.NoError(t, err)
	_, last, ok := c.LiveSince(0)
	require.True(t, ok)
	require.Zero(t, last)

	c.Arrive(t0, Request{ID: "a", FirstPrompt: 10})
	c.Arrive(t0, Request{ID: "b", FirstPrompt: 10})
	ch, last, ok := c.LiveSince(0)
	require.True(t, ok)
	assert.Equal(t, []LiveChange{{ID: "a", Live: true}, {ID: "b", Live: true}}, ch)
	assert.Equal(t, uint64(2), last)

	c.End(t0, "a")
	_, err = c.Merge(t0, State{Live: []LiveSession{{ID: "m", Context: 5}}})
	require.NoError(t, err)
	ch, last, ok = c.LiveSince(2)
	require.True(t, ok)
	assert.Equal(t, []LiveChange{{ID: "a"}, {ID: "m", Live: true}}, ch)
	assert.Equal(t, uint64(4), last)

	// Past twice its length the log is cut back to the last two: 0 is out of reach.
	c.End(t0, "b")
	_, last, ok = c.LiveSince(0)
	assert.False(t, ok, "the log no longer reaches back to 0")
	assert.Equal(t, uint64(5), last)
	ch, _, ok = c.LiveSince(3)
	require.True(t, ok)
	assert.Equal(t, []LiveChange{{ID: "m", Live: true}, {ID: "b"}}, ch)
	_, _, ok = c.LiveSince(9)
	assert.False(t, ok, "a number from another core")
	ids, last := c.LiveIDs()
	assert.Equal(t, []string{"m"}, ids)
	assert.Equal(t, uint64(5), last)

	off, err := New(Options{Budget: 1})
	require.NoError(t, err)
	_, _, ok = off.LiveSince(0)
	assert.False(t, ok, "no log kept by default")
	assert.ErrorContains(t, Options{Budget: 1, LiveLog: -1}.Validate(), "live_log")
}
