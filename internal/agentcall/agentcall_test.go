package agentcall

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ptr(v int64) *int64 { return &v }

// readCase is a body read as a shape (Chat when zero), what it must read and the field of its
// error ("-" for a whole-body error).
type readCase struct {
	name           string
	shape          Shape
	body           string
	prompt, shared int64
	task, lastRole string
	err            string
}

func TestRead(t *testing.T) {
	for _, tc := range append(append(chatCases, completionCases...), newShapeCases...) {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.shape
			if s == 0 {
				s = Chat
			}
			c, err := Read(s, []byte(tc.body))
			assert.Equal(t, tc.prompt, c.Prompt, "prompt")
			assert.Equal(t, tc.shared, c.Shared, "shared")
			assert.Equal(t, tc.task, c.Task, "task")
			assert.Equal(t, len([]rune(tc.task)), c.TaskChars, "task characters")
			assert.Equal(t, tc.lastRole, c.LastRole, "last role")
			switch tc.err {
			case "":
				assert.NoError(t, err)
			case "-":
				var fe *FieldError
				require.ErrorAs(t, err, &fe)
				assert.Empty(t, fe.Field)
				assert.Contains(t, err.Error(), "request body: ")
			default:
				var fe *FieldError
				require.ErrorAs(t, err, &fe)
				assert.Equal(t, tc.err, fe.Field)
				assert.True(t, strings.HasPrefix(err.Error(), tc.err+": "), "the message names the field: %v", err)
			}
		})
	}
}

var chatCases = []readCase{
	{name: "one user message", body: `{"messages":[{"role":"user","content":"abcdefgh"}]}`,
		prompt: 2 + 4, task: "abcdefgh", lastRole: "user"},
	{name: "rounds up over the whole prompt", body: `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"bcdef"}]}`,
		prompt: 2 + 8, task: "a", lastRole: "user"},
	{name: "characters, not bytes", body: `{"messages":[{"role":"user","content":"ééééé"}]}`,
		prompt: 2 + 4, task: "ééééé", lastRole: "user"},
	{name: "escapes are one character", body: `{"messages":[{"role":"user","content":"\u00e9\n\ud83d\ude00\"\\"}]}`,
		prompt: 2 + 4, task: "é\n😀\"\\", lastRole: "user"},
	{name: "leading system and developer messages are shared",
		body:   `{"messages":[{"role":"system","content":"ssss"},{"role":"developer","content":"dddd"},{"role":"user","content":"uuuu"},{"role":"system","content":"late"}]}`,
		prompt: 4 + 16, shared: 2 + 8, task: "uuuu", lastRole: "system"},
	{name: "text parts: their text, no separator; the task joins them by lines",
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"text","text":""},{"type":"text","text":"efgh"}]}]}`,
		prompt: 2 + 4, task: "abcd\nefgh", lastRole: "user"},
	{name: "tool calls count as their JSON text, null content as nothing",
		body:   `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`,
		prompt: 3 + 4, lastRole: "assistant"},
	{name: "a later user message is not the task",
		body:   `{"messages":[{"role":"assistant","content":"x"},{"role":"user","content":"first"},{"role":"user","content":"second"}]}`,
		prompt: 3 + 12, task: "first", lastRole: "user"},
	{name: "an image part is counted as nothing and refused by a strict server",
		body:   `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"data:,x"}}]}]}`,
		prompt: 1 + 4, task: "abcd", lastRole: "user", err: "messages[0].content[1].type"},
	{name: "missing messages: sized by the body", body: `{"model":"abcdefgh"}`, prompt: 5, err: "messages"},
	{name: "empty messages", body: `{"messages":[]}`, prompt: 1, err: "messages"},
	{name: "messages not an array: sized by the body", body: `{"messages":"hi"}`, prompt: 5, err: "messages"},
	{name: "a message not an object: sized by the body", body: `{"messages":[{"role":"user","content":"hi"},"x"]}`,
		prompt: 13, err: "messages[1]"},
	{name: "role of the wrong type: sized by the body", body: `{"messages":[{"role":1,"content":"hi"}]}`,
		prompt: 10, err: "messages[0].role"},
	{name: "role missing", body: `{"messages":[{"content":"abcd"}]}`, prompt: 1 + 4, err: "messages[0].role"},
	{name: "content of another shape counts nothing", body: `{"messages":[{"role":"user","content":7},{"role":"user","content":"abcd"}]}`,
		prompt: 1 + 8, task: "", lastRole: "user", err: "messages[0].content"},
	{name: "invalid JSON: sized by the body", body: `{"messages":[{"role":"user","content":"hi"}]`, prompt: 11, err: "-"},
	{name: "not an object", body: `[{"role":"user"}]`, prompt: 5, err: "-"},
	{name: "null body", body: `null`, prompt: 1, err: "-"},
	{name: "keys match exactly, as engines read them", body: `{"Messages":[{"role":"user","content":"hi"}]}`,
		prompt: 12, err: "messages"},
	{name: "a top-level field of the wrong type is the first error", body: `{"messages":[{"content":"x"}],"stream":"yes"}`,
		prompt: 1 + 4, err: "stream"},
}

var completionCases = []readCase{
	{name: "a string", shape: Completions, body: `{"prompt":"abcde"}`, prompt: 2, task: "abcde"},
	{name: "an empty string", shape: Completions, body: `{"prompt":""}`, prompt: 1},
	{name: "one string", shape: Completions, body: `{"prompt":["abcdefgh"]}`, prompt: 2, task: "abcdefgh"},
	{name: "token ids", shape: Completions, body: `{"prompt":[5, 6, 7]}`, prompt: 3},
	{name: "two strings: the first", shape: Completions, body: `{"prompt":["abcdefgh","b"]}`, prompt: 2, task: "abcdefgh", err: "prompt"},
	{name: "a null string", shape: Completions, body: `{"prompt":[null,"b"]}`, prompt: 1, err: "prompt"},
	{name: "no strings", shape: Completions, body: `{"prompt":[]}`, prompt: 4, err: "prompt"},
	{name: "null", shape: Completions, body: `{"prompt":null}`, prompt: 4, err: "prompt"},
	{name: "a number", shape: Completions, body: `{"prompt":3}`, prompt: 3, err: "prompt"},
	{name: "nested ids", shape: Completions, body: `{"prompt":[[1]]}`, prompt: 4, err: "prompt"},
	{name: "a fraction", shape: Completions, body: `{"prompt":[1.5]}`, prompt: 4, err: "prompt"},
	{name: "an object", shape: Completions, body: `{"prompt":{"a":1}}`, prompt: 5, err: "prompt"},
	{name: "messages are not a prompt", shape: Completions, body: `{"messages":[{"role":"user","content":"abcdefgh"}]}`, prompt: 13, err: "prompt"},
}

// newShapeCases are bodies of OpenAI Responses and Anthropic Messages.
var newShapeCases = []readCase{
	{name: "responses: input a string", shape: Responses, body: `{"input":"abcdefgh","instructions":"ssss"}`,
		prompt: 3 + 8, shared: 1 + 4, task: "abcdefgh", lastRole: "user"},
	{name: "responses: items", shape: Responses,
		body: `{"instructions":"ssss","input":[{"role":"developer","content":"dddd"},{"type":"message","role":"user","content":[{"type":"input_text","text":"abcd"}]},` +
			`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}]}`,
		prompt: Tokens(4+4+4+66+59) + 5*4, shared: 2 + 8, task: "abcd"},
	{name: "responses: an output_text part is text", shape: Responses,
		body:   `{"input":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"output_text","text":"bcd"}]}]}`,
		prompt: 1 + 8, task: "a", lastRole: "assistant"},
	{name: "responses: input required", shape: Responses, body: `{"previous_response_id":"r1"}`, prompt: 8, err: "input"},
	{name: "responses: instructions a number", shape: Responses, body: `{"input":"abcd","instructions":3}`,
		prompt: 1 + 4, task: "abcd", lastRole: "user", err: "instructions"},
	{name: "messages: system and blocks", shape: Messages,
		body: `{"system":[{"type":"text","text":"ssss","cache_control":{"type":"ephemeral"}}],"messages":[` +
			`{"role":"user","content":[{"type":"text","text":"ab"},{"type":"image","source":{"data":"AAAA"}},{"type":"text","text":"cd"}]},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"hmm!","signature":"x"},{"type":"tool_use","id":"t","name":"bash","input":{"c":1}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"done"}]}]}]}`,
		prompt: Tokens(4+4+4+4+7+4) + 4*4, shared: 1 + 4, task: "ab\ncd", lastRole: "user"},
	{name: "messages: string content", shape: Messages, body: `{"system":"ssss","messages":[{"role":"user","content":"abcd"}]}`,
		prompt: 2 + 8, shared: 1 + 4, task: "abcd", lastRole: "user"},
	{name: "messages: a block not an object", shape: Messages, body: `{"messages":[{"role":"user","content":["x"]}]}`,
		prompt: 4, lastRole: "user", err: "messages[0].content[0]"},
}

func TestReadFields(t *testing.T) {
	c, err := Read(Chat, []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":10,
		"max_completion_tokens":20,"n":1,"user":" u ","metadata":{"session_id":" s "},"messages":[{"role":"user","content":"x"}]}`))
	require.NoError(t, err)
	assert.Equal(t, Call{Shape: Chat, Prompt: 5, Task: "x", TaskChars: 1, LastRole: "user", SessionID: "s", User: "u",
		Model: "m", Stream: true, IncludeUsage: true, MaxTokens: ptr(10), MaxCompletionTokens: ptr(20), N: ptr(1)}, c)

	for _, tc := range []struct{ body, field string }{
		{`{"model":1}`, "model"},
		{`{"stream":"yes"}`, "stream"},
		{`{"stream_options":[]}`, "stream_options"},
		{`{"stream_options":{"include_usage":1}}`, "stream_options.include_usage"},
		{`{"max_tokens":1.5}`, "max_tokens"},
		{`{"max_tokens":"10"}`, "max_tokens"},
		{`{"max_completion_tokens":1e3}`, "max_completion_tokens"},
		{`{"n":99999999999999999999}`, "n"},
		{`{"user":42}`, "user"},
		{`{"metadata":"m"}`, "metadata"},
		{`{"metadata":{"session_id":7}}`, "metadata.session_id"},
	} {
		body := strings.Replace(tc.body, "{", `{"messages":[{"role":"user","content":"x"}],`, 1)
		c, err := Read(Chat, []byte(body))
		if assert.Error(t, err, body) {
			assert.Equal(t, tc.field, err.(*FieldError).Field, body)
			assert.Contains(t, err.Error(), "must be", body)
		}
		assert.Equal(t, int64(5), c.Prompt, "the prompt is still read: %s", body)
	}

	c, err = Read(Chat, []byte(`{"messages":[{"role":"user","content":"x"}],"user":"u","metadata":{"session_id":null}}`))
	require.NoError(t, err)
	assert.Equal(t, "", c.SessionID, "a null session id is none (the user's is not carried over)")
	assert.Equal(t, "u", c.User)

	c, err = Read(Responses, []byte(`{"input":"x","prompt_cache_key":" k ","previous_response_id":"r","max_output_tokens":9,"user":"u"}`))
	require.NoError(t, err)
	assert.Equal(t, Call{Shape: Responses, Prompt: 5, Task: "x", TaskChars: 1, LastRole: "user", CacheKey: "k", User: "u",
		PreviousResponseID: "r", MaxTokens: ptr(9)}, c)
	for body, noStore := range map[string]bool{`{"input":"x","store":false}`: true, `{"input":"x","store":true}`: false,
		`{"input":"x","store":null}`: false, `{"input":"x"}`: false} {
		c, err = Read(Responses, []byte(body))
		require.NoError(t, err, body)
		assert.Equal(t, noStore, c.NoStore, body)
	}
	_, err = Read(Responses, []byte(`{"input":"x","store":"no"}`))
	assert.ErrorContains(t, err, "store")
	c, err = Read(Messages, []byte(`{"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":" u "},"max_tokens":9,"model":"claude"}`))
	require.NoError(t, err)
	assert.Equal(t, Call{Shape: Messages, Prompt: 5, Task: "x", TaskChars: 1, LastRole: "user", User: "u",
		Model: "claude", MaxTokens: ptr(9)}, c)

	_, err = Read(Shape(9), []byte(`{}`))
	assert.ErrorContains(t, err, "unknown shape")
}

// TestRepeatedKeys checks the duplicate-key rule: a key a reader reads, repeated in one object,
// leaves the call unread, with no identity; repeated keys nobody reads change nothing.
func TestRepeatedKeys(t *testing.T) {
	for _, tc := range []struct{ body, field string }{
		{`{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}`, "messages"},
		{`{"messages":[{"role":"user","content":"a"}],"user":"a","user":"b"}`, "user"},
		{`{"messages":[{"role":"user","content":"a"}],"metadata":{"session_id":"a","session_id":"b"}}`, "metadata.session_id"},
		{`{"messages":[{"role":"user","content":"a"}],"stream":true,"stream":false}`, "stream"},
		{`{"messages":[{"role":"user","content":"a"}],"stream_options":{"include_usage":true,"include_usage":false}}`, "stream_options.include_usage"},
		{`{"messages":[{"role":"user","role":"system","content":"a"}]}`, "messages[0].role"},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"user","content":5,"content":"hi"}]}`, "messages[1].content"},
		{`{"messages":[{"role":"user","content":"a","tool_calls":[],"tool_calls":null}]}`, "messages[0].tool_calls"},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`, "messages[0].content[0].text"},
		{`{"messages":[{"role":"user","content":[{"type":"image","text":"a"},{"type":"image","type":"text","text":"x"}]}]}`, "messages[0].content[1].type"},
		{`{"me\u0073sages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}],"user":"u"}`, "messages"},
	} {
		checkRepeated(t, Chat, tc.body, tc.field)
	}
	checkRepeated(t, Responses, `{"input":[{"type":"message","type":"function_call","role":"user","content":"a"}]}`, "input[0].type")
	checkRepeated(t, Responses, `{"input":"a","prompt_cache_key":"k","prompt_cache_key":"l"}`, "prompt_cache_key")
	checkRepeated(t, Messages, `{"messages":[{"role":"user","content":[{"type":"text","text":"a","type":"image"}]}]}`, "messages[0].content[0].type")
	checkRepeated(t, Messages, `{"system":[{"type":"text","text":"a","text":"b"}],"messages":[]}`, "system[0].text")
	checkRepeated(t, Messages, `{"messages":[],"metadata":{"user_id":"a","user_id":"b"}}`, "metadata.user_id")
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"a","name":"x","name":"y"}],"tools":[{"a":1,"a":2}],"temperature":1,"temperature":0}`,
		`{"messages":[{"role":"user","content":"a"}],"MESSAGES":[{"content":"b"}],"User":"x","metadata":{"Session_ID":"y","session_id":"s"}}`,
		`{"metadata":{"messages":1,"session_id":"s"},"messages":[{"role":"user","content":"a"}]}`,
	} {
		c, err := Read(Chat, []byte(body))
		require.NoError(t, err, body)
		assert.Equal(t, int64(1+4), c.Prompt, body)
		assert.Equal(t, "a", c.Task, body)
	}
}

// checkRepeated checks that body, read as shape s, is ambiguous for the key at field: unread.
func checkRepeated(t *testing.T, s Shape, body, field string) {
	t.Helper()
	c, err := Read(s, []byte(body))
	var fe *FieldError
	if assert.ErrorAs(t, err, &fe, body) {
		assert.Equal(t, field, fe.Field, body)
	}
	assert.Equal(t, Call{Shape: s, Prompt: Tokens(int64(len(body)))}, c, "unread: %s", body)
}

func TestIdentity(t *testing.T) {
	headers := SessionHeaders()
	for _, tc := range []struct {
		name       string
		header     map[string]string
		body       string
		id, source string
	}{
		{"none", nil, ``, "", "user"},
		{"user", nil, `,"user":" u1 "`, "u1", "user"},
		{"metadata beats user", nil, `,"user":"u1","metadata":{"session_id":"m1"}`, "m1", "metadata.session_id"},
		{"any header beats the body", map[string]string{"x-dynamo-session-id": "d1"},
			`,"user":"u1","metadata":{"session_id":"m1"}`, "d1", "x-dynamo-session-id"},
		{"headers in order", map[string]string{"x-session-id": "a", "x-claude-code-session-id": "b"}, ``, "a", "x-session-id"},
		{"claude code before session-id", map[string]string{"x-claude-code-session-id": "b", "session-id": "c"}, ``, "b", "x-claude-code-session-id"},
		{"blank header skipped", map[string]string{"x-session-id": "  ", "session_id": " d "}, ``, "d", "session_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			c, err := Read(Completions, []byte(`{"prompt":"hi"`+tc.body+`}`))
			require.NoError(t, err)
			id, source := c.Identity(h, headers)
			assert.Equal(t, tc.id, id)
			assert.Equal(t, tc.source, source)
		})
	}
	assert.NotSame(t, &SessionHeaders()[0], &SessionHeaders()[0], "each caller gets its own list")

	c, err := Read(Responses, []byte(`{"input":"x","prompt_cache_key":"k","user":"u"}`))
	require.NoError(t, err)
	id, source := c.Identity(http.Header{}, headers)
	assert.Equal(t, []string{"k", "prompt_cache_key"}, []string{id, source}, "the cache key before the user")
	c, err = Read(Messages, []byte(`{"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":"u"}}`))
	require.NoError(t, err)
	id, source = c.Identity(http.Header{}, headers)
	assert.Equal(t, []string{"u", "metadata.user_id"}, []string{id, source})
	id, _ = c.Identity(http.Header{"X-Claude-Code-Session-Id": {"cc"}}, headers)
	assert.Equal(t, "cc", id, "Claude Code's header first")
}

func TestShape(t *testing.T) {
	assert.Equal(t, "chat", Chat.String())
	assert.Equal(t, "/v1/chat/completions", Chat.Path())
	assert.Equal(t, "messages", Chat.PromptField())
	assert.Equal(t, "completions", Completions.String())
	assert.Equal(t, "/v1/completions", Completions.Path())
	assert.Equal(t, "prompt", Completions.PromptField())
	assert.Equal(t, "/v1/responses", Responses.Path())
	assert.Equal(t, "input", Responses.PromptField())
	assert.Equal(t, "/v1/messages", Messages.Path())
	assert.Equal(t, "messages", Messages.PromptField())
	assert.Equal(t, "shape(0)", Shape(0).String())
	assert.Empty(t, Shape(7).Path())
}
