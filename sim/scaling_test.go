package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newSim builds a run and fails the test on invalid options.
func newSim(t *testing.T, o Options) *Sim {
	t.Helper()
	s, err := New(o)
	require.NoError(t, err)
	return s
}

// stepUntil processes events one at a time until cond holds; it fails the test if the run ends
// first.
func stepUntil(t *testing.T, s *Sim, cond func() bool) {
	t.Helper()
	for !cond() {
		require.NotEmpty(t, s.evq, "the run ended before the condition held")
		s.step()
	}
}

func TestSetInstancesClampsAndCancelsStartsFirst(t *testing.T) {
	o := opts1P1D(t, 1, 1)
	o.Deployment.Scaling.StartupDelay = 2 * time.Minute
	s := newSim(t, o)
	s.RunUntil(5 * time.Minute)
	count := func(role Role) [2]int {
		r, st := s.Instances(role)
		return [2]int{r, st}
	}

	for _, role := range []Role{RolePrefill, RoleDecode} {
		for _, n := range []int{0, -3} {
			s.SetInstances(role, n)
			assert.Equal(t, [2]int{1, 0}, count(role), "%s set to %d keeps its one instance", role, n)
		}
	}
	assert.Len(t, s.prefill, 1, "a refused scale-in drains nothing")
	require.NoError(t, s.checkInvariants())
	assert.Nil(t, s.result().FirstScaleOutMin, "no instance asked for yet")

	s.SetInstances(RolePrefill, 3)
	assert.Equal(t, [2]int{1, 2}, count(RolePrefill))
	if first := s.result().FirstScaleOutMin; assert.NotNil(t, first) {
		assert.Equal(t, 5.0, *first, "the first ask, to the second")
	}
	s.RunUntil(6 * time.Minute)
	s.SetInstances(RolePrefill, 4) // asked a minute later: the newest start
	assert.Equal(t, 5.0, *s.result().FirstScaleOutMin, "a later ask does not move the first")
	s.SetInstances(RolePrefill, 3)
	assert.Equal(t, [2]int{1, 2}, count(RolePrefill))
	assert.Equal(t, []instState{instRunning, instStarting, instStarting, instGone}, s.states(RolePrefill),
		"the most recently asked-for start is cancelled first")
	require.NoError(t, s.checkInvariants())

	s.RunUntil(8*time.Minute + time.Second) // past the ready time of the two starts
	assert.Equal(t, [2]int{3, 0}, count(RolePrefill))
	s.SetInstances(RolePrefill, 5)
	s.SetInstances(RolePrefill, 2) // cancels both starts, then drains one running instance
	assert.Equal(t, [2]int{2, 0}, count(RolePrefill))
	st := s.states(RolePrefill)
	require.Len(t, st, 6)
	assert.Equal(t, []instState{instRunning, instRunning}, st[:2], "the deployment's own instance and the first started stay")
	assert.Contains(t, []instState{instDraining, instGone}, st[2], "the most recently started running instance drains")
	assert.Equal(t, []instState{instGone, instGone}, st[4:6], "both pending starts are cancelled")
	require.NoError(t, s.checkInvariants())

	assert.Panics(t, func() { s.SetInstances(Role("router"), 2) })
}

func TestStartupDelay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		role  Role
		delay time.Duration // 0: the default
	}{
		{"prefill, default delay", RolePrefill, 0},
		{"prefill, 90 s", RolePrefill, 90 * time.Second},
		{"decode, default delay", RoleDecode, 0},
		{"decode, 7 min", RoleDecode, 7 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts1P1D(t, 3, 1)
			o.Deployment.Scaling.StartupDelay = tc.delay
			want := tc.delay
			if want == 0 {
				want = DefaultStartupDelay
			}
			ask := 20 * time.Minute
			var failed error
			firstWork := time.Duration(-1)
			o.Controller = &Controller{Every: time.Second, Tick: func(now time.Duration, c Control) {
				s := c.(*Sim)
				if failed == nil {
					if err := s.checkInvariants(); err != nil {
						failed = fmt.Errorf("at %v: %w", now, err)
					}
				}
				if now == ask {
					c.SetInstances(tc.role, 2)
				}
				if now < ask {
					return
				}
				running, starting := c.Instances(tc.role)
				if now < ask+want {
					assert.Equal(t, [2]int{1, 1}, [2]int{running, starting}, "at %v", now)
				} else {
					assert.Equal(t, [2]int{2, 0}, [2]int{running, starting}, "at %v", now)
				}
				worked := false
				if tc.role == RolePrefill {
					worked = s.prefill[1].pending > 0 || s.prefill[1].st.PromptTokens > 0
				} else {
					worked = s.decode[1].reserved > 0 || s.decode[1].st.Requests > 0
				}
				if worked && firstWork < 0 {
					firstWork = now
				}
				listed := false
				for _, st := range c.Stats() {
					listed = listed || st.Role == tc.role && st.Index == 1
				}
				assert.Equal(t, now >= ask+want, listed, "a starting instance serves no metrics (at %v)", now)
			}}
			r := run(t, o)
			require.NoError(t, failed)
			require.GreaterOrEqual(t, firstWork, ask+want, "no work before the instance is ready")
			assert.Less(t, firstWork, ask+want+5*time.Minute, "the new instance takes its share once ready")
			assert.Equal(t, r.Sessions.Arrived, r.Sessions.Completed)
		})
	}
}

func TestAddedPrefillInstanceStartsCold(t *testing.T) {
	o := opts1P1D(t, 2, 1)
	o.Deployment.Scaling.StartupDelay = time.Minute
	s := newSim(t, o)
	first := s.prefill[0]
	stepUntil(t, s, func() bool { return first.st.PromptTokens > 0 })
	assert.Positive(t, first.st.CachedDevice, "a deployment's own instance counts the shared prefix as resident")

	s.RunUntil(20 * time.Minute)
	s.SetInstances(RolePrefill, 2)
	added := s.prefill[1]
	stepUntil(t, s, func() bool { return added.st.PromptTokens > 0 })
	assert.Positive(t, added.st.ComputedTokens)
	assert.Zero(t, added.st.CachedDevice+added.st.CachedHost+added.st.CachedLent,
		"the first call on an added instance finds nothing cached, not even the shared prefix")
	assert.Equal(t, added.st.PromptTokens, added.st.ComputedTokens)

	// Its second prefill finds the shared prefix the first one left.
	calls := added.st.PromptTokens
	stepUntil(t, s, func() bool { return added.st.PromptTokens > calls })
	assert.Positive(t, added.st.CachedDevice)
	require.NoError(t, s.checkInvariants())
}

func TestDrainedPrefillSessionsRecomputeElsewhere(t *testing.T) {
	o := opts1P1D(t, 4, 1)
	o.Deployment.Prefill.Instances = 2
	s := newSim(t, o)
	s.RunUntil(30 * time.Minute)
	// Sessions on prefill-1 between calls, with a prefix cached there.
	moved := map[int64]int{}
	for _, ss := range s.sessions {
		if ss.state == stLive && ss.prefill == 1 && ss.inFlight == nil && ss.gpu != nil && ss.gpu.tokens > 0 && !ss.callHeld {
			moved[ss.id] = ss.next
		}
	}
	require.NotEmpty(t, moved)
	s.SetInstances(RolePrefill, 1)
	require.Contains(t, []instState{instDraining, instGone}, s.prefill[1].state)
	drainAt := s.now

	checked := 0
	for checked < len(moved) && len(s.evq) > 0 {
		s.step()
		for _, ss := range s.sessions {
			next, ok := moved[ss.id]
			if !ok || ss.inFlight == nil || ss.next != next || ss.inFlight.stage < stagePrefill {
				continue
			}
			r := ss.inFlight
			assert.Equal(t, 0, r.p.idx, "session %d's next call goes to the running instance", ss.id)
			assert.LessOrEqual(t, r.cached, ss.spec.Shared, "session %d's prefix stayed behind: its call recomputes it", ss.id)
			delete(moved, ss.id)
			checked++
		}
		for _, ss := range s.sessions {
			if r := ss.inFlight; r != nil && r.arrive > drainAt {
				require.NotEqual(t, 1, r.p.idx, "a call routed to a draining instance")
			}
		}
	}
	require.NoError(t, s.checkInvariants())
	s.RunUntil(s.now + 10*time.Minute)
	assert.Equal(t, instGone, s.prefill[1].state)
	require.NoError(t, s.checkInvariants())
}

func TestScaleInDrainsWithoutLosingACall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		role   Role
		from   int
		to     int
		preset string
		rate   float64
	}{
		{"prefill 3 → 1", RolePrefill, 3, 1, "paper-1p3d-h200", 6},
		{"decode 3 → 1", RoleDecode, 3, 1, "paper-1p3d-h200", 6},
		{"decode 2 → 1 with lending", RoleDecode, 2, 1, "paper-1p1d-h100", 3.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts1P1D(t, 5, 1)
			o.Deployment = preset(t, tc.preset)
			o.Streams[0].RatePerMin = tc.rate
			if tc.role == RolePrefill {
				o.Deployment.Prefill.Instances = tc.from
			} else {
				o.Deployment.Decode.Instances = tc.from
				o.Deployment.Lending.Enabled = true
			}
			// The drain begins at the first second from minute 40 when the instance it will take
			// (the newest) holds work, so the test sees that work finished rather than dropped.
			drainAt := time.Duration(-1)
			var failed error
			var drained []int
			doneAfter := 0.0 // requests the drained instances finished after the drain began
			goneAt := map[int]time.Duration{}
			o.Controller = &Controller{Every: time.Second, Tick: func(now time.Duration, c Control) {
				s := c.(*Sim)
				if failed == nil {
					if err := s.checkInvariants(); err != nil {
						failed = fmt.Errorf("at %v: %w", now, err)
					}
				}
				if drainAt < 0 && now >= 40*time.Minute && s.holdsWork(tc.role, tc.from-1) {
					drainAt = now
					before := map[int]float64{}
					for i := range tc.from {
						before[i] = s.instanceRequests(tc.role, i)
					}
					c.SetInstances(tc.role, tc.to)
					for i, st := range s.states(tc.role) {
						if st == instDraining || st == instGone {
							drained = append(drained, i)
							doneAfter -= before[i]
						}
					}
				}
				for _, i := range drained {
					if _, ok := goneAt[i]; !ok && s.states(tc.role)[i] == instGone {
						goneAt[i] = now
						doneAfter += s.instanceRequests(tc.role, i)
					}
				}
				for _, ss := range s.sessions {
					r := ss.inFlight
					if drainAt < 0 || r == nil || r.arrive <= drainAt || r.killed {
						continue
					}
					for _, i := range drained {
						if tc.role == RolePrefill && r.p.idx == i || tc.role == RoleDecode && r.d.idx == i {
							failed = fmt.Errorf("at %v: a call of session %d routed to draining %s-%d", now, ss.id, tc.role, i)
						}
					}
				}
			}}
			r := run(t, o)
			require.NoError(t, failed)
			require.Len(t, drained, tc.from-tc.to)
			for _, i := range drained {
				require.Contains(t, goneAt, i, "%s-%d drained and went", tc.role, i)
			}
			assert.Greater(t, goneAt[tc.from-1], drainAt, "%s-%d, which held work, went only once it had finished it",
				tc.role, tc.from-1)
			assert.Positive(t, doneAfter, "the draining instances finished the calls they held")
			assert.Equal(t, r.Sessions.Arrived, r.Sessions.Completed, "every session completes: no call is lost or cut")
			assert.Zero(t, r.Sessions.Killed)
		})
	}
}

// holdsWork reports whether instance i of a role has calls routed to it and not yet through it.
func (s *Sim) holdsWork(role Role, i int) bool {
	if role == RolePrefill {
		return s.prefill[i].pending > 0
	}
	return s.decode[i].reserved > 0
}

// instanceRequests is the finished-request counter of instance i of a role.
func (s *Sim) instanceRequests(role Role, i int) float64 {
	if role == RolePrefill {
		return s.prefill[i].st.Requests
	}
	return s.decode[i].st.Requests
}

func TestInstanceMinutes(t *testing.T) {
	type change struct {
		at   time.Duration
		role Role
		n    int
	}
	for _, tc := range []struct {
		name             string
		changes          []change
		prefill, decode  float64 // expected over minutes 25–85; NaN: checked against the observed drain
		drainedAt, askAt time.Duration
	}{
		{name: "never scales", prefill: 60, decode: 60},
		{name: "one more prefill from minute 30", changes: []change{{30 * time.Minute, RolePrefill, 2}},
			prefill: 60 + 55, decode: 60},
		{name: "a start cancelled after a minute", changes: []change{{30 * time.Minute, RolePrefill, 3}, {31 * time.Minute, RolePrefill, 1}},
			prefill: 60 + 2, decode: 60},
		{name: "two more decode before the window", changes: []change{{10 * time.Minute, RoleDecode, 3}},
			prefill: 60, decode: 180},
		{name: "half a minute before the window", changes: []change{{24*time.Minute + 30*time.Second, RoleDecode, 2}},
			prefill: 60, decode: 120},
		{name: "a decode instance drained at minute 50", changes: []change{{5 * time.Minute, RoleDecode, 2}, {50 * time.Minute, RoleDecode, 1}},
			prefill: 60, decode: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts1P1D(t, 6, 1)
			var failed error
			goneAt := time.Duration(-1)
			o.Controller = &Controller{Every: time.Second, Tick: func(now time.Duration, c Control) {
				s := c.(*Sim)
				if failed == nil {
					if err := s.checkInvariants(); err != nil {
						failed = fmt.Errorf("at %v: %w", now, err)
					}
				}
				for _, ch := range tc.changes {
					if ch.at == now {
						c.SetInstances(ch.role, ch.n)
					}
				}
				if st := s.states(RoleDecode); len(st) > 1 && st[1] == instGone && goneAt < 0 {
					goneAt = now
				}
			}}
			r := run(t, o)
			require.NoError(t, failed)
			decode := tc.decode
			if decode < 0 {
				require.Positive(t, goneAt, "the drained instance went")
				require.Greater(t, goneAt, 50*time.Minute, "it drained its calls first")
				decode = 60 + (goneAt - 25*time.Minute).Minutes()
			}
			assert.InDelta(t, tc.prefill, r.PrefillInstanceMinutesWindow, 1e-9)
			assert.InDelta(t, decode, r.DecodeInstanceMinutesWindow, 1.0/60, "to the second the drain was seen")

			var p, d float64
			for _, m := range r.Timeline[25:85] {
				p += m.PrefillInstanceMinutes
				d += m.DecodeInstanceMinutes
				assert.LessOrEqual(t, m.PrefillBusy, 1.0)
			}
			assert.InDelta(t, r.PrefillInstanceMinutesWindow, p, 1e-9, "the timeline adds up to the window")
			assert.InDelta(t, r.DecodeInstanceMinutesWindow, d, 1e-9)
			last := r.Timeline[len(r.Timeline)-1]
			assert.InDelta(t, float64(last.PrefillInstances), last.PrefillInstanceMinutes, 1e-9,
				"a minute without a change charges its count")
		})
	}
}

func TestStartupDelayValidation(t *testing.T) {
	d := preset(t, "paper-1p1d-h100")
	d.Scaling.StartupDelay = -time.Second
	err := d.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "deployment.scaling.startup_delay")
	d.Scaling.StartupDelay = 0
	assert.NoError(t, d.Validate(), "zero is the default")
}
