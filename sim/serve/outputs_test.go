package serve_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/serve"
)

// fixedWorkload draws sessions whose calls have the given output lengths, counting the draws.
type fixedWorkload struct {
	outputs []int
	draws   int
}

func (w *fixedWorkload) Name() string { return "fixed" }

func (w *fixedWorkload) Session(*rand.Rand) sim.SessionSpec {
	w.draws++
	s := sim.SessionSpec{Shared: 10}
	for _, o := range w.outputs {
		s.Calls = append(s.Calls, sim.CallSpec{Prompt: 100, Output: o})
	}
	return s
}

// TestOutputLengthsFromWorkload checks that an answer is as long as the workload's call, as a
// model ends its turn, and that only a smaller limit cuts it, which the answer then says, in each
// API's terms. A session's calls take the drawn session's calls in order.
func TestOutputLengthsFromWorkload(t *testing.T) {
	w := &fixedWorkload{outputs: []int{5, 40, 7}}
	h := start(t, func(o *serve.Options) { o.Workload = w })
	user := message{"user", strings.Repeat("u", 400)}
	sess := map[string]string{"x-session-id": "agent"}

	type want struct {
		words  int
		reason string
	}
	check := func(c completion, want want) {
		t.Helper()
		require.Len(t, c.Choices, 1)
		assert.Len(t, strings.Fields(c.Choices[0].Message.Content), want.words)
		assert.Equal(t, want.words, c.Usage.CompletionTokens)
		require.NotNil(t, c.Choices[0].FinishReason)
		assert.Equal(t, want.reason, *c.Choices[0].FinishReason)
	}
	// A coding agent's limit (Claude Code asks 32,000) is far above what the model says.
	c, _ := h.chat(sess, chatBody(t, map[string]any{"max_tokens": 32_000}, user))
	check(c, want{5, "stop"})
	// The second call's natural length is 40: a limit of 20 cuts it.
	c, _ = h.chat(sess, chatBody(t, map[string]any{"max_tokens": 20}, user))
	check(c, want{20, "length"})
	// Without a limit, the context is the only one.
	c, _ = h.chat(sess, chatBody(t, nil, user))
	check(c, want{7, "stop"})
	// The drawn session's calls are used up: the next call takes another's first.
	c, _ = h.chat(sess, chatBody(t, map[string]any{"max_completion_tokens": 9000}, user))
	check(c, want{5, "stop"})
	assert.Equal(t, 2, w.draws)

	// ignore_eos (SGLang, vLLM) asks for exactly the limit.
	c, _ = h.chat(nil, chatBody(t, map[string]any{"max_tokens": 33, "ignore_eos": true}, user))
	check(c, want{33, "length"})
	c, _ = h.chat(nil, chatBody(t, map[string]any{"max_tokens": 33, "ignore_eos": false}, user))
	check(c, want{5, "stop"})

	t.Run("streamed chat", func(t *testing.T) {
		for _, tc := range []struct {
			limit int
			want  want
		}{{1000, want{5, "stop"}}, {3, want{3, "length"}}} {
			code, _, b := h.do(http.MethodPost, "/v1/chat/completions", nil,
				chatBody(t, map[string]any{"max_tokens": tc.limit, "stream": true}, user))
			require.Equal(t, http.StatusOK, code, string(b))
			text, reason := chatStreamText(t, b)
			assert.Len(t, strings.Fields(text), tc.want.words)
			assert.Equal(t, tc.want.reason, reason)
		}
	})

	t.Run("messages", func(t *testing.T) {
		body := func(limit int, stream bool) string {
			b, err := json.Marshal(map[string]any{"model": "claude", "max_tokens": limit, "stream": stream,
				"messages": []message{user}})
			require.NoError(t, err)
			return string(b)
		}
		for _, tc := range []struct {
			limit  int
			words  int
			reason string
		}{{32_000, 5, "end_turn"}, {2, 2, "max_tokens"}} {
			code, _, b := h.do(http.MethodPost, "/v1/messages", nil, body(tc.limit, false))
			require.Equal(t, http.StatusOK, code, string(b))
			var m map[string]any
			require.NoError(t, json.Unmarshal(b, &m))
			assert.Equal(t, tc.reason, m["stop_reason"])
			assert.Equal(t, tc.words, num(t, m, "usage", "output_tokens"))
			assert.Len(t, strings.Fields(m["content"].([]any)[0].(map[string]any)["text"].(string)), tc.words)

			events := readNamedStream(t, h, "/v1/messages", nil, body(tc.limit, true))
			d := events[len(events)-2]
			require.Equal(t, "message_delta", d.event)
			assert.Equal(t, tc.reason, d.data["delta"].(map[string]any)["stop_reason"])
			assert.Equal(t, tc.words, num(t, d.data, "usage", "output_tokens"))
		}
	})

	t.Run("responses", func(t *testing.T) {
		for _, tc := range []struct {
			limit  string
			words  int
			status string
		}{{"", 5, "completed"}, {`,"max_output_tokens":4`, 4, "incomplete"}} {
			body := `{"model":"m","input":"` + strings.Repeat("u", 400) + `","store":false` + tc.limit
			code, _, b := h.do(http.MethodPost, "/v1/responses", nil, body+`}`)
			require.Equal(t, http.StatusOK, code, string(b))
			var r map[string]any
			require.NoError(t, json.Unmarshal(b, &r))
			assert.Equal(t, tc.status, r["status"])
			assert.Equal(t, tc.words, num(t, r, "usage", "output_tokens"))
			if tc.status == "incomplete" {
				assert.Equal(t, "max_output_tokens", r["incomplete_details"].(map[string]any)["reason"])
			} else {
				assert.Nil(t, r["incomplete_details"])
			}

			events := readNamedStream(t, h, "/v1/responses", nil, body+`,"stream":true}`)
			last := events[len(events)-1]
			assert.Equal(t, "response."+tc.status, last.event)
			assert.Equal(t, tc.status, last.data["response"].(map[string]any)["status"])
			assert.Equal(t, tc.words, num(t, last.data, "response", "usage", "output_tokens"))
		}
	})
}

// chatStreamText joins the text of a streamed chat completion's chunks and returns it with the
// finish reason the stream ended with.
func chatStreamText(t *testing.T, body []byte) (text, reason string) {
	t.Helper()
	var b strings.Builder
	for _, ev := range readStream(t, bytes.NewReader(body), nil) {
		if ev.data == "[DONE]" {
			continue
		}
		var ch completion
		require.NoError(t, json.Unmarshal([]byte(ev.data), &ch), ev.data)
		for _, c := range ch.Choices {
			if c.Delta != nil {
				b.WriteString(c.Delta.Content)
			}
			if c.FinishReason != nil {
				reason = *c.FinishReason
			}
		}
	}
	return b.String(), reason
}

// TestOutputLengthsWithoutWorkload checks the exact mode tests size calls with: the limit is the
// answer's length, and ignore_eos says the limit ended it.
func TestOutputLengthsWithoutWorkload(t *testing.T) {
	h := start(t, nil)
	user := message{"user", "hello"}
	c, _ := h.chat(nil, chatBody(t, map[string]any{"max_tokens": 32}, user))
	assert.Equal(t, 32, c.Usage.CompletionTokens)
	assert.Equal(t, "stop", *c.Choices[0].FinishReason)
	c, _ = h.chat(nil, chatBody(t, map[string]any{"max_tokens": 32, "ignore_eos": true}, user))
	assert.Equal(t, 32, c.Usage.CompletionTokens)
	assert.Equal(t, "length", *c.Choices[0].FinishReason)
}

func TestIgnoreEOSRefused(t *testing.T) {
	h := start(t, nil)
	for name, body := range map[string]string{
		"not a boolean": `{"messages":[{"role":"user","content":"x"}],"ignore_eos":"yes"}`,
		"sent twice":    `{"messages":[{"role":"user","content":"x"}],"ignore_eos":true,"ignore_eos":false}`,
	} {
		t.Run(name, func(t *testing.T) {
			code, _, b := h.do(http.MethodPost, "/v1/chat/completions", nil, body)
			require.Equal(t, http.StatusBadRequest, code, string(b))
			var e errBody
			require.NoError(t, json.Unmarshal(b, &e))
			require.NotNil(t, e.Error.Param)
			assert.Equal(t, "ignore_eos", *e.Error.Param)
			assert.Contains(t, e.Error.Message, "ignore_eos")
		})
	}
	// A nested ignore_eos is not the sampling parameter.
	c, _ := h.chat(nil, `{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"metadata":{"ignore_eos":"x"}}`)
	assert.Equal(t, "stop", *c.Choices[0].FinishReason)
}

// TestSpeedAnnounced checks the speed contract: every HTTP answer carries X-Basin-Sim-Speed and
// every engine instance's metrics the gauge basin_sim_speed.
func TestSpeedAnnounced(t *testing.T) {
	h := start(t, func(o *serve.Options) { o.Speed = 62.5 })
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": 2}, message{"user", "x"})},
		{http.MethodPost, "/v1/chat/completions", chatBody(t, map[string]any{"max_tokens": 2, "stream": true}, message{"user", "x"})},
		{http.MethodPost, "/v1/messages", `{"max_tokens":2,"messages":[{"role":"user","content":"x"}]}`},
		{http.MethodPost, "/v1/responses", `{"input":"x","max_output_tokens":2}`},
		{http.MethodPost, "/v1/chat/completions", `{"messages":3}`}, // 400
		{http.MethodGet, "/v1/models", ""},
		{http.MethodGet, "/admin/state", ""},
		{http.MethodGet, "/healthz", ""},
		{http.MethodGet, "/metrics", ""},
		{http.MethodGet, "/metrics/decode-0", ""},
		{http.MethodGet, "/nowhere", ""},    // 404
		{http.MethodDelete, "/healthz", ""}, // 405
	} {
		_, hdr, _ := h.do(tc.method, tc.path, nil, tc.body)
		assert.Equal(t, "62.5", hdr.Get(serve.SpeedHeader), "%s %s", tc.method, tc.path)
	}
	for _, instance := range []string{"prefill-0", "decode-0"} {
		code, _, b := h.do(http.MethodGet, "/metrics/"+instance, nil, "")
		require.Equal(t, http.StatusOK, code)
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		require.NoError(t, err)
		f := fams["basin_sim_speed"]
		require.NotNil(t, f, "%s exports basin_sim_speed", instance)
		assert.Equal(t, "Simulated seconds per wall-clock second of this simulated engine; real engines do not export it", f.GetHelp())
		require.Len(t, f.GetMetric(), 1)
		assert.Empty(t, f.GetMetric()[0].GetLabel(), "no labels")
		assert.Equal(t, 62.5, f.GetMetric()[0].GetGauge().GetValue())
	}
}
