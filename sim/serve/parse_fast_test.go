package serve

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/agentbody"
	"github.com/basin-dev/basin/sim"
)

// parseFastCases are chat bodies, valid and not; fast marks those the fast path must take itself.
var parseFastCases = []struct {
	name string
	body string
	fast bool
}{
	{"string content", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`, true},
	{"empty string content", `{"messages":[{"role":"user","content":""}]}`, true},
	{"text parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"text","text":"éé"}]}]}`, true},
	{"text parts, cased keys", `{"messages":[{"role":"user","content":[{"TYPE":"text","Text":"abcd"}]}]}`, true},
	{"text parts, duplicate keys", `{"messages":[{"role":"user","content":[{"type":"image","text":5,"type":"text","text":"x"}]}]}`, false},
	{"text part with null text", `{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`, true},
	{"empty parts", `{"messages":[{"role":"user","content":[]}]}`, true},
	{"image part", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, false},
	{"part without type", `{"messages":[{"role":"user","content":[{"text":"a"}]}]}`, false},
	{"null part", `{"messages":[{"role":"user","content":[null]}]}`, false},
	{"part not an object", `{"messages":[{"role":"user","content":["a"]}]}`, false},
	{"content a number", `{"messages":[{"role":"user","content":5}]}`, false},
	{"content an object", `{"messages":[{"role":"user","content":{"type":"text"}}]}`, false},
	{"null content with tool_calls", `{"messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":\"é\"}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"}]}`, true},
	{"missing content", `{"messages":[{"role":"assistant"}]}`, true},
	{"tool_calls null", `{"messages":[{"role":"assistant","content":"x","tool_calls":null}]}`, true},
	{"tool_calls with spaces", `{"messages":[{"role":"assistant","tool_calls" : [ {"id" : "ü"} ] }]}`, true},
	{"system leads", `{"messages":[{"role":"system","content":"` + strings.Repeat("s", 41) + `"},{"role":"user","content":"u"}]}`, true},
	{"system and developer lead", `{"messages":[{"role":"system","content":"ssss"},{"role":"developer","content":"dd"},{"role":"user","content":"u"},{"role":"system","content":"late"}]}`, true},
	{"only system", `{"messages":[{"role":"system","content":"ssss"}]}`, true},
	{"system role cased", `{"messages":[{"role":"System","content":"ssss"},{"role":"user","content":"u"}]}`, true},
	{"empty messages", `{"messages":[]}`, false},
	{"null messages", `{"messages":null}`, false},
	{"no messages", `{"model":"m"}`, false},
	{"messages not an array", `{"messages":{"role":"user"}}`, false},
	{"messages a string", `{"messages":"hi"}`, false},
	{"message not an object", `{"messages":["hi"]}`, false},
	{"null message", `{"messages":[null]}`, false},
	{"missing role", `{"messages":[{"content":"hi"}]}`, false},
	{"empty role", `{"messages":[{"role":"","content":"hi"}]}`, false},
	{"null role", `{"messages":[{"role":null,"content":"hi"}]}`, false},
	{"role a number", `{"messages":[{"role":7,"content":"hi"}]}`, false},
	{"second message bad", `{"messages":[{"role":"user","content":"hi"},{"role":"user","content":true}]}`, false},
	{"malformed JSON", `{"messages":[{"role":"user","content":"hi"}]`, false},
	{"trailing garbage", `{"messages":[{"role":"user","content":"hi"}]} x`, false},
	{"empty body", ``, false},
	{"null body", `null`, false},
	{"array body", `[1]`, false},
	{"unicode", `{"messages":[{"role":"user","content":"日本語 🎉 ünïcödé"}]}`, true},
	{"escapes", `{"messages":[{"role":"user","content":"a\nb\t\"q\"\\ \/ \u00e9 \ud83c\udf89 \ud800 x \udc00\ud800\u0041 \b\f\r"}]}`, true},
	{"escape at end", `{"messages":[{"role":"user","content":"\ud83c"}]}`, true},
	{"lone high surrogate then escape", `{"messages":[{"role":"user","content":"\ud83c\n"}]}`, true},
	{"invalid UTF-8", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\xe2\x82\\n\xed\xa0\x80\"}]}", true},
	{"escaped key", `{"m\u0065ssages":[{"role":"user","content":"hi"}]}`, true},
	{"cased key", `{"Messages":[{"Role":"user","CONTENT":"hi"}]}`, true},
	{"duplicate messages", `{"messages":[{"role":"user","content":"hi","tool_calls":[1]}],"messages":[{"content":"yo"}]}`, false},
	{"duplicate messages, cased", `{"messages":[{"role":"user","content":"hi"}],"MESSAGES":[{"role":"user"}]}`, false},
	{"duplicate role", `{"messages":[{"role":"user","role":"system","content":"hi"}]}`, true},
	{"duplicate content", `{"messages":[{"role":"user","content":5,"content":"hi"}]}`, true},
	{"unknown fields", `{"temperature":0.5,"tools":[{"type":"function"}],"messages":[{"role":"user","content":"hi","name":"x"}]}`, true},
	{"nested messages key", `{"metadata":{"messages":1,"session_id":"s"},"messages":[{"role":"user","content":"hi"}]}`, true},
	{"whitespace", " \n{ \"messages\" :\t[ { \"role\" : \"user\" , \"content\" : \"hi\" } ] , \"n\" : 1 }\r\n", true},
	{"max_tokens", `{"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"max_completion_tokens wins", `{"max_tokens":10,"max_completion_tokens":20,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"max_tokens zero", `{"max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"max_tokens negative", `{"max_completion_tokens":-3,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"max_tokens too many", `{"max_tokens":100000000000,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"max_tokens a string", `{"max_tokens":"10","messages":[{"role":"user","content":"hi"}]}`, false},
	{"max_tokens a float", `{"max_tokens":1.5,"messages":[{"role":"user","content":"hi"}]}`, false},
	{"max_tokens null", `{"max_tokens":null,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"n 1", `{"n":1,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"n 2", `{"n":2,"messages":[{"role":"user","content":"hi"}]}`, true},
	{"n 2 and bad messages", `{"n":2,"messages":[]}`, false},
	{"stream and usage", `{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, true},
	{"stream a string", `{"stream":"yes","messages":[{"role":"user","content":"hi"}]}`, false},
	{"metadata session", `{"metadata":{"session_id":" s1 "},"user":"u","messages":[{"role":"user","content":"hi"}]}`, true},
	{"user", `{"user":"u1","messages":[{"role":"user","content":"hi"}]}`, true},
	{"user a number", `{"user":1,"messages":[{"role":"user","content":"hi"}]}`, false},
	{"prompt in a chat body", `{"prompt":"x","messages":[{"role":"user","content":"hi"}]}`, true},
	{"long", `{"messages":[{"role":"user","content":"` + strings.Repeat("word ", 200000) + `"}]}`, true},
}

// parseTestServer is testServer for fuzz targets and benchmarks too.
func parseTestServer(tb testing.TB) *Server {
	tb.Helper()
	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	require.NoError(tb, err)
	s, err := New(Options{Sim: sim.Options{Deployment: dep}, Speed: 60})
	require.NoError(tb, err)
	return s
}

// parseFastHeaders are the header sets each case is tried with.
var parseFastHeaders = []http.Header{
	{},
	{"X-Session-Id": {"h1"}, "X-Session-End": {"true"}},
	{"X-Session-End": {"maybe"}},
}

// checkSameParse asserts parseGenerate answers as parseGenerateSlow does; it reports whether the
// fast path took the body itself.
func checkSameParse(t *testing.T, s *Server, h http.Header, body []byte) bool {
	t.Helper()
	wantReq, wantErr := s.parseGenerateSlow(chatEndpoint, h, body)
	gotReq, gotErr := s.parseGenerate(chatEndpoint, h, body)
	require.Equal(t, wantErr, gotErr, "error for %q", body)
	require.Equal(t, wantReq, gotReq, "request for %q", body)
	_, counts, fast := parseChatFast(body)
	if fast {
		prompt, shared, apiErr := chatTokens(mustMessages(t, body))
		require.Nil(t, apiErr)
		require.Equal(t, promptCounts{prompt, shared}, counts, "counts for %q", body)
	}
	return fast
}

func mustMessages(t *testing.T, body []byte) json.RawMessage {
	t.Helper()
	var b requestBody
	require.NoError(t, json.Unmarshal(body, &b))
	return b.Messages
}

func TestParseGenerateFastMatchesSlow(t *testing.T) {
	s := testServer(t)
	for _, tc := range parseFastCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range parseFastHeaders {
				fast := checkSameParse(t, s, h, []byte(tc.body))
				assert.Equal(t, tc.fast, fast, "fast path taken")
			}
		})
	}
}

func TestJSONStringRunes(t *testing.T) {
	for _, lit := range []string{`""`, `"abc"`, `"\u00e9\ud83c\udf89"`, `"\ud800\ud800\udc00"`, `"\udc00"`,
		`"\ud83c\u0041"`, `"\\u0041"`, `"\\\""`, "\"\xff\xfe\xed\xa0\x80\xe2\x82\\n\"", `"日本\n語"`} {
		var s string
		require.NoError(t, json.Unmarshal([]byte(lit), &s), lit)
		assert.Equal(t, len([]rune(s)), jsonStringRunes([]byte(lit)), lit)
	}
}

func FuzzParseGenerateEquivalence(f *testing.F) {
	for _, tc := range parseFastCases {
		if len(tc.body) < 4096 {
			f.Add([]byte(tc.body), "")
		}
	}
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), "true")
	s := parseTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte, end string) {
		h := http.Header{}
		if end != "" {
			h.Set("x-session-end", end)
		}
		checkSameParse(t, s, h, body)
	})
}

func BenchmarkParseGenerate(b *testing.B) {
	s := parseTestServer(b)
	body := agentbody.Chat(300 << 10)
	h := http.Header{}
	for _, p := range []struct {
		name  string
		parse func(endpoint, http.Header, []byte) (genRequest, *apiError)
	}{{"fast", s.parseGenerate}, {"slow", s.parseGenerateSlow}} {
		b.Run(p.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, apiErr := p.parse(chatEndpoint, h, body); apiErr != nil {
					b.Fatal(apiErr)
				}
			}
		})
	}
}
