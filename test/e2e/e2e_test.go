//go:build unix

package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	// speed is the simulated deployment's seconds per wall second. At 30 the paper's spike
	// (virtual minutes 15–25) is over 50 s after the load starts and the trap closes within
	// seconds of that, which keeps the test well within its bound; the simulator, the gateway
	// and the load generator keep up with it on two cores, one of them busy elsewhere.
	speed = 30
	// The deployment (no traffic of its own) and the two loads: the paper's workload with its
	// +100% spike, and without it.
	scenarioDeployment = "paper-1p1d-h100"
	scenarioSpike      = "paper-1p1d-h100-spike"
	scenarioBase       = "paper-1p1d-h100"
	// testBound is the whole test's budget, processes' start and stop included.
	testBound = 3 * time.Minute
	// trapBy is the virtual minute by which basin's alert must fire. The detector says drifting
	// at minute 25.6 and trapped at 27.8 in the simulator (`basin sim run --scenario
	// paper-1p1d-h100-spike`), and drifting or trapped between minutes 24 and 28 when served.
	trapBy = 45
	// conventionalBy is how long (virtual minutes) the trapped deployment is left running for
	// the conventional utilisation alerts to fire, if they are going to: the simulator's KV usage
	// first crosses 0.9 at about minute 27.5, plus the alerts' 5 minutes.
	conventionalBy = 40
	// deployment is the deployment label of examples/prometheus.yml, and so the daemon's name.
	deployment = exampleDeployment
)

// conventional are the utilisation alerts basin's must fire before (rules/basin.rules.yml,
// group conventional).
var conventional = []string{"EngineKVCacheUsageHigh", "EngineQueueLong"}

// TestObservabilityPack runs the observability pack against a simulated deployment caught in
// the cache-pressure trap, with the real Prometheus and Alertmanager, and checks what a user of
// the pack would see:
//
//	(a) every query of the generated dashboards returns data, except the ones listed in noData
//	    with the reason they cannot;
//	(b) BasinMetastableDrift or BasinTrapped fires before the conventional utilisation alerts
//	    (EngineKVCacheUsageHigh, EngineQueueLong), or those never fire;
//	(c) Alertmanager delivers it to the daemon's webhook (the daemon's status shows the alert
//	    active and its policy in incident mode) and to Slack;
//	(d) once the deployment is out of the trap, the alerts resolve, and Alertmanager tells the
//	    daemon (the incident ends) and Slack.
//
// The daemon runs with dry_run: true and the gateway's budget is out of reach, so basin watches
// but does not act. Acting from the start, basin caps the working set near its reference budget
// and the +100% spike never traps the deployment (this test with dry_run: false: the detector
// reaches pressure at virtual minute 22 and stays there to minute 45), so there is no drift to
// alert on. A dry run is also how the README introduces basin to a deployment.
//
// A trapped deployment does not recover by itself — that is the trap: an hour after the spike
// the simulator's spiked run is still stuck (`basin sim run --scenario paper-1p1d-h100-spike`,
// and the dry run of `make demo`) — and with basin only watching nothing pushes it out. So (d) ends the trap the way an operator would without
// basin: the load stops (its calls in flight are aborted), every session still live at the
// gateway is ended through the gateway's API (and at the simulator, the engines' side), and the
// workload starts again at its normal rate, which the deployment serves on its plateau. The
// detector then leaves trapped, and the alerts resolve.
func TestObservabilityPack(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: builds basin and runs a simulated deployment, Prometheus and Alertmanager for about two minutes")
	}
	if raceEnabled {
		t.Skip("end to end: the processes under test are built without the race detector; `go test` without -race runs it")
	}
	busy.Add(1) // before t.Parallel: TestReplicatedGateways waits for it
	defer busy.Done()
	t.Parallel()
	promBin, amBin := prometheusPath(t), alertmanagerPath(t)
	promtool, amtool := promtoolPath(t), amtoolPath(t)
	began := time.Now()
	end := began.Add(testBound - 15*time.Second) // leave time to stop the processes
	ctx := t.Context()
	root := moduleRoot(t)
	dir := t.TempDir()
	step := func(what string) { t.Logf("%6.1fs  %s", time.Since(began).Seconds(), what) }

	// basin, built once, and the deployment's calibration (its knee, in the deployment's time:
	// the daemon's --clock-speed converts).
	basin := basinBinary(t)
	step("built basin")
	run(t, dir, time.Minute, basin, "calibrate", "--scenario", scenarioDeployment, "-o", "calibration.json")
	step("calibrated")

	free := freeAddrs(t, 6)
	a := addrs{sim: free[0], gateway: free[1], gatewayAdmin: free[2], daemon: free[3], prometheus: free[4], alertmanager: free[5]}
	const daemonToken, adminToken = "e2e-daemon-token", "e2e-gateway-admin-token"
	writeTestFile(t, dir, "daemon-token", daemonToken+"\n")
	writeTestFile(t, dir, "admin-token", adminToken+"\n")
	slack := &slackStandIn{}
	slackSrv := httptest.NewServer(slack)
	t.Cleanup(slackSrv.Close)

	// The gateway proxies and counts but never holds anyone back (the budget is out of reach).
	// Its idle timeout is the simulator's, 10 minutes of the deployment's time: the gateway
	// divides it by the speed the simulator announces.
	writeTestFile(t, dir, "gateway.yaml", fmt.Sprintf(`listen: %s
admin_listen: %s
admin_token_file: admin-token
upstreams: ["http://%s"]
idle_timeout: 10m
max_queue_wait: %s
admission:
  budget_tokens: 1000000000000
`, a.gateway, a.gatewayAdmin, a.sim, scaleDuration(30*time.Second, speed, time.Second)))

	// The daemon: dry run, on the deployment's clock, its default matchers (basin's three alerts).
	writeTestFile(t, dir, "daemon.yaml", fmt.Sprintf(`deployment: %s
listen: %s
token_file: daemon-token
data_dir: daemon-data
dry_run: true
calibration: calibration.json
`, deployment, a.daemon)+watching(a.sim, a.gatewayAdmin, "5s"))

	// basin's rules on the deployment's clock, and the example configurations pointed at this
	// test's processes; each checked by the tool that loads it.
	rules, err := scaleRules(readFile(t, root, "rules/basin.rules.yml"), speed)
	require.NoError(t, err)
	writeTestFile(t, dir, "basin.rules.yml", string(rules))
	pcfg, err := prometheusConfig(readFile(t, root, examplePrometheus), a, "basin.rules.yml")
	require.NoError(t, err)
	writeTestFile(t, dir, "prometheus.yml", string(pcfg))
	run(t, dir, time.Minute, promtool, "check", "config", "prometheus.yml")
	acfg, err := alertmanagerConfig(readFile(t, root, exampleAlertmanager), a.daemon, filepath.Join(dir, "daemon-token"), slackSrv.URL+"/slack", speed)
	require.NoError(t, err)
	writeTestFile(t, dir, "alertmanager.yml", string(acfg))
	run(t, dir, time.Minute, amtool, "check-config", "alertmanager.yml")
	step("configurations written and checked")

	ps := newProcs(t, dir)
	sp := strconv.Itoa(speed)
	sim := ps.start("sim", basin, "sim", "serve", "--scenario", scenarioDeployment, "--speed", sp, "--listen", a.sim)
	gw := ps.start("gateway", basin, "gateway", "--config", "gateway.yaml")
	am := ps.start("alertmanager", amBin, "--config.file=alertmanager.yml", "--storage.path=alertmanager-data",
		"--web.listen-address="+a.alertmanager, "--cluster.listen-address=", "--log.level=debug")
	daemon := ps.start("daemon", basin, "daemon", "--config", "daemon.yaml", "--clock-speed", sp)
	pr := ps.start("prometheus", promBin, "--config.file=prometheus.yml", "--storage.tsdb.path=prometheus-data",
		"--web.listen-address="+a.prometheus)
	core := []*proc{sim, gw, am, daemon, pr}
	for name, u := range map[string]string{
		"sim": "http://" + a.sim + "/healthz", "gateway": "http://" + a.gatewayAdmin + "/healthz",
		"alertmanager": "http://" + a.alertmanager + "/-/ready", "daemon": "http://" + a.daemon + "/readyz",
		"prometheus": "http://" + a.prometheus + "/-/ready",
	} {
		mustWaitFor(t, began.Add(45*time.Second), name+" ready", core, func() (bool, string) { return ready(ctx, u) })
	}
	step("processes ready")

	// Prometheus scrapes every target with the labels the rules expect, and knows Alertmanager.
	p := prom{base: "http://" + a.prometheus}
	mustWaitFor(t, time.Now().Add(20*time.Second), "Prometheus' targets up", core, func() (bool, string) {
		ts, err := p.targets(ctx)
		if err != nil {
			return false, err.Error()
		}
		up := map[string]bool{}
		var bad []string
		for _, tg := range ts {
			key := tg.Labels["job"] + "/" + tg.Labels["instance"]
			if tg.Health == "up" && tg.Labels["deployment"] == deployment {
				up[key] = true
			} else {
				bad = append(bad, fmt.Sprintf("%s %s %s", key, tg.Health, tg.LastError))
			}
		}
		want := []string{"basin-daemon/" + a.daemon, "basin-gateway/" + a.gatewayAdmin, "basin-sim/prefill-0", "basin-sim/decode-0"}
		for _, w := range want {
			if !up[w] {
				return false, fmt.Sprintf("want %v up; not up: %v", want, bad)
			}
		}
		if len(ts) != len(want) {
			return false, fmt.Sprintf("targets %v", ts)
		}
		ams, err := p.alertmanagers(ctx)
		return err == nil && len(ams) == 1 && strings.Contains(ams[0], a.alertmanager), fmt.Sprintf("alertmanagers %v %v", ams, err)
	})
	step("Prometheus scrapes the daemon, the gateway and both simulated engines, and knows Alertmanager")

	// The spike.
	load := ps.start("loadgen-spike", basin, "loadgen", "--target", "http://"+a.gateway, "--scenario", scenarioSpike, "--speed", sp)
	loadStart := time.Now()
	vmin := func(at time.Time) float64 { return at.Sub(loadStart).Seconds() * speed / 60 }
	atMin := func(m float64) time.Time {
		return loadStart.Add(time.Duration(m * 60 / speed * float64(time.Second)))
	}
	step("load started: " + scenarioSpike)
	watch := append(slices.Clone(core), load)

	// (b), (c): basin's alert fires, and reaches the daemon and Slack.
	lastState := "(none)"
	status := func() (daemonStatus, error) {
		var s daemonStatus
		err := getJSON(ctx, "http://"+a.daemon+"/api/v1/status", "", &s)
		if err == nil && s.Assessment.State != lastState {
			step(fmt.Sprintf("detector: %s → %s at virtual minute %.1f", lastState, s.Assessment.State, vmin(time.Now())))
			lastState = s.Assessment.State
		}
		return s, err
	}
	var fired string // the basin alert that fired first
	mustWaitFor(t, minTime(atMin(trapBy), end), "BasinMetastableDrift or BasinTrapped firing", watch, func() (bool, string) {
		if _, err := status(); err != nil {
			return false, err.Error()
		}
		f, err := p.firing(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range []string{"BasinMetastableDrift", "BasinTrapped"} {
			if f[n] {
				fired = n
				return true, ""
			}
		}
		return false, fmt.Sprintf("firing: %v, virtual minute %.1f", keys(f), vmin(time.Now()))
	})
	step(fmt.Sprintf("%s firing at virtual minute %.1f", fired, vmin(time.Now())))

	mustWaitFor(t, minTime(time.Now().Add(30*time.Second), end), "the daemon in incident mode from Alertmanager's webhook", watch, func() (bool, string) {
		s, err := status()
		if err != nil {
			return false, err.Error()
		}
		names := s.alertNames()
		basinAlert := slices.Contains(names, "BasinMetastableDrift") || slices.Contains(names, "BasinTrapped")
		return s.Alerts.Active && basinAlert && s.Policy.Mode == "incident",
			fmt.Sprintf("alerts.active %t %v, policy mode %s, state %s", s.Alerts.Active, names, s.Policy.Mode, s.Assessment.State)
	})
	step("daemon: alerts active (delivered by Alertmanager), policy mode incident")
	// Either alert: a drift that turns into trapped within group_wait is never notified (its
	// group has nothing firing left by the time Alertmanager flushes it).
	mustWaitFor(t, minTime(time.Now().Add(30*time.Second), end), "Slack post of BasinMetastableDrift or BasinTrapped", watch, func() (bool, string) {
		return slack.posted("BasinMetastableDrift", "firing", loadStart) || slack.posted("BasinTrapped", "firing", loadStart),
			fmt.Sprintf("posts: %q", slack.titles(loadStart))
	})
	step(fmt.Sprintf("Slack stand-in: %q", slack.titles(loadStart)))
	// The example's Slack template renders the rule's annotations: its summary and its runbook.
	for _, n := range []string{"BasinMetastableDrift", "BasinTrapped"} {
		if a, ok := slack.find(n, "firing", loadStart); ok {
			runbook := "docs/runbook.md#" + strings.ToLower(n)
			assert.True(t, strings.HasSuffix(a.TitleLink, runbook), "%s: title_link %q", n, a.TitleLink)
			assert.Contains(t, a.Text, "Runbook: https://github.com/basin-dev/basin/blob/main/"+runbook, n)
			assert.Contains(t, a.Text, deployment+" is ", "%s: the summary names the deployment", n)
		}
	}

	// Give the conventional alerts their chance while the deployment stays trapped.
	waitFor(t, minTime(atMin(conventionalBy), end.Add(-60*time.Second)), watch, func() (bool, string) {
		_, _ = status()
		f, err := p.firing(ctx)
		return err == nil && f[conventional[0]] && f[conventional[1]], ""
	})
	trapEnd := time.Now()

	// Every basin alert firing now reaches the daemon (unless it stops firing first): the daemon's
	// incident comes from them.
	var held []string // basin's alerts the daemon holds while the deployment is trapped
	mustWaitFor(t, minTime(time.Now().Add(20*time.Second), end), "the daemon holding every basin alert that fires", watch, func() (bool, string) {
		s, err := status()
		if err != nil {
			return false, err.Error()
		}
		f, err := p.firing(ctx)
		if err != nil {
			return false, err.Error()
		}
		held = s.alertNames()
		for _, n := range basinAlerts {
			if f[n] && !slices.Contains(held, n) {
				return false, fmt.Sprintf("daemon holds %v, Prometheus fires %v", held, keys(f))
			}
		}
		return s.Alerts.Active && len(held) > 0 && s.Policy.Mode == "incident",
			fmt.Sprintf("alerts.active %t %v, policy mode %s", s.Alerts.Active, held, s.Policy.Mode)
	})
	step(fmt.Sprintf("(c) daemon holds %v from Alertmanager, state %s", held, lastState))

	first, err := p.firstFiring(ctx, loadStart, trapEnd)
	require.NoError(t, err)
	var names []string
	for n := range first {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return first[names[i]].Before(first[names[j]]) })
	for _, n := range names {
		t.Logf("first firing: %-28s virtual minute %5.1f", n, vmin(first[n]))
	}
	basinFirst, ok := first[fired]
	require.True(t, ok, "Prometheus has no ALERTS series of %s", fired)
	for _, n := range []string{"BasinMetastableDrift", "BasinTrapped"} {
		if at, ok := first[n]; ok && at.Before(basinFirst) {
			basinFirst = at
		}
	}
	for _, c := range conventional {
		at, ok := first[c]
		if !ok {
			t.Logf("(b) %s never fired by virtual minute %.1f", c, vmin(trapEnd))
			continue
		}
		assert.True(t, basinFirst.Before(at), "(b) %s fired at virtual minute %.1f, not after basin's alert (%.1f)", c, vmin(at), vmin(basinFirst))
		t.Logf("(b) basin's alert fired %.1f virtual minutes before %s", vmin(at)-vmin(basinFirst), c)
	}
	step(fmt.Sprintf("(b) checked at virtual minute %.1f", vmin(trapEnd)))

	// (a) Every dashboard query over the run so far, as Grafana would draw it. The interval
	// macros become the rules' 5-minute window on the deployment's clock.
	window := scaleDuration(5*time.Minute, speed, minWindow).String()
	checkDashboards(ctx, t, p, window, loadStart, time.Now())
	step("(a) dashboard queries checked")

	// (d) Out of the trap: stop the load, end every live session, start the normal load again.
	// The basin alerts firing now are the ones that must resolve after it.
	stillFiring, err := p.firing(ctx)
	require.NoError(t, err)
	trapOver := time.Now()
	load.stop()
	var gs struct {
		Live     int `json:"live_sessions"`
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	require.NoError(t, getJSON(ctx, "http://"+a.gatewayAdmin+"/admin/state", adminToken, &gs))
	ended := 0
	for _, s := range gs.Sessions {
		code, err := post(ctx, "http://"+a.gateway+"/v1/sessions/"+s.ID+"/end")
		require.NoError(t, err)
		if code == 200 {
			ended++
		}
		_, err = post(ctx, "http://"+a.sim+"/v1/sessions/"+s.ID+"/end") // 404 if it already ended there
		require.NoError(t, err)
	}
	step(fmt.Sprintf("load stopped; ended %d of %d live sessions at the gateway", ended, gs.Live))
	mustWaitFor(t, minTime(time.Now().Add(15*time.Second), end), "no live session at the gateway", core, func() (bool, string) {
		err := getJSON(ctx, "http://"+a.gatewayAdmin+"/admin/state", adminToken, &gs)
		return err == nil && gs.Live == 0, fmt.Sprintf("live %d, err %v", gs.Live, err)
	})
	base := ps.start("loadgen-base", basin, "loadgen", "--target", "http://"+a.gateway, "--scenario", scenarioBase, "--speed", sp)
	recovery := time.Now()
	step("load started again: " + scenarioBase)
	watch = append(slices.Clone(core), base)

	mustWaitFor(t, end, "basin's alerts resolved in Prometheus", watch, func() (bool, string) {
		_, _ = status()
		f, err := p.firing(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range basinAlerts {
			if f[n] {
				return false, fmt.Sprintf("firing: %v", keys(f))
			}
		}
		return true, ""
	})
	step(fmt.Sprintf("(d) basin's alerts resolved %.1fs after the restart", time.Since(recovery).Seconds()))
	// The daemon forgets an alert it has not heard about for 10 minutes; the test is far shorter,
	// so an alert gone from its status was resolved by Alertmanager's notification.
	var final daemonStatus
	mustWaitFor(t, end, "the daemon's alerts resolved by Alertmanager", watch, func() (bool, string) {
		s, err := status()
		if err != nil {
			return false, err.Error()
		}
		final = s
		return !s.Alerts.Active && len(s.Alerts.Alerts) == 0 && s.Assessment.State != "trapped",
			fmt.Sprintf("alerts.active %t %v, state %s, policy mode %s", s.Alerts.Active, s.alertNames(), s.Assessment.State, s.Policy.Mode)
	})
	step(fmt.Sprintf("(d) daemon: no alert active; detector %s, policy mode %s", final.Assessment.State, final.Policy.Mode))
	// Slack hears of the end of every alert that was firing when the trap ended and that it had
	// heard of (Alertmanager sends no resolve for an alert it never notified).
	var toSlack []string
	for _, n := range basinAlerts {
		if stillFiring[n] && slack.posted(n, "firing", loadStart) {
			toSlack = append(toSlack, n)
		}
	}
	require.NotEmpty(t, toSlack, "Slack heard of none of the basin alerts firing in the trap (%v): %q", keys(stillFiring), slack.titles(loadStart))
	mustWaitFor(t, end, fmt.Sprintf("Slack posts of %v resolved", toSlack), watch, func() (bool, string) {
		for _, n := range toSlack {
			if !slack.posted(n, "resolved", trapOver) {
				return false, fmt.Sprintf("posts since the load stopped: %q", slack.titles(trapOver))
			}
		}
		return true, ""
	})
	step(fmt.Sprintf("(d) Slack stand-in: %v resolved", toSlack))
}

// checkDashboards runs every dashboard query against Prometheus over [from, to] and requires
// data (a finite value) from each, except those in noData, which must have none.
func checkDashboards(ctx context.Context, t *testing.T, p prom, window string, from, to time.Time) {
	t.Helper()
	qs := dashboardQueries(t)
	seen := map[string]bool{}
	var missing, unexpected []string
	for _, q := range qs {
		seen[q.key] = true
		expr, err := substitute(q.expr, window)
		require.NoError(t, err, q.key)
		var has bool
		var detail string
		if q.label != "" {
			vs, err := p.labelValues(ctx, q.label, expr, from, to)
			require.NoError(t, err, "%s: %s", q.key, expr)
			has, detail = len(vs) > 0, fmt.Sprintf("%s values %v", q.label, vs)
		} else {
			ss, err := p.queryRange(ctx, expr, from, to)
			require.NoError(t, err, "%s: %s", q.key, expr)
			n := 0
			for _, s := range ss {
				_, vs := s.points()
				for _, v := range vs {
					if !math.IsNaN(v) && !math.IsInf(v, 0) {
						n++
					}
				}
			}
			has, detail = n > 0, fmt.Sprintf("%d series, %d finite samples", len(ss), n)
		}
		reason, excused := noData[q.key]
		switch {
		case excused && has:
			unexpected = append(unexpected, fmt.Sprintf("%s (listed as no data: %s) has data: %s", q.key, reason, detail))
		case !excused && !has:
			missing = append(missing, fmt.Sprintf("%s: %s (%s)", q.key, expr, detail))
		case excused:
			t.Logf("(a) no data, as expected: %s — %s", q.key, reason)
		}
	}
	for k := range noData {
		assert.True(t, seen[k], "noData names %s, which no dashboard has", k)
	}
	assert.Empty(t, missing, "(a) dashboard queries without data")
	assert.Empty(t, unexpected, "(a) queries listed in noData that have data")
	t.Logf("(a) %d dashboard queries: %d with data, %d without (listed)", len(qs), len(qs)-len(noData), len(noData))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// watching is the part of a daemon's configuration that points it at `basin sim serve` at sim and
// the gateway's admin listener at admin, with the daily jobs off; timeout, when set, is the
// collector's scrape timeout.
func watching(sim, admin, timeout string) string {
	var to string
	if timeout != "" {
		to = "\n  timeout: " + timeout
	}
	return fmt.Sprintf(`collector:%[3]s
  targets:
    - {name: prefill-0, url: "http://%[1]s/metrics/prefill-0", role: prefill, dialect: sglang}
    - {name: decode-0, url: "http://%[1]s/metrics/decode-0", role: decode, dialect: sglang}
    - {name: gateway, url: "http://%[2]s/metrics", role: gateway, dialect: basin-gateway}
gateway:
  admin_url: "http://%[2]s"
  token_file: admin-token
cron: {daily_summary: "-", knee_reestimate: "-"}
`, sim, admin, to)
}
