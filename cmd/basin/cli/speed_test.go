package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
)

// fastDeployment is a simulated deployment served speed times faster than real time, as `basin
// sim serve --speed` serves one: its engines announce the speed as basin_sim_speed (when
// announce), and its counters advance in its own time — 0.05 sessions arrive per second of it
// (3 a minute), 1.5 calls complete.
func fastDeployment(t *testing.T, speed float64, announce bool) *httptest.Server {
	t.Helper()
	start := time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elapsed := time.Since(start).Seconds() * speed // seconds of the deployment's time
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		sp := ""
		if announce {
			sp = fmt.Sprintf("# TYPE basin_sim_speed gauge\nbasin_sim_speed %g\n", speed)
		}
		switch r.URL.Path {
		case "/metrics/prefill-0":
			fmt.Fprintf(w, "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens 1e6\n"+
				"# TYPE sglang:realtime_tokens_total counter\n"+
				"sglang:realtime_tokens_total{mode=\"prefill_cache\"} %.0f\nsglang:realtime_tokens_total{mode=\"prefill_compute\"} %.0f\n%s",
				19_000*elapsed, 1_000*elapsed, sp)
		case "/metrics/decode-0":
			fmt.Fprintf(w, "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens 800000\n"+
				"# TYPE sglang:kv_used_tokens gauge\nsglang:kv_used_tokens 300000\n"+
				"# TYPE sglang:kv_available_tokens gauge\nsglang:kv_available_tokens 500000\n"+
				"# TYPE sglang:num_requests_total counter\nsglang:num_requests_total %.1f\n%s", 1.5*elapsed, sp)
		case "/metrics":
			fmt.Fprintf(w, "basin_gateway_working_set_tokens 1e6\nbasin_gateway_sessions_live 40\nbasin_gateway_sessions_in_call 10\n"+
				"basin_gateway_sessions_queued 0\n# TYPE basin_gateway_session_arrivals_total counter\n"+
				"basin_gateway_session_arrivals_total %.3f\n# TYPE basin_gateway_session_completions_total counter\n"+
				"basin_gateway_session_completions_total %.3f\n", 0.05*elapsed, 0.05*elapsed)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestLiveRiskUsesTheAnnouncedSpeed: `basin risk` against a deployment served at 60× reads λ per
// second of the deployment's time — 3 arrivals a minute, not 180 — because the engines announce
// the speed.
func TestLiveRiskUsesTheAnnouncedSpeed(t *testing.T) {
	dep := fastDeployment(t, 60, true)
	code, stdout, stderr := runQuick(t, 30*time.Second, "risk", "--window", "1500ms", "--json", "--metrics",
		"prefill="+dep.URL+"/metrics/prefill-0,decode="+dep.URL+"/metrics/decode-0,gateway="+dep.URL+"/metrics")
	require.Equal(t, 0, code, stderr)
	var rep struct {
		Speed float64 `json:"deployment_speed"`
		T     struct {
			ArrivalsPerMin float64 `json:"arrivals_per_min"`
		} `json:"spike_tolerance"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.Equal(t, 60.0, rep.Speed)
	assert.InDelta(t, 3, rep.T.ArrivalsPerMin, 0.3, "arrivals per minute of the deployment's time")
}

// TestDaemonWatchesTheAnnouncedSpeed: `basin daemon` against a deployment whose engines announce
// basin_sim_speed 60 runs its clock at 60× without being told — arrivals read 0.05 per second of
// the deployment's time, not 3 — and the status is in the deployment's time.
func TestDaemonWatchesTheAnnouncedSpeed(t *testing.T) {
	dep := fastDeployment(t, 60, true)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("secret-token\n"), 0o600))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg := fmt.Sprintf(`deployment: fast
listen: %s
token_file: token
data_dir: data
dry_run: true
collector:
  targets:
    - {name: prefill-0, url: "%[2]s/metrics/prefill-0", role: prefill}
    - {name: decode-0, url: "%[2]s/metrics/decode-0", role: decode}
    - {name: gateway, url: "%[2]s/metrics", role: gateway}
cron:
  daily_summary: "-"
  knee_reestimate: "-"
`, addr, dep.URL)
	path := filepath.Join(dir, "daemon.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))

	ctx, cancel := context.WithCancel(context.Background())
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, Env{Stdout: &bytes.Buffer{}, Stderr: &stderr}, []string{"daemon", "--config", path})
	}()
	defer func() { cancel(); <-done }()

	var st struct {
		Now        time.Time `json:"now"`
		Assessment struct {
			ArrivalRate float64 `json:"arrival_rate_per_s"`
		} `json:"assessment"`
	}
	started := time.Now()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/api/v1/status")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Assessment.ArrivalRate > 0 &&
			time.Since(started) > 2*time.Second
	}, 20*time.Second, 100*time.Millisecond, "daemon log:\n%s", &stderr)
	assert.InDelta(t, 0.05, st.Assessment.ArrivalRate, 0.01, "sessions per second of the deployment's time")
	assert.Greater(t, st.Now.Sub(started), time.Minute, "the status is in the deployment's time, 60× the wall clock's")
	assert.Contains(t, stderr.String(), "the deployment announces its speed")
}

// TestDeploymentSpeed: the announced speed wins; an override agreeing with it is fine, one that
// disagrees is an error naming both; without an announcement the override stands, and without
// either the speed is 1.
func TestDeploymentSpeed(t *testing.T) {
	announced := collector.AnnouncedSpeed{Speed: 60, Announced: []string{"prefill-0"}, Answered: 2, Engines: 2}
	real := collector.AnnouncedSpeed{Speed: 1, Answered: 2, Engines: 2}
	for _, tc := range []struct {
		name     string
		probe    collector.AnnouncedSpeed
		override float64
		set      bool
		want     float64
		wantErr  string
		wantLog  string
	}{
		{"announced", announced, 0, false, 60, "", "announces its speed"},
		{"override agrees", announced, 60, true, 60, "", ""},
		{"override disagrees", announced, 30, true, 0, "--clock-speed 30, but the deployment announces basin_sim_speed 60 (prefill-0)", ""},
		{"real engines", real, 0, false, 1, "", ""},
		{"real engines, override", real, 20, true, 20, "", "announce no speed"},
		{"nobody answers", collector.AnnouncedSpeed{Speed: 1, Engines: 2}, 0, false, 1, "", "no engine answered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			got, err := deploymentSpeed(tc.probe, tc.override, tc.set, slog.New(slog.NewTextHandler(&logs, nil)))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			if tc.wantLog != "" {
				assert.Contains(t, logs.String(), tc.wantLog)
			}
		})
	}
}
