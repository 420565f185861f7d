package serve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// namedEvent is one server-sent event: its event line and its data.
type namedEvent struct {
	event string
	data  map[string]any
}

// readNamedStream reads a stream of named events (Responses, Messages) to its end.
func readNamedStream(t *testing.T, h *harness, path string, header map[string]string, body string) []namedEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := h.ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var out []namedEvent
	var ev namedEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			require.NotEmpty(t, ev.event, "every event is named")
			out = append(out, ev)
			ev = namedEvent{}
		case strings.HasPrefix(line, "event: "):
			ev.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.data), line)
			assert.Equal(t, ev.event, ev.data["type"], "the event line names the data's type")
		default:
			t.Fatalf("unexpected line %q", line)
		}
	}
	return out
}

// num reads a number at a path of nested objects.
func num(t *testing.T, v map[string]any, path ...string) int {
	t.Helper()
	for _, k := range path[:len(path)-1] {
		next, ok := v[k].(map[string]any)
		require.True(t, ok, "%s in %v", k, v)
		v = next
	}
	f, ok := v[path[len(path)-1]].(float64)
	require.True(t, ok, "%v in %v", path, v)
	return int(f)
}

func TestResponses(t *testing.T) {
	h := start(t, nil)
	instructions, input := strings.Repeat("s", 800), strings.Repeat("u", 2000)
	body := `{"model":"m","instructions":"` + instructions + `","input":"` + input + `","max_output_tokens":12}`
	prompt := 200 + 4 + 500 + 4
	code, _, b := h.do(http.MethodPost, "/v1/responses", nil, body)
	require.Equal(t, http.StatusOK, code, string(b))
	var r map[string]any
	require.NoError(t, json.Unmarshal(b, &r))
	assert.Equal(t, "response", r["object"])
	assert.Equal(t, "completed", r["status"])
	assert.Equal(t, prompt, num(t, r, "usage", "input_tokens"))
	assert.Equal(t, 12, num(t, r, "usage", "output_tokens"))
	assert.Equal(t, prompt+12, num(t, r, "usage", "total_tokens"))
	text := r["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"].(string)
	assert.Len(t, strings.Fields(text), 12)
	first := r["id"].(string)
	require.True(t, strings.HasPrefix(first, "resp_"), first)

	// The next call continues the conversation the server keeps: its prompt is all of it, and
	// it is read from the cache.
	events := readNamedStream(t, h, "/v1/responses", nil,
		`{"model":"m","input":"abcd","previous_response_id":"`+first+`","max_output_tokens":7,"stream":true}`)
	var names []string
	var delta strings.Builder
	for i, ev := range events {
		names = append(names, ev.event)
		assert.Equal(t, i, num(t, ev.data, "sequence_number"))
		if ev.event == "response.output_text.delta" {
			delta.WriteString(ev.data["delta"].(string))
		}
	}
	assert.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added"}, names[:4])
	assert.Equal(t, []string{"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed"}, names[len(names)-4:])
	assert.Len(t, strings.Fields(delta.String()), 7)
	done := events[len(events)-1].data
	chained := prompt + 12 + 1 + 4
	assert.Equal(t, chained, num(t, done, "response", "usage", "input_tokens"), "the chain's whole prompt")
	assert.GreaterOrEqual(t, num(t, done, "response", "usage", "input_tokens_details", "cached_tokens"), prompt,
		"the chain's earlier turns are read from the cache")
	assert.Equal(t, first, done["response"].(map[string]any)["previous_response_id"])
	assert.Equal(t, 1, h.state().ExternalSessions, "a chain is one session")

	code, _, b = h.do(http.MethodPost, "/v1/responses", nil, `{"input":"x","previous_response_id":"resp_unknown"}`)
	assert.Equal(t, http.StatusBadRequest, code, string(b))
	assert.Contains(t, string(b), "previous_response_id")
}

func TestMessages(t *testing.T) {
	h := start(t, nil)
	system, user := strings.Repeat("s", 800), strings.Repeat("u", 2000)
	body := func(stream bool) string {
		s := `{"model":"claude","max_tokens":9,"system":"` + system + `","messages":[{"role":"user","content":"` + user + `"}]`
		if stream {
			s += `,"stream":true`
		}
		return s + `}`
	}
	prompt := 200 + 4 + 500 + 4
	hdr := map[string]string{"x-claude-code-session-id": "cc-1"}
	code, _, b := h.do(http.MethodPost, "/v1/messages", hdr, body(false))
	require.Equal(t, http.StatusOK, code, string(b))
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, "message", m["type"])
	assert.Equal(t, "end_turn", m["stop_reason"])
	u := m["usage"].(map[string]any)
	assert.Equal(t, prompt, num(t, u, "input_tokens")+num(t, u, "cache_read_input_tokens")+num(t, u, "cache_creation_input_tokens"),
		"Anthropic's input_tokens leave out the cached tokens")
	assert.Equal(t, 9, num(t, u, "output_tokens"))

	events := readNamedStream(t, h, "/v1/messages", hdr, body(true))
	var names []string
	var text strings.Builder
	for _, ev := range events {
		names = append(names, ev.event)
		if ev.event == "content_block_delta" {
			text.WriteString(ev.data["delta"].(map[string]any)["text"].(string))
		}
	}
	assert.Equal(t, []string{"message_start", "content_block_start"}, names[:2])
	assert.Equal(t, []string{"content_block_stop", "message_delta", "message_stop"}, names[len(names)-3:])
	assert.Len(t, strings.Fields(text.String()), 9)
	start := events[0].data["message"].(map[string]any)["usage"].(map[string]any)
	assert.Equal(t, prompt, num(t, start, "input_tokens")+num(t, start, "cache_read_input_tokens"))
	assert.GreaterOrEqual(t, num(t, start, "cache_read_input_tokens"), prompt-4,
		"the same session's second call reads its prompt from the cache")
	assert.Equal(t, 9, num(t, events[len(events)-2].data, "usage", "output_tokens"))

	// Errors are Anthropic's.
	code, _, b = h.do(http.MethodPost, "/v1/messages", nil, `{"messages":"x"}`)
	assert.Equal(t, http.StatusBadRequest, code)
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	require.NoError(t, json.Unmarshal(b, &e))
	assert.Equal(t, "error", e.Type)
	assert.Equal(t, "invalid_request_error", e.Error.Type)
	assert.Contains(t, e.Error.Message, "messages")
}
