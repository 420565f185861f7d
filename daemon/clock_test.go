package daemon

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/remediate"
)

// TestClockSpeedKeyRemoved: clock_speed is no longer a key of the daemon's configuration (the
// clock is injected); an old file that still sets it is told so, at its line, with the file's
// other problems kept. Under another key it is an unknown key like any other.
func TestClockSpeedKeyRemoved(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"top level", minimalYAML + "clock_speed: 60\n",
			[]string{"line 7: clock_speed: removed: ", "`basin demo` injects"}},
		{"with another unknown key", minimalYAML + "clock_speed: 1\nintervl: 5s\n",
			[]string{"line 7: clock_speed: removed: ", `line 8: unknown key "intervl"`}},
		{"nested", minimalYAML + "slack:\n  clock_speed: 60\n", []string{`line 8: unknown key "clock_speed"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			if tc.name == "nested" {
				assert.NotContains(t, err.Error(), "removed")
			}
		})
	}
}

// TestScaledClockRunsInDeploymentTime: on a clock 100 times faster than the wall clock (a
// simulated deployment served at 100×) the daemon times the detector's holds and the policy in
// the deployment's time and reads rates per deployment second, so a trap is seen and cut after
// 30 s of the deployment's time (0.3 s of wall time), as on real engines.
func TestScaledClockRunsInDeploymentTime(t *testing.T) {
	e := newEnv(t, "")
	e.speed = 100
	d := e.daemon()
	for range 4 {
		e.step(d)
	}
	s := d.StatusNow()
	require.Empty(t, s.Assessment.Blind)
	assert.Equal(t, detector.Healthy, s.Assessment.State)
	assert.InDelta(t, 0.05, s.Assessment.ArrivalRate, 1e-6, "sessions per deployment second")
	assert.Equal(t, t0.Add(4*stepEvery), s.Now.UTC(), "the status is in the deployment's time")
	wallStart := e.clock.Now()
	e.dep.collapse()
	s = e.stepUntil(d, 40, "incident cut", func(s Status) bool { return s.Policy.Target == testCut })
	assert.Equal(t, detector.Trapped, s.Assessment.State)
	assert.Less(t, e.clock.Now().Sub(wallStart), 2*time.Second, "minutes of deployment time in wall seconds")
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut))
}

// TestHeadWaitIsTheGatewaysOwn: the wait of the head of the gateway's queue is read as the gateway
// reports it, in seconds of the gateway's clock — the deployment's, which a gateway in front of a
// simulated deployment served at a speed is given too. With arrivals above the peak completion
// rate, a head that waited 100 s is far from the 15 minutes that allow shedding, whatever the
// daemon's clock speed; one that waited 20 minutes is shed.
func TestHeadWaitIsTheGatewaysOwn(t *testing.T) {
	for _, tc := range []struct {
		waited time.Duration
		shed   bool
	}{
		{100 * time.Second, false},
		{20 * time.Minute, true},
	} {
		t.Run(tc.waited.String(), func(t *testing.T) {
			e := newEnv(t, "")
			e.speed = 100
			e.dep.arrivalRate = 0.5 // above the calibrated peak completion rate 0.2/s: shedding is allowed
			d := e.daemon()
			e.clock.Advance(20 * time.Second) // 33 minutes of the deployment's time since the daemon started
			arrived := e.deploymentClock().Now().Add(-tc.waited)
			e.gw.set(func(g *fakeGateway) {
				g.queue = []adminapi.QueuedSession{{ID: "s1", Arrival: arrived, Priority: arrived, WaitedSeconds: tc.waited.Seconds()}}
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
			assert.Equal(t, tc.shed, len(sheds) > 0, "sheds %+v", sheds)
		})
	}
}

// TestRestartKeepsTheDeploymentsTime: a daemon restarted on the same clock (the deployment keeps
// running while it is away) must not see the deployment's time go back, nor a pause grow: a
// 30-minute pause has at most 30 minutes left after the restart. (The clock anchored at each
// daemon's start, as a clock_speed did before the state file carried it, brought a 30-minute pause
// back as a 2 h 8 min one.)
func TestRestartKeepsTheDeploymentsTime(t *testing.T) {
	e := newEnv(t, "")
	e.speed = 100
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

	e.clock.Advance(time.Second) // down for a wall second: 100 s of the deployment's time
	d2 := e.daemon()
	after := d2.StatusNow()
	assert.Equal(t, 100*time.Second, after.Now.Sub(before.Now), "the deployment's time ran on while the daemon was away")
	require.NotNil(t, after.Paused)
	assert.Equal(t, 30*time.Minute-100*time.Second, after.Paused.Until.Sub(after.Now), "the pause's time left")
}

// TestCollectorDefaultsFollowTheInterval: an interval under the collector's 4 s default timeout
// (or over half its 60 s default window) with no collector.timeout (window) set must still start:
// the collector derives its defaults from the interval (CollectorDefaults).
func TestCollectorDefaultsFollowTheInterval(t *testing.T) {
	for _, iv := range []string{"2s", "1m"} {
		t.Run(iv, func(t *testing.T) {
			e := newEnv(t, "")
			e.cfg.Collector.Timeout, e.cfg.Collector.Window = 0, 0
			v, err := time.ParseDuration(iv)
			require.NoError(t, err)
			e.cfg.Interval = Duration(v)
			_, err = New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw})
			assert.NoError(t, err, "interval %s without collector.timeout and collector.window", iv)
		})
	}
}

// TestAlertsKeepWallTime: on a clock 100 times faster than the wall clock an Alertmanager alert
// lives in wall time — its endsAt is Alertmanager's wall clock, its lifetime without one is
// measured against the route's repeat_interval — so one wall minute (100 minutes of the
// deployment's) after firing it is still active, and it expires 10 wall minutes after the last
// notification. (On the deployment's clock it expired 6 wall seconds after firing.)
func TestAlertsKeepWallTime(t *testing.T) {
	e := newEnv(t, "")
	e.speed = 100
	d := e.daemon()
	api := serveAPI(t, d)
	firing, err := os.ReadFile("../remediate/alerts/testdata/firing.json")
	require.NoError(t, err)
	code, body := call(t, http.MethodPost, api.URL+"/api/v1/alerts", testToken, string(firing))
	require.Equal(t, http.StatusOK, code, "%s", body)
	// An alert Alertmanager says ends five wall minutes from now.
	ends := strings.Replace(string(firing), `"endsAt": "0001-01-01T00:00:00Z"`,
		`"endsAt": "`+e.clock.Now().Add(5*time.Minute).UTC().Format(time.RFC3339Nano)+`"`, 1)
	ends = strings.Replace(ends, "a04e51d1b80f119d", "0000000000000001", 1)
	ends = strings.Replace(ends, `"alertname": "BasinTrapped"`, `"alertname": "BasinMetastableDrift"`, 1)
	code, body = call(t, http.MethodPost, api.URL+"/api/v1/alerts", testToken, ends)
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.Len(t, d.StatusNow().Alerts.Alerts, 3)

	e.clock.Advance(time.Minute) // 100 minutes of the deployment's time
	s := d.StatusNow()
	assert.True(t, s.Alerts.Active, "a wall minute after firing")
	assert.Len(t, s.Alerts.Alerts, 3, "the alert with endsAt in five wall minutes too")
	e.clock.Advance(5 * time.Minute)
	assert.Len(t, d.StatusNow().Alerts.Alerts, 2, "past its endsAt")
	e.clock.Advance(4*time.Minute + time.Second)
	assert.False(t, d.StatusNow().Alerts.Active, "10 wall minutes after the last notification")
}
