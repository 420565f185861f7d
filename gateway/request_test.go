package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// parseCallBodies are bodies on which parseCall (one pass) must read what parseCallSlow reads.
var parseCallBodies = []string{
	``,
	`{}`,
	`null`,
	`[]`,
	`"x"`,
	`42`,
	`{"messages":`,
	`{"messages":[]} trailing`,
	`{"messages":[{"role":"user","content":"hello"}]}`,
	`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"  hi  "},{"role":"assistant","content":"yes"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"b"}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":""},null,{"type":"text","text":"c"}]}]}`,
	`{"messages":[{"role":"user","content":["a"]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":7,"text":"x"}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","Text":"x"}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":5,"text":"b"}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":null}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","te\u0078t":5,"text":"b"}]}]}`,
	`{"messages":[{"role":"user","content":[{"TYPE":[1],"type":"text","text":"b"}]}]}`,
	`{"messages":[{"role":"user","content":{"text":"obj"}}]}`,
	`{"messages":[{"role":"user","content":12}]}`,
	`{"messages":[{"role":"user","content":true}]}`,
	`{"messages":[{"role":"user","content":[]}]}`,
	`{"messages":[{"role":"user","content":"a","content":null}]}`,
	`{"messages":[{"role":"user","content":null,"content":"b"}]}`,
	`{"messages":[{"role":"user"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"limit\": 5, \"type\": 3}"}}]},{"role":"tool","content":"42"}]}`,
	`{"messages":[{"role":"assistant","content":"x","tool_calls":null}]}`,
	`{"messages":[{"role":1,"content":"x"}]}`,
	`{"messages":[{"role":null,"content":"x"}]}`,
	`{"messages":[{"role":"user","role":null,"content":"x"}]}`,
	`{"messages":[1,2]}`,
	`{"messages":[null,{"role":"user","content":"x"}]}`,
	`{"messages":{"role":"user"}}`,
	`{"messages":"hello"}`,
	`{"messages":null}`,
	`{"Messages":[{"ROLE":"user","Content":"case"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"messages":[{"content":"b"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"MESSAGES":[{"content":"b"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"me\u017fsages":[{"content":"b"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"messages":null}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":{"session_id":" s1 "},"user":"u1"}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":{"session_id":null},"user":" u2 "}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":{"session_id":7},"user":42}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":"m","user":null}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":null,"user":["u"]}`,
	`{"messages":[{"role":"user","content":"x"}],"user":"a","user":"b"}`,
	`{"messages":[{"role":"user","content":"héllo wörld ✓ 日本語 🙂"}]}`,
	`{"messages":[{"role":"user","content":"esc \"q\" \\ \n\t \u00e9 \ud83d\ude00 \u0000"}]}`,
	"{\"messages\":[{\"role\":\"user\",\"content\":\"bad utf8 \xff\xfe\"}]}",
	`{"messages" : [ { "role" : "user" , "content" : [ { "type" : "text" , "text" : "spaced" } ] } ] }`,
	`{"model":"m","tools":[{"type":"function","function":{"parameters":{"type":["string","null"]}}}],"messages":[{"role":"user","content":"x"}]}`,
	`{"prompt":"complete me"}`,
	`{"prompt":["first","second"]}`,
	`{"prompt":["first",null]}`,
	`{"prompt":[null,"x"]}`,
	`{"prompt":[]}`,
	`{"prompt":[1,2,3]}`,
	`{"prompt":[1.5]}`,
	`{"prompt":[[1,2]]}`,
	`{"prompt":null}`,
	`{"prompt":{"a":1}}`,
	`{"prompt":7}`,
	`{"prompt":"héllo 🙂","user":" u ","metadata":{"session_id":"s"}}`,
	`{"prompt":"a","prompt":[1]}`,
	`{"prompt":"x","messages":"not an array"}`,
}

func requireSameCall(t *testing.T, body []byte) {
	t.Helper()
	for _, ep := range []endpoint{chatEndpoint, completionEndpoint} {
		require.Equal(t, parseCallSlow(ep, body), parseCall(ep, body), "endpoint %d, body %q", ep, body)
	}
}

func TestParseCallEquivalence(t *testing.T) {
	for _, body := range parseCallBodies {
		requireSameCall(t, []byte(body))
	}
	requireSameCall(t, benchChatBody())
}

// TestParseCallFastPath checks that ordinary bodies are read by the one pass, not the fallback.
func TestParseCallFastPath(t *testing.T) {
	for _, tc := range []struct {
		ep   endpoint
		body string
	}{
		{chatEndpoint, string(benchChatBody())},
		{chatEndpoint, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}],"metadata":{"session_id":"s"}}`},
		{completionEndpoint, `{"prompt":"x"}`},
	} {
		_, ok := parseCallFast(tc.ep, []byte(tc.body))
		require.True(t, ok, "%.80s", tc.body)
	}
}

func FuzzParseCallEquivalence(f *testing.F) {
	for _, body := range parseCallBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		requireSameCall(t, body)
	})
}
