package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/internal/trace"
)

func TestAdminNeedsTheTokenAndChangesNothingWithout(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
	decodeCompletion(t, h.chat("live", 5, nil))
	queued := h.chatAsync(context.Background(), "queued", 5, nil)
	h.waitQueued(1)
	before := h.state()

	calls := []struct{ method, path, body string }{
		{http.MethodGet, "/admin/state", ""},
		{http.MethodPut, "/admin/budget", `{"tokens":99999999,"reason":"attack"}`},
		{http.MethodPost, "/admin/shed", `{"count":1,"reason":"attack"}`},
		{http.MethodPut, "/admin/affinity", `{"enabled":true,"reason":"attack"}`},
		{http.MethodDelete, "/admin/state", ""},
		{http.MethodGet, "/admin/", ""},
	}
	for _, c := range calls {
		for name, auth := range map[string]string{
			"no token":          "",
			"wrong token":       "Bearer not-the-token",
			"prefix of token":   "Bearer " + testToken[:10],
			"token plus suffix": "Bearer " + testToken + "x",
			"basic scheme":      "Basic " + testToken,
			"bare token":        testToken,
		} {
			t.Run(c.method+" "+c.path+" "+name, func(t *testing.T) {
				req, err := http.NewRequest(c.method, h.admin.URL+c.path, strings.NewReader(c.body))
				require.NoError(t, err)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				resp, err := h.admin.Client().Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
				assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			})
		}
	}
	after := h.state()
	assert.Equal(t, before.Budget, after.Budget)
	require.Len(t, after.Queue, 1)
	assert.Equal(t, before.Queue[0].ID, after.Queue[0].ID)
	assert.Equal(t, before.Queue[0].Priority, after.Queue[0].Priority)
	assert.Equal(t, before.Affinity, after.Affinity)
	assert.Equal(t, uint64(0), after.Counters.Shed)
	assert.NotContains(t, h.log.String(), testToken, "the token is never logged")
	assert.NotContains(t, h.log.String(), "attack")

	// The right token works; /metrics needs none.
	r := h.adminDo(http.MethodPost, "/admin/shed", testToken, `{"count":5,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"shed":["queued"],"admitted":[]}`, string(r.body))
	<-queued
	assert.Equal(t, http.StatusOK, h.adminDo(http.MethodGet, "/metrics", "", "").status)
}

func TestAdminRejectsBadBodiesNamingTheField(t *testing.T) {
	h := start(t, baseConfig(t, []string{"http://127.0.0.1:1"}, nil), nil)
	for _, tc := range []struct {
		name, method, path, body, param string
	}{
		{"budget: no tokens", http.MethodPut, "/admin/budget", `{"reason":"r"}`, "tokens"},
		{"budget: zero", http.MethodPut, "/admin/budget", `{"tokens":0,"reason":"r"}`, "tokens"},
		{"budget: string", http.MethodPut, "/admin/budget", `{"tokens":"many","reason":"r"}`, "tokens"},
		{"budget: bad reference", http.MethodPut, "/admin/budget", `{"tokens":5,"reference_tokens":-1,"reason":"r"}`, "reference_tokens"},
		{"budget: no reason", http.MethodPut, "/admin/budget", `{"tokens":5}`, "reason"},
		{"budget: blank reason", http.MethodPut, "/admin/budget", `{"tokens":5,"reason":"  "}`, "reason"},
		{"budget: unknown field", http.MethodPut, "/admin/budget", `{"tokens":5,"reason":"r","budget":3}`, "budget"},
		{"budget: not JSON", http.MethodPut, "/admin/budget", `tokens=5`, ""},
		{"budget: two objects", http.MethodPut, "/admin/budget", `{"tokens":5,"reason":"r"}{}`, ""},
		{"shed: neither", http.MethodPost, "/admin/shed", `{"reason":"r"}`, "count"},
		{"shed: both", http.MethodPost, "/admin/shed", `{"count":1,"session_ids":["a"],"reason":"r"}`, "session_ids"},
		{"shed: zero count", http.MethodPost, "/admin/shed", `{"count":0,"reason":"r"}`, "count"},
		{"shed: empty ids", http.MethodPost, "/admin/shed", `{"session_ids":[],"reason":"r"}`, "session_ids"},
		{"shed: no reason", http.MethodPost, "/admin/shed", `{"count":1}`, "reason"},
		{"affinity: missing", http.MethodPut, "/admin/affinity", `{"reason":"r"}`, "enabled"},
		{"affinity: not bool", http.MethodPut, "/admin/affinity", `{"enabled":"yes","reason":"r"}`, "enabled"},
		{"affinity: no reason", http.MethodPut, "/admin/affinity", `{"enabled":true}`, "reason"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.adminDo(tc.method, tc.path, testToken, tc.body)
			require.Equal(t, http.StatusBadRequest, r.status, "%s", r)
			e := errorOf(t, r)
			if tc.param != "" {
				require.NotNil(t, e.Param, "%s", r)
				assert.Equal(t, tc.param, *e.Param)
				assert.Contains(t, e.Message, tc.param)
			}
		})
	}
	s := h.state()
	assert.Equal(t, int64(1000000), s.Budget, "nothing changed")
	assert.False(t, s.Affinity.Enabled)
}

// TestMetricsAfterAFewCalls runs in a bubble, where a queue wait of 10 minutes and an upstream
// that takes 2 s to answer cost nothing, and every wait is known to the second.
func TestMetricsAfterAFewCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const modelTime = 2 * time.Second
		n := newMemNet()
		ok := okJSON(100, 10)
		up := newMemUpstream(t, n, func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(modelTime)
			ok(w, r)
		})
		h := startInBubble(t, n, baseConfig(t, []string{up.URL}, func(c *Config) {
			c.Admission.BudgetTokens = 1
			c.MaxQueueWait = Duration(10 * time.Minute)
			c.IdleTimeout = Duration(time.Hour) // a stays live while b waits
			c.TenantHeader = "x-tenant-id"
			c.Admission.TenantQuota = 1
		}))
		decodeCompletion(t, h.chat("a", 5, map[string]string{"x-tenant-id": "t1"}))
		decodeCompletion(t, h.chat("a", 5, map[string]string{"x-tenant-id": "t1"}))
		r := h.chat("b", 5, map[string]string{"x-tenant-id": "t2"}) // queued, times out
		require.Equal(t, http.StatusServiceUnavailable, r.status)
		r = h.chat("c", 5, map[string]string{"x-tenant-id": "t1"}) // over quota
		require.Equal(t, http.StatusTooManyRequests, r.status)
		d := h.chatAsync(context.Background(), "d", 5, map[string]string{"x-tenant-id": "t3"})
		h.waitQueued(1)
		advance(time.Minute)
		decodeCompletion(t, h.chat("a", 5, map[string]string{"x-tenant-id": "t1", "x-session-end": "true"}))
		advance(modelTime) // d's first call, admitted as a ended
		decodeCompletion(t, answeredNow(t, d))
		h.settle()
		s := h.state()

		got, _ := gather(t, h)
		for series, want := range map[string]float64{
			`basin_gateway_admissions_total{result="immediate"}`:              1, // a
			`basin_gateway_admissions_total{result="queued"}`:                 1, // d
			`basin_gateway_session_arrivals_total`:                            4, // a, b, c, d
			`basin_gateway_session_completions_total`:                         1, // a
			`basin_gateway_refusals_total{code="503",reason="queue_timeout"}`: 1, // b
			`basin_gateway_refusals_total{code="429",reason="tenant_quota"}`:  1, // c
			`basin_gateway_refusals_total{code="529",reason="shed"}`:          0,
			`basin_gateway_refusals_total{code="503",reason="shutting_down"}`: 0,
			`basin_gateway_sessions_live`:                                     1, // d
			`basin_gateway_sessions_queued`:                                   0,
			`basin_gateway_budget_tokens`:                                     1,
			`basin_gateway_reference_budget_tokens`:                           1,
			`basin_gateway_affinity_enabled`:                                  0,
			`basin_gateway_admission_count_only`:                              0,
			`basin_gateway_working_set_tokens`:                                float64(s.WorkingSet),
			`basin_gateway_reserved_tokens`:                                   float64(s.Reserved),
			`basin_gateway_queue_wait_seconds_count`:                          1, // d waited in the queue
			`basin_gateway_first_call_wait_seconds_count`:                     2, // a's and d's first calls
			`basin_gateway_session_peak_tokens_count`:                         1, // a ended
		} {
			v, ok := got[series]
			if assert.True(t, ok, "%s is exported", series) {
				assert.Equal(t, want, v, series)
			}
		}
		assert.Positive(t, got["basin_gateway_working_set_tokens"])
		// d queued for a minute and a's last call; its first call then took the model's time, as a's did.
		queued := time.Minute + modelTime
		assert.Equal(t, queued.Seconds(), got["basin_gateway_queue_wait_seconds_sum"])
		assert.Equal(t, (modelTime + queued + modelTime).Seconds(), got["basin_gateway_first_call_wait_seconds_sum"],
			"d's first-call wait includes its queueing")
		assert.Positive(t, got["basin_gateway_session_peak_tokens_sum"])

		// The same over HTTP, for Prometheus.
		r = h.adminDo(http.MethodGet, "/metrics", "", "")
		require.Equal(t, http.StatusOK, r.status)
		assert.Contains(t, string(r.body), "basin_gateway_working_set_tokens ")
	})
}

func TestStateFileRestoresLiveSessionsAcrossARestart(t *testing.T) {
	sim := startSim(t)
	state := filepath.Join(t.TempDir(), "gateway-state.json")
	cfg := baseConfig(t, []string{sim}, func(c *Config) {
		c.Admission.BudgetTokens = 1
		c.StateFile = state
	})
	h1 := start(t, cfg, nil)
	decodeCompletion(t, h1.chat("veteran", 5, nil))
	r := h1.adminDo(http.MethodPut, "/admin/affinity", testToken, `{"enabled":true,"reason":"test"}`)
	require.Equal(t, http.StatusOK, r.status)
	h1.settle()
	ws := h1.state().WorkingSet
	require.NoError(t, h1.stop())

	data, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"veteran"`)
	entries, err := os.ReadDir(filepath.Dir(state))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"gateway-state.json", "gateway-state.json.journal"}, names,
		"no temporary file is left behind")
	journal, err := os.ReadFile(state + ".journal")
	require.NoError(t, err)
	assert.Empty(t, journal, "a clean shutdown compacts the journal into the state file")

	h2 := start(t, cfg, nil)
	s := h2.state()
	assert.Equal(t, 1, s.Live)
	assert.Equal(t, ws, s.WorkingSet)
	assert.True(t, s.Affinity.Enabled, "the affinity switch survives too")

	// The veteran is live: its call passes at once even though the budget is full…
	done := h2.chatAsync(context.Background(), "veteran", 5, nil)
	select {
	case r := <-done:
		decodeCompletion(t, r)
	case <-time.After(3 * time.Second):
		t.Fatal("a session live before the restart was not let through")
	}
	assert.Empty(t, h2.state().Queue)
	assert.Equal(t, uint64(0), h2.state().Counters.Arrivals, "not treated as a new session")
	// …while a newcomer queues behind it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	newcomer := h2.chatAsync(ctx, "newcomer", 5, nil)
	h2.waitQueued(1)
	cancel()
	<-newcomer
}

func TestTraceRecordingReadsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) {
		c.Record.Path = path
		c.TenantHeader = "x-tenant-id"
	}), nil)
	for i := range 3 {
		extra := map[string]string{"x-tenant-id": "acme-corp"}
		if i == 2 {
			extra["x-session-end"] = "true"
		}
		decodeCompletion(t, h.chat("secret-session-1", 5+i, extra))
		decodeCompletion(t, h.chat("secret-session-2", 3, nil))
	}
	h.settle()
	// The same id after its session ended is a new trace session.
	decodeCompletion(t, h.chat("secret-session-1", 4, nil))
	h.settle()
	require.NoError(t, h.stop())

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, secret := range []string{"secret-session", "acme-corp", "Fix the failing test"} {
		assert.NotContains(t, string(data), secret, "no raw id, tenant or text in the trace")
	}
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sessions, err := trace.ReadBasin(f)
	require.NoError(t, err)
	require.Len(t, sessions, 3)
	byCalls := map[int][]trace.Session{}
	for _, s := range sessions {
		assert.Len(t, s.ID, 16)
		byCalls[len(s.Calls)] = append(byCalls[len(s.Calls)], s)
	}
	require.Len(t, byCalls[3], 2)
	require.Len(t, byCalls[1], 1)
	var withTenant *trace.Session
	for i := range byCalls[3] {
		if byCalls[3][i].Tenant != "" {
			withTenant = &byCalls[3][i]
		}
	}
	require.NotNil(t, withTenant, "the tenant is recorded, hashed")
	assert.Len(t, withTenant.Tenant, 16)
	assert.Equal(t, len("Fix the failing test in the parser package, please."), withTenant.TaskChars)
	for i, c := range withTenant.Calls {
		assert.Equal(t, int64(5+i), int64(c.Output), "call %d's output from usage", i)
		assert.Positive(t, c.Prompt)
		assert.False(t, c.End.Before(c.Start))
		if i > 0 {
			assert.True(t, c.Human, "the conversation ends with a user message: a person's turn")
			assert.GreaterOrEqual(t, c.GapBefore, time.Duration(0))
		}
	}
	var js map[string]any
	first := strings.SplitN(string(data), "\n", 2)[0]
	require.NoError(t, json.Unmarshal([]byte(first), &js))
	assert.NotContains(t, js, "reused_tokens")
}

// gather reads the gateway's registry into series → value, histograms as _count and _sum.
func gather(t *testing.T, h *harness) (map[string]float64, map[string]uint64) {
	t.Helper()
	mfs, err := h.reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			if len(m.GetLabel()) > 0 {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				name += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[name] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
				got[name+"_sum"] = m.GetHistogram().GetSampleSum()
				counts[name] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	return got, counts
}

// TestStateQueueTail: GET /admin/state?queue_tail=N lists only the N lowest-priority queued
// sessions and no live sessions, with the full count and the oldest wait; a bad N is a 400 naming
// the parameter.
func TestStateQueueTail(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
	decodeCompletion(t, h.chat("live", 5, nil))
	h.settle()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, id := range []string{"q1", "q2", "q3"} {
		h.chatAsync(ctx, id, 5, nil)
	}
	full := h.waitQueued(3)
	r := h.adminDo(http.MethodGet, "/admin/state?queue_tail=2", testToken, "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var v adminapi.StateView
	require.NoError(t, json.Unmarshal(r.body, &v))
	assert.Equal(t, 3, v.Queued)
	require.Len(t, v.Queue, 2)
	assert.Equal(t, []string{full.Queue[1].ID, full.Queue[2].ID}, []string{v.Queue[0].ID, v.Queue[1].ID}, "the two lowest, best first")
	assert.Empty(t, v.Sessions, "no live-session listing")
	assert.Equal(t, 1, v.Live)
	assert.GreaterOrEqual(t, v.OldestWaitSeconds, full.Queue[0].WaitedSeconds)

	for _, bad := range []string{"-1", "x", "10001"} {
		r := h.adminDo(http.MethodGet, "/admin/state?queue_tail="+bad, testToken, "")
		assert.Equal(t, http.StatusBadRequest, r.status)
		assert.Contains(t, string(r.body), `"param":"queue_tail"`)
	}
}

// TestBudgetAnswerSaysWhatTookEffect: a budget change either engages admission or its answer says
// plainly why it does not yet, and count-only mode is its own setting, shown in the state and the
// metrics, that the first budget ends.
func TestBudgetAnswerSaysWhatTookEffect(t *testing.T) {
	t.Run("count only until the first budget, which engages", func(t *testing.T) {
		up := newFakeUpstream(t, okJSON(1000, 10))
		cfg := baseConfig(t, []string{up.URL}, func(c *Config) {
			c.Admission.CountOnly, c.Admission.BudgetTokens = true, 0
		})
		h := start(t, cfg, nil)
		for i := range 3 {
			decodeCompletion(t, h.chat(fmt.Sprint("s", i), 5, nil))
		}
		h.settle()
		s := h.state()
		assert.True(t, s.CountOnly)
		assert.False(t, s.Engaged)
		assert.Equal(t, 3, s.Live)
		got, _ := gather(t, h)
		assert.Equal(t, 1.0, got["basin_gateway_admission_count_only"])

		r := h.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":100,"reason":"test: first budget"}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var ans adminapi.BudgetResult
		require.NoError(t, json.Unmarshal(r.body, &ans))
		assert.Equal(t, adminapi.Budget{CountOnly: true}, ans.Before)
		assert.Equal(t, adminapi.Budget{BudgetTokens: 100, ReferenceBudgetTokens: 100}, ans.After)
		assert.True(t, ans.Engaged)
		assert.Equal(t, int64(3030), ans.WorkingSetTokens)
		assert.Contains(t, ans.Effect, "count-only mode ended")
		assert.Contains(t, ans.Effect, "admission is engaged")
		got, _ = gather(t, h)
		assert.Equal(t, 0.0, got["basin_gateway_admission_count_only"])

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		newcomer := h.chatAsync(ctx, "newcomer", 5, nil)
		h.waitQueued(1)
		cancel()
		<-newcomer
	})
	t.Run("a budget under an out-of-reach reference says it changes nothing yet", func(t *testing.T) {
		up := newFakeUpstream(t, okJSON(1000, 10))
		h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) {
			c.Admission.BudgetTokens, c.Admission.ReferenceBudgetTokens = 1_000_000_000_000, 0
		}), nil)
		decodeCompletion(t, h.chat("s", 5, nil))
		h.settle()
		r := h.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":100,"reason":"test: manual"}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var ans adminapi.BudgetResult
		require.NoError(t, json.Unmarshal(r.body, &ans))
		assert.False(t, ans.Engaged)
		assert.Equal(t, adminapi.Budget{BudgetTokens: 100, ReferenceBudgetTokens: 1_000_000_000_000}, ans.After)
		assert.Contains(t, ans.Effect, "changes nothing yet")
		assert.Contains(t, ans.Effect, "reference budget of 1000000000000 tokens")
		assert.Contains(t, ans.Effect, "reference_tokens")
		assert.Contains(t, h.log.String(), "changes nothing yet", "the log says it too")
	})
}

// snakeCase is what every key of the admin API's JSON looks like.
var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// jsonKeys lists every object key in a JSON document with its path, recursively.
func jsonKeys(t *testing.T, body []byte) []string {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(body, &v), "%s", body)
	var out []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				out = append(out, path+"."+k)
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	walk("", v)
	return out
}

func TestAdminJSONIsSnakeCase(t *testing.T) {
	up := newFakeUpstream(t, okJSON(1000, 10))
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) {
		c.Admission.BudgetTokens = 1
		c.TenantHeader = "x-tenant-id"
	}), nil)
	decodeCompletion(t, h.chat("live", 5, map[string]string{"x-tenant-id": "acme"}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q1 := h.chatAsync(ctx, "queued-1", 5, map[string]string{"x-tenant-id": "acme"})
	q2 := h.chatAsync(ctx, "queued-2", 5, nil)
	h.waitQueued(2)

	answers := map[string][]byte{}
	get := func(name, method, path, body string, want int) {
		r := h.adminDo(method, path, testToken, body)
		require.Equal(t, want, r.status, "%s: %s", name, r)
		answers[name] = r.body
	}
	get("state", http.MethodGet, "/admin/state", "", http.StatusOK)
	get("state tail", http.MethodGet, "/admin/state?queue_tail=1", "", http.StatusOK)
	get("shed", http.MethodPost, "/admin/shed", `{"session_ids":["queued-2"],"reason":"test"}`, http.StatusOK)
	get("budget", http.MethodPut, "/admin/budget", `{"tokens":2,"reason":"test"}`, http.StatusOK)
	get("affinity", http.MethodPut, "/admin/affinity", `{"enabled":true,"reason":"test"}`, http.StatusOK)
	get("bad field", http.MethodPut, "/admin/budget", `{"tokens":"many","reason":"test"}`, http.StatusBadRequest)
	r := h.adminDo(http.MethodGet, "/admin/state", "wrong", "")
	require.Equal(t, http.StatusUnauthorized, r.status)
	answers["unauthorized"] = r.body

	for name, body := range answers {
		keys := jsonKeys(t, body)
		require.NotEmpty(t, keys, name)
		for _, k := range keys {
			last := k[strings.LastIndex(k, ".")+1:]
			assert.Regexp(t, snakeCase, last, "%s: key %s", name, k)
		}
	}
	// The populated state really has the counters, a live session and a queued one with a tenant.
	state := strings.Join(jsonKeys(t, answers["state"]), " ")
	for _, k := range []string{`\.counters\.admitted_at_once`, `\.sessions\[0\]\.context_tokens`, `\.queue\[\d\]\.tenant`,
		`\.upstreams\[0\]\.url`} {
		assert.Regexp(t, k, state)
	}
	cancel()
	<-q1
	<-q2
}

func TestAdminStateListsNoSessionsAsEmpty(t *testing.T) {
	h := start(t, baseConfig(t, []string{"http://127.0.0.1:1"}, nil), nil)
	r := h.adminDo(http.MethodGet, "/admin/state", testToken, "")
	require.Equal(t, http.StatusOK, r.status)
	var v map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(r.body, &v))
	assert.Equal(t, "[]", string(v["sessions"]), "no live session is an empty list, not null")
	assert.Equal(t, "[]", string(v["queue"]))
	r = h.adminDo(http.MethodGet, "/admin/state?queue_tail=3", testToken, "")
	require.NoError(t, json.Unmarshal(r.body, &v))
	assert.Equal(t, "null", string(v["sessions"]), "with queue_tail the live sessions are not listed")
}
