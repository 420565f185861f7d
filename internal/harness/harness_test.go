package harness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

func load(t *testing.T, name string) *scenario.Scenario {
	t.Helper()
	sc, err := scenario.Load(name)
	require.NoError(t, err)
	sc.Policies = Policies{}
	return sc
}

func TestBasinPoliciesRunTheAdmissionCore(t *testing.T) {
	sc := load(t, "paper-1p3d-h200-spike300")
	for _, name := range []string{BasinCurrent, Basin, Oracle} {
		t.Run(name, func(t *testing.T) {
			o, err := sc.Options(name)
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
	_, err := sc.Options("basin-magic")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "basin-current")
	assert.NoError(t, Validate("oracle"))
	assert.Error(t, Validate("lru"))
	handled, err := Policies{}.Apply("none", &sim.Options{})
	assert.False(t, handled)
	assert.NoError(t, err)
}
