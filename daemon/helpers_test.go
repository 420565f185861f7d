package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/test/testclock"
)

// testToken is the control API token of the test daemons.
const testToken = "daemon-test-token-0123456789"

// t0 is when the test clocks start.
var t0 = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// stepEvery is the fake time between two steps: the default interval.
const stepEvery = 5 * time.Second

// budgetCall is one SetBudget the fake gateway received.
type budgetCall struct {
	Tokens, Reference int64
	Reason            string
}

// fakeGateway implements GatewayAPI: its budget follows SetBudget, and it records every call.
type fakeGateway struct {
	mu        sync.Mutex
	budget    int64
	reference int64
	queue     []adminapi.QueuedSession
	// stateErr, when set, fails State (an unreachable gateway).
	stateErr error
	// onSetBudget, when set, takes over SetBudget: it calls apply (or not) and may kill the
	// calling goroutine (runtime.Goexit) to stand for a daemon killed while the call was in flight.
	onSetBudget func(tokens int64, apply func())
	budgets     []budgetCall
	sheds       [][]string
	affinity    []bool
	// sessions are the live sessions StateSessions lists (State never does); stateSessions
	// counts those reads, holds the hold-list changes asked.
	sessions      []adminapi.LiveSession
	stateSessions int
	holds         []holdCall
	// affinityOn is the gateway's affinity switch, as GET /admin/state reports it.
	affinityOn bool
	// countOnly is admission.count_only until the first SetBudget (budget and reference read 0).
	countOnly bool
}

func newFakeGateway(budget int64) *fakeGateway {
	return &fakeGateway{budget: budget, reference: budget}
}

func (g *fakeGateway) State(context.Context) (adminapi.StateView, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stateErr != nil {
		return adminapi.StateView{}, g.stateErr
	}
	budget, reference := g.budget, g.reference
	if g.countOnly {
		budget, reference = 0, 0
	}
	return adminapi.StateView{Mode: string(admission.ModeCurrent), Budget: budget, CountOnly: g.countOnly,
		ReferenceBudget: reference, Queue: append([]adminapi.QueuedSession(nil), g.queue...),
		Affinity: adminapi.AffinityView{Enabled: g.affinityOn}}, nil
}

func (g *fakeGateway) SetBudget(_ context.Context, r adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	tokens, reason := *r.Tokens, r.Reason
	var reference int64
	if r.ReferenceTokens != nil {
		reference = *r.ReferenceTokens
	}
	var res adminapi.BudgetResult
	apply := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		res.Before = adminapi.Budget{BudgetTokens: g.budget, ReferenceBudgetTokens: g.reference, CountOnly: g.countOnly}
		g.budgets = append(g.budgets, budgetCall{Tokens: tokens, Reference: reference, Reason: reason})
		g.budget, g.reference, g.countOnly = tokens, reference, false
		res.After = adminapi.Budget{BudgetTokens: tokens, ReferenceBudgetTokens: reference}
		res.Effect = fmt.Sprintf("budget %d: admission engages once the working set passes %d", tokens, reference)
	}
	g.mu.Lock()
	hook := g.onSetBudget
	g.mu.Unlock()
	if hook != nil {
		hook(tokens, apply)
		return res, nil
	}
	apply()
	return res, nil
}

func (g *fakeGateway) Shed(_ context.Context, r adminapi.ShedRequest) (adminapi.ShedResult, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sheds = append(g.sheds, r.SessionIDs)
	return adminapi.ShedResult{Shed: r.SessionIDs}, nil
}

// holdCall is one Hold the daemon asked for.
type holdCall struct {
	Hold, Resume []string
	Reason       string
}

func (g *fakeGateway) StateSessions(ctx context.Context) (adminapi.StateView, error) {
	v, err := g.State(ctx)
	if err != nil {
		return v, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stateSessions++
	v.Sessions = append([]adminapi.LiveSession{}, g.sessions...)
	for _, s := range g.sessions {
		v.WorkingSet += s.Context
		if s.Held {
			v.Held++
			v.HeldTokens += s.Context
		}
	}
	v.Live = len(g.sessions)
	return v, nil
}

func (g *fakeGateway) Hold(_ context.Context, r adminapi.HoldRequest) (adminapi.HoldResult, error) {
	hold, resume, reason := r.Hold, r.Resume, r.Reason
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holds = append(g.holds, holdCall{Hold: hold, Resume: resume, Reason: reason})
	on := map[string]bool{}
	for _, id := range hold {
		on[id] = true
	}
	off := map[string]bool{}
	for _, id := range resume {
		off[id] = true
	}
	var res adminapi.HoldResult
	for i, s := range g.sessions {
		if on[s.ID] && !s.Held {
			g.sessions[i].Held = true
			res.Added++
		}
		if off[s.ID] && s.Held {
			g.sessions[i].Held = false
			res.Resumed++
		}
		if g.sessions[i].Held {
			res.HeldSessions++
			res.HeldTokens += s.Context
		}
	}
	return res, nil
}

func (g *fakeGateway) SetAffinity(_ context.Context, enabled bool, _ string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.affinity = append(g.affinity, enabled)
	g.affinityOn = enabled
	return nil
}

func (g *fakeGateway) Budget() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.budget
}

func (g *fakeGateway) Budgets() []budgetCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]budgetCall(nil), g.budgets...)
}

func (g *fakeGateway) set(f func(g *fakeGateway)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g)
}

// callsTo counts the SetBudget calls that set tokens.
func callsTo(calls []budgetCall, tokens int64) int {
	n := 0
	for _, c := range calls {
		if c.Tokens == tokens {
			n++
		}
	}
	return n
}

// The synthetic deployment the unit tests feed the collector: one SGLang prefill, one decode and
// the gateway. Capacity 1M tokens and a calibrated knee of 1.9 with a plateau of 0.95 make
// B_ref = min(0.9 × 1.9 × C, C) = 1M tokens, so an incident cuts the budget to 0.7 × B_ref.
const (
	testCapacity  = 1_000_000
	testReference = 1_000_000
	testCut       = 700_000
)

// exposition is the synthetic deployment's state; its counters advance with time.
type exposition struct {
	// hit is the fraction of prompt tokens served from cache from now on.
	hit float64
	// workingSet and live are the gateway's gauges.
	workingSet, live float64
	// arrivalRate is sessions per second of the deployment's time.
	arrivalRate float64
	// inCall is the gateway's sessions in a call, exported when > 0 (the lender's risk rule needs
	// it).
	inCall float64
	// quiet: no prompt, call, arrival or completion from now on (the counters stand still).
	quiet bool
	// capacity is the prefill's cache, tokens (0: testCapacity).
	capacity float64
	// Cumulative counters.
	cacheTokens, computeTokens, calls, arrivals, completions float64
}

// healthy is a deployment well under its knee (W/C 1.0 against 1.9), on its plateau.
func healthy() *exposition {
	return &exposition{hit: 0.95, workingSet: testCapacity, live: 40, arrivalRate: 0.05}
}

// collapse is the trap: the hit rate off its plateau with the working set past the knee (W/C 1.8
// against 1.9; the detector calls a collapse a trap only from 0.9 × knee·C, where a full cache
// can churn).
func (x *exposition) collapse() { x.hit, x.workingSet = 0.2, 1.8*testCapacity }

// recover is the way back to healthy().
func (x *exposition) recover() { x.hit, x.workingSet = 0.95, testCapacity }

// advance runs the deployment for d of its own time: 20k prompt tokens/s, 1.5 calls/s,
// arrivalRate sessions/s in and 0.05 out.
func (x *exposition) advance(d time.Duration) {
	s := d.Seconds()
	if x.quiet {
		return
	}
	x.cacheTokens += 20_000 * s * x.hit
	x.computeTokens += 20_000 * s * (1 - x.hit)
	x.calls += 1.5 * s
	x.arrivals += x.arrivalRate * s
	x.completions += 0.05 * s
}

func (x *exposition) cacheCapacity() int64 {
	if x.capacity > 0 {
		return int64(x.capacity)
	}
	return testCapacity
}

func (x *exposition) prefill() string {
	return fmt.Sprintf(`# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="prefill",model_name="m",tp_rank="0"} %d
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{engine_type="prefill",mode="prefill_cache",model_name="m",tp_rank="0"} %.0f
sglang:realtime_tokens_total{engine_type="prefill",mode="prefill_compute",model_name="m",tp_rank="0"} %.0f
`, x.cacheCapacity(), x.cacheTokens, x.computeTokens)
}

func (x *exposition) decode() string {
	return fmt.Sprintf(`# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="decode",model_name="m",tp_rank="0"} 800000
# TYPE sglang:kv_used_tokens gauge
sglang:kv_used_tokens{engine_type="decode",model_name="m",tp_rank="0"} 300000
# TYPE sglang:kv_available_tokens gauge
sglang:kv_available_tokens{engine_type="decode",model_name="m",tp_rank="0"} 500000
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{engine_type="decode",model_name="m",tp_rank="0"} %.0f
`, x.calls)
}

func (x *exposition) gateway() string {
	return fmt.Sprintf(`# TYPE basin_gateway_working_set_tokens gauge
basin_gateway_working_set_tokens %.0f
# TYPE basin_gateway_sessions_live gauge
basin_gateway_sessions_live %.0f
# TYPE basin_gateway_sessions_queued gauge
basin_gateway_sessions_queued 0
# TYPE basin_gateway_session_arrivals_total counter
basin_gateway_session_arrivals_total %.3f
# TYPE basin_gateway_session_completions_total counter
basin_gateway_session_completions_total %.3f
`, x.workingSet, x.live, x.arrivals, x.completions) + x.inCallText()
}

func (x *exposition) inCallText() string {
	if x.inCall <= 0 {
		return ""
	}
	return fmt.Sprintf("# TYPE basin_gateway_sessions_in_call gauge\nbasin_gateway_sessions_in_call %.0f\n", x.inCall)
}

// testTargets are the configured targets; nothing listens at their URL (port 1), the tests feed
// the collector through IngestText instead, the derivation a scrape uses, at fake times.
var testTargets = []collector.Target{
	{Name: "prefill-0", URL: "http://127.0.0.1:1/metrics/prefill-0", Role: collector.RolePrefill, Dialect: collector.DialectSGLang},
	{Name: "decode-0", URL: "http://127.0.0.1:1/metrics/decode-0", Role: collector.RoleDecode, Dialect: collector.DialectSGLang},
	{Name: "gateway", URL: "http://127.0.0.1:1/metrics", Role: collector.RoleGateway, Dialect: collector.DialectGateway},
}

// feed ingests the exposition as scraped at now.
func (x *exposition) feed(t testing.TB, d *Daemon, now time.Time) {
	t.Helper()
	for _, tg := range testTargets {
		var body string
		switch tg.Role {
		case collector.RolePrefill:
			body = x.prefill()
		case collector.RoleDecode:
			body = x.decode()
		default:
			body = x.gateway()
		}
		require.NoError(t, d.col.IngestText(now, tg, strings.NewReader(body)), tg.Name)
	}
}

// env is one test's data directory, configuration, clock, gateway and deployment. Daemons built
// from the same env share the data directory: a second one is the first restarted.
type env struct {
	t   *testing.T
	dir string
	cfg *Config
	// clock is the wall clock; speed, when set, makes the daemons' clock run that many times
	// faster (a simulated deployment served at a speed), from when the first daemon is built.
	clock *testclock.Clock
	speed float64
	// deployment is the daemons' clock, shared by every daemon built on the env: the deployment
	// keeps its time across their restarts.
	deployment *scaledclock.Clock
	gw         *fakeGateway
	dep        *exposition
	// made are the daemons built on dir, in order.
	made []*Daemon
	// log, when set, is the daemons' logger (testLogger otherwise).
	log *slog.Logger
}

// testCalibration is the synthetic deployment's calibration: knee 1.9, plateau 0.95.
func testCalibration() *detector.Calibration {
	return &detector.Calibration{Version: detector.CalibrationVersion, KneeRatio: 1.9, PlateauHit: 0.95,
		PeakCompletionRatePerS: 0.2, CallsPerSession: 30, Created: t0.Add(-24 * time.Hour), Source: "daemon tests"}
}

// baseYAML is the configuration of the unit tests' daemons; paths are relative to the env's
// directory (LoadConfig resolves them).
const baseYAML = `deployment: unit
listen: 127.0.0.1:0
token_file: token
data_dir: data
calibration: calibration.json
collector:
  window: 15s
  targets:
    - {name: prefill-0, url: "http://127.0.0.1:1/metrics/prefill-0", role: prefill, dialect: sglang}
    - {name: decode-0, url: "http://127.0.0.1:1/metrics/decode-0", role: decode, dialect: sglang}
    - {name: gateway, url: "http://127.0.0.1:1/metrics", role: gateway, dialect: basin-gateway}
gateway:
  admin_url: http://127.0.0.1:1
cron:
  daily_summary: "-"
  knee_reestimate: "-"
`

// newEnv writes the configuration (baseYAML plus extra), the token and the calibration to a
// temporary directory and loads the configuration.
func newEnv(t *testing.T, extra string) *env {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte(testToken+"\n"), 0o600))
	require.NoError(t, testCalibration().Save(filepath.Join(dir, "calibration.json")))
	path := filepath.Join(dir, "basin.yaml")
	require.NoError(t, os.WriteFile(path, []byte(baseYAML+extra), 0o600))
	cfg, err := LoadConfig(path)
	require.NoError(t, err)
	return &env{t: t, dir: dir, cfg: cfg, clock: testclock.New(t0), gw: newFakeGateway(testReference), dep: healthy()}
}

// daemon builds a daemon on the env (a restart when one was built before).
func (e *env) daemon() *Daemon {
	e.t.Helper()
	// A new daemon on the env's data directory is a restart: the earlier ones are dead, and a dead
	// process holds no lock (the restart tests "kill" a daemon by never using it again).
	for _, old := range e.made {
		require.NoError(e.t, old.unlock())
	}
	log := e.log
	if log == nil {
		log = testLogger(e.t)
	}
	d, err := New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw, Logger: log})
	require.NoError(e.t, err)
	e.made = append(e.made, d)
	return d
}

// deploymentClock is the daemons' clock: the wall clock at e.speed (1 when unset).
func (e *env) deploymentClock() *scaledclock.Clock {
	e.t.Helper()
	if e.deployment == nil {
		var err error
		e.deployment, err = scaledclock.New(max(e.speed, 1), e.clock.Now)
		require.NoError(e.t, err)
	}
	return e.deployment
}

// step advances the deployment by one interval (the wall clock by the interval ÷ the speed),
// feeds the deployment's exposition and steps d.
func (e *env) step(d *Daemon) {
	e.t.Helper()
	e.dep.advance(stepEvery)
	e.clock.Advance(e.wall(stepEvery))
	e.dep.feed(e.t, d, e.deploymentClock().Now())
	d.Step(context.Background())
}

// wall is d of the deployment's time in wall time.
func (e *env) wall(d time.Duration) time.Duration {
	return e.deploymentClock().WallDuration(d)
}

// stepUntil steps d until cond holds, at most n times, and fails otherwise.
func (e *env) stepUntil(d *Daemon, n int, what string, cond func(Status) bool) Status {
	e.t.Helper()
	for range n {
		e.step(d)
		if s := d.StatusNow(); cond(s) {
			return s
		}
	}
	s := d.StatusNow()
	e.t.Fatalf("%s: not after %d steps; state %s, mode %s, target %d, reasons %q", what, n,
		s.Assessment.State, s.Policy.Mode, s.Policy.Target, s.Assessment.Reasons)
	return s
}

// testLogger writes the daemon's log to the test's output only when BASIN_TEST_LOG is set.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("BASIN_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// listen opens a loopback listener on a free port, closed when the test ends.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// serveAPI serves d.Handler on a loopback test server.
func serveAPI(t *testing.T, d *Daemon) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(d.Handler())
	t.Cleanup(ts.Close)
	return ts
}

// call makes one request and returns the status and the body.
func call(t testing.TB, method, url, token, body string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// getJSON GETs url, requires 200 and decodes the body into v.
func getJSON(t testing.TB, url string, v any) {
	t.Helper()
	code, b := call(t, http.MethodGet, url, "", "")
	require.Equal(t, http.StatusOK, code, "%s", b)
	dec := json.NewDecoder(bytes.NewReader(b))
	require.NoError(t, dec.Decode(v), "%s", b)
}

// apiErr is the daemon's error body.
type apiErr struct {
	Error struct {
		Message string `json:"message"`
		Param   string `json:"param"`
	} `json:"error"`
}

func decodeErr(t testing.TB, b []byte) apiErr {
	t.Helper()
	var e apiErr
	require.NoError(t, json.Unmarshal(b, &e), "%s", b)
	require.NotEmpty(t, e.Error.Message, "%s", b)
	return e
}

// events reads GET /api/v1/events.
func events(t testing.TB, base string) []remediate.Record {
	t.Helper()
	var out struct {
		Events []remediate.Record `json:"events"`
	}
	getJSON(t, base+"/api/v1/events?limit=10000", &out)
	return out.Events
}

// done returns the records with phase done of a kind.
func done(recs []remediate.Record, kind string) []remediate.Record {
	var out []remediate.Record
	for _, r := range recs {
		if r.Kind == kind && r.Phase == remediate.PhaseDone {
			out = append(out, r)
		}
	}
	return out
}

// auditLines reads the audit log from disk.
func auditLines(t testing.TB, dataDir string) []remediate.Record {
	t.Helper()
	b, err := os.ReadFile(auditPath(dataDir))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []remediate.Record
	for line := range bytes.Lines(b) {
		var r remediate.Record
		require.NoError(t, json.Unmarshal(line, &r), "%s", line)
		out = append(out, r)
	}
	return out
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// gatewayRefusals reads basin_gateway_refusals_total from the gateway's admin /metrics, keyed
// "code/reason".
func gatewayRefusals(t testing.TB, url string) map[string]float64 {
	t.Helper()
	code, b := call(t, http.MethodGet, url, "", "")
	require.Equal(t, http.StatusOK, code)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	require.NoError(t, err)
	out := map[string]float64{}
	if f, ok := fams["basin_gateway_refusals_total"]; ok {
		for _, m := range f.GetMetric() {
			var code, reason string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "code":
					code = l.GetValue()
				case "reason":
					reason = l.GetValue()
				}
			}
			out[code+"/"+reason] += m.GetCounter().GetValue()
		}
	}
	return out
}
