package gateway

import (
	"math"
	"net/http"
	"strconv"
	"sync"
)

// SimSpeedHeader is how a simulated deployment (`basin sim serve --speed S`) announces S, its
// seconds per wall-clock second, on every answer; a real engine sends no such header.
const SimSpeedHeader = "X-Basin-Sim-Speed"

// speedWatch reads the deployment's speed off the upstream's answers and gives it to the core, so
// that the idle timeout (set against the workload's tool time) is kept in the deployment's time:
// in front of `basin sim serve --speed 60` a 10-minute idle timeout is 10 s of wall time, not 10
// simulated hours. A value that is not a finite number > 0 is logged once, naming the header,
// and changes nothing. Client-facing waits stay in wall time (admission.Core.SetDeploymentSpeed).
type speedWatch struct {
	mu struct {
		sync.Mutex
		raw   string  // the last header value seen ("" before any)
		speed float64 // the speed in force (0: none announced)
	}
}

// note reads one upstream answer's header.
func (g *Gateway) noteSpeed(h http.Header) {
	raw := h.Get(SimSpeedHeader)
	if raw == "" {
		return
	}
	sw := &g.speed
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if raw == sw.mu.raw {
		return // the usual case: nothing changed
	}
	sw.mu.raw = raw
	v, err := strconv.ParseFloat(raw, 64)
	if err == nil && g.deploymentClock && v > 0 && !math.IsInf(v, 0) {
		sw.mu.speed = v // the clock runs at it already
		return
	}
	if err != nil || !g.core.SetDeploymentSpeed(v) {
		g.log.Error("the upstream announced a speed that is not a finite number > 0; the idle timeout stays as it was",
			"header", SimSpeedHeader, "value", raw, "speed_in_force", max(sw.mu.speed, 1))
		return
	}
	sw.mu.speed = v
	g.log.Info("the upstream is a simulated deployment: the idle timeout is kept in its time",
		"header", SimSpeedHeader, "speed", v, "idle_timeout_wall", g.core.IdleTimeout())
}

// deploymentSpeed is the speed in force, 0 when none was announced.
func (g *Gateway) deploymentSpeed() float64 {
	g.speed.mu.Lock()
	defer g.speed.mu.Unlock()
	return g.speed.mu.speed
}
