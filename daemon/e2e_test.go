package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/slack-go/slack/slacktest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/loadgen"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim/harness"
	"github.com/basin-dev/basin/sim/scenario"
	"github.com/basin-dev/basin/test/servetest"
)

// slackPosts stands in for chat.postMessage and records the posts. slacktest's own handler is
// replaced: it leaks a goroutine per post without an RTM client.
type slackPosts struct {
	mu    sync.Mutex
	texts []string
}

func (s *slackPosts) handle(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.texts = append(s.texts, r.PostForm.Get("text"))
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"ok":true,"channel":%q,"ts":"1795167000.000100"}`, r.PostForm.Get("channel"))
}

func (s *slackPosts) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.texts...)
}

// TestEndToEnd runs the daemon as `basin daemon` runs: Serve on a loopback listener, scraping the
// simulated 1P1D deployment's engines (`basin sim serve` at 200×) and a real gateway in front of
// it, acting through the gateway's admin API, posting to a Slack stand-in.
//
// The clock: the daemon is given a clock at 200×, the simulator's speed, so it scrapes, steps and times the
// detector's holds in the deployment's time and the calibration is used as measured. (On the
// wall clock instead, every hold is 200× longer in the deployment's terms: a deployment at W/C 8
// and hit rate 0.3 stays "healthy" for 15 s of wall time = 50 simulated minutes, and trapped needs
// 30 s = 100 minutes of collapse.) Interval 1 m (300 ms of wall time, the scrape timeout too)
// keeps the scrapes of a busy simulator inside their timeout on two loaded CPUs; at 20 s (100 ms)
// most steps went blind when another simulator ran beside it, as `go test ./...` does with
// lab/calibrate. Every hold of 1 m or less is then one step. Shedding is off: the
// gateway holds queued calls 5 s of wall time (17 simulated minutes), so with arrivals at 3× the
// peak it would shed, ending sessions and changing the load this test reasons about; its clock
// handling is TestHeadWaitIsTheGatewaysOwn's.
//
// The story: the load generator drives the paper's workload at 3× its base rate for 20 minutes,
// then at its base rate, through the gateway, whose budget is out of reach (1e12 tokens:
// observe-only), until the deployment is deep in the trap (working set ≥ 3.5 × cache, hit rate
// ≈ 0.3); then the daemon starts, as when basin is deployed into an incident. Started with the
// load instead, it would cap the working set at 1.1 × B_ref from its first step and the spike
// would never trap the deployment. Expected: the detector goes trapped, the policy takes the
// budget over and cuts it to 0.7 × B_ref through the admin API, holds admitted sessions' next
// calls once the arrivals are under the peak, the cache recovers, Slack hears of it in an
// operator's words, no admitted session is refused, and each action is audited once.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: a simulated deployment, a gateway, the daemon and a load generator for up to a minute")
	}
	if raceEnabled {
		t.Skip("wall-clock end to end: under the race detector the simulated deployment answers too slowly; `go test` runs it")
	}
	const speed = 200
	const spikeEnd = scenario.Duration(20 * time.Minute)
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()

	sc, err := scenario.Load("paper-1p1d-h100")
	require.NoError(t, err)
	cal, err := harness.Calibrate(sc, time.Now().UTC())
	require.NoError(t, err)
	require.NoError(t, cal.Save(filepath.Join(dir, "calibration.json")))

	sim := servetest.Start(t, speed)
	const capacity = 560_000 // paper-1p1d-h100's prefill cache

	const gwToken = "e2e-gateway-admin-token"
	gcfg, err := gateway.ParseConfig([]byte("upstreams: [" + sim.URL + "]\nmax_queue_wait: 5s\nadmission: {budget_tokens: 1000000000000}\n"))
	require.NoError(t, err)
	g, err := gateway.New(gateway.Options{Config: gcfg, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		ShutdownTimeout: 3 * time.Second, Getenv: func(k string) string {
			if k == gateway.AdminTokenEnv {
				return gwToken
			}
			return ""
		}})
	require.NoError(t, err)
	gwAPI := httptest.NewServer(g.Handler())
	t.Cleanup(gwAPI.Close)
	gwAdmin := httptest.NewServer(g.AdminHandler())
	t.Cleanup(gwAdmin.Close)
	gwCtx, gwCancel := context.WithCancel(context.Background())
	gwDone := make(chan error, 1)
	go func() { gwDone <- g.Run(gwCtx) }()
	t.Cleanup(func() {
		gwCancel()
		assert.NoError(t, <-gwDone)
	})
	gwState := func() adminapi.StateView {
		var v adminapi.StateView
		code, b := call(t, http.MethodGet, gwAdmin.URL+"/admin/state", gwToken, "")
		require.Equal(t, http.StatusOK, code, "%s", b)
		require.NoError(t, jsonUnmarshal(b, &v))
		return v
	}

	posts := &slackPosts{}
	slackSrv := slacktest.NewTestServer(func(c slacktest.Customize) { c.Handle("/chat.postMessage", posts.handle) })
	slackSrv.Start()
	t.Cleanup(slackSrv.Stop)

	// The load: the paper's workload at 3× its base rate (1.8 × the peak completion rate) for the
	// first 20 minutes, then at its base rate (0.6 × the peak): a spike whose trap outlives it.
	// Under lasting overload the policy holds nobody (remediate's TestNoHoldWhileArrivalsKeepTheTrap);
	// here the arrivals that built the trap are gone by the time the daemon acts, as when an
	// operator installs basin because the deployment is stuck.
	lsc := *sc
	lsc.Arrivals.Spikes = []scenario.Spike{{From: 0, To: spikeEnd, Multiplier: 3}}
	genDone := make(chan error, 1)
	go func() {
		_, err := loadgen.Run(ctx, loadgen.Options{Target: gwAPI.URL, Scenario: &lsc, Speed: speed, NoStream: true,
			MaxRetryWait: time.Minute, Logger: slog.New(slog.DiscardHandler)})
		genDone <- err
	}()
	t.Cleanup(func() {
		cancel()
		<-genDone
	})

	// Wait for the trap.
	for deadline := time.Now().Add(20 * time.Second); gwState().WorkingSet < 7*capacity/2; {
		require.True(t, time.Now().Before(deadline), "the load did not build a working set of 3.5 × cache")
		time.Sleep(100 * time.Millisecond)
	}
	trapAt := time.Since(start)

	for name, v := range map[string]string{"token": testToken, "gateway-token": gwToken, "slack-token": "xoxb-e2e-test"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600))
	}
	cfgYAML := fmt.Sprintf(`deployment: e2e
token_file: token
data_dir: data
calibration: calibration.json
interval: 1m
collector:
  timeout: 1m
  window: 5m
  targets:
    - {name: prefill-0, url: %q, role: prefill, dialect: sglang}
    - {name: decode-0, url: %q, role: decode, dialect: sglang}
    - {name: gateway, url: %q, role: gateway, dialect: basin-gateway}
gateway:
  admin_url: %q
  token_file: gateway-token
slack:
  bot_token_file: slack-token
  channel: C0BASIN
  api_url: %q
remediate: {disable_shedding: true}
cron: {daily_summary: "-", knee_reestimate: "-"}
`, sim.URL+"/metrics/prefill-0", sim.URL+"/metrics/decode-0", gwAdmin.URL+"/metrics", gwAdmin.URL, slackSrv.GetAPIURL())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "basin.yaml"), []byte(cfgYAML), 0o600))
	cfg, err := LoadConfig(filepath.Join(dir, "basin.yaml"))
	require.NoError(t, err)
	deployment, err := scaledclock.New(speed, nil)
	require.NoError(t, err)
	d, err := New(cfg, Options{Clock: deployment, Logger: testLogger(t)})
	require.NoError(t, err)
	ln := listen(t)
	served := make(chan error, 1)
	daemonAt := time.Now()
	go func() { served <- d.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	// Watch until the deployment is back in normal mode after the incident, or time is up. Each
	// milestone is the wall time since the daemon's start when it was first seen (-1: never).
	never := time.Duration(-1)
	budgetPost := regexp.MustCompile(`e2e: session budget (\d+) tokens → (\d+) tokens`)
	var (
		first                                   *Status // the first complete assessment
		ref, cut                                int64
		trapped, incident, recovering, restored = never, never, never, never
		states                                  []detector.State
		budgets                                 []int64
		leftPost, trappedPost, finished         bool
		takeoverPost, cutPost, holdPost         bool
		heldMax                                 int
		lastLog                                 time.Time
		reads, blindReads                       int
		lastBlind                               []string
		s                                       Status
	)
	since := func() time.Duration { return time.Since(daemonAt).Round(100 * time.Millisecond) }
	for deadline := start.Add(55 * time.Second); time.Now().Before(deadline) && !finished; time.Sleep(200 * time.Millisecond) {
		code, b := call(t, http.MethodGet, base+"/api/v1/status", "", "")
		if code != http.StatusOK {
			continue
		}
		s = Status{} // fields the JSON omits must not keep the previous reading's values
		require.NoError(t, jsonUnmarshal(b, &s))
		if first == nil && !s.Assessment.ObservedAt.IsZero() && len(s.Assessment.Blind) == 0 {
			f := s
			first, ref = &f, s.ReferenceBudget
			cut = int64(math.Round(0.7 * float64(ref)))
		}
		reads++
		if len(s.Assessment.Blind) > 0 {
			blindReads++
			lastBlind = s.Assessment.Blind
		}
		if st := s.Assessment.State; st != "" && (len(states) == 0 || states[len(states)-1] != st) {
			states = append(states, st)
		}
		gs := gwState()
		if len(budgets) == 0 || budgets[len(budgets)-1] != gs.Budget {
			budgets = append(budgets, gs.Budget)
		}
		if trapped < 0 && s.Assessment.State == detector.Trapped {
			trapped = since()
		}
		if incident < 0 && cut > 0 && s.Policy.Mode == remediate.Incident && gs.Budget <= cut {
			incident = since()
		}
		if recovering < 0 && trapped >= 0 && s.Assessment.State == detector.Recovering {
			recovering = since()
		}
		if restored < 0 && recovering >= 0 && incident >= 0 && s.Policy.Mode == remediate.Normal && gs.Budget >= ref {
			restored = since()
		}
		heldMax = max(heldMax, gs.Held)
		for _, p := range posts.got() {
			leftPost = leftPost || strings.Contains(p, "e2e: healthy → ")
			trappedPost = trappedPost || strings.Contains(p, " → trapped")
			holdPost = holdPost || strings.Contains(p, "e2e: holds: holding ")
			if m := budgetPost.FindStringSubmatch(p); m != nil {
				from, _ := strconv.ParseInt(m[1], 10, 64)
				to, _ := strconv.ParseInt(m[2], 10, 64)
				takeoverPost = takeoverPost || from == 1_000_000_000_000
				cutPost = cutPost || (cut > 0 && to <= cut && to < from)
			}
		}
		// Holds get the deployment out of the trap; the incident (and its cut) lasts until the
		// held sessions are back, which at this load takes longer than the test watches.
		finished = recovering >= 0 && heldMax > 0 && leftPost && takeoverPost && holdPost
		if time.Since(lastLog) >= time.Second {
			lastLog = time.Now()
			t.Logf("%5s %-10s mode %-9s W/C %5.2f hit %.2f | gateway B %7d W %7d live %3d held %3d queued %3d | slack %d | blind %d",
				since(), s.Assessment.State, s.Policy.Mode, s.Assessment.WorkingSetOverCache, s.Assessment.HitRate,
				gs.Budget, gs.WorkingSet, gs.Live, gs.Held, len(gs.Queue), len(posts.got()), len(s.Assessment.Blind))
		}
	}
	t.Logf("trap built in %v; since the daemon's start: trapped at %v, incident with B ≤ 0.7 × B_ref at %v, recovering at %v, "+
		"normal with B ≥ B_ref at %v; states %v; budgets %v; %d of %d status reads blind (last: %q)", trapAt.Round(100*time.Millisecond),
		trapped, incident, recovering, restored, states, budgets, blindReads, reads, lastBlind)

	require.NotNil(t, first, "the daemon never saw every signal")
	assert.Less(t, first.Assessment.HitRate, first.Assessment.CollapseHit, "the daemon started in a trap")
	assert.Greater(t, first.Assessment.WorkingSetOverCache, first.Assessment.Knee.Ratio)
	assert.EqualValues(t, capacity, ref, "B_ref = min(0.9 × knee × C, C) = C with knee %.2f", first.Assessment.Knee.Ratio)
	assert.GreaterOrEqual(t, trapped, never+1, "the detector went trapped: states %v", states)
	assert.GreaterOrEqual(t, incident, never+1, "incident mode cut the gateway's budget to 0.7 × B_ref: %v", budgets)
	assert.GreaterOrEqual(t, recovering, never+1, "the cache recovered under the cut: states %v", states)
	assert.Positive(t, heldMax, "the daemon held admitted sessions' next calls")
	assert.True(t, holdPost, "Slack got the holds in an operator's words: %q", posts.got())
	// No admitted session refused or cut: every refusal is a newcomer's first call that waited
	// max_queue_wait (5 s here, 17 minutes of the deployment's time) at the door the incident
	// closed — how many depends on how busy the machine is. Shedding is off and nothing else may
	// refuse: not a held call, not a session's later call.
	refused := gatewayRefusals(t, gwAdmin.URL+"/metrics")
	for reason, n := range refused {
		if reason != `503/queue_timeout` {
			assert.Zero(t, n, "the gateway refused calls: %s", reason)
		}
	}
	t.Logf("refusals: %v", refused)
	t.Logf("held at most %d sessions; normal with B ≥ B_ref at %v (the held sessions' return outlasts the test at this load)", heldMax, restored)
	assert.True(t, takeoverPost, "Slack got the takeover of the budget: %q", posts.got())
	assert.True(t, leftPost, "Slack got the detector leaving healthy: %q", posts.got())
	// The cut and "→ trapped" are posted too, but after a burst of five the notifier spaces posts
	// 10 s apart on the daemon's clock, a wait it sleeps on a real timer (up to 10 s of wall time
	// here), so under a loaded CPU they may come after the test is done.
	t.Logf("Slack: trapped posted %t, cut to ≤ 0.7 × B_ref posted %t", trappedPost, cutPost)

	// GET /api/v1/events while serving: each action once.
	evs := events(t, base)
	require.NotEmpty(t, done(evs, "budget"))
	noDuplicateDone(t, evs)

	cancel()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}

	// A stop between an intent and its action leaves the intent for the next start to reconcile
	// (the executor begins nothing once ctx is done): restart as an operator would, so the check
	// below sees an intent that a restart still leaves without its outcome.
	if n := pendingIntents(auditLines(t, cfg.DataDir)); n > 0 {
		t.Logf("%d intent(s) left unbegun at the stop; restarting to reconcile them", n)
		d2, err := New(cfg, Options{Clock: deployment, Logger: testLogger(t)})
		require.NoError(t, err)
		rctx, rcancel := context.WithCancel(context.Background())
		reserved := make(chan error, 1)
		go func() { reserved <- d2.Serve(rctx, listen(t)) }()
		for deadline := time.Now().Add(10 * time.Second); pendingIntents(auditLines(t, cfg.DataDir)) > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		rcancel()
		require.NoError(t, <-reserved)
	}

	// On disk after the stop: each action once, each intent with its outcome, and the last budget
	// set is the gateway's.
	recs := auditLines(t, cfg.DataDir)
	assert.GreaterOrEqual(t, len(recs), len(evs))
	noDuplicateDone(t, recs)
	oneRecordPerSeq(t, recs)
	intents := map[string]int{}
	outcomes := map[string]int{}
	for _, r := range recs {
		switch r.Phase {
		case remediate.PhaseIntent:
			intents[r.Kind]++
		case remediate.PhaseDone, remediate.PhaseFailed:
			outcomes[r.Kind]++
		}
	}
	assert.Equal(t, intents, outcomes, "every intent has its outcome")
	assert.Zero(t, intents["shed"], "shedding is off")
	budgetsDone := done(recs, "budget")
	require.NotEmpty(t, budgetsDone)
	if !assert.Equal(t, gwState().Budget, budgetsDone[len(budgetsDone)-1].Budget.To, "the gateway has the last budget set") {
		for _, r := range recs[max(0, len(recs)-6):] {
			t.Logf("audit: %+v budget %+v", r, r.Budget)
		}
	}
	assert.EqualValues(t, 1_000_000_000_000, budgetsDone[0].Budget.From, "the first action takes the budget over")
	for _, p := range posts.got() {
		t.Logf("slack: %s", p)
	}
	t.Logf("%d budget actions, %d Slack posts, %v in all", len(budgetsDone), len(posts.got()), time.Since(start).Round(100*time.Millisecond))
}

// pendingIntents counts the intents in recs without an outcome, an action being a plan's
// sequence number and kind as in remediate.Audit.Pending.
func pendingIntents(recs []remediate.Record) int {
	type action struct {
		seq  uint64
		kind string
	}
	open := map[action]bool{}
	for _, r := range recs {
		switch r.Phase {
		case remediate.PhaseIntent:
			open[action{r.Seq, r.Kind}] = true
		case remediate.PhaseDone, remediate.PhaseFailed:
			delete(open, action{r.Seq, r.Kind})
		}
	}
	return len(open)
}
