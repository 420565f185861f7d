package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/trace"
)

// answerWith answers every call with the body of the given content type.
func answerWith(contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", contentType)
		_, _ = io.WriteString(w, body)
	}
}

// The answers below carry a context of 120 tokens (prompt, cached or not, plus output), in each
// API's own usage fields.
const (
	responsesJSON = `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","role":"assistant",` +
		`"content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":60},` +
		`"output_tokens":20,"total_tokens":120}}`
	responsesSSE = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"ok\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\"," +
		"\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":60},\"output_tokens\":20,\"total_tokens\":120}}}\n\n"
	messagesJSON = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn",` +
		`"usage":{"input_tokens":10,"cache_read_input_tokens":80,"cache_creation_input_tokens":10,"output_tokens":20}}`
	messagesSSE = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]," +
		"\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":20}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
)

func TestResponsesAndMessagesAreAdmittedAndTracked(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, contentType, answer string
		header                                map[string]string
		session                               string // the session id it must be tracked under
	}{
		{name: "responses", path: "/v1/responses", body: `{"model":"m","input":"hi","prompt_cache_key":"codex-1"}`,
			contentType: "application/json", answer: responsesJSON, session: "codex-1"},
		{name: "responses streamed", path: "/v1/responses", body: `{"model":"m","input":"hi","stream":true,"user":"u-7"}`,
			contentType: "text/event-stream", answer: responsesSSE, session: "u-7"},
		{name: "responses: metadata", path: "/v1/responses", body: `{"model":"m","input":"hi","metadata":{"session_id":"s-3"},"user":"u"}`,
			contentType: "application/json", answer: responsesJSON, session: "s-3"},
		{name: "messages", path: "/v1/messages", body: `{"model":"m","max_tokens":20,"metadata":{"user_id":"user_abc"},` +
			`"messages":[{"role":"user","content":"hi"}]}`, contentType: "application/json", answer: messagesJSON, session: "user_abc"},
		{name: "messages streamed, Claude Code's header first", path: "/v1/messages",
			body:   `{"model":"m","max_tokens":20,"stream":true,"metadata":{"user_id":"user_abc"},"messages":[{"role":"user","content":"hi"}]}`,
			header: map[string]string{"x-claude-code-session-id": "cc-42"}, contentType: "text/event-stream", answer: messagesSSE, session: "cc-42"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFakeUpstream(t, answerWith(tc.contentType, tc.answer))
			h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
			r, err := h.do(context.Background(), http.MethodPost, tc.path, tc.header, tc.body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			assert.Equal(t, tc.answer, string(r.body), "passed through byte for byte")
			h.settle()
			s := h.state()
			assert.Equal(t, 1, s.Live)
			assert.True(t, h.g.core.Live(tc.session), "tracked as session %q", tc.session)
			assert.Equal(t, int64(120), s.WorkingSet, "the context from the shape's usage")
			assert.Equal(t, uint64(1), s.Counters.AdmittedAtOnce)
		})
	}
}

// chainUpstream answers Responses calls with ids resp_1, resp_2, … and a prompt that grows by
// 1000 tokens a call, as a server holding the conversation counts it.
func chainUpstream(t *testing.T) *fakeUpstream {
	var n atomic.Int64
	return newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		i := n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_%d","object":"response","status":"completed","output":[],"usage":{"input_tokens":%d,"output_tokens":10}}`,
			i, 1000*i)
	})
}

func TestAPreviousResponseChainIsOneSession(t *testing.T) {
	up := chainUpstream(t)
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
	send := func(body string) {
		t.Helper()
		r, err := h.do(context.Background(), http.MethodPost, "/v1/responses", nil, body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		h.settle()
	}
	send(`{"model":"m","input":"start"}`)
	send(`{"model":"m","input":"go on","previous_response_id":"resp_1"}`)
	send(`{"model":"m","input":"and on","previous_response_id":"resp_2"}`)
	s := h.state()
	require.Equal(t, 1, s.Live, "three chained calls are one session")
	assert.Equal(t, uint64(1), s.Counters.AdmittedAtOnce)
	assert.Equal(t, int64(3010), s.WorkingSet, "the chain's context, from the last call's usage")

	// The chain's prompt estimate is its context so far plus the new input.
	var c call
	c.req, _ = agentcall.Read(agentcall.Responses, []byte(`{"input":"abcd","previous_response_id":"resp_3"}`))
	h.g.chain(context.Background(), &c)
	assert.Equal(t, int64(3010+1+agentcall.PerMessageTokens), c.req.Prompt)
	assert.True(t, strings.HasPrefix(c.id, chainPrefix), "%q", c.id)

	// A call the server does not keep is a one-call session; one continuing an unknown response
	// is keyed by it.
	send(`{"model":"m","input":"once","store":false}`)
	assert.Equal(t, 1, h.state().Live)
	send(`{"model":"m","input":"x","previous_response_id":"resp_from_elsewhere"}`)
	assert.True(t, h.g.core.Live(chainPrefix+"resp_from_elsewhere"))
}

// anthropicErrorOf decodes an Anthropic error body.
func anthropicErrorOf(t *testing.T, r response) anthropicError {
	t.Helper()
	var e anthropicError
	require.NoError(t, json.Unmarshal(r.body, &e), "%s", r)
	require.Equal(t, "error", e.Type, "%s", r)
	return e
}

func TestRefusalsAreInEachShapesFormat(t *testing.T) {
	for _, tc := range []struct {
		path, body string
	}{
		{"/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"m","input":"hi"}`},
	} {
		// In a bubble: the queue timeout is a realistic 10 minutes, which costs nothing there.
		t.Run(tc.path, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newMemNet()
				up := newMemUpstream(t, n, okJSON(100, 10))
				h := startInBubble(t, n, baseConfig(t, []string{up.URL}, func(c *Config) {
					c.Admission.BudgetTokens = 1
					c.MaxQueueWait = Duration(10 * time.Minute)
					c.IdleTimeout = Duration(time.Hour) // the live session stays live while the others wait
					c.TenantHeader = "x-tenant-id"
					c.Admission.TenantQuota = 1
				}))
				decodeCompletion(t, h.chat("live", 5, map[string]string{"x-tenant-id": "a"}))
				call := func(id, tenant string) response {
					r, err := h.do(context.Background(), http.MethodPost, tc.path,
						map[string]string{"x-session-id": id, "x-tenant-id": tenant}, tc.body)
					require.NoError(t, err)
					return r
				}
				// queue timeout: 503, retry soon.
				r := call("waiting", "b")
				require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
				assert.Equal(t, "true", r.header.Get("x-should-retry"))
				ra, err := strconv.Atoi(r.header.Get("Retry-After"))
				require.NoError(t, err)
				assert.LessOrEqual(t, ra, int(MaxRetryAfter/time.Second))
				assert.NotEmpty(t, r.header.Get("retry-after-ms"))
				// tenant quota: 429.
				q := call("second", "a")
				require.Equal(t, http.StatusTooManyRequests, q.status, "%s", q)
				assert.Equal(t, "true", q.header.Get("x-should-retry"))
				// shed: 529, do not retry.
				queued := make(chan response, 1)
				go func() { queued <- call("victim", "c") }()
				h.waitQueued(1)
				a := h.adminDo(http.MethodPost, "/admin/shed", testToken, `{"session_ids":["victim"],"reason":"test"}`)
				require.Equal(t, http.StatusOK, a.status, "%s", a)
				s := <-queued
				require.Equal(t, 529, s.status, "%s", s)
				assert.Equal(t, "false", s.header.Get("x-should-retry"))
				again := call("victim", "c")
				require.Equal(t, 529, again.status, "%s", again)
				assert.Equal(t, "false", again.header.Get("x-should-retry"))
				for _, r := range []response{s, again} {
					assert.Empty(t, r.header.Get("Retry-After"), "no Retry-After where a retry cannot help: some clients sleep it out")
					assert.Empty(t, r.header.Get("retry-after-ms"))
					assert.Contains(t, string(r.body), "This session id is refused for another ", "the body says when it may return")
				}

				if tc.path == "/v1/messages" {
					assert.Equal(t, "overloaded_error", anthropicErrorOf(t, r).Error.Type)
					assert.Equal(t, "rate_limit_error", anthropicErrorOf(t, q).Error.Type)
					e := anthropicErrorOf(t, s)
					assert.Equal(t, "overloaded_error", e.Error.Type)
					assert.Contains(t, e.Error.Message, "retrying soon will not help")
					return
				}
				assert.Equal(t, "queue_timeout", errorOf(t, r).Code)
				assert.Equal(t, "rate_limit_exceeded", errorOf(t, q).Type)
				assert.Equal(t, "shed", errorOf(t, s).Code)
			})
		})
	}
}

func TestRetryAfterIsBoundedWhereARetryHelps(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	for _, tc := range []struct {
		reason      string
		status      int
		retryAfter  string
		shouldRetry string
	}{
		{reasonQueueTimeout, http.StatusServiceUnavailable, "60", "true"},
		{reasonTenantQuota, http.StatusTooManyRequests, "60", "true"},
		{reasonDegraded, http.StatusServiceUnavailable, "60", "true"},
		// A shed session stays refused for the shed memory: no retry, and no Retry-After that
		// a client could sleep through; the body says when the session may return.
		{reasonShed, 529, "", "false"},
		{reasonBadRequest, http.StatusBadRequest, "", "false"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			w := httptest.NewRecorder()
			h.g.refuse(w, refusal{api: agentcall.Messages, status: tc.status, reason: tc.reason, retryAfter: 1792 * time.Second,
				message: "refused."})
			assert.Equal(t, tc.status, w.Code)
			assert.Equal(t, tc.retryAfter, w.Header().Get("Retry-After"))
			if tc.retryAfter == "" {
				assert.Empty(t, w.Header().Get("retry-after-ms"))
				assert.Contains(t, anthropicErrorOf(t, response{status: w.Code, header: w.Header(), body: w.Body.Bytes()}).Error.Message,
					"refused for another 29m52s", "the body says when the session may return")
			} else {
				assert.Equal(t, tc.retryAfter+"000", w.Header().Get("retry-after-ms"))
			}
			assert.Equal(t, tc.shouldRetry, w.Header().Get("x-should-retry"))
		})
	}
}

func TestBodyTooLargeIs413OnEveryPath(t *testing.T) {
	up := newFakeUpstream(t, okJSON(10, 2))
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.MaxBodyBytes = 100 }), nil)
	big := strings.Repeat("x", 200)
	for _, s := range []agentcall.Shape{agentcall.Chat, agentcall.Completions, agentcall.Responses, agentcall.Messages} {
		r, err := h.do(context.Background(), http.MethodPost, s.Path(), map[string]string{"x-session-id": "big"},
			`{"model":"m","input":"`+big+`"}`)
		require.NoError(t, err)
		assert.Equal(t, http.StatusRequestEntityTooLarge, r.status, "%s: %s", s, r)
		assert.Equal(t, "body_too_large", r.header.Get("x-basin-reason"), "%s", s)
		assert.Equal(t, "false", r.header.Get("x-should-retry"), "%s", s)
		if s == agentcall.Messages {
			assert.Equal(t, "request_too_large", anthropicErrorOf(t, r).Error.Type)
		}
	}
	assert.Empty(t, up.seen())
	assert.False(t, h.g.core.Live("big"))
}

func TestTraceRecordsEveryAPI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.Record.Path = path }), nil)
	bodies := map[string]string{
		"/v1/chat/completions": chatBody(6),
		"/v1/responses":        `{"model":"basin-sim","instructions":"You are a coding agent.","input":"Fix the failing test in the parser package, please.","max_output_tokens":6}`,
		"/v1/messages":         `{"model":"basin-sim","system":"You are a coding agent.","messages":[{"role":"user","content":"Fix the failing test in the parser package, please."}],"max_tokens":6}`,
	}
	contexts := map[int64]bool{}
	for p, body := range bodies {
		for range 2 {
			r, err := h.do(context.Background(), http.MethodPost, p, map[string]string{"x-session-id": p}, body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, r.status, "%s: %s", p, r)
		}
	}
	h.settle()
	for p := range bodies {
		ls, ok := h.g.core.LiveSession(p)
		require.True(t, ok, p)
		contexts[ls.Context] = true
	}
	require.NoError(t, h.stop())

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sessions, err := trace.ReadBasin(f)
	require.NoError(t, err)
	require.Len(t, sessions, 3, "a session per API")
	for _, s := range sessions {
		require.Len(t, s.Calls, 2)
		assert.Equal(t, len("Fix the failing test in the parser package, please."), s.TaskChars)
		for _, c := range s.Calls {
			assert.Equal(t, 6, c.Output, "the output from each API's usage")
			assert.Positive(t, c.Prompt)
		}
		last := s.Calls[1]
		assert.True(t, contexts[int64(last.Prompt+last.Output)], "the recorded prompt is the one admission counted: %v", contexts)
	}
}

func TestChainsUnderRejectAnonymousAndLongIDs(t *testing.T) {
	up := chainUpstream(t)
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.RejectAnonymous = true }), nil)
	r, err := h.do(context.Background(), http.MethodPost, "/v1/responses", nil, `{"model":"m","input":"start"}`)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, r.status, "a call that names no session and continues none is anonymous: %s", r)
	assert.Equal(t, "no_session_id", r.header.Get("x-basin-reason"))

	r, err = h.do(context.Background(), http.MethodPost, "/v1/responses", nil,
		`{"model":"m","input":"x","previous_response_id":"`+strings.Repeat("r", MaxSessionIDBytes)+`"}`)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, r.status, "%s", r)
	assert.Equal(t, "previous_response_id", deref(errorOf(t, r).Param))
	assert.Empty(t, up.seen())
}

// TestAStreamedAnswerLinksAtItsFirstEvent: a streamed Responses answer's id is remembered as
// its first event passes, with the prompt as the chain's context, so a call continuing it joins
// the session however soon it is sent; once the answer is complete the link has its full
// context.
func TestAStreamedAnswerLinksAtItsFirstEvent(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(release) }) }
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_s1\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_s1\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":1000,\"output_tokens\":10}}}\n\n")
	})
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
	t.Cleanup(finish) // before the gateway's cleanup: a failing test does not leave the stream hanging
	done := make(chan response, 1)
	go func() {
		r, err := h.do(context.Background(), http.MethodPost, "/v1/responses", nil, `{"model":"m","input":"start","stream":true}`)
		assert.NoError(t, err)
		done <- r
	}()
	link := func() (chainLink, bool) {
		h.g.mu.Lock()
		defer h.g.mu.Unlock()
		l, ok := h.g.mu.chains["resp_s1"]
		return l, ok
	}
	waitFor(t, "the link known while the answer streams", func() bool { _, ok := link(); return ok })
	l, _ := link()
	assert.True(t, strings.HasPrefix(l.session, chainPrefix), "%q", l.session)
	assert.Less(t, l.context, int64(1000), "the prompt's estimate until the answer is complete")
	finish()
	r := <-done
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	h.settle()
	l, _ = link()
	assert.Equal(t, int64(1010), l.context, "the complete answer's context")
	h.g.mu.Lock()
	assert.Equal(t, []string{"resp_s1"}, h.g.mu.sessions[l.session].responses, "remembered once")
	h.g.mu.Unlock()
}
