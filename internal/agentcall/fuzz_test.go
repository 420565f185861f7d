package agentcall

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/agentbody"
)

// corpus are bodies, valid and not, of every shape: the fuzz seeds and the differential test's
// fixed cases.
var corpus = []string{
	``, `{}`, `null`, `[]`, `"x"`, `42`, ` {} `, `{"a":1} x`, `{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`, `{"a":tru}`,
	`{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x1f\"}", `{"a":[1,]}`, `{"a":{"b":1,}}`, `{"a" 1}`, `{,}`, `[1 2]`,
	`{"messages":`, `{"messages":[]} trailing`,
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
	`{"messages":[{"role":"user","content":[{"type":"text","te\u0078t":5,"text":"b"}]}]}`,
	`{"messages":[{"role":"user","content":[{"TYPE":[1],"type":"text","text":"b"}]}]}`,
	`{"messages":[{"role":"user","content":{"text":"obj"}}]}`,
	`{"messages":[{"role":"user","content":12}]}`,
	`{"messages":[{"role":"user","content":true}]}`,
	`{"messages":[{"role":"user","content":[]}]}`,
	`{"messages":[{"role":"user","content":"a","content":null}]}`,
	`{"messages":[{"role":"user"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"limit\": 5, \"type\": 3}"}}]},{"role":"tool","content":"42"}]}`,
	`{"messages":[{"role":"assistant","tool_calls" : [ {"id" : "ü"} ] }]}`,
	`{"messages":[{"role":"assistant","content":"x","tool_calls":null}]}`,
	`{"messages":[{"role":1,"content":"x"}]}`,
	`{"messages":[{"role":null,"content":"x"}]}`,
	`{"messages":[1,2]}`,
	`{"messages":[null,{"role":"user","content":"x"}]}`,
	`{"messages":{"role":"user"}}`,
	`{"messages":"hello"}`,
	`{"messages":null}`,
	`{"Messages":[{"ROLE":"user","Content":"case"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"messages":[{"content":"b"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"MESSAGES":[{"content":"b"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"me\u017fsages":[{"content":"b"}]}`,
	`{"m\u0065ssages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":{"session_id":" s1 "},"user":"u1"}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":{"session_id":null},"user":" u2 "}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":{"session_id":7},"user":42}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":"m","user":null}`,
	`{"messages":[{"role":"user","content":"x"}],"user":"a","user":"b"}`,
	`{"messages":[{"role":"user","content":"héllo wörld ✓ 日本語 🙂"}]}`,
	`{"messages":[{"role":"user","content":"esc \"q\" \\ \n\t \u00e9 \ud83d\ude00 \u0000 \ud800 x \udc00\ud800\u0041 \b\f\r \/"}]}`,
	`{"messages":[{"role":"user","content":"\ud83c"}]}`,
	"{\"messages\":[{\"role\":\"user\",\"content\":\"bad utf8 \xff\xfe\xed\xa0\x80\xe2\x82\"}],\"user\":\"\xff\"}",
	" \n{ \"messages\" :\t[ { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"text\" , \"text\" : \"spaced\" } ] } ] , \"n\" : 1 }\r\n",
	`{"model":"m","tools":[{"type":"function","function":{"parameters":{"type":["string","null"]}}}],"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":10,"max_completion_tokens":20,"n":2,"messages":[{"role":"developer","content":"d"},{"role":"user","content":"x"}]}`,
	`{"max_tokens":1.5,"n":-0,"max_completion_tokens":-7,"stream":null,"stream_options":null,"messages":[{"role":"user","content":"x"}]}`,
	`{"prompt":"complete me"}`, `{"prompt":["first","second"]}`, `{"prompt":["first",null]}`, `{"prompt":[null,"x"]}`,
	`{"prompt":[]}`, `{"prompt":[1,2,3]}`, `{"prompt":[null,1]}`, `{"prompt":[1.5]}`, `{"prompt":[[1,2]]}`, `{"prompt":null}`,
	`{"prompt":{"a":1}}`, `{"prompt":7}`, `{"prompt":"héllo 🙂","user":" u ","metadata":{"session_id":"s"}}`,
	`{"prompt":"a","prompt":[1]}`, `{"prompt":"x","messages":"not an array"}`,
	// OpenAI Responses
	`{"model":"m","input":"hello","instructions":"be brief","max_output_tokens":5,"stream":true,"store":false}`,
	`{"input":"x","prompt_cache_key":" k ","previous_response_id":" r ","user":"u","metadata":{"session_id":"s"}}`,
	`{"input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":""},{"type":"input_text","text":"b"}]},` +
		`{"type":"function_call","call_id":"c","name":"f","arguments":"{\"x\":1}"},{"type":"function_call_output","call_id":"c","output":"ok"},` +
		`{"type":"reasoning","summary":[]},{"role":"assistant","content":[{"type":"output_text","text":"done"}]}],"instructions":"sys"}`,
	`{"input":[{"type":5,"role":"user","content":"x"}]}`, `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`,
	`{"input":[]}`, `{"input":null}`, `{"input":3}`, `{"input":[null]}`, `{"input":"x","store":"no"}`, `{"input":"x","instructions":["a"]}`,
	`{"input":"a","input":"b"}`, `{"input":"x","previous_response_id":"a","previous_response_id":"b"}`,
	// Anthropic Messages
	`{"model":"claude","max_tokens":9,"system":"sys","metadata":{"user_id":" u "},"messages":[{"role":"user","content":"hi"}]}`,
	`{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},` +
		`{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"text","text":"b"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"think it through","signature":"x"},` +
		`{"type":"tool_use","id":"t1","name":"bash","input":{"cmd":"ls"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"out"}]},` +
		`{"type":"tool_result","tool_use_id":"t2","content":"plain"},{"type":"text","text":5}]}]}`,
	`{"messages":[{"role":"user","content":["x"]}]}`, `{"messages":[{"role":"user","content":null}]}`, `{"system":3,"messages":[{"role":"user","content":"x"}]}`,
	`{"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":"a","user_id":"b"}}`, `{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`,
}

// FuzzRead is the differential test of the fast path: on every input the scanner accepts,
// encoding/json's tokenizer accepts it too and gives the same tree, and Read gives what reading
// encoding/json's tree gives; on a body Read finds no problem with, a plain encoding/json decode
// of its fields reads the same Call.
func FuzzRead(f *testing.F) {
	for _, b := range corpus {
		f.Add([]byte(b))
	}
	f.Fuzz(checkRead)
}

func TestReadDifferential(t *testing.T) {
	for _, b := range corpus {
		checkRead(t, []byte(b))
	}
	checkRead(t, agentbody.Chat(300<<10))
}

func checkRead(t *testing.T, body []byte) {
	ref, refErr := buildRef(body)
	require.Equal(t, json.Valid(body), refErr == nil, "%q", body)
	if fast, ok := buildFast(body); ok {
		require.NoError(t, refErr, "the scanner accepts only JSON: %q", body)
		require.Equal(t, ref.nodes, fast.nodes, "%q", body)
		require.Empty(t, ref.keys, "the scanner accepts no key with escapes: %q", body)
	}
	if refErr == nil {
		for i, n := range ref.nodes {
			if n.keyStart >= 0 {
				var k string
				require.NoError(t, json.Unmarshal(body[n.keyStart-1:n.keyEnd+1], &k))
				if key := ref.key(int32(i)); utf8.Valid(key) {
					require.Equal(t, k, string(key))
				} else {
					// Left undecoded: with a byte ≥ 0x80 it matches no field name, as the
					// decoded key (with U+FFFD) would not.
					require.NotEqual(t, -1, bytes.IndexFunc(key, func(r rune) bool { return r >= utf8.RuneSelf }))
				}
			}
			if n.kind == kindString {
				var s string
				require.NoError(t, json.Unmarshal(ref.raw(int32(i)), &s))
				require.Equal(t, s, ref.str(int32(i)))
				require.Equal(t, utf8.RuneCountInString(s), ref.runes(int32(i)), "%s", ref.raw(int32(i)))
			}
		}
	}
	for _, s := range []Shape{Chat, Completions, Responses, Messages} {
		got, err := Read(s, body)
		if refErr != nil {
			require.Equal(t, unread(s, body), got)
			require.Equal(t, &FieldError{Problem: "invalid JSON: " + refErr.Error()}, err)
		} else {
			want, wantErr := readTree(s, ref)
			require.Equal(t, want, got, "%s %q", s, body)
			require.Equal(t, wantErr, err, "%s %q", s, body)
		}
		require.GreaterOrEqual(t, got.Prompt, int64(1))
		require.LessOrEqual(t, got.Prompt, max(1, Tokens(int64(len(body)))+PerMessageTokens*int64(len(body)/2+1)),
			"the estimate is bounded by the body's size")
		require.Equal(t, utf8.RuneCountInString(got.Task), got.TaskChars)
		require.Equal(t, strings.TrimSpace(got.User), got.User)
		require.Equal(t, strings.TrimSpace(got.SessionID), got.SessionID)
		if fe, ok := err.(*FieldError); ok && strings.HasPrefix(fe.Problem, "key repeated") {
			require.Equal(t, unread(s, body), got, "an ambiguous body is not read")
		}
		if err == nil {
			require.Equal(t, plainRead(t, s, body), got, "%s %q", s, body)
		}
	}
}

// plainRead reads a body Read found nothing wrong with through encoding/json alone: the oracle
// of the differential test. Decoding into maps matches keys exactly, as Read does.
func plainRead(t *testing.T, s Shape, body []byte) Call {
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &top))
	dec := func(raw json.RawMessage, v any) {
		if raw != nil {
			require.NoError(t, json.Unmarshal(raw, v))
		}
	}
	c := Call{Shape: s}
	dec(top["model"], &c.Model)
	dec(top["stream"], &c.Stream)
	switch s {
	case Responses:
		return plainResponses(t, top, c)
	case Messages:
		return plainMessages(t, top, c)
	}
	dec(top["max_tokens"], &c.MaxTokens)
	dec(top["max_completion_tokens"], &c.MaxCompletionTokens)
	dec(top["n"], &c.N)
	dec(top["user"], &c.User)
	c.User = strings.TrimSpace(c.User)
	var opts, meta map[string]json.RawMessage
	dec(top["stream_options"], &opts)
	dec(opts["include_usage"], &c.IncludeUsage)
	dec(top["metadata"], &meta)
	dec(meta["session_id"], &c.SessionID)
	c.SessionID = strings.TrimSpace(c.SessionID)
	switch s {
	case Chat:
		var msgs []map[string]json.RawMessage
		dec(top["messages"], &msgs)
		var chars, shared, sharedMsgs int64
		past, found := false, false
		for _, m := range msgs {
			var role string
			dec(m["role"], &role)
			var n int64
			var text string
			var str string
			var parts []map[string]json.RawMessage
			switch {
			case m["content"] == nil || string(m["content"]) == "null":
			case json.Unmarshal(m["content"], &str) == nil:
				text, n = str, int64(utf8.RuneCountInString(str))
			default:
				dec(m["content"], &parts)
				var texts []string
				for _, p := range parts {
					var pt string
					dec(p["text"], &pt)
					n += int64(utf8.RuneCountInString(pt))
					if pt != "" {
						texts = append(texts, pt)
					}
				}
				text = strings.Join(texts, "\n")
			}
			if tc := m["tool_calls"]; tc != nil && string(tc) != "null" {
				n += int64(utf8.RuneCount(tc))
			}
			chars += n
			if !past && (role == "system" || role == "developer") {
				shared += n
				sharedMsgs++
			} else {
				past = true
			}
			if !found && role == "user" {
				c.Task, c.TaskChars, found = text, utf8.RuneCountInString(text), true
			}
			c.LastRole = role
		}
		c.Prompt = max(1, Tokens(chars)+PerMessageTokens*int64(len(msgs)))
		if sharedMsgs > 0 {
			c.Shared = Tokens(shared) + PerMessageTokens*sharedMsgs
		}
	case Completions:
		var text string
		var texts []string
		var ids []int64
		switch p := top["prompt"]; {
		case json.Unmarshal(p, &text) == nil:
		case json.Unmarshal(p, &texts) == nil:
			text = texts[0]
		default:
			dec(p, &ids)
			c.Prompt = int64(len(ids))
			return c
		}
		c.Task, c.TaskChars = text, utf8.RuneCountInString(text)
		c.Prompt = max(1, Tokens(int64(c.TaskChars)))
	}
	return c
}

// plainPrompt counts a prompt as the readers do: characters and messages, the leading system and
// developer messages apart as the shared prefix, the first user message's text as the task.
type plainPrompt struct {
	chars, msgs, shared, sharedMsgs int64
	past, found                     bool
}

func (p *plainPrompt) add(role string, n int64) {
	p.chars += n
	p.msgs++
	if !p.past && (role == "system" || role == "developer") {
		p.shared += n
		p.sharedMsgs++
	} else {
		p.past = true
	}
}

// addShared counts a prompt that is shared wherever it is (Responses instructions, Anthropic system).
func (p *plainPrompt) addShared(n int64) {
	p.chars += n
	p.msgs++
	p.shared += n
	p.sharedMsgs++
}

func (p *plainPrompt) fill(c *Call) Call {
	c.Prompt = max(1, Tokens(p.chars)+PerMessageTokens*p.msgs)
	if p.sharedMsgs > 0 {
		c.Shared = Tokens(p.shared) + PerMessageTokens*p.sharedMsgs
	}
	c.TaskChars = utf8.RuneCountInString(c.Task)
	return *c
}

func plainDec(t *testing.T, raw json.RawMessage, v any) {
	if raw != nil {
		require.NoError(t, json.Unmarshal(raw, v))
	}
}

// plainString decodes raw when it is a JSON string.
func plainString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// plainTexts counts text parts (or blocks) of the given types; texts are the non-empty ones.
func plainTexts(t *testing.T, raw json.RawMessage) (n int64, texts []string) {
	var parts []map[string]json.RawMessage
	plainDec(t, raw, &parts)
	for _, p := range parts {
		if s, ok := plainString(p["text"]); ok {
			n += int64(utf8.RuneCountInString(s))
			if s != "" {
				texts = append(texts, s)
			}
		}
	}
	return n, texts
}

// plainResponses is plainRead of an OpenAI Responses body.
func plainResponses(t *testing.T, top map[string]json.RawMessage, c Call) Call {
	plainDec(t, top["max_output_tokens"], &c.MaxTokens)
	var meta map[string]json.RawMessage
	plainDec(t, top["metadata"], &meta)
	plainDec(t, meta["session_id"], &c.SessionID)
	plainDec(t, top["user"], &c.User)
	plainDec(t, top["prompt_cache_key"], &c.CacheKey)
	plainDec(t, top["previous_response_id"], &c.PreviousResponseID)
	c.SessionID, c.User = strings.TrimSpace(c.SessionID), strings.TrimSpace(c.User)
	c.CacheKey, c.PreviousResponseID = strings.TrimSpace(c.CacheKey), strings.TrimSpace(c.PreviousResponseID)
	var store *bool
	plainDec(t, top["store"], &store)
	c.NoStore = store != nil && !*store
	var p plainPrompt
	if s, ok := plainString(top["instructions"]); ok {
		p.addShared(int64(utf8.RuneCountInString(s)))
	}
	if s, ok := plainString(top["input"]); ok {
		c.Task, c.LastRole = s, "user"
		p.add("user", int64(utf8.RuneCountInString(s)))
		return p.fill(&c)
	}
	var items []map[string]json.RawMessage
	plainDec(t, top["input"], &items)
	var raws []json.RawMessage
	plainDec(t, top["input"], &raws)
	for i, it := range items {
		typ, isString := plainString(it["type"])
		if it["type"] != nil && (!isString || typ != "message") {
			p.add("", int64(utf8.RuneCount(raws[i])))
			c.LastRole = ""
			continue
		}
		var role string
		plainDec(t, it["role"], &role)
		n, texts := int64(0), []string(nil)
		if s, ok := plainString(it["content"]); ok {
			n, texts = int64(utf8.RuneCountInString(s)), []string{s}
		} else {
			n, texts = plainTexts(t, it["content"])
		}
		if !p.found && role == "user" {
			c.Task, p.found = strings.Join(texts, "\n"), true
		}
		p.add(role, n)
		c.LastRole = role
	}
	return p.fill(&c)
}

// plainBlocks counts Anthropic content blocks as the reader does.
func plainBlocks(t *testing.T, raw json.RawMessage) (n int64, texts []string) {
	var blocks []map[string]json.RawMessage
	plainDec(t, raw, &blocks)
	runes := func(k string, b map[string]json.RawMessage) int64 {
		s, _ := plainString(b[k])
		return int64(utf8.RuneCountInString(s))
	}
	for _, b := range blocks {
		typ, _ := plainString(b["type"])
		switch typ {
		case "text":
			if s, ok := plainString(b["text"]); ok {
				n += int64(utf8.RuneCountInString(s))
				if s != "" {
					texts = append(texts, s)
				}
			}
		case "thinking":
			n += runes("thinking", b)
		case "tool_use", "server_tool_use":
			if in := b["input"]; in != nil {
				n += int64(utf8.RuneCount(in))
			}
			n += runes("name", b)
		case "tool_result":
			if s, ok := plainString(b["content"]); ok {
				n += int64(utf8.RuneCountInString(s))
			} else if c := b["content"]; len(c) > 0 && c[0] == '[' {
				k, _ := plainBlocks(t, c)
				n += k
			}
		}
	}
	return n, texts
}

// plainMessages is plainRead of an Anthropic Messages body.
func plainMessages(t *testing.T, top map[string]json.RawMessage, c Call) Call {
	plainDec(t, top["max_tokens"], &c.MaxTokens)
	var meta map[string]json.RawMessage
	plainDec(t, top["metadata"], &meta)
	plainDec(t, meta["user_id"], &c.User)
	c.User = strings.TrimSpace(c.User)
	var p plainPrompt
	if sys := top["system"]; sys != nil && string(sys) != "null" {
		if s, ok := plainString(sys); ok {
			p.addShared(int64(utf8.RuneCountInString(s)))
		} else {
			n, _ := plainBlocks(t, sys)
			p.addShared(n)
		}
	}
	var msgs []map[string]json.RawMessage
	plainDec(t, top["messages"], &msgs)
	for _, m := range msgs {
		var role string
		plainDec(t, m["role"], &role)
		n, task := int64(0), ""
		if s, ok := plainString(m["content"]); ok {
			n, task = int64(utf8.RuneCountInString(s)), s
		} else {
			var texts []string
			n, texts = plainBlocks(t, m["content"])
			task = strings.Join(texts, "\n")
		}
		if !p.found && role == "user" {
			c.Task, p.found = task, true
		}
		p.add(role, n)
		c.LastRole = role
	}
	return p.fill(&c)
}

// TestFastPathTaken checks that ordinary bodies are read by the scanner, not the fallback.
func TestFastPathTaken(t *testing.T) {
	for _, body := range [][]byte{
		agentbody.Chat(300 << 10),
		[]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9"},{"type":"image_url","image_url":{"url":"u"}}]}],"metadata":{"session_id":"s"}}`),
		[]byte(" {\"prompt\" : [1, -2, 3e5, 0.5, true, false, null, {}, []]}\r\n"),
	} {
		_, ok := buildFast(body)
		assert.True(t, ok, "%.80s", body)
	}
	for _, body := range []string{`{"m\u0065ssages":[]}`, `{"a":1} x`, `{"a":01}`, "{\"a\":\"\x01\"}", strings.Repeat("[", 600) + strings.Repeat("]", 600)} {
		_, ok := buildFast([]byte(body))
		assert.False(t, ok, body)
	}
}
