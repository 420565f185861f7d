package harness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

func load(t *testing.T, name string) *scenario.Scenario {
	t.Helper()
	sc, err := scenario.Load(name)
	require.NoError(t, err)
	return sc
}

func TestBasinPoliciesRunTheAdmissionCore(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	sc := load(t, "paper-1p3d-h200-spike300")
	for _, name := range []string{BasinCurrent, Basin, BasinBlind, Oracle} {
		t.Run(name, func(t *testing.T) {
			o, err := scenario.Wiring{Policies: Policies{}}.Options(sc, name)
			require.NoError(t, err)
			g, ok := o.Gate.(*Gate)
			require.True(t, ok, "a basin policy puts the admission core in front of the engines")
			assert.True(t, o.PriorityQueues)
			assert.True(t, o.Deployment.Lending.Enabled)
			maxQueued := 0
			o.Controller = &sim.Controller{Every: 10 * time.Second, Tick: func(now time.Duration, c sim.Control) {
				obs := c.Observe()
				snap := g.Core().Snapshot(time.Time{}, false)
				maxQueued = max(maxQueued, obs.HeldSessions)
				assert.Equal(t, obs.HeldSessions, g.Core().QueueLen(), "sim and core agree on who waits")
				assert.Equal(t, obs.LiveSessions, snap.Live, "sim and core agree on who is live")
			}}
			s, err := sim.New(o)
			require.NoError(t, err)
			r := s.Run()
			assert.Positive(t, maxQueued, "the +300%% spike queues sessions at the gate")
			assert.Zero(t, r.Sessions.Rejected+r.Sessions.Shed, "no admitted or queued session is refused")
			assert.Greater(t, *r.HitRateEnd, 0.9, "admission keeps the deployment out of the trap")
		})
	}
}

func TestUnknownPolicies(t *testing.T) {
	sc := load(t, "paper-1p1d-h100")
	_, err := scenario.Wiring{Policies: Policies{}}.Options(sc, "basin-magic")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "basin-current")
	assert.NoError(t, Validate("oracle"))
	assert.Error(t, Validate("lru"))
	handled, err := Policies{}.Apply("none", &sim.Options{})
	assert.False(t, handled)
	assert.NoError(t, err)
}

// TestGateTracksCallStart: as the gateway does, the Gate raises a live session's context when a
// later call starts (its prompt holds the tool output since the last answer), not only when the
// answer's usage comes back.
func TestGateTracksCallStart(t *testing.T) {
	core, err := admission.New(admission.Options{Budget: 1_000_000})
	require.NoError(t, err)
	g := NewGate(core, func(s sim.SessionInfo) int64 { return int64(s.FirstPrompt) })
	require.Equal(t, sim.Admit, g.Arrive(0, sim.SessionInfo{ID: 7, FirstPrompt: 100}).Action)
	g.CallDone(time.Second, 7, 150)
	assert.EqualValues(t, 150, core.Snapshot(Epoch.Add(time.Second), false).Reserved)
	g.CallStart(2*time.Second, 7, 400)
	assert.EqualValues(t, 400, core.Snapshot(Epoch.Add(2*time.Second), false).Reserved, "the new prompt counts at once")
	g.CallDone(3*time.Second, 7, 450)
	assert.EqualValues(t, 450, core.Snapshot(Epoch.Add(3*time.Second), false).Reserved)
}
