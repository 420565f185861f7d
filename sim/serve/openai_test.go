package serve

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
)

// testServer is a server over the paper's 1P1D H100 deployment at 60× speed, for tests, fuzz
// targets and benchmarks.
func testServer(tb testing.TB) *Server {
	tb.Helper()
	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	require.NoError(tb, err)
	s, err := New(Options{Sim: sim.Options{Deployment: dep}, Speed: 60})
	require.NoError(tb, err)
	return s
}

func TestChatTokens(t *testing.T) {
	s := testServer(t)
	for _, tc := range []struct {
		name           string
		messages       string
		prompt, shared int
	}{
		{"one user message", `[{"role":"user","content":"abcdefgh"}]`, 2 + 4, 0},
		{"rounds up over the whole prompt", `[{"role":"user","content":"a"},{"role":"user","content":"bcdef"}]`, 2 + 8, 0},
		{"characters, not bytes", `[{"role":"user","content":"ééééé"}]`, 2 + 4, 0},
		{"leading system prompt is shared",
			`[{"role":"system","content":"` + strings.Repeat("s", 40) + `"},{"role":"user","content":"` + strings.Repeat("u", 40) + `"}]`,
			20 + 8, 10 + 4},
		{"system and developer lead together",
			`[{"role":"system","content":"ssss"},{"role":"developer","content":"dddd"},{"role":"user","content":"uuuu"}]`,
			3 + 12, 2 + 8},
		{"a later system message is not shared",
			`[{"role":"user","content":"uuuu"},{"role":"system","content":"ssss"}]`, 2 + 8, 0},
		{"text parts", `[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"text","text":"efgh"}]}]`, 2 + 4, 0},
		{"tool calls count, null content does not",
			`[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]`, 3 + 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, apiErr := s.parseGenerate(chatEndpoint, http.Header{}, []byte(`{"messages":`+tc.messages+`}`))
			require.Nil(t, apiErr)
			assert.Equal(t, tc.prompt, req.prompt, "prompt")
			assert.Equal(t, tc.shared, req.shared, "shared")
		})
	}
}

func TestCompletionTokens(t *testing.T) {
	s := testServer(t)
	completionTokens := func(prompt []byte) (int, *apiError) {
		req, apiErr := s.parseGenerate(completionEndpoint, http.Header{}, []byte(`{"prompt":`+string(prompt)+`}`))
		return req.prompt, apiErr
	}
	for _, tc := range []struct {
		prompt string
		want   int
	}{
		{`"abcde"`, 2},
		{`""`, 1},
		{`["abcdefgh"]`, 2},
		{`[5, 6, 7]`, 3},
	} {
		got, apiErr := completionTokens([]byte(tc.prompt))
		require.Nil(t, apiErr, tc.prompt)
		assert.Equal(t, tc.want, got, tc.prompt)
	}
	for _, bad := range []string{`null`, `3`, `[]`, `["a","b"]`, `[[1]]`, `{"a":1}`} {
		_, apiErr := completionTokens([]byte(bad))
		if assert.NotNil(t, apiErr, bad) {
			assert.Equal(t, "prompt", apiErr.param, bad)
		}
	}
}

func TestSessionIdentity(t *testing.T) {
	s := testServer(t)
	for _, tc := range []struct {
		name    string
		header  map[string]string
		body    string
		session string
		end     bool
	}{
		{"none: a one-call session", nil, `{}`, "", false},
		{"user", nil, `{"user":"u1"}`, "u1", false},
		{"metadata beats user", nil, `{"user":"u1","metadata":{"session_id":"m1"}}`, "m1", false},
		{"any header beats the body", map[string]string{"x-dynamo-session-id": "d1"},
			`{"user":"u1","metadata":{"session_id":"m1"}}`, "d1", false},
		{"x-session-id first", map[string]string{"x-session-id": "a", "x-claude-code-session-id": "b", "session_id": "c"},
			`{}`, "a", false},
		{"claude code before session-id", map[string]string{"x-claude-code-session-id": "b", "session-id": "c"}, `{}`, "b", false},
		{"session-id before session_id", map[string]string{"session-id": "c", "session_id": "d"}, `{}`, "c", false},
		{"session_id before affinity", map[string]string{"session_id": "d", "x-session-affinity": "e"}, `{}`, "d", false},
		{"affinity before dynamo", map[string]string{"x-session-affinity": "e", "x-dynamo-session-id": "f"}, `{}`, "e", false},
		{"blank header skipped", map[string]string{"x-session-id": "  ", "session-id": "c"}, `{}`, "c", false},
		{"end header", map[string]string{"x-session-id": "a", "x-session-end": "true"}, `{}`, "a", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			body := strings.Replace(tc.body, "{", `{"messages":[{"role":"user","content":"hi"}],`, 1)
			body = strings.Replace(body, ",}", "}", 1)
			req, apiErr := s.parseGenerate(chatEndpoint, h, []byte(body))
			require.Nil(t, apiErr, body)
			assert.Equal(t, tc.session, req.session)
			assert.Equal(t, tc.end, req.endAfter)
		})
	}
}

func TestFiller(t *testing.T) {
	whole := filler(0, 37)
	assert.Len(t, strings.Fields(whole), 37)
	assert.Len(t, whole, 4*37-1, "four characters a word, so the answer is as many tokens again")
	assert.Equal(t, whole, filler(0, 1)+filler(1, 10)+filler(10, 37), "stream pieces concatenate to the whole")
	assert.Empty(t, filler(5, 5))
}
