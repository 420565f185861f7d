package gateway

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/testclock"
)

// In front of a simulated deployment that announces its speed, the idle timeout is kept in the
// deployment's time (10 minutes at 60× is 10 s of wall time) and the speed is in /admin/state; a
// bad announcement is logged, naming the header, and changes nothing.
func TestIdleTimeoutFollowsTheAnnouncedSpeed(t *testing.T) {
	var announce atomic.Value
	announce.Store("60")
	ok := okJSON(100, 10)
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(SimSpeedHeader, announce.Load().(string))
		ok(w, r)
	})
	clock := testclock.New(time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC))
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.IdleTimeout = Duration(10 * time.Minute) }), clock.Now)

	require.Equal(t, http.StatusOK, h.chat("a", 5, nil).status)
	h.settle()
	st := h.state()
	assert.Equal(t, 60.0, st.DeploymentSpeed)
	require.Equal(t, 1, st.Live)
	clock.Advance(9 * time.Second)
	h.g.expire()
	assert.Equal(t, 1, h.state().Live, "9 s of wall time: 9 minutes of the deployment's")
	clock.Advance(2 * time.Second)
	h.g.expire()
	assert.Zero(t, h.state().Live, "11 minutes of the deployment's time: idle")

	announce.Store("fast")
	require.Equal(t, http.StatusOK, h.chat("b", 5, nil).status)
	h.settle()
	assert.Equal(t, 60.0, h.state().DeploymentSpeed, "a bad value changes nothing")
	assert.Contains(t, h.log.String(), SimSpeedHeader)
	assert.Contains(t, h.log.String(), `value=fast`)
}

// A real engine announces nothing: the idle timeout is as configured.
func TestIdleTimeoutWithoutAnAnnouncedSpeed(t *testing.T) {
	up := newFakeUpstream(t, okJSON(100, 10))
	clock := testclock.New(time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC))
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.IdleTimeout = Duration(10 * time.Minute) }), clock.Now)
	require.Equal(t, http.StatusOK, h.chat("a", 5, nil).status)
	h.settle()
	assert.Zero(t, h.state().DeploymentSpeed)
	clock.Advance(time.Minute)
	h.g.expire()
	assert.Equal(t, 1, h.state().Live)
}

// A gateway on the deployment's clock already (basin demo) shows the announced speed and does
// not divide the idle timeout by it a second time.
func TestDeploymentClockIsNotScaledTwice(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(SimSpeedHeader, "60")
		okJSON(100, 10)(w, r)
	})
	clock := testclock.New(time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC))
	cfg := baseConfig(t, []string{up.URL}, func(c *Config) { c.IdleTimeout = Duration(10 * time.Minute) })
	h := startPrepared(t, cfg, clock.Now, httptest.NewUnstartedServer(nil), func(g *Gateway) { g.deploymentClock = true })
	require.Equal(t, http.StatusOK, h.chat("a", 5, nil).status)
	h.settle()
	assert.Equal(t, 60.0, h.state().DeploymentSpeed)
	assert.Equal(t, 10*time.Minute, h.g.core.IdleTimeout())
	clock.Advance(time.Minute)
	h.g.expire()
	assert.Equal(t, 1, h.state().Live)
}
