package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/client"
)

// testToken is the admin token of the test gateways.
const testToken = "client-test-admin-token-0123456789"

// The remediation executor switches affinity through this one-method interface; the client must
// keep satisfying it.
var _ interface {
	SetAffinity(ctx context.Context, enabled bool, reason string) error
} = (*client.Client)(nil)

// testGateway is a real gateway (gateway.New, its Run loop going) on loopback servers, in front of
// a fake upstream that answers every chat call with 100 prompt + 10 completion tokens.
type testGateway struct {
	api, admin *httptest.Server
}

// startGateway starts a gateway with the given budget; now may be nil for the wall clock.
func startGateway(t *testing.T, budget int64, now func() time.Time) *testGateway {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,`+
			`"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}`)
	}))
	t.Cleanup(up.Close)
	cfg, err := gateway.ParseConfig(fmt.Appendf(nil,
		"upstreams: [%s]\nmax_queue_wait: 30s\nadmission:\n  budget_tokens: %d\n", up.URL, budget))
	require.NoError(t, err)
	g, err := gateway.New(gateway.Options{Config: cfg, Now: now, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 3 * time.Second,
		Getenv: func(k string) string {
			if k == gateway.AdminTokenEnv {
				return testToken
			}
			return ""
		}})
	require.NoError(t, err)
	tg := &testGateway{api: httptest.NewServer(g.Handler()), admin: httptest.NewServer(g.AdminHandler())}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel() // answers the calls still queued
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Error("gateway Run did not return")
		}
		tg.api.Close()
		tg.admin.Close()
	})
	return tg
}

// client is an admin client for tg with the right token.
func (tg *testGateway) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{BaseURL: tg.admin.URL, Token: testToken})
	require.NoError(t, err)
	return c
}

// chat makes a model call for session id through the gateway, in the background, and delivers
// its status.
func (tg *testGateway) chat(t *testing.T, id string) <-chan int {
	t.Helper()
	ch := make(chan int, 1)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tg.api.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"Fix the failing test, please."}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", id)
	go func() {
		resp, err := tg.api.Client().Do(req)
		if err != nil {
			ch <- -1
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ch <- resp.StatusCode
	}()
	return ch
}

// status waits for a call's status.
func status(t *testing.T, ch <-chan int) int {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("the call was not answered")
		return 0
	}
}

// waitState polls the state through c until cond holds.
func waitState(t *testing.T, c *client.Client, what string, cond func(adminapi.StateView) bool) adminapi.StateView {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := c.State(context.Background())
		require.NoError(t, err)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// withQueue fills a budget-1 gateway: one live session, then q1, q2, q3 queued in that order, their
// calls held. It returns the held calls by session.
func withQueue(t *testing.T, tg *testGateway, c *client.Client) map[string]<-chan int {
	t.Helper()
	require.Equal(t, http.StatusOK, status(t, tg.chat(t, "live")))
	held := map[string]<-chan int{}
	for i, id := range []string{"q1", "q2", "q3"} {
		held[id] = tg.chat(t, id)
		waitState(t, c, fmt.Sprintf("%d queued", i+1), func(v adminapi.StateView) bool { return len(v.Queue) == i+1 })
	}
	return held
}

// budgetReq is PUT /admin/budget's body; a zero reference is left out, which leaves the gateway's
// reference budget as it is, and a zero budget is sent, for the gateway to refuse.
func budgetReq(tokens, reference int64, reason string) adminapi.BudgetRequest {
	r := adminapi.BudgetRequest{Tokens: &tokens, Reason: reason}
	if reference != 0 {
		r.ReferenceTokens = &reference
	}
	return r
}

// shedReq is POST /admin/shed's body: ids as given (nil: not given), count when not zero.
func shedReq(ids []string, count int, reason string) adminapi.ShedRequest {
	r := adminapi.ShedRequest{SessionIDs: ids, Reason: reason}
	if count != 0 {
		r.Count = &count
	}
	return r
}

// holdReq is POST /admin/holds' body.
func holdReq(hold, resume []string, reason string) adminapi.HoldRequest {
	return adminapi.HoldRequest{Hold: hold, Resume: resume, Reason: reason}
}

func queueIDs(v adminapi.StateView) []string {
	ids := []string{}
	for _, q := range v.Queue {
		ids = append(ids, q.ID)
	}
	return ids
}

func TestNewValidatesOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    client.Options
		want []string // substrings of the error; none: valid
	}{
		{"valid", client.Options{BaseURL: "http://127.0.0.1:8081", Token: "t"}, nil},
		{"https with a path prefix", client.Options{BaseURL: "https://gw.example/basin/", Token: "t",
			Timeout: time.Second}, nil},
		{"token with its file's newline", client.Options{BaseURL: "http://gw:8081", Token: "t\n"}, nil},
		{"no url", client.Options{Token: "t"}, []string{"BaseURL: required"}},
		{"not http", client.Options{BaseURL: "ftp://gw:8081", Token: "t"}, []string{"BaseURL: want an http or https URL"}},
		{"host:port without scheme", client.Options{BaseURL: "127.0.0.1:8081", Token: "t"}, []string{"BaseURL"}},
		{"no host", client.Options{BaseURL: "http:///admin", Token: "t"}, []string{"BaseURL: no host"}},
		{"credentials in url", client.Options{BaseURL: "http://admin:pw@gw:8081", Token: "t"}, []string{"BaseURL: must not carry credentials"}},
		{"query", client.Options{BaseURL: "http://gw:8081/?x=1", Token: "t"}, []string{"BaseURL: must not have a query"}},
		{"no token", client.Options{BaseURL: "http://gw:8081"}, []string{"Token: required"}},
		{"blank token", client.Options{BaseURL: "http://gw:8081", Token: " \n"}, []string{"Token: required"}},
		{"control character in token", client.Options{BaseURL: "http://gw:8081", Token: "se\x00cret"}, []string{"Token: contains control characters"}},
		{"negative timeout", client.Options{BaseURL: "http://gw:8081", Token: "t", Timeout: -time.Second}, []string{"Timeout: must be ≥ 0"}},
		{"every field at once", client.Options{BaseURL: "gopher://x", Timeout: -1}, []string{"BaseURL", "Token", "Timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New(tc.o)
			if tc.want == nil {
				require.NoError(t, err)
				assert.NotNil(t, c)
				return
			}
			require.Error(t, err)
			assert.Nil(t, c)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "se\x00cret", "a bad token is not echoed")
		})
	}
}

func TestTheTokenIsNeverPrinted(t *testing.T) {
	o := client.Options{BaseURL: "http://gw:8081", Token: testToken}
	c, err := client.New(o)
	require.NoError(t, err)
	for _, s := range []string{fmt.Sprint(o), fmt.Sprintf("%+v", o), fmt.Sprint(c), fmt.Sprintf("%+v", c)} {
		assert.NotContains(t, s, testToken)
	}
	assert.Contains(t, fmt.Sprint(c), "http://gw:8081")
}

func TestStateRoundTrip(t *testing.T) {
	now := time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC)
	tg := startGateway(t, 250000, func() time.Time { return now })
	v, err := tg.client(t).State(context.Background())
	require.NoError(t, err)
	assert.True(t, now.Equal(v.Now), "the gateway's clock: %s", v.Now)
	assert.Equal(t, "current", string(v.Mode))
	assert.Equal(t, int64(250000), v.Budget)
	assert.Equal(t, int64(250000), v.ReferenceBudget)
	assert.Zero(t, v.Live)
	assert.Empty(t, v.Queue)
	assert.False(t, v.Affinity.Enabled)
	assert.Equal(t, gateway.DefaultAffinityHeader, v.Affinity.Header)
	require.Len(t, v.Upstreams, 1)
	assert.True(t, strings.HasPrefix(v.Upstreams[0].URL, "http://127.0.0.1:"), v.Upstreams[0].URL)
}

// TestStateReadsTheSnakeCaseAPI reads a state as the gateway writes it, every key snake_case.
func TestStateReadsTheSnakeCaseAPI(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"mode":"current","count_only":true,"budget_tokens":0,"reference_budget_tokens":0,`+
			`"live_sessions":0,"sessions":[],"queue":[],"counters":{"arrivals":7,"admitted_at_once":5,`+
			`"admitted_from_queue":1,"queued":2,"over_quota":1,"refused":0,"shed":1,"cancelled":0,"ended":4}}`)
	}))
	t.Cleanup(ts.Close)
	c, err := client.New(client.Options{BaseURL: ts.URL, Token: "t"})
	require.NoError(t, err)
	v, err := c.State(context.Background())
	require.NoError(t, err)
	assert.True(t, v.CountOnly)
	assert.Equal(t, uint64(7), v.Counters.Arrivals)
	assert.Equal(t, uint64(5), v.Counters.AdmittedAtOnce)
	assert.Equal(t, uint64(1), v.Counters.AdmittedFromQueue)
	assert.Equal(t, uint64(1), v.Counters.OverQuota)
	assert.Equal(t, uint64(4), v.Counters.Ended)
	assert.NotNil(t, v.Sessions)
}

func TestSetBudgetChangesTheBudget(t *testing.T) {
	for _, tc := range []struct {
		name             string
		tokens, ref      int64
		wantBudget, wRef int64
	}{
		{"budget only keeps the reference", 500000, 0, 500000, 1000000},
		{"budget and reference", 400000, 300000, 400000, 300000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startGateway(t, 1000000, nil).client(t)
			r, err := c.SetBudget(context.Background(), budgetReq(tc.tokens, tc.ref, "test: capacity changed"))
			require.NoError(t, err)
			assert.Equal(t, adminapi.Budget{BudgetTokens: 1000000, ReferenceBudgetTokens: 1000000}, r.Before)
			assert.Equal(t, adminapi.Budget{BudgetTokens: tc.wantBudget, ReferenceBudgetTokens: tc.wRef}, r.After)
			assert.Empty(t, r.Admitted)
			assert.False(t, r.Engaged, "nothing is live")
			assert.Contains(t, r.Effect, "admission is not engaged")

			v, err := c.State(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.wantBudget, v.Budget)
			assert.Equal(t, tc.wRef, v.ReferenceBudget)
		})
	}
}

func TestSetBudgetAdmitsTheQueue(t *testing.T) {
	tg := startGateway(t, 1, nil)
	c := tg.client(t)
	held := withQueue(t, tg, c)

	r, err := c.SetBudget(context.Background(), budgetReq(1000000, 1000000, "test: capacity restored"))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"q1", "q2", "q3"}, r.Admitted)
	assert.Equal(t, int64(1), r.Before.BudgetTokens)
	for id, ch := range held {
		assert.Equal(t, http.StatusOK, status(t, ch), "%s's held call goes through", id)
	}
	v, err := c.State(context.Background())
	require.NoError(t, err)
	assert.Empty(t, v.Queue)
	assert.Equal(t, 4, v.Live)
}

func TestShedQueuedSessions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ids   []string
		count int
		// want is the sessions shed, given the queue in priority order (highest first).
		want func(queue []string) []string
	}{
		{"by count, lowest priority first", nil, 1, func(q []string) []string { return q[len(q)-1:] }},
		{"by count beyond the queue", nil, 10, func(q []string) []string { return q }},
		{"by ids, unknown ones skipped", []string{"q2", "nobody", "live"}, 0, func([]string) []string { return []string{"q2"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := startGateway(t, 1, nil)
			c := tg.client(t)
			held := withQueue(t, tg, c)
			before, err := c.State(context.Background())
			require.NoError(t, err)
			want := tc.want(queueIDs(before))

			r, err := c.Shed(context.Background(), shedReq(tc.ids, tc.count, "test: capacity lost"))
			require.NoError(t, err)
			assert.ElementsMatch(t, want, r.Shed)
			assert.Empty(t, r.Admitted, "the budget is still full")

			for _, id := range want {
				assert.Equal(t, 529, status(t, held[id]), "%s's held call is refused", id)
			}
			after, err := c.State(context.Background())
			require.NoError(t, err)
			assert.Len(t, after.Queue, 3-len(want))
			for _, id := range want {
				assert.NotContains(t, queueIDs(after), id)
			}
			assert.Equal(t, 1, after.Live, "a live session is never shed")
			assert.Equal(t, uint64(len(want)), after.Counters.Shed)
		})
	}
}

func TestSetAffinity(t *testing.T) {
	c := startGateway(t, 1000000, nil).client(t)
	for _, enabled := range []bool{true, true, false} {
		require.NoError(t, c.SetAffinity(context.Background(), enabled, "test: routing"))
		v, err := c.State(context.Background())
		require.NoError(t, err)
		assert.Equal(t, enabled, v.Affinity.Enabled)
	}
}

func TestRefusalsAreAPIErrors(t *testing.T) {
	tg := startGateway(t, 1000000, nil)
	good := tg.client(t)
	wrong, err := client.New(client.Options{BaseURL: tg.admin.URL, Token: "not-the-token"})
	require.NoError(t, err)
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		call          func() error
		op            string
		status        int
		param, typ    string
		inTheMessage  string
		wantUnchanged bool
	}{
		{"wrong token: state", func() error { _, err := wrong.State(ctx); return err }, "state: ",
			http.StatusUnauthorized, "", "authentication_error", "admin token", true},
		{"wrong token: budget", func() error { _, err := wrong.SetBudget(ctx, budgetReq(5, 0, "attack")); return err }, "set budget: ",
			http.StatusUnauthorized, "", "authentication_error", "admin token", true},
		{"wrong token: shed", func() error { _, err := wrong.Shed(ctx, shedReq(nil, 1, "attack")); return err }, "shed: ",
			http.StatusUnauthorized, "", "authentication_error", "admin token", true},
		{"wrong token: affinity", func() error { return wrong.SetAffinity(ctx, true, "attack") }, "set affinity: ",
			http.StatusUnauthorized, "", "authentication_error", "admin token", true},
		{"zero budget", func() error { _, err := good.SetBudget(ctx, budgetReq(0, 0, "r")); return err }, "set budget: ",
			http.StatusBadRequest, "tokens", "invalid_request_error", "tokens: must be > 0", true},
		{"negative reference", func() error { _, err := good.SetBudget(ctx, budgetReq(5, -1, "r")); return err }, "set budget: ",
			http.StatusBadRequest, "reference_tokens", "invalid_request_error", "reference_tokens", true},
		{"budget without a reason", func() error { _, err := good.SetBudget(ctx, budgetReq(5, 0, " ")); return err }, "set budget: ",
			http.StatusBadRequest, "reason", "invalid_request_error", "reason: required", true},
		{"shed neither ids nor count", func() error { _, err := good.Shed(ctx, shedReq(nil, 0, "r")); return err }, "shed: ",
			http.StatusBadRequest, "count", "invalid_request_error", "one is required", true},
		{"shed both", func() error { _, err := good.Shed(ctx, shedReq([]string{"a"}, 1, "r")); return err }, "shed: ",
			http.StatusBadRequest, "session_ids", "invalid_request_error", "not both", true},
		{"shed an empty id list", func() error { _, err := good.Shed(ctx, shedReq([]string{}, 0, "r")); return err }, "shed: ",
			http.StatusBadRequest, "session_ids", "invalid_request_error", "must not be empty", true},
		{"shed an empty id", func() error { _, err := good.Shed(ctx, shedReq([]string{"a", ""}, 0, "r")); return err }, "shed: ",
			http.StatusBadRequest, "session_ids[1]", "invalid_request_error", "empty", true},
		{"shed a negative count", func() error { _, err := good.Shed(ctx, shedReq(nil, -2, "r")); return err }, "shed: ",
			http.StatusBadRequest, "count", "invalid_request_error", "must be > 0", true},
		{"affinity without a reason", func() error { return good.SetAffinity(ctx, true, "") }, "set affinity: ",
			http.StatusBadRequest, "reason", "invalid_request_error", "reason: required", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Error(t, err)
			var ae *client.APIError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, tc.status, ae.Status)
			assert.Equal(t, tc.param, ae.Param)
			assert.Equal(t, tc.typ, ae.Type)
			assert.NotEmpty(t, ae.Code)
			assert.Contains(t, ae.Message, tc.inTheMessage)
			assert.True(t, strings.HasPrefix(err.Error(), tc.op), "the operation leads: %s", err)
			assert.Contains(t, err.Error(), fmt.Sprint(tc.status))
			assert.Contains(t, err.Error(), ae.Message)
			assert.NotContains(t, err.Error(), testToken)
			assert.NotContains(t, err.Error(), "not-the-token")
		})
	}
	v, err := good.State(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1000000), v.Budget, "no refused call changed anything")
	assert.False(t, v.Affinity.Enabled)
}

// calls are the client's calls, each named by the prefix its errors carry.
func calls(c *client.Client) map[string]func() error {
	ctx := context.Background()
	return map[string]func() error{
		"state: ":        func() error { _, err := c.State(ctx); return err },
		"set budget: ":   func() error { _, err := c.SetBudget(ctx, budgetReq(5, 0, "r")); return err },
		"shed: ":         func() error { _, err := c.Shed(ctx, shedReq(nil, 1, "r")); return err },
		"set affinity: ": func() error { return c.SetAffinity(ctx, true, "r") },
	}
}

// checkTransportFailure checks the error of call op that got no answer: the operation leads,
// the transport's error is wrapped (errors.Is target, when not nil), it is no refusal, and the
// token is not in it.
func checkTransportFailure(t *testing.T, op string, err, target error) {
	t.Helper()
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), op), "the operation leads: %s", err)
	var ue *url.Error
	assert.ErrorAs(t, err, &ue, "the transport error is wrapped, not flattened")
	var ae *client.APIError
	assert.False(t, errors.As(err, &ae), "no answer is not a refusal")
	if target != nil {
		assert.ErrorIs(t, err, target)
	}
	assert.NotContains(t, err.Error(), testToken)
}

func TestTransportFailuresAreWrapped(t *testing.T) {
	// A server that was started and closed: its port refuses connections.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	down, err := client.New(client.Options{BaseURL: gone.URL, Token: testToken})
	require.NoError(t, err)
	for op, call := range calls(down) {
		t.Run("server down "+strings.TrimSuffix(op, ": "), func(t *testing.T) {
			start := time.Now()
			checkTransportFailure(t, op, call(), nil)
			assert.Less(t, time.Since(start), time.Second)
		})
	}
}

// TestACallToAStuckGatewayEndsAtTheTimeout runs in a testing/synctest bubble, on a connection
// that accepts the call and never answers: the call fails at the client's timeout (Timeout, or
// DefaultTimeout when zero), to the second, with the deadline in its error.
func TestACallToAStuckGatewayEndsAtTheTimeout(t *testing.T) {
	for _, timeout := range []time.Duration{0, 30 * time.Second} {
		want := timeout
		if want == 0 {
			want = client.DefaultTimeout
		}
		for op := range calls(nil) {
			t.Run(fmt.Sprintf("%s, Timeout %v", strings.TrimSuffix(op, ": "), timeout), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
						c, stuck := net.Pipe()
						go func() {
							_, _ = io.Copy(io.Discard, stuck) // reads the call until the client hangs up
							stuck.Close()
						}()
						return c, nil
					}}
					defer tr.CloseIdleConnections()
					c, err := client.New(client.Options{BaseURL: "http://gateway.test:8081", Token: testToken,
						HTTPClient: &http.Client{Transport: tr}, Timeout: timeout})
					require.NoError(t, err)
					start := time.Now()
					checkTransportFailure(t, op, calls(c)[op](), context.DeadlineExceeded)
					assert.Equal(t, want, time.Since(start))
				})
			})
		}
	}
}

func TestAnswersThatAreNotTheGatewaysJSON(t *testing.T) {
	// Something other than the gateway answering on the admin address: a proxy's error page, a
	// redirect, a server echoing the request. The gateway cannot be made to do these, so these
	// servers are hand-written.
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		status  int
		message string
	}{
		{"proxy error page", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
		}, http.StatusBadGateway, "502 Bad Gateway</body>"},
		{"redirect is not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "https://elsewhere.example/admin/state", http.StatusPermanentRedirect)
		}, http.StatusPermanentRedirect, "redirected to https://elsewhere.example/admin/state"},
		{"echo of the token", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "bad request headers: Authorization: "+r.Header.Get("Authorization"))
		}, http.StatusInternalServerError, "Authorization: Bearer [token]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(tc.handler)
			t.Cleanup(ts.Close)
			c, err := client.New(client.Options{BaseURL: ts.URL, Token: testToken})
			require.NoError(t, err)
			_, err = c.State(context.Background())
			var ae *client.APIError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, tc.status, ae.Status)
			assert.Contains(t, ae.Message, tc.message)
			assert.NotContains(t, err.Error(), testToken)
		})
	}

	t.Run("success that is not JSON", func(t *testing.T) {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "ok\n")
		}))
		t.Cleanup(ts.Close)
		c, err := client.New(client.Options{BaseURL: ts.URL, Token: testToken})
		require.NoError(t, err)
		_, err = c.State(context.Background())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "state: decoding the response")
	})
}
