package serve

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/test/agentbody"
)

// parseCases are chat bodies, valid and not, and the field each is refused for ("" accepted,
// "request body" for the body as a whole). Keys are matched exactly and a key read twice is
// refused (internal/agentcall's duplicate-key rule); among several problems, the body's come
// before those of what the simulator supports (n, max_tokens, the context).
var parseCases = []struct {
	name  string
	body  string
	param string
}{
	{"string content", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`, ""},
	{"empty string content", `{"messages":[{"role":"user","content":""}]}`, ""},
	{"text parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"text","text":"éé"}]}]}`, ""},
	{"text parts, cased keys", `{"messages":[{"role":"user","content":[{"TYPE":"text","Text":"abcd"}]}]}`, "messages[0].content[0].type"},
	{"text parts, duplicate keys", `{"messages":[{"role":"user","content":[{"type":"image","text":5,"type":"text","text":"x"}]}]}`, "messages[0].content[0].type"},
	{"text part with null text", `{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`, ""},
	{"empty parts", `{"messages":[{"role":"user","content":[]}]}`, ""},
	{"image part", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[1].type"},
	{"part without type", `{"messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type"},
	{"null part", `{"messages":[{"role":"user","content":[null]}]}`, "messages[0].content[0].type"},
	{"part not an object", `{"messages":[{"role":"user","content":["a"]}]}`, "messages[0].content"},
	{"content a number", `{"messages":[{"role":"user","content":5}]}`, "messages[0].content"},
	{"content an object", `{"messages":[{"role":"user","content":{"type":"text"}}]}`, "messages[0].content"},
	{"null content with tool_calls", `{"messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":\"é\"}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"}]}`, ""},
	{"missing content", `{"messages":[{"role":"assistant"}]}`, ""},
	{"tool_calls null", `{"messages":[{"role":"assistant","content":"x","tool_calls":null}]}`, ""},
	{"tool_calls with spaces", `{"messages":[{"role":"assistant","tool_calls" : [ {"id" : "ü"} ] }]}`, ""},
	{"system leads", `{"messages":[{"role":"system","content":"` + strings.Repeat("s", 41) + `"},{"role":"user","content":"u"}]}`, ""},
	{"system and developer lead", `{"messages":[{"role":"system","content":"ssss"},{"role":"developer","content":"dd"},{"role":"user","content":"u"},{"role":"system","content":"late"}]}`, ""},
	{"only system", `{"messages":[{"role":"system","content":"ssss"}]}`, ""},
	{"system role cased", `{"messages":[{"role":"System","content":"ssss"},{"role":"user","content":"u"}]}`, ""},
	{"empty messages", `{"messages":[]}`, "messages"},
	{"null messages", `{"messages":null}`, "messages"},
	{"no messages", `{"model":"m"}`, "messages"},
	{"messages not an array", `{"messages":{"role":"user"}}`, "messages"},
	{"messages a string", `{"messages":"hi"}`, "messages"},
	{"message not an object", `{"messages":["hi"]}`, "messages[0]"},
	{"null message", `{"messages":[null]}`, "messages[0].role"},
	{"missing role", `{"messages":[{"content":"hi"}]}`, "messages[0].role"},
	{"empty role", `{"messages":[{"role":"","content":"hi"}]}`, "messages[0].role"},
	{"null role", `{"messages":[{"role":null,"content":"hi"}]}`, "messages[0].role"},
	{"role a number", `{"messages":[{"role":7,"content":"hi"}]}`, "messages[0].role"},
	{"second message bad", `{"messages":[{"role":"user","content":"hi"},{"role":"user","content":true}]}`, "messages[1].content"},
	{"malformed JSON", `{"messages":[{"role":"user","content":"hi"}]`, "request body"},
	{"trailing garbage", `{"messages":[{"role":"user","content":"hi"}]} x`, "request body"},
	{"empty body", ``, "request body"},
	{"null body", `null`, "request body"},
	{"array body", `[1]`, "request body"},
	{"unicode", `{"messages":[{"role":"user","content":"日本語 🎉 ünïcödé"}]}`, ""},
	{"escapes", `{"messages":[{"role":"user","content":"a\nb\t\"q\"\\ \/ \u00e9 \ud83c\udf89 \ud800 x \udc00\ud800\u0041 \b\f\r"}]}`, ""},
	{"escape at end", `{"messages":[{"role":"user","content":"\ud83c"}]}`, ""},
	{"lone high surrogate then escape", `{"messages":[{"role":"user","content":"\ud83c\n"}]}`, ""},
	{"invalid UTF-8", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\xe2\x82\\n\xed\xa0\x80\"}]}", ""},
	{"escaped key", `{"m\u0065ssages":[{"role":"user","content":"hi"}]}`, ""},
	{"cased key", `{"Messages":[{"Role":"user","CONTENT":"hi"}]}`, "messages"},
	{"duplicate messages", `{"messages":[{"role":"user","content":"hi","tool_calls":[1]}],"messages":[{"content":"yo"}]}`, "messages"},
	{"duplicate messages, cased", `{"messages":[{"role":"user","content":"hi"}],"MESSAGES":[{"role":"user"}]}`, ""},
	{"duplicate role", `{"messages":[{"role":"user","role":"system","content":"hi"}]}`, "messages[0].role"},
	{"duplicate content", `{"messages":[{"role":"user","content":5,"content":"hi"}]}`, "messages[0].content"},
	{"unknown fields", `{"temperature":0.5,"tools":[{"type":"function"}],"messages":[{"role":"user","content":"hi","name":"x"}]}`, ""},
	{"nested messages key", `{"metadata":{"messages":1,"session_id":"s"},"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"whitespace", " \n{ \"messages\" :\t[ { \"role\" : \"user\" , \"content\" : \"hi\" } ] , \"n\" : 1 }\r\n", ""},
	{"max_tokens", `{"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"max_completion_tokens wins", `{"max_tokens":10,"max_completion_tokens":20,"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"max_tokens zero", `{"max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
	{"max_tokens negative", `{"max_completion_tokens":-3,"messages":[{"role":"user","content":"hi"}]}`, "max_completion_tokens"},
	{"max_tokens too many", `{"max_tokens":100000000000,"messages":[{"role":"user","content":"hi"}]}`, "messages"},
	{"max_tokens a string", `{"max_tokens":"10","messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
	{"max_tokens a float", `{"max_tokens":1.5,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
	{"max_tokens null", `{"max_tokens":null,"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"n 1", `{"n":1,"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"n 2", `{"n":2,"messages":[{"role":"user","content":"hi"}]}`, "n"},
	{"n 2 and bad messages", `{"n":2,"messages":[]}`, "messages"},
	{"stream and usage", `{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"stream a string", `{"stream":"yes","messages":[{"role":"user","content":"hi"}]}`, "stream"},
	{"metadata session", `{"metadata":{"session_id":" s1 "},"user":"u","messages":[{"role":"user","content":"hi"}]}`, ""},
	{"user", `{"user":"u1","messages":[{"role":"user","content":"hi"}]}`, ""},
	{"user a number", `{"user":1,"messages":[{"role":"user","content":"hi"}]}`, "user"},
	{"prompt in a chat body", `{"prompt":"x","messages":[{"role":"user","content":"hi"}]}`, ""},
	{"long", `{"messages":[{"role":"user","content":"` + strings.Repeat("word ", 200000) + `"}]}`, ""},
}

// checkParse checks parseGenerate's answer to a body against agentcall's reading: an accepted
// call carries its sizes, model and stream flag; a refused one names the field at fault, in the
// message too. It returns the field ("" accepted, "request body" for the whole body).
func checkParse(t *testing.T, s *Server, h http.Header, body []byte) string {
	t.Helper()
	c, readErr := agentcall.Read(chatEndpoint, body)
	req, apiErr := s.parseGenerate(chatEndpoint, h, body)
	if apiErr != nil {
		require.Equal(t, http.StatusBadRequest, apiErr.status)
		if readErr != nil {
			require.Equal(t, readErr.Error(), apiErr.message, "agentcall's problem is the answer")
		}
		if apiErr.param == "" {
			require.True(t, strings.HasPrefix(apiErr.message, "request body: "), apiErr.message)
			return "request body"
		}
		require.Contains(t, apiErr.message, apiErr.param, "the message names the field")
		return apiErr.param
	}
	require.NoError(t, readErr)
	assert.Equal(t, int(c.Prompt), req.prompt)
	assert.Equal(t, int(c.Shared), req.shared)
	assert.Equal(t, c.Stream, req.stream)
	assert.LessOrEqual(t, req.shared, req.prompt)
	assert.Positive(t, req.output)
	return ""
}

func TestParseGenerate(t *testing.T) {
	s := testServer(t)
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.param, checkParse(t, s, http.Header{}, []byte(tc.body)))
			if tc.param == "" {
				req, _ := s.parseGenerate(chatEndpoint, http.Header{"X-Session-Id": {" h1 "}, "X-Session-End": {"true"}}, []byte(tc.body))
				assert.Equal(t, "h1", req.session)
				assert.True(t, req.endAfter)
				_, apiErr := s.parseGenerate(chatEndpoint, http.Header{"X-Session-End": {"maybe"}}, []byte(tc.body))
				if assert.NotNil(t, apiErr) {
					assert.Equal(t, "x-session-end", apiErr.param)
				}
			}
		})
	}
}

func FuzzParseGenerate(f *testing.F) {
	for _, tc := range parseCases {
		if len(tc.body) < 4096 {
			f.Add([]byte(tc.body), "")
		}
	}
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), "true")
	s := testServer(f)
	f.Fuzz(func(t *testing.T, body []byte, end string) {
		h := http.Header{}
		if end != "" {
			h.Set("x-session-end", end)
		}
		checkParse(t, s, h, body)
	})
}

func BenchmarkParseGenerate(b *testing.B) {
	s := testServer(b)
	body := agentbody.Chat(300 << 10)
	h := http.Header{}
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, apiErr := s.parseGenerate(chatEndpoint, h, body); apiErr != nil {
				b.Fatal(apiErr)
			}
		}
	})
}
