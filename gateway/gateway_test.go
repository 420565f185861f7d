package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// completion is the part of a chat completion the tests read.
type completion struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

func decodeCompletion(t *testing.T, r response) completion {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var c completion
	require.NoError(t, json.Unmarshal(r.body, &c))
	require.Len(t, c.Choices, 1)
	return c
}

// errorReply is an OpenAI-style error as a client decodes it.
type errorReply struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

type errorBody struct {
	Error errorReply `json:"error"`
}

// errorOf decodes an OpenAI-style error body.
func errorOf(t *testing.T, r response) errorReply {
	t.Helper()
	var e errorBody
	require.NoError(t, json.Unmarshal(r.body, &e), "%s", r)
	return e.Error
}

func TestSessionsUnderReferenceAreAdmittedAndTracked(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	var want int64
	for _, id := range []string{"a", "b", "c"} {
		r := h.chat(id, 10, nil)
		c := decodeCompletion(t, r)
		assert.Len(t, strings.Fields(c.Choices[0].Message.Content), 10)
		want += c.Usage.PromptTokens + c.Usage.CompletionTokens
	}
	h.settle()
	s := h.state()
	assert.Equal(t, 3, s.Live)
	assert.Empty(t, s.Queue)
	assert.Equal(t, want, s.WorkingSet, "the working set is the sum of the contexts from usage")
	assert.Equal(t, uint64(3), s.Counters.AdmittedAtOnce)
}

func TestQueuedSessionIsAdmittedWhenTheLiveOneEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newMemNet()
		up := newMemUpstream(t, n, okJSON(100, 10))
		h := startInBubble(t, n, baseConfig(t, []string{up.URL}, func(c *Config) { c.Admission.BudgetTokens = 1 }))
		decodeCompletion(t, h.chat("first", 5, nil))

		second := h.chatAsync(context.Background(), "second", 5, nil)
		s := h.waitQueued(1)
		assert.Equal(t, "second", s.Queue[0].ID)
		advance(DefaultMaxQueueWait - time.Second)
		pendingNow(t, second, "before the live session ended")

		decodeCompletion(t, h.chat("first", 5, map[string]string{"x-session-end": "true"}))
		decodeCompletion(t, answeredNow(t, second))
		s = h.state()
		assert.Empty(t, s.Queue)
		assert.Equal(t, 1, s.Live)
		assert.Equal(t, uint64(1), s.Counters.AdmittedFromQueue)
		assert.False(t, h.g.core.Live("first"))
		assert.True(t, h.g.core.Live("second"))
	})
}

// TestQueueTimeoutIs503AndARetryKeepsItsArrival runs in a bubble: the queued call is answered at
// max_queue_wait, not a second before, and a retry a minute later keeps the first arrival.
func TestQueueTimeoutIs503AndARetryKeepsItsArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const wait = 10 * time.Minute
		n := newMemNet()
		up := newMemUpstream(t, n, okJSON(100, 10))
		h := startInBubble(t, n, baseConfig(t, []string{up.URL}, func(c *Config) {
			c.Admission.BudgetTokens = 1
			c.MaxQueueWait = Duration(wait)
			c.IdleTimeout = Duration(time.Hour) // the live session stays live while the other waits
		}))
		decodeCompletion(t, h.chat("live", 5, nil))

		first := h.chatAsync(context.Background(), "waiting", 5, nil)
		synctest.Wait()
		st := h.state()
		require.Len(t, st.Queue, 1)
		q := st.Queue[0]
		arrival, priority := q.Arrival, q.Priority
		time.Sleep(wait - time.Second)
		synctest.Wait()
		select {
		case r := <-first:
			t.Fatalf("answered a second before max_queue_wait: %s", r)
		default:
		}
		time.Sleep(time.Second)
		synctest.Wait()
		var r response
		select {
		case r = <-first:
		default:
			t.Fatal("no answer at max_queue_wait")
		}
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
		assert.Equal(t, "queue_timeout", r.header.Get("x-basin-reason"))
		ra, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After must be whole seconds, got %q", r.header.Get("Retry-After"))
		assert.GreaterOrEqual(t, ra, 1)
		e := errorOf(t, r)
		assert.Equal(t, "queue_timeout", e.Code)
		assert.Equal(t, "server_error", e.Type)
		assert.Empty(t, h.state().Queue, "a timed-out session leaves the queue")

		time.Sleep(time.Minute)
		ctx, cancel := context.WithCancel(context.Background())
		retry := h.chatAsync(ctx, "waiting", 5, nil)
		synctest.Wait()
		st = h.state()
		require.Len(t, st.Queue, 1)
		assert.True(t, st.Queue[0].Arrival.Equal(arrival), "retry arrival %v, want the original %v", st.Queue[0].Arrival, arrival)
		assert.True(t, st.Queue[0].Priority.Equal(priority), "retry priority %v, want the original %v", st.Queue[0].Priority, priority)
		assert.Equal(t, (wait + time.Minute).Seconds(), st.Queue[0].WaitedSeconds, "its wait counts from the first arrival")
		cancel()
		<-retry
	})
}

func TestTenantOverQuotaIs429(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) {
		c.TenantHeader = "x-tenant-id"
		c.Admission.TenantQuota = 1
	}), nil)
	decodeCompletion(t, h.chat("a1", 5, map[string]string{"x-tenant-id": "acme"}))
	decodeCompletion(t, h.chat("a1", 5, map[string]string{"x-tenant-id": "acme"})) // its own calls pass
	r := h.chat("a2", 5, map[string]string{"x-tenant-id": "acme"})
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r)
	assert.Equal(t, "tenant_quota", r.header.Get("x-basin-reason"))
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	assert.Equal(t, "rate_limit_exceeded", errorOf(t, r).Type)
	decodeCompletion(t, h.chat("b1", 5, map[string]string{"x-tenant-id": "other"}))
}

func TestAdminShedOfAQueuedSessionIs529(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
	decodeCompletion(t, h.chat("live", 5, nil))
	queued := h.chatAsync(context.Background(), "victim", 5, nil)
	h.waitQueued(1)

	a := h.adminDo(http.MethodPost, "/admin/shed", testToken, `{"session_ids":["victim"],"reason":"test: capacity lost"}`)
	require.Equal(t, http.StatusOK, a.status, "%s", a)
	var shed struct{ Shed []string }
	require.NoError(t, json.Unmarshal(a.body, &shed))
	assert.Equal(t, []string{"victim"}, shed.Shed)
	assert.Contains(t, h.log.String(), "test: capacity lost")

	r := <-queued
	require.Equal(t, 529, r.status, "%s", r)
	assert.Equal(t, "shed", r.header.Get("x-basin-reason"))
	assert.Contains(t, errorOf(t, r).Message, "retrying soon will not help")
	assert.Empty(t, h.state().Queue)

	// A retry stays refused.
	r = h.chat("victim", 5, nil)
	assert.Equal(t, 529, r.status, "%s", r)
}

func TestQueuedClientThatDisconnectsLeavesTheQueue(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
	decodeCompletion(t, h.chat("live", 5, nil))
	ctx, cancel := context.WithCancel(context.Background())
	gone := h.chatAsync(ctx, "impatient", 5, nil)
	h.waitQueued(1)
	cancel()
	<-gone
	h.waitQueued(0)
	assert.Equal(t, uint64(1), h.state().Counters.Cancelled)
	assert.False(t, h.g.core.Live("impatient"))
}

func TestAdminBudgetChangeTakesEffectOnTheNextAdmission(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	decodeCompletion(t, h.chat("a", 5, nil))

	a := h.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":1,"reference_tokens":1,"reason":"test: tighten"}`)
	require.Equal(t, http.StatusOK, a.status, "%s", a)
	var ans adminapi.BudgetResult
	require.NoError(t, json.Unmarshal(a.body, &ans))
	assert.Equal(t, adminapi.Budget{BudgetTokens: 1000000, ReferenceBudgetTokens: 1000000}, ans.Before)
	assert.Equal(t, adminapi.Budget{BudgetTokens: 1, ReferenceBudgetTokens: 1}, ans.After)
	assert.Equal(t, []string{}, ans.Admitted)
	assert.True(t, ans.Engaged)
	logs := h.log.String()
	assert.Contains(t, logs, "test: tighten")
	assert.Contains(t, logs, "1000000 → 1")

	decodeCompletion(t, h.chat("a", 5, nil)) // live sessions are never cut
	b := h.chatAsync(context.Background(), "b", 5, nil)
	h.waitQueued(1)

	a = h.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":1000000,"reason":"test: loosen"}`)
	require.Equal(t, http.StatusOK, a.status, "%s", a)
	assert.Contains(t, string(a.body), `"admitted":["b"]`)
	select {
	case r := <-b:
		decodeCompletion(t, r)
	case <-time.After(5 * time.Second):
		t.Fatal("loosening the budget did not admit the queued session")
	}
	assert.Equal(t, int64(1000000), h.state().Budget)
}

func TestSessionEnds(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	t.Run("x-session-end", func(t *testing.T) {
		decodeCompletion(t, h.chat("s1", 5, nil))
		require.True(t, h.g.core.Live("s1"))
		decodeCompletion(t, h.chat("s1", 5, map[string]string{"x-session-end": "true"}))
		h.settle()
		assert.False(t, h.g.core.Live("s1"))
	})
	t.Run("x-session-end false keeps it", func(t *testing.T) {
		decodeCompletion(t, h.chat("s2", 5, map[string]string{"x-session-end": "false"}))
		assert.True(t, h.g.core.Live("s2"))
	})
	t.Run("bad x-session-end", func(t *testing.T) {
		r := h.chat("s2", 5, map[string]string{"x-session-end": "soon"})
		require.Equal(t, http.StatusBadRequest, r.status)
		assert.Equal(t, "x-session-end", *errorOf(t, r).Param)
	})
	t.Run("POST end", func(t *testing.T) {
		decodeCompletion(t, h.chat("s3", 5, nil))
		r, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/s3/end", nil, "")
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, r.status, "%s", r)
		// basin sim serve knew the session by its header and ended it too (it answers 404 otherwise).
		assert.JSONEq(t, `{"ended":true,"upstream":{"ended":true,"status":200}}`, string(r.body))
		assert.False(t, h.g.core.Live("s3"))
		r, err = h.do(context.Background(), http.MethodPost, "/v1/sessions/s3/end", nil, "")
		require.NoError(t, err)
		assert.Equal(t, http.StatusNotFound, r.status, "%s", r)
	})
}

// TestIdleSessionsExpire: the Run loop ends a session idle past the idle timeout, within the
// second, and no other.
func TestIdleSessionsExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newMemNet()
		up := newMemUpstream(t, n, okJSON(100, 10))
		h := startInBubble(t, n, baseConfig(t, []string{up.URL}, func(c *Config) { c.IdleTimeout = Duration(time.Minute) }))
		decodeCompletion(t, h.chat("idle", 5, nil))
		advance(30 * time.Second)
		decodeCompletion(t, h.chat("busy", 5, nil))
		advance(30*time.Second - time.Second)
		assert.True(t, h.g.core.Live("idle"), "idle for 59 s < 1 min")
		advance(2 * time.Second)
		assert.False(t, h.g.core.Live("idle"), "idle for 61 s > 1 min")
		assert.True(t, h.g.core.Live("busy"), "idle for 31 s")
		assert.Equal(t, 1, h.state().Live)
		advance(30 * time.Second)
		assert.False(t, h.g.core.Live("busy"), "idle for 61 s > 1 min")
	})
}

func TestAnonymousCalls(t *testing.T) {
	t.Run("one-call session", func(t *testing.T) {
		h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
		decodeCompletion(t, h.chat("", 5, nil))
		h.settle()
		s := h.state()
		assert.Equal(t, 0, s.Live, "a call without a session id is a session of its own, ended with the call")
		assert.Equal(t, uint64(1), s.Counters.Ended)
	})
	t.Run("rejected", func(t *testing.T) {
		h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.RejectAnonymous = true }), nil)
		r := h.chat("", 5, nil)
		require.Equal(t, http.StatusBadRequest, r.status)
		assert.Equal(t, "no_session_id", r.header.Get("x-basin-reason"))
		msg := errorOf(t, r).Message
		for _, hdr := range defaultSessionHeaders {
			assert.Contains(t, msg, hdr)
		}
		assert.Equal(t, 0, h.state().Live)
	})
}

func TestSessionIdentity(t *testing.T) {
	up := newFakeUpstream(t, okJSON(10, 2))
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
	for _, tc := range []struct {
		name   string
		header map[string]string
		body   string
		want   string
	}{
		{"x-session-id", map[string]string{"x-session-id": "h1"}, `{"messages":[]}`, "h1"},
		{"claude code", map[string]string{"X-Claude-Code-Session-Id": "h2"}, `{"messages":[]}`, "h2"},
		{"codex", map[string]string{"session_id": "h3"}, `{"messages":[]}`, "h3"},
		{"dynamo", map[string]string{"X-Dynamo-Session-ID": "h4"}, `{"messages":[]}`, "h4"},
		{"first header wins", map[string]string{"session-id": "late", "x-session-id": "h5"}, `{"user":"u"}`, "h5"},
		{"metadata", nil, `{"metadata":{"session_id":"m1"},"user":"u1"}`, "m1"},
		{"user", nil, `{"user":"u2","messages":[{"role":"user","content":"hi"}]}`, "u2"},
		{"odd body still proxied", map[string]string{"x-session-id": "h6"}, `not json`, "h6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := h.do(context.Background(), http.MethodPost, "/v1/chat/completions", tc.header, tc.body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			assert.True(t, h.g.core.Live(tc.want), "session %q", tc.want)
		})
	}
}

func TestBodyTooLargeIs413(t *testing.T) {
	up := newFakeUpstream(t, okJSON(10, 2))
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.MaxBodyBytes = 100 }), nil)
	r, err := h.do(context.Background(), http.MethodPost, "/v1/chat/completions", map[string]string{"x-session-id": "big"},
		`{"messages":[{"role":"user","content":"`+strings.Repeat("x", 200)+`"}]}`)
	require.NoError(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, r.status, "%s", r)
	assert.Equal(t, "body_too_large", r.header.Get("x-basin-reason"))
	assert.Empty(t, up.seen())
	assert.False(t, h.g.core.Live("big"))
}

func TestPassThroughPaths(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	r, err := h.do(context.Background(), http.MethodGet, "/v1/models", nil, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), `"object":"list"`)
	r, err = h.do(context.Background(), http.MethodGet, "/healthz", nil, "")
	require.NoError(t, err)
	assert.Equal(t, "ok", strings.TrimSpace(string(r.body)), "unknown paths go to the upstream (sim serve's /healthz)")
	r, err = h.do(context.Background(), http.MethodGet, "/no/such/path", nil, "")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, r.status)
	assert.Equal(t, 0, h.state().Live, "pass-through calls admit no session")
}

func TestShutdownAnswersQueuedCallsAndSavesState(t *testing.T) {
	state := t.TempDir() + "/state.json"
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) {
		c.Admission.BudgetTokens = 1
		c.StateFile = state
	}), nil)
	decodeCompletion(t, h.chat("live", 5, nil))
	queued := h.chatAsync(context.Background(), "queued", 5, nil)
	h.waitQueued(1)
	require.NoError(t, h.stop())
	r := <-queued
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
	assert.Equal(t, "shutting_down", r.header.Get("x-basin-reason"))
	assert.FileExists(t, state)

	// New sessions are refused while shutting down; live ones still pass.
	r = h.chat("newcomer", 5, nil)
	assert.Equal(t, "shutting_down", r.header.Get("x-basin-reason"))
	decodeCompletion(t, h.chat("live", 5, nil))
}
