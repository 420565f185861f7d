package collector

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// engineBody is a unified SGLang engine that has finished calls (num_requests_total), with
// basin_sim_speed when speed is not empty.
func engineBody(calls float64, speed string) string {
	b := fmt.Sprintf(`# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified"} 100000
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{engine_type="unified"} %g
`, calls)
	if speed != "" {
		b += "# HELP basin_sim_speed Simulated seconds per wall-clock second of this simulated engine; real engines do not export it\n" +
			"# TYPE basin_sim_speed gauge\nbasin_sim_speed " + speed + "\n"
	}
	return b
}

// scaled is a clock running speed times faster than a settable wall clock, as
// internal/scaledclock's.
type scaled struct {
	wall  *clock
	start time.Time
	speed float64
}

func (s *scaled) Now() time.Time {
	return s.start.Add(time.Duration(float64(s.wall.now.Sub(s.start)) * s.speed))
}
func (s *scaled) WallDuration(d time.Duration) time.Duration {
	return time.Duration(float64(d) / s.speed)
}

// TestAnnouncedSpeed: an engine that exports basin_sim_speed is read on a clock at that speed
// (rates per second of the deployment's time); on a clock at another speed its scrapes are
// refused with an error naming the metric, never read S times off; an invalid value is an error
// naming the metric, not a silent 1; a real engine (no metric) is read on any clock.
func TestAnnouncedSpeed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		announced  string
		clockSpeed float64
		wantRate   float64 // calls per second of the clock's time; 0: the scrape is refused
		wantErr    string
	}{
		{"announced and matching", "60", 60, 1, ""},
		{"announced, clock at wall speed", "60", 1, 0, "basin_sim_speed: the engine announces 60 simulated seconds per wall second, but this reader's clock runs at 1"},
		{"real engine on a fast clock", "", 60, 1, ""},
		{"real engine on the wall clock", "", 1, 60, ""},
		{"zero", "0", 1, 0, "basin_sim_speed: got 0, want a finite number > 0"},
		{"negative", "-3", 1, 0, "basin_sim_speed: got -3"},
		{"NaN", "NaN", 1, 0, "basin_sim_speed: got NaN"},
		{"infinite", "+Inf", 1, 0, "basin_sim_speed: got +Inf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t)
			var calls float64
			srv.handle("/metrics", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				fmt.Fprint(w, engineBody(calls, tc.announced))
			})
			wall := &clock{now: t0}
			clk := &scaled{wall: wall, start: t0, speed: tc.clockSpeed}
			var logs strings.Builder
			c, reg, _ := newTest(t, Options{Targets: []Target{{Name: "engine", URL: srv.URL + "/metrics", Role: RoleUnified}},
				Now: clk.Now, WallDuration: clk.WallDuration, Logger: slogTo(&logs)})
			// The deployment completes 60 calls per wall second: 1 per second of its own time at 60×.
			// Scrapes every 100 ms of wall time: 6 s of the deployment's at 60×.
			for i := range 4 {
				if i > 0 {
					wall.now = wall.now.Add(100 * time.Millisecond)
					calls += 6
				}
				c.round(t.Context())
			}
			rate, ok := c.Snapshot().Get(CallRate)
			if tc.wantErr != "" {
				assert.False(t, ok, "no rate from a refused engine, got %v", rate)
				assert.Contains(t, logs.String(), tc.wantErr)
				n, _ := metricValue(gather(t, reg), "basin_scrape_errors_total", map[string]string{"target": "engine", "reason": "sim_speed"})
				assert.Equal(t, 4.0, n)
				return
			}
			require.True(t, ok, "call rate: %s", c.Snapshot().State(CallRate))
			assert.InDelta(t, tc.wantRate, rate, 1e-9)
		})
	}
}

// TestScrapeTimeoutIsWallTime: on a clock 60 times faster than the wall clock a scrape still has
// its Timeout of wall time (it had Timeout/60 before: a 4 s timeout became 67 ms, and a busy
// simulated engine answered too late on most scrapes).
func TestScrapeTimeoutIsWallTime(t *testing.T) {
	srv := newServer(t)
	srv.handle("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(150 * time.Millisecond)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, engineBody(1, "60"))
	})
	clk := &scaled{wall: &clock{now: time.Now()}, speed: 60}
	clk.start = clk.wall.now
	c, reg, _ := newTest(t, Options{Targets: []Target{{Name: "engine", URL: srv.URL + "/metrics", Role: RoleUnified}},
		Interval: 5 * time.Second, Timeout: 2 * time.Second, Now: clk.Now, WallDuration: clk.WallDuration})
	c.round(t.Context())
	n, _ := metricValue(gather(t, reg), "basin_scrape_errors_total", map[string]string{"target": "engine", "reason": "timeout"})
	assert.Zero(t, n, "a 150 ms answer within a 2 s wall timeout")
	assert.Equal(t, OK, c.Snapshot().State(CacheCapacity))
}

// TestProbeSpeed: the speed a deployment announces, read once before a reader sets its clock.
func TestProbeSpeed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		speeds   []string // per engine; "down" does not answer
		want     float64
		answered int
		wantErr  string
	}{
		{"real engines", []string{"", ""}, 1, 2, ""},
		{"simulated", []string{"60", "60"}, 60, 2, ""},
		{"one down", []string{"down", "30"}, 30, 1, ""},
		{"none answers", []string{"down"}, 1, 0, ""},
		{"disagree", []string{"60", "30"}, 0, 2, "basin_sim_speed: target e0 announces 60, target e1 announces 30"},
		{"invalid", []string{"0"}, 0, 1, "target e0 (http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t)
			var targets []Target
			for i, s := range tc.speeds {
				path := fmt.Sprintf("/e%d", i)
				if s != "down" {
					srv.handle(path, serveBody([]byte(engineBody(1, s))))
				}
				targets = append(targets, Target{Name: fmt.Sprintf("e%d", i), URL: srv.URL + path, Role: RoleUnified})
			}
			targets = append(targets, Target{Name: "gateway", URL: srv.URL + "/gateway-down", Role: RoleGateway})
			c, _, _ := newTest(t, Options{Targets: targets})
			got, err := c.ProbeSpeed(context.Background())
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Speed)
			assert.Equal(t, tc.answered, got.Answered)
			assert.Equal(t, len(tc.speeds), got.Engines, "the gateway is not asked")
		})
	}
}
