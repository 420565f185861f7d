package daemon

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/remediate"
)

func TestClockSpeedConfig(t *testing.T) {
	c, err := ParseConfig([]byte(minimalYAML))
	require.NoError(t, err)
	assert.Equal(t, 1.0, c.ClockSpeed, "real engines: the wall clock")
	c, err = ParseConfig([]byte(minimalYAML + "clock_speed: 60\n"))
	require.NoError(t, err)
	assert.Equal(t, 60.0, c.ClockSpeed)
	for _, bad := range []string{"0.5", "1001", "-3"} {
		_, err := ParseConfig([]byte(minimalYAML + "clock_speed: " + bad + "\n"))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "line 7: clock_speed: "+bad+" outside [1, 1000]")
	}
}

// TestClockSpeedRunsInDeploymentTime: at clock_speed 100 the daemon times the detector's holds
// and the policy in the deployment's time and reads rates per deployment second, so a trap is
// seen and cut after 30 s of the deployment's time (0.3 s of wall time), as on real engines.
func TestClockSpeedRunsInDeploymentTime(t *testing.T) {
	e := newEnv(t, "")
	e.cfg.ClockSpeed = 100
	d := e.daemon()
	for range 4 {
		e.step(d)
	}
	s := d.StatusNow()
	require.Empty(t, s.Assessment.Blind)
	assert.Equal(t, detector.Healthy, s.Assessment.State)
	assert.InDelta(t, 0.05, s.Assessment.ArrivalRate, 1e-6, "sessions per deployment second")
	wallStart := e.clock.Now()
	e.dep.collapse()
	s = e.stepUntil(d, 40, "incident cut", func(s Status) bool { return s.Policy.Target == testCut })
	assert.Equal(t, detector.Trapped, s.Assessment.State)
	assert.Less(t, e.clock.Now().Sub(wallStart), 2*time.Second, "minutes of deployment time in wall seconds")
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut))
}

// TestClockSpeedHeadWait: the head of the gateway's queue waited one wall second — 100 s of the
// deployment's time at clock_speed 100, far from the 15 minutes that allow shedding, although
// arrivals run above the peak completion rate. The wait must come from the gateway's own clock:
// the daemon's deployment clock minus the gateway's wall-clock arrival time would add
// (clock_speed − 1) × the time since the daemon started (here 99 × 20 s ≈ 33 min).
func TestClockSpeedHeadWait(t *testing.T) {
	e := newEnv(t, "")
	e.cfg.ClockSpeed = 100
	e.dep.arrivalRate = 0.5 // above the calibrated peak completion rate 0.2/s: shedding is allowed
	d := e.daemon()
	e.clock.Advance(20 * time.Second)
	arrived := e.clock.Now().Add(-time.Second)
	e.gw.set(func(g *fakeGateway) {
		g.queue = []admission.QueuedSession{{ID: "s1", Arrival: arrived, Priority: arrived, WaitedSeconds: 1}}
	})
	for range 8 {
		e.step(d)
	}
	var sheds []remediate.Record
	for _, r := range auditLines(t, e.cfg.DataDir) {
		if r.Kind == "shed" {
			sheds = append(sheds, r)
		}
	}
	assert.Empty(t, sheds, "shed a session that waited %v of deployment time", 100*e.clock.Now().Sub(arrived))
}

// TestClockSpeedRestartKeepsTime: the deployment's clock must not jump back when the daemon
// restarts. Clock() is d.start + speed × (now − d.start) with d.start the process's start, so a
// restarted daemon's clock starts again from the wall clock: everything persisted in deployment
// time (the detector's since, the policy's last change, a pause's end, the audit's times) is then
// in its future. Here a 30-minute pause comes back as a 2 h 8 min one. See the report.
func TestClockSpeedRestartKeepsTime(t *testing.T) {
	e := newEnv(t, "")
	e.cfg.ClockSpeed = 100
	d1 := e.daemon()
	e.clock.Advance(59 * time.Second) // 98 minutes of deployment time
	for range 4 {
		e.step(d1)
	}
	api := serveAPI(t, d1)
	code, body := call(t, http.MethodPost, api.URL+"/api/v1/pause", testToken, `{"minutes": 30, "reason": "by hand"}`)
	require.Equal(t, http.StatusOK, code, "%s", body)
	before := d1.StatusNow()
	require.NotNil(t, before.Paused)

	e.clock.Advance(time.Second) // down for a wall second
	d2 := e.daemon()
	after := d2.StatusNow()
	assert.False(t, after.Now.Before(before.Now), "BUG: the deployment clock went back from %v to %v", before.Now, after.Now)
	require.NotNil(t, after.Paused)
	assert.LessOrEqual(t, after.Paused.Until.Sub(after.Now), 30*time.Minute,
		"BUG: the pause has %v left after the restart", after.Paused.Until.Sub(after.Now))
}

// TestCollectorDefaultsFollowTheInterval: an interval under the collector's 4 s default timeout
// (or over half its 60 s default window) with no collector.timeout (window) set must still start.
// New passes the collector explicit defaults, 4 s / clock_speed and 60 s / clock_speed, instead of
// leaving the collector to derive them from the interval (min(4 s, interval), max(60 s,
// 2 × interval)), so collector.New refuses them. See the report.
func TestCollectorDefaultsFollowTheInterval(t *testing.T) {
	for _, iv := range []string{"2s", "1m"} {
		t.Run(iv, func(t *testing.T) {
			e := newEnv(t, "")
			e.cfg.Collector.Timeout, e.cfg.Collector.Window = 0, 0
			v, err := time.ParseDuration(iv)
			require.NoError(t, err)
			e.cfg.Interval = Duration(v)
			_, err = New(e.cfg, Options{Now: e.clock.Now, Gateway: e.gw})
			assert.NoError(t, err, "BUG: interval %s without collector.timeout and collector.window", iv)
		})
	}
}
