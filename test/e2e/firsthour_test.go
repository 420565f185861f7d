//go:build unix

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstHourSpeed is the simulated deployment's seconds per wall second in TestFirstHourQuiet.
const firstHourSpeed = 10

// firstHourStatus is the part of the daemon's status the test reads.
type firstHourStatus struct {
	Assessment struct {
		State       string   `json:"state"`
		Blind       []string `json:"blind"`
		Reasons     []string `json:"reasons"`
		HitEvidence struct {
			Enough bool `json:"enough"`
		} `json:"hit_evidence"`
	} `json:"assessment"`
	Policy struct {
		Mode string `json:"mode"`
	} `json:"policy"`
}

// TestFirstHourQuiet is an operator's first hour, as processes on 127.0.0.1: `basin sim serve`
// as the engine, `basin gateway` in front of it counting only (as docs/real-engines.md starts
// it), and an *acting* `basin daemon` with the deployment's calibration, all started with no
// traffic; then two tiny
// sessions ("hi", three tokens out, one call each) and two more a little later, then nothing. Every call is a first call's miss and the
// windows hold a handful of prompt tokens, so the hit rate reads 0.00 — which once took the
// daemon from healthy to trapped within 40 s and made it cut the budget. The daemon must stay out
// of drifting and trapped and out of incident mode, and once the traffic is gone it is quiet, not
// blind, and ready. Then the engine and the gateway go away: now the daemon is blind, and says so
// in its status, its metrics and its readiness.
func TestFirstHourQuiet(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: builds basin and runs a simulated deployment, the gateway and the daemon for about 40 s")
	}
	if raceEnabled {
		t.Skip("end to end: the processes under test are built without the race detector; `go test` without -race runs it")
	}
	busy.Add(1) // before t.Parallel: TestReplicatedGateways waits for it
	defer busy.Done()
	t.Parallel()
	began := time.Now()
	ctx := t.Context()
	dir := t.TempDir()
	basin := basinBinary(t)
	run(t, dir, time.Minute, basin, "calibrate", "--scenario", scenarioDeployment, "-o", "calibration.json")
	t.Logf("%.1fs built and calibrated", time.Since(began).Seconds())

	free := freeAddrs(t, 4)
	simAddr, gwAddr, gwAdmin, daemonAddr := free[0], free[1], free[2], free[3]
	const daemonToken, adminToken = "first-hour-daemon-token", "first-hour-admin-token"
	writeTestFile(t, dir, "daemon-token", daemonToken+"\n")
	writeTestFile(t, dir, "admin-token", adminToken+"\n")
	writeTestFile(t, dir, "gateway.yaml", fmt.Sprintf(`listen: %s
admin_listen: %s
admin_token_file: admin-token
upstreams: ["http://%s"]
admission:
  count_only: true
state_file: gateway-state.json
`, gwAddr, gwAdmin, simAddr))
	writeTestFile(t, dir, "daemon.yaml", fmt.Sprintf(`deployment: first-hour
listen: %s
token_file: daemon-token
data_dir: daemon-data
dry_run: false
calibration: calibration.json
`, daemonAddr)+watching(simAddr, gwAdmin, ""))

	ps := newProcs(t, dir)
	sim := ps.start("sim", basin, "sim", "serve", "--scenario", scenarioDeployment, "--speed", strconv.Itoa(firstHourSpeed), "--listen", simAddr)
	gw := ps.start("gateway", basin, "gateway", "--config", "gateway.yaml")
	daemon := ps.start("daemon", basin, "daemon", "--config", "daemon.yaml", "--clock-speed", strconv.Itoa(firstHourSpeed))
	all := []*proc{sim, gw, daemon}
	for name, u := range map[string]string{
		"sim": "http://" + simAddr + "/healthz", "gateway": "http://" + gwAdmin + "/healthz", "daemon": "http://" + daemonAddr + "/readyz",
	} {
		mustWaitFor(t, time.Now().Add(30*time.Second), name+" ready", all, func() (bool, string) { return ready(ctx, u) })
	}

	// Every status the daemon reports from here on, polled well inside its step (5 s of the
	// deployment's time, half a second here).
	var seen []firstHourStatus
	poll := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			alive(t, all...)
			var st firstHourStatus
			if err := getJSON(ctx, "http://"+daemonAddr+"/api/v1/status", "", &st); err == nil {
				seen = append(seen, st)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	poll(3 * time.Second) // 30 s of an idle deployment

	// Two tiny sessions of one call each, then two more 100 s later: every call a first call.
	chat := func(session string) {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gwAddr+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-Id", session)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	}
	for i := range 2 {
		chat(fmt.Sprintf("first-hour-%d-a", i))
		chat(fmt.Sprintf("first-hour-%d-b", i))
		poll(10 * time.Second)
	}
	// Then nothing for another 100 s of the deployment's time: the sessions idle, the hit rate of
	// no tokens goes stale.
	poll(10 * time.Second)

	require.NotEmpty(t, seen)
	var states, modes []string
	for _, st := range seen {
		if len(states) == 0 || states[len(states)-1] != st.Assessment.State {
			states = append(states, st.Assessment.State)
		}
		if len(modes) == 0 || modes[len(modes)-1] != st.Policy.Mode {
			modes = append(modes, st.Policy.Mode)
		}
	}
	assert.NotContains(t, states, "trapped", "states: %v", states)
	assert.NotContains(t, states, "drifting", "states: %v", states)
	assert.NotContains(t, modes, "incident", "policy modes: %v", modes)
	last := seen[len(seen)-1]
	assert.Empty(t, last.Assessment.Blind, "quiet is not blind: %q", last.Assessment.Reasons)
	assert.False(t, last.Assessment.HitEvidence.Enough, "a handful of tokens is no hit-rate reading")
	ok, why := ready(ctx, "http://"+daemonAddr+"/readyz")
	assert.True(t, ok, "ready while quiet: %s", why)

	// Everything it watches goes away: blind, in the status, the metrics and /readyz.
	sim.stop()
	gw.stop()
	mustWaitFor(t, time.Now().Add(20*time.Second), "the daemon blind", []*proc{daemon}, func() (bool, string) {
		var st struct {
			Blind  bool     `json:"blind"`
			Unseen []string `json:"unseen"`
		}
		if err := getJSON(ctx, "http://"+daemonAddr+"/api/v1/status", "", &st); err != nil {
			return false, err.Error()
		}
		return st.Blind && len(st.Unseen) > 0, fmt.Sprintf("blind %v, unseen %q", st.Blind, st.Unseen)
	})
	ok, why = ready(ctx, "http://"+daemonAddr+"/readyz")
	assert.False(t, ok, "not ready while blind: %s", why)
	resp, err := httpClient.Get("http://" + daemonAddr + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(metrics), `basin_blind{deployment="first-hour"} 1`)
	ok, _ = ready(ctx, "http://"+daemonAddr+"/healthz")
	assert.True(t, ok, "up all the same")

	if t.Failed() {
		var b bytes.Buffer
		for _, r := range last.Assessment.Reasons {
			fmt.Fprintln(&b, "  ", r)
		}
		t.Logf("last reasons:\n%s", b.String())
	}
}
