package serve_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/serve"
	"github.com/basin-dev/basin/test/testclock"
)

// syncBuffer is a log sink the test can read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// harness is a running server behind a loopback HTTP server.
type harness struct {
	t      *testing.T
	srv    *serve.Server
	ts     *httptest.Server
	cancel context.CancelFunc
	done   chan error
	log    *syncBuffer
}

func deployment(t *testing.T) sim.Deployment {
	t.Helper()
	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	require.NoError(t, err)
	return dep
}

// start runs a server on the small 1P1D deployment at 600× unless opts says otherwise.
func start(t *testing.T, opts func(*serve.Options)) *harness {
	t.Helper()
	h := &harness{t: t, log: &syncBuffer{}, done: make(chan error, 1)}
	o := serve.Options{
		Sim:    sim.Options{Seed: 1, Deployment: deployment(t)},
		Speed:  600,
		Logger: slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if opts != nil {
		opts(&o)
	}
	srv, err := serve.New(o)
	require.NoError(t, err)
	h.srv = srv
	var ctx context.Context
	ctx, h.cancel = context.WithCancel(context.Background())
	go func() { h.done <- srv.Run(ctx) }()
	h.ts = httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		h.cancel()
		select {
		case err := <-h.done:
			assert.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
		h.ts.Close()
	})
	return h
}

// do sends a request and returns the status, headers and body.
func (h *harness) do(method, path string, header map[string]string, body string) (int, http.Header, []byte) {
	h.t.Helper()
	return h.doCtx(context.Background(), method, path, header, body)
}

func (h *harness) doCtx(ctx context.Context, method, path string, header map[string]string, body string) (int, http.Header, []byte) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, h.ts.URL+path, strings.NewReader(body))
	require.NoError(h.t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := h.ts.Client().Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return resp.StatusCode, resp.Header, b
}

// state reads /admin/state.
func (h *harness) state() adminState {
	h.t.Helper()
	code, _, body := h.do(http.MethodGet, "/admin/state", nil, "")
	require.Equal(h.t, http.StatusOK, code, string(body))
	var st adminState
	require.NoError(h.t, json.Unmarshal(body, &st))
	return st
}

type adminState struct {
	NowSeconds          float64 `json:"now_seconds"`
	Speed               float64 `json:"speed"`
	LiveSessions        int     `json:"live_sessions"`
	ExternalSessions    int     `json:"external_sessions"`
	ExternalCalls       int     `json:"external_calls_in_flight"`
	WorkingSetTokens    int64   `json:"working_set_tokens"`
	CacheCapacityTokens int64   `json:"cache_capacity_tokens"`
	CallsCompleted      int64   `json:"calls_completed"`
	Lending             struct {
		Enabled     bool    `json:"enabled"`
		MaxFraction float64 `json:"max_fraction"`
	} `json:"lending"`
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func chatBody(t *testing.T, fields map[string]any, msgs ...message) string {
	t.Helper()
	m := map[string]any{"model": "basin-sim", "messages": msgs}
	for k, v := range fields {
		m[k] = v
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type errBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// chat sends a non-streaming chat call and decodes the answer.
func (h *harness) chat(header map[string]string, body string) (completion, http.Header) {
	h.t.Helper()
	code, hdr, b := h.do(http.MethodPost, "/v1/chat/completions", header, body)
	require.Equal(h.t, http.StatusOK, code, string(b))
	var c completion
	require.NoError(h.t, json.Unmarshal(b, &c), string(b))
	return c, hdr
}

// tokensOf is the documented sizing: ceil(characters / 4) + 4 per message.
func tokensOf(msgs ...message) int {
	chars := 0
	for _, m := range msgs {
		chars += len(m.Content)
	}
	return (chars+3)/4 + 4*len(msgs)
}

func TestChatCompletion(t *testing.T) {
	h := start(t, nil)
	sys := message{"system", strings.Repeat("s", 400)}
	user1 := message{"user", strings.Repeat("u", 4000)}
	shared := tokensOf(sys)

	// First call of session "a": only the shared system prompt is cached.
	conv := []message{sys, user1}
	c1, hdr := h.chat(map[string]string{"x-session-id": "a"}, chatBody(t, map[string]any{"max_tokens": 50}, conv...))
	prompt1 := tokensOf(conv...)
	require.Len(t, c1.Choices, 1)
	require.NotNil(t, c1.Choices[0].Message)
	assert.Equal(t, "chat.completion", c1.Object)
	assert.Equal(t, "basin-sim", c1.Model)
	assert.NotEmpty(t, c1.ID)
	assert.Equal(t, "assistant", c1.Choices[0].Message.Role)
	assert.Len(t, strings.Fields(c1.Choices[0].Message.Content), 50)
	require.NotNil(t, c1.Choices[0].FinishReason)
	assert.Equal(t, "stop", *c1.Choices[0].FinishReason)
	require.NotNil(t, c1.Usage)
	assert.Equal(t, prompt1, c1.Usage.PromptTokens)
	assert.Equal(t, 50, c1.Usage.CompletionTokens)
	assert.Equal(t, prompt1+50, c1.Usage.TotalTokens)
	assert.Equal(t, shared, c1.Usage.PromptTokensDetails.CachedTokens)
	assert.Equal(t, strconv.Itoa(prompt1), hdr.Get("x-basin-sim-prompt-tokens"))
	assert.Equal(t, strconv.Itoa(shared), hdr.Get("x-basin-sim-cached-tokens"))

	// Second call of "a", the conversation extended by the answer and a new user turn: the whole
	// previous prompt is found in the cache.
	conv = append(conv, message{"assistant", c1.Choices[0].Message.Content}, message{"user", strings.Repeat("v", 400)})
	c2, _ := h.chat(map[string]string{"x-session-id": "a"}, chatBody(t, nil, conv...))
	prompt2 := tokensOf(conv...)
	assert.Equal(t, prompt2, c2.Usage.PromptTokens)
	assert.Equal(t, serve.DefaultOutputTokens, c2.Usage.CompletionTokens, "default output")
	assert.GreaterOrEqual(t, c2.Usage.PromptTokensDetails.CachedTokens, prompt1)
	assert.LessOrEqual(t, c2.Usage.PromptTokensDetails.CachedTokens, prompt2)

	// Another session (identified in the body) shares only the system prompt.
	c3, _ := h.chat(nil, chatBody(t, map[string]any{"max_completion_tokens": 7, "max_tokens": 99,
		"metadata": map[string]string{"session_id": "b"}}, sys, message{"user", strings.Repeat("w", 4000)}))
	assert.Equal(t, shared, c3.Usage.PromptTokensDetails.CachedTokens)
	assert.Equal(t, 7, c3.Usage.CompletionTokens, "max_completion_tokens wins over max_tokens")

	// A call without a session id is a one-call session; x-session-end ends a named one.
	h.chat(nil, chatBody(t, map[string]any{"max_tokens": 5}, message{"user", "hello"}))
	h.chat(map[string]string{"session_id": "c", "x-session-end": "true"},
		chatBody(t, map[string]any{"max_tokens": 5}, message{"user", "bye"}))
	st := h.state()
	assert.Equal(t, 2, st.ExternalSessions, "a and b stay live; the one-call session and c ended")
	assert.Equal(t, 2, st.LiveSessions)
	assert.EqualValues(t, 5, st.CallsCompleted)
	assert.Equal(t, 0, st.ExternalCalls)
	assert.Equal(t, 600.0, st.Speed)

	// Ending a session by id.
	code, _, body := h.do(http.MethodPost, "/v1/sessions/a/end", nil, "")
	require.Equal(t, http.StatusOK, code, string(body))
	assert.JSONEq(t, `{"ended":true}`, string(body))
	assert.Equal(t, 1, h.state().ExternalSessions)
	code, _, _ = h.do(http.MethodPost, "/v1/sessions/a/end", nil, "")
	assert.Equal(t, http.StatusNotFound, code, "already ended")
}

// sseEvent is one data line of a stream and when it arrived.
type sseEvent struct {
	data string
	at   time.Time
}

// readStream reads server-sent events until the body ends; stop, if set, ends reading early.
func readStream(t *testing.T, r io.Reader, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, "line %q is not a data line", line)
		ev := sseEvent{data: data, at: time.Now()}
		out = append(out, ev)
		if stop != nil && stop(ev) {
			break
		}
	}
	return out
}

func TestChatStreaming(t *testing.T) {
	for _, includeUsage := range []bool{true, false} {
		t.Run("include_usage="+strconv.FormatBool(includeUsage), func(t *testing.T) {
			// 3×: 200 output tokens decode in about 1 virtual second (≈ 4.7 ms a step alone on
			// the decode GPU), ≈ 300 ms of wall time.
			h := start(t, func(o *serve.Options) { o.Speed = 3 })
			const output = 200
			msgs := []message{{"system", strings.Repeat("s", 800)}, {"user", strings.Repeat("u", 2000)}}
			body := chatBody(t, map[string]any{"stream": true, "max_tokens": output,
				"stream_options": map[string]bool{"include_usage": includeUsage}}, msgs...)
			req, err := http.NewRequest(http.MethodPost, h.ts.URL+"/v1/chat/completions", strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("x-session-id", "s1")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := h.ts.Client().Do(req.WithContext(ctx))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			assert.Equal(t, strconv.Itoa(tokensOf(msgs...)), resp.Header.Get("x-basin-sim-prompt-tokens"))

			events := readStream(t, resp.Body, nil)
			require.NotEmpty(t, events)
			assert.Equal(t, "[DONE]", events[len(events)-1].data, "[DONE] comes last")
			var text strings.Builder
			var contentAt []time.Time
			var finished, usages int
			for i, ev := range events[:len(events)-1] {
				var c completion
				require.NoError(t, json.Unmarshal([]byte(ev.data), &c), ev.data)
				assert.Equal(t, "chat.completion.chunk", c.Object)
				if c.Usage != nil {
					usages++
					assert.Empty(t, c.Choices, "the usage chunk has no choices")
					assert.Equal(t, tokensOf(msgs...), c.Usage.PromptTokens)
					assert.Equal(t, output, c.Usage.CompletionTokens)
					assert.Equal(t, tokensOf(msgs[0]), c.Usage.PromptTokensDetails.CachedTokens)
					assert.Equal(t, len(events)-2, i, "the usage chunk is the last before [DONE]")
					continue
				}
				require.Len(t, c.Choices, 1)
				ch := c.Choices[0]
				require.NotNil(t, ch.Delta)
				if i == 0 {
					assert.Equal(t, "assistant", ch.Delta.Role, "the first chunk carries the role")
				}
				if ch.Delta.Content != "" {
					assert.Zero(t, finished, "content after the final chunk")
					text.WriteString(ch.Delta.Content)
					contentAt = append(contentAt, ev.at)
				}
				if ch.FinishReason != nil {
					assert.Equal(t, "stop", *ch.FinishReason)
					finished++
				}
			}
			assert.Equal(t, 1, finished, "one chunk has finish_reason")
			assert.Len(t, strings.Fields(text.String()), output, "content words total completion tokens")
			if includeUsage {
				assert.Equal(t, 1, usages)
			} else {
				assert.Zero(t, usages)
			}
			// The stream is paced by the simulated decode, not sent in one burst.
			require.GreaterOrEqual(t, len(contentAt), 3, "content chunks")
			assert.Greater(t, contentAt[len(contentAt)-1].Sub(contentAt[0]), 100*time.Millisecond,
				"200 tokens at 3× should take about 300 ms of wall time")
		})
	}
}

func TestCompletions(t *testing.T) {
	h := start(t, nil)
	code, hdr, b := h.do(http.MethodPost, "/v1/completions", nil,
		`{"model":"m","prompt":"`+strings.Repeat("p", 399)+`","max_tokens":12}`)
	require.Equal(t, http.StatusOK, code, string(b))
	var c completion
	require.NoError(t, json.Unmarshal(b, &c))
	assert.Equal(t, "text_completion", c.Object)
	assert.Equal(t, "m", c.Model, "the requested model name is echoed")
	require.Len(t, c.Choices, 1)
	require.NotNil(t, c.Choices[0].Text)
	assert.Len(t, strings.Fields(*c.Choices[0].Text), 12)
	require.NotNil(t, c.Usage)
	assert.Equal(t, 100, c.Usage.PromptTokens, "ceil(399 / 4)")
	assert.Equal(t, 12, c.Usage.CompletionTokens)
	assert.Equal(t, "100", hdr.Get("x-basin-sim-prompt-tokens"))

	// Streaming completions.
	code, _, b = h.do(http.MethodPost, "/v1/completions", nil,
		`{"prompt":[1,2,3,4,5],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true}}`)
	require.Equal(t, http.StatusOK, code, string(b))
	events := readStream(t, bytes.NewReader(b), nil)
	require.GreaterOrEqual(t, len(events), 3)
	assert.Equal(t, "[DONE]", events[len(events)-1].data)
	var text strings.Builder
	for _, ev := range events[:len(events)-1] {
		var c completion
		require.NoError(t, json.Unmarshal([]byte(ev.data), &c), ev.data)
		assert.Equal(t, "text_completion", c.Object)
		if c.Usage != nil {
			assert.Equal(t, 5, c.Usage.PromptTokens, "one token per token id")
			continue
		}
		require.Len(t, c.Choices, 1)
		require.NotNil(t, c.Choices[0].Text)
		text.WriteString(*c.Choices[0].Text)
	}
	assert.Len(t, strings.Fields(text.String()), 9)
}

func TestErrors(t *testing.T) {
	h := start(t, func(o *serve.Options) { o.MaxBodyBytes = 4096 })
	ok := `[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name    string
		method  string
		path    string
		header  map[string]string
		body    string
		status  int
		param   string // "" expects null
		code    string
		allow   string
		inError string
	}{
		{name: "bad JSON", path: "/v1/chat/completions", body: `{"messages":`, status: 400, inError: "invalid JSON"},
		{name: "trailing garbage", path: "/v1/chat/completions", body: `{"messages":` + ok + `} x`, status: 400},
		{name: "missing messages", path: "/v1/chat/completions", body: `{"model":"m"}`, status: 400, param: "messages"},
		{name: "empty messages", path: "/v1/chat/completions", body: `{"messages":[]}`, status: 400, param: "messages"},
		{name: "messages not an array", path: "/v1/chat/completions", body: `{"messages":"hi"}`, status: 400, param: "messages"},
		{name: "role missing", path: "/v1/chat/completions", body: `{"messages":[{"content":"hi"}]}`, status: 400,
			param: "messages[0].role"},
		{name: "role a number", path: "/v1/chat/completions", body: `{"messages":[{"role":1,"content":"hi"}]}`,
			status: 400, param: "messages[0].role"},
		{name: "message not an object", path: "/v1/chat/completions", body: `{"messages":["hi"]}`,
			status: 400, param: "messages[0]"},
		{name: "content a number", path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"a"},{"role":"user","content":3}]}`, status: 400,
			param: "messages[1].content"},
		{name: "image part", path: "/v1/chat/completions",
			body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`,
			status: 400, param: "messages[0].content[1].type"},
		{name: "max_tokens 0", path: "/v1/chat/completions", body: `{"messages":` + ok + `,"max_tokens":0}`,
			status: 400, param: "max_tokens"},
		{name: "max_completion_tokens negative", path: "/v1/chat/completions",
			body: `{"messages":` + ok + `,"max_completion_tokens":-3}`, status: 400, param: "max_completion_tokens"},
		{name: "max_tokens a string", path: "/v1/chat/completions", body: `{"messages":` + ok + `,"max_tokens":"ten"}`,
			status: 400, param: "max_tokens"},
		{name: "stream a string", path: "/v1/chat/completions", body: `{"messages":` + ok + `,"stream":"yes"}`,
			status: 400, param: "stream"},
		{name: "n 2", path: "/v1/chat/completions", body: `{"messages":` + ok + `,"n":2}`, status: 400, param: "n"},
		{name: "context too long", path: "/v1/chat/completions", body: `{"messages":` + ok + `,"max_tokens":5000000}`,
			status: 400, param: "messages", code: "context_length_exceeded"},
		{name: "bad x-session-end", path: "/v1/chat/completions", header: map[string]string{"x-session-end": "maybe"},
			body: `{"messages":` + ok + `}`, status: 400, param: "x-session-end"},
		{name: "completion without prompt", path: "/v1/completions", body: `{"model":"m"}`, status: 400, param: "prompt"},
		{name: "completion batch", path: "/v1/completions", body: `{"prompt":["a","b"]}`, status: 400, param: "prompt"},
		{name: "oversized body", path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, status: 413,
			inError: "4096 bytes"},
		{name: "wrong method chat", method: http.MethodGet, path: "/v1/chat/completions", status: 405, allow: "POST",
			code: "method_not_allowed"},
		{name: "wrong method lending", method: http.MethodDelete, path: "/admin/lending", status: 405,
			allow: "GET, PUT, POST, HEAD", code: "method_not_allowed"},
		{name: "wrong method end", method: http.MethodGet, path: "/v1/sessions/x/end", status: 405, allow: "POST",
			code: "method_not_allowed"},
		{name: "unknown session", path: "/v1/sessions/nobody/end", status: 404, param: "id", code: "session_not_found"},
		{name: "unknown path", method: http.MethodGet, path: "/v2/nothing", status: 404, code: "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			code, hdr, body := h.do(method, tc.path, tc.header, tc.body)
			require.Equal(t, tc.status, code, string(body))
			assert.Equal(t, tc.allow, hdr.Get("Allow"))
			var e errBody
			require.NoError(t, json.Unmarshal(body, &e), string(body))
			assert.NotEmpty(t, e.Error.Message)
			assert.NotEmpty(t, e.Error.Type)
			if tc.param == "" {
				assert.Nil(t, e.Error.Param)
			} else if assert.NotNil(t, e.Error.Param) {
				assert.Equal(t, tc.param, *e.Error.Param)
				assert.Contains(t, e.Error.Message, tc.param, "the message names the field")
			}
			if tc.code != "" && assert.NotNil(t, e.Error.Code) {
				assert.Equal(t, tc.code, *e.Error.Code)
			}
			assert.Contains(t, e.Error.Message, tc.inError)
		})
	}
	// Nothing above reached the simulator.
	st := h.state()
	assert.Zero(t, st.ExternalSessions)
	assert.Zero(t, st.CallsCompleted)

	code, _, body := h.do(http.MethodGet, "/metrics/prefill-9", nil, "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, string(body), "prefill-0", "the 404 lists the known instances")
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, 5*time.Millisecond, what)
}

// asyncCall is a request running in the background.
type asyncCall struct {
	cancel context.CancelFunc
	done   chan asyncResult
}

type asyncResult struct {
	status int
	body   []byte
	err    error
}

func (h *harness) startCall(header map[string]string, body string) *asyncCall {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	a := &asyncCall{cancel: cancel, done: make(chan asyncResult, 1)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(h.t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	go func() {
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			a.done <- asyncResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		a.done <- asyncResult{status: resp.StatusCode, body: b, err: err}
	}()
	return a
}

func (a *asyncCall) wait(t *testing.T) asyncResult {
	t.Helper()
	defer a.cancel()
	select {
	case r := <-a.done:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("call did not finish")
		return asyncResult{}
	}
}

func TestBusyAndEndInFlight(t *testing.T) {
	clock := testclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := start(t, func(o *serve.Options) { o.Now, o.Speed = clock.Now, 1 })
	body := chatBody(t, map[string]any{"max_tokens": 100}, message{"user", "hello"})
	first := h.startCall(map[string]string{"x-session-id": "x"}, body)
	waitFor(t, "call in flight", func() bool { return h.state().ExternalCalls == 1 })

	// The clock stands still, so the first call is still running.
	code, _, b := h.do(http.MethodPost, "/v1/chat/completions", map[string]string{"x-session-id": "x"}, body)
	require.Equal(t, http.StatusConflict, code, string(b))
	var e errBody
	require.NoError(t, json.Unmarshal(b, &e))
	require.NotNil(t, e.Error.Code)
	assert.Equal(t, "session_busy", *e.Error.Code)

	// Ending the session aborts the call in flight, which answers 409 session_ended.
	code, _, _ = h.do(http.MethodPost, "/v1/sessions/x/end", nil, "")
	require.Equal(t, http.StatusOK, code)
	r := first.wait(t)
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusConflict, r.status, string(r.body))
	assert.Contains(t, string(r.body), "session_ended")
	st := h.state()
	assert.Zero(t, st.ExternalSessions)
	assert.Zero(t, st.LiveSessions)
}

func TestClientDisconnectAborts(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			clock := testclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			h := start(t, func(o *serve.Options) { o.Now, o.Speed = clock.Now, 1 })
			body := chatBody(t, map[string]any{"max_tokens": 5000, "stream": stream}, message{"user", "hello"})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions", strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("x-session-id", "gone")
			got := make(chan error, 1)
			go func() {
				resp, err := h.ts.Client().Do(req)
				if err == nil {
					if stream {
						// Read the first chunk, then hang up mid-stream.
						_, _ = bufio.NewReader(resp.Body).ReadString('\n')
						cancel()
					}
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				got <- err
			}()
			waitFor(t, "call in flight", func() bool { return h.state().ExternalCalls == 1 })
			if stream {
				clock.Advance(time.Second) // past prefill and transfer, well before 5000 tokens decode
			} else {
				cancel()
			}
			select {
			case err := <-got:
				assert.True(t, errors.Is(err, context.Canceled), "client error: %v", err)
			case <-time.After(5 * time.Second):
				t.Fatal("client did not return")
			}
			waitFor(t, "session aborted", func() bool {
				st := h.state()
				return st.ExternalSessions == 0 && st.LiveSessions == 0
			})
			assert.Contains(t, h.log.String(), "call aborted")
			assert.Contains(t, h.log.String(), "session=gone")
		})
	}
}

func TestLending(t *testing.T) {
	h := start(t, nil)
	lending := func(method, body string) (int, string) {
		code, _, b := h.do(method, "/admin/lending", nil, body)
		return code, string(b)
	}
	code, body := lending(http.MethodGet, "")
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"enabled":false,"max_fraction":0.5}`, body, "the preset's lending")

	code, body = lending(http.MethodPut, `{"enabled":true}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"enabled":true,"max_fraction":0.5}`, body, "max_fraction kept")

	code, body = lending(http.MethodPost, `{"enabled":true,"max_fraction":0.25}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"enabled":true,"max_fraction":0.25}`, body)
	st := h.state()
	assert.True(t, st.Lending.Enabled)
	assert.Equal(t, 0.25, st.Lending.MaxFraction)

	for _, tc := range []struct {
		name, body, param string
	}{
		{"max_fraction above 1", `{"enabled":true,"max_fraction":1.5}`, "max_fraction"},
		{"max_fraction negative", `{"enabled":false,"max_fraction":-0.1}`, "max_fraction"},
		{"enabled missing", `{"max_fraction":0.2}`, "enabled"},
		{"enabled a string", `{"enabled":"yes"}`, "enabled"},
		{"unknown field", `{"enabled":true,"fraction":0.2}`, "fraction"},
		{"bad JSON", `{"enabled":`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := lending(http.MethodPut, tc.body)
			require.Equal(t, http.StatusBadRequest, code, body)
			var e errBody
			require.NoError(t, json.Unmarshal([]byte(body), &e))
			if tc.param == "" {
				assert.Nil(t, e.Error.Param)
			} else if assert.NotNil(t, e.Error.Param) {
				assert.Equal(t, tc.param, *e.Error.Param)
			}
		})
	}
	_, body = lending(http.MethodGet, "")
	assert.JSONEq(t, `{"enabled":true,"max_fraction":0.25}`, body, "refused switches change nothing")

	code, body = lending(http.MethodPut, `{"enabled":false}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.False(t, h.state().Lending.Enabled)
}

func TestMetrics(t *testing.T) {
	h := start(t, nil)
	code, _, b := h.do(http.MethodGet, "/metrics", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "/metrics/prefill-0\n/metrics/decode-0\n", string(b))

	c, _ := h.chat(nil, chatBody(t, map[string]any{"max_tokens": 30}, message{"user", strings.Repeat("x", 1000)}))

	scrape := func(instance string) map[string]float64 {
		code, hdr, b := h.do(http.MethodGet, "/metrics/"+instance, nil, "")
		require.Equal(t, http.StatusOK, code, string(b))
		assert.Contains(t, hdr.Get("Content-Type"), "text/plain")
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		require.NoError(t, err)
		out := map[string]float64{}
		for name, f := range fams {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "engine_type" {
						assert.Equal(t, strings.TrimSuffix(instance, "-0"), l.GetValue())
					}
				}
				if m.GetCounter() != nil {
					out[name] += m.GetCounter().GetValue()
				}
			}
		}
		return out
	}
	prefill := scrape("prefill-0")
	require.Contains(t, prefill, "sglang:prompt_tokens_total")
	assert.Equal(t, float64(c.Usage.PromptTokens), prefill["sglang:prompt_tokens_total"])
	decode := scrape("decode-0")
	assert.Equal(t, 30.0, decode["sglang:generation_tokens_total"])
}

func TestIdleTimeout(t *testing.T) {
	clock := testclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := start(t, func(o *serve.Options) {
		o.Now, o.Speed, o.IdleTimeout = clock.Now, 60, time.Minute
	})
	call := h.startCall(map[string]string{"x-session-id": "idle"},
		chatBody(t, map[string]any{"max_tokens": 10}, message{"user", "hello"}))
	waitFor(t, "call in flight", func() bool { return h.state().ExternalCalls == 1 })
	clock.Advance(100 * time.Millisecond) // 6 virtual seconds: the call is done
	r := call.wait(t)
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.status, string(r.body))

	st := h.state()
	assert.InDelta(t, 6, st.NowSeconds, 1e-9, "virtual time is wall time × speed")
	assert.Equal(t, 1, st.ExternalSessions)
	clock.Advance(500 * time.Millisecond) // 36 s: idle for about 30 s
	assert.Equal(t, 1, h.state().ExternalSessions)
	clock.Advance(500 * time.Millisecond) // 66 s: idle for more than a minute
	st = h.state()
	assert.Zero(t, st.ExternalSessions)
	assert.Zero(t, st.LiveSessions)
	assert.Zero(t, st.WorkingSetTokens, "the session's prefix left the working set")
	assert.Contains(t, h.log.String(), "session idle; ended")
}

func TestRunStops(t *testing.T) {
	clock := testclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	o := serve.Options{Sim: sim.Options{Deployment: deployment(t)}, Speed: 1, Now: clock.Now}
	srv, err := serve.New(o)
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	h := &harness{t: t, srv: srv, ts: ts}

	// A call waits for a clock that stands still; stopping the simulator answers it.
	waiting := h.startCall(nil, chatBody(t, nil, message{"user", "hi"}))
	waitFor(t, "call in flight", func() bool { return h.state().ExternalCalls == 1 })
	assert.Error(t, srv.Run(ctx), "a second Run is refused")
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(time.Second):
		t.Fatal("Run did not return within a second of cancel")
	}
	r := waiting.wait(t)
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Contains(t, string(r.body), "simulator_stopped")
	code, _, b := h.do(http.MethodPost, "/v1/chat/completions", nil, chatBody(t, nil, message{"user", "hi"}))
	assert.Equal(t, http.StatusServiceUnavailable, code, string(b))
}

func TestModelsAndHealth(t *testing.T) {
	h := start(t, func(o *serve.Options) { o.ModelName = "qwen-sim" })
	code, _, b := h.do(http.MethodGet, "/v1/models", nil, "")
	require.Equal(t, http.StatusOK, code)
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(b, &models))
	assert.Equal(t, "list", models.Object)
	require.Len(t, models.Data, 1)
	assert.Equal(t, "qwen-sim", models.Data[0].ID)

	c, _ := h.chat(nil, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	assert.Equal(t, "qwen-sim", c.Model, "no model asked: the served one")

	code, _, b = h.do(http.MethodGet, "/healthz", nil, "")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok", strings.TrimSpace(string(b)))
}

func TestNewValidates(t *testing.T) {
	good := func(t *testing.T) serve.Options {
		return serve.Options{Sim: sim.Options{Deployment: deployment(t)}, Speed: 60}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*serve.Options)
		field string
	}{
		{"zero speed", func(o *serve.Options) { o.Speed = 0 }, "speed"},
		{"negative speed", func(o *serve.Options) { o.Speed = -2 }, "speed"},
		{"infinite speed", func(o *serve.Options) { o.Speed = math.Inf(1) }, "speed"},
		{"negative idle timeout", func(o *serve.Options) { o.IdleTimeout = -time.Second }, "idle_timeout"},
		{"negative body limit", func(o *serve.Options) { o.MaxBodyBytes = -1 }, "max_body_bytes"},
		{"bad model name", func(o *serve.Options) { o.ModelName = "\xff" }, "model_name"},
		{"bad deployment", func(o *serve.Options) { o.Sim.Deployment.Decode.KVTokens = 0 }, "deployment.decode.kv_tokens"},
		{"bad policy", func(o *serve.Options) { o.Sim.Policy = "lru" }, "policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good(t)
			tc.edit(&o)
			_, err := serve.New(o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
	_, err := serve.New(good(t))
	assert.NoError(t, err, "defaults fill the rest")
}

// TestLendingDecision: the simulator receives the basin lender's http backend payload (version 1,
// as lender/README.md documents it) and switches its lending; grants collapse to max_fraction.
func TestLendingDecision(t *testing.T) {
	h := start(t, nil)
	post := func(body string) (int, string) {
		code, _, b := h.do(http.MethodPost, "/admin/lending/decision", nil, body)
		return code, string(b)
	}
	code, body := post(`{"version":1,"at":"2026-05-01T12:00:00Z","enabled":true,"changed":true,
		"since":"2026-05-01T12:00:00Z","max_fraction":0.3,
		"grants":[{"instance":"decode-0","tokens":37000,"reason":"decode-0: free 52000"}],
		"reasons":["lending on: cache-first"]}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"enabled":true,"max_fraction":0.3}`, body)
	st := h.state()
	assert.True(t, st.Lending.Enabled)
	assert.Equal(t, 0.3, st.Lending.MaxFraction)

	code, body = post(`{"version":1,"enabled":false,"changed":true,"grants":[],"reasons":[]}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"enabled":false,"max_fraction":0.3}`, body, "max_fraction kept when absent")

	for _, tc := range []struct{ name, body, param string }{
		{"other version", `{"version":2,"enabled":true}`, "version"},
		{"enabled missing", `{"version":1,"max_fraction":0.2}`, "enabled"},
		{"max_fraction out of range", `{"version":1,"enabled":true,"max_fraction":2}`, "max_fraction"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(tc.body)
			require.Equal(t, http.StatusBadRequest, code, body)
			var e errBody
			require.NoError(t, json.Unmarshal([]byte(body), &e))
			require.NotNil(t, e.Error.Param)
			assert.Equal(t, tc.param, *e.Error.Param)
		})
	}
	code, _, _ = h.do(http.MethodGet, "/admin/lending/decision", nil, "")
	assert.Equal(t, http.StatusMethodNotAllowed, code)
}
