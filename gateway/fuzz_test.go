package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/test/yamlconftest"
)

// FuzzParseConfig feeds arbitrary files to ParseConfig. It must never panic; every problem of a
// rejection says where (its line) or what (its key path), except a YAML syntax error the parser
// cannot place; an accepted configuration satisfies everything New relies on.
func FuzzParseConfig(f *testing.F) {
	example, err := os.ReadFile("testdata/gateway.example.yaml")
	require.NoError(f, err)
	f.Add(example)
	for _, s := range []string{
		"upstreams: [http://127.0.0.1:8000]\nadmission: {budget_tokens: 5000}\n",
		"upstreams:\n  - https://a:1\n  - http://b:2/v1\nadmission:\n  mode: peak\n  budget_tokens: 1\n  quotas: {acme: 3}\n",
		"upstreams: [http://a:1]\nadmission:\n  budget_tokens: 0\n",
		"upstreams: [ftp://a]\nadmission: {budget_tokens: 5}\nsession_headers: []\n",
		"upstreams: [http://a:1]\nadmission: {budget_tokens: 5}\nmax_queue_wait: soon\nidle_timeout: -1s\n",
		"upstreams: [http://a:1]\nadmission: {budget_tokens: 5, priority_tokens_per_sec: .nan}\n",
		"upstreams: [http://a:1]\nadmission: {budget_tokens: 5}\nlisen: x\n",
		"upstreams: [\n",
		"- a\n- b\n",
		"a: &x [*x]\n",
		"",
	} {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			require.Nil(t, c)
			yamlconftest.RequireNamed(t, data, err)
			return
		}
		require.NotNil(t, c)
		for _, a := range []string{c.Listen, c.AdminListen} {
			_, _, err := net.SplitHostPort(a)
			require.NoError(t, err, "listen address %q", a)
		}
		require.NotEmpty(t, c.Upstreams)
		for _, u := range c.Upstreams {
			pu, err := url.Parse(u)
			require.NoError(t, err)
			require.Contains(t, []string{"http", "https"}, pu.Scheme)
			require.NotEmpty(t, pu.Host)
		}
		require.NotEmpty(t, c.SessionHeaders)
		for _, h := range append(append([]string(nil), c.SessionHeaders...), c.Affinity.Header) {
			require.True(t, validHeaderName(h), "header %q", h)
		}
		if c.TenantHeader != "" {
			require.True(t, validHeaderName(c.TenantHeader))
		}
		require.Positive(t, int64(c.IdleTimeout))
		require.Positive(t, int64(c.MaxQueueWait))
		require.Positive(t, c.MaxBodyBytes)
		a := c.Admission
		require.Contains(t, []string{"current", "peak"}, a.Mode)
		require.Positive(t, a.BudgetTokens)
		require.GreaterOrEqual(t, a.ReferenceBudgetTokens, int64(0))
		require.GreaterOrEqual(t, a.PriorityTokensPerSec, 0.0)
		require.GreaterOrEqual(t, a.TenantQuota, 0)
		for tenant, q := range a.Quotas {
			require.GreaterOrEqual(t, q, 0, "quota of %q", tenant)
		}
		require.NoError(t, c.admissionOptions().Validate(), "the admission core takes an accepted config")
	})
}

// fuzzMaxBody is the body limit of the gateway FuzzSessionIdentity drives.
const fuzzMaxBody = 4096

// FuzzSessionIdentity feeds arbitrary call bodies and session headers to the gateway. Reading a
// body never panics and gives a sane estimate; the session id is the first non-empty configured
// header, then metadata.session_id, then user, always trimmed. Through the real handler, a body
// over max_body_bytes is refused 413 before anything reaches the upstream; any other call reaches
// the upstream carrying its session id (or an anonymous one) as the routing key.
func FuzzSessionIdentity(f *testing.F) {
	for _, s := range []struct {
		body string
		hdr  uint8
		val  string
		chat bool
	}{
		{`{"model":"llama","messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"Fix the failing test in ./pkg"}],"stream":true,"stream_options":{"include_usage":true},"metadata":{"session_id":"sess-7f3a"}}`, 255, "", true},
		{`{"model":"llama","messages":[{"role":"user","content":[{"type":"text","text":"What is in this image?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"user":"user-42"}`, 0, "", true},
		{`{"model":"llama","messages":[{"role":"user","content":"ls"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"go.mod\nmain.go"}],"tools":[{"type":"function","function":{"name":"bash","parameters":{"type":"object"}}}],"metadata":{"session_id":"  padded  "},"user":"u"}`, 1, "claude-session-1", true},
		{`{"model":"llama","prompt":"def fib(n):","max_tokens":64,"user":"batch-7"}`, 255, "", false},
		{`{"model":"llama","prompt":["first","second"],"metadata":{"session_id":42}}`, 2, "  ", false},
		{`{"model":"llama","prompt":[1,2,3,4],"metadata":"sess"}`, 5, "dynamo-9", false},
		{`{"model":"llama","messages":"not a list","user":{"id":"x"}}`, 3, "", true},
		{`{"messages":[{"role":"user","content":"\ud83d\ude00 caf\u00e9"}],"User":"CaseFolded","METADATA":{"session_id":"loud"}}`, 255, "", true},
		{`{"messages":[]`, 255, "", true},
		{`not json at all`, 0, "hdr-only", true},
		{``, 255, "", true},
		{`{"messages":[{"role":"user","content":"` + strings.Repeat("x", fuzzMaxBody) + `"}],"user":"big"}`, 255, "", true},
	} {
		f.Add([]byte(s.body), s.hdr, s.val, s.chat)
	}

	// One gateway for the whole run (a fuzz worker runs inputs one after another), in front of an
	// upstream that notes the routing key it was sent.
	var up struct {
		sync.Mutex
		key   string
		calls int
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		up.Lock()
		up.key, up.calls = r.Header.Get(DefaultAffinityHeader), up.calls+1
		up.Unlock()
		okJSON(10, 2)(w, r)
	}))
	f.Cleanup(upstream.Close)
	cfg := baseConfig(f, []string{upstream.URL}, func(c *Config) {
		c.MaxBodyBytes = fuzzMaxBody
		c.Affinity.Enabled = true
	})
	h := start(f, cfg, nil)

	f.Fuzz(func(t *testing.T, body []byte, hdr uint8, val string, chat bool) {
		ep, path := completionEndpoint, "/v1/completions"
		if chat {
			ep, path = chatEndpoint, "/v1/chat/completions"
		}
		c := parseCall(ep, body)
		require.GreaterOrEqual(t, c.Prompt, int64(1))
		require.LessOrEqual(t, c.Prompt, max(1, tokensOf(int64(len(body)))+agentcall.PerMessageTokens*int64(len(body)/2+1)),
			"the estimate is bounded by the body's size")
		require.Equal(t, utf8.RuneCountInString(c.Task), c.TaskChars)
		require.LessOrEqual(t, c.TaskChars, len(body))
		require.Equal(t, strings.TrimSpace(c.SessionID), c.SessionID)
		require.Equal(t, strings.TrimSpace(c.User), c.User)
		if c.SessionID != "" || c.User != "" {
			// What was read survives a round trip through a well-formed body.
			again, err := json.Marshal(map[string]any{"metadata": map[string]string{"session_id": c.SessionID}, "user": c.User})
			require.NoError(t, err)
			c2 := parseCall(ep, again)
			assert.Equal(t, c.SessionID, c2.SessionID)
			assert.Equal(t, c.User, c2.User)
		}

		// The header: one of the configured session headers, or (hdr beyond them) an unrelated one.
		hdrName := "x-unrelated"
		if int(hdr) < len(cfg.SessionHeaders) {
			hdrName = cfg.SessionHeaders[hdr]
		}
		if !validHeaderValue(val) {
			val = "" // a server never hands the handler such a value
		}
		header := http.Header{}
		if val != "" {
			header.Set(hdrName, val)
		}
		id := h.g.sessionID(header, c)
		want := c.SessionID
		if want == "" {
			want = c.User
		}
		if v := strings.TrimSpace(val); v != "" && hdrName != "x-unrelated" {
			want = v
		}
		require.Equal(t, want, id)
		require.Equal(t, strings.TrimSpace(id), id)
		if hid := h.g.headerSessionID(header); hid != "" {
			require.Equal(t, hid, id, "a header id wins over the body")
		}

		// Through the handler.
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		for k, vs := range header {
			req.Header[k] = vs
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-end", "true")
		up.Lock()
		before := up.calls
		up.Unlock()
		rec := httptest.NewRecorder()
		h.g.Handler().ServeHTTP(rec, req)
		up.Lock()
		reached, key := up.calls > before, up.key
		up.Unlock()
		if len(body) > fuzzMaxBody {
			require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
			require.False(t, reached, "an oversized body never reaches the upstream")
			return
		}
		require.Equal(t, http.StatusOK, rec.Code, "session id %q: %s", id, rec.Body.String())
		require.True(t, reached)
		if id != "" {
			require.Equal(t, routingKey(id), key, "the routing key is the session id (hashed when no header can carry it)")
			require.True(t, validHeaderValue(key), "routing key %q", key)
		} else {
			require.True(t, strings.HasPrefix(key, "anon-"), "routing key %q", key)
		}
	})
}

// validHeaderValue reports whether s can travel as an HTTP header value (RFC 9110 field-value:
// no control characters but tab).
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}

// FuzzShapeIdentity is FuzzSessionIdentity for the OpenAI Responses and Anthropic Messages
// bodies: reading never panics and gives a sane estimate; the session id is the first non-empty
// configured header, then the shape's own fields (Responses: metadata.session_id,
// prompt_cache_key, user; Messages: metadata.user_id); through the real handler, a body over
// max_body_bytes is 413 and reaches nothing, an id over MaxSessionIDBytes is 400, and any other
// call reaches the upstream with its session as the routing key — for a Responses call that
// names none, its chain's (chain-…), unless the server keeps nothing (store: false).
func FuzzShapeIdentity(f *testing.F) {
	for _, s := range []struct {
		body     string
		hdr      uint8
		val      string
		messages bool
	}{
		{`{"model":"m","instructions":"You are a coding agent.","input":"Fix the test","prompt_cache_key":"codex-1","stream":true}`, 255, "", false},
		{`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}],"metadata":{"session_id":" s "},"user":"u"}`, 2, "codex-session", false},
		{`{"model":"m","input":"go on","previous_response_id":"resp_123"}`, 255, "", false},
		{`{"model":"m","input":"once","store":false}`, 255, "", false},
		{`{"model":"m","input":"x","previous_response_id":"a\nb"}`, 255, "", false},
		{`{"model":"claude","max_tokens":9,"system":[{"type":"text","text":"sys"}],"metadata":{"user_id":"user_x_session_y"},"messages":[{"role":"user","content":"hi"}]}`, 255, "", true},
		{`{"model":"claude","max_tokens":9,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}`, 1, "cc-session", true},
		{`{"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":"a","user_id":"b"}}`, 255, "", true},
		{`not json`, 0, "hdr-only", true},
		{``, 255, "", false},
	} {
		f.Add([]byte(s.body), s.hdr, s.val, s.messages)
	}
	var up struct {
		sync.Mutex
		key   string
		calls int
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		up.Lock()
		up.key, up.calls = r.Header.Get(DefaultAffinityHeader), up.calls+1
		up.Unlock()
		okJSON(10, 2)(w, r)
	}))
	f.Cleanup(upstream.Close)
	cfg := baseConfig(f, []string{upstream.URL}, func(c *Config) {
		c.MaxBodyBytes = fuzzMaxBody
		c.Affinity.Enabled = true
	})
	h := start(f, cfg, nil)

	f.Fuzz(func(t *testing.T, body []byte, hdr uint8, val string, messages bool) {
		ep := agentcall.Responses
		if messages {
			ep = agentcall.Messages
		}
		c := parseCall(ep, body)
		require.GreaterOrEqual(t, c.Prompt, int64(1))
		require.LessOrEqual(t, c.Prompt, max(1, tokensOf(int64(len(body)))+agentcall.PerMessageTokens*int64(len(body)/2+1)),
			"the estimate is bounded by the body's size")
		require.Equal(t, utf8.RuneCountInString(c.Task), c.TaskChars)
		for _, v := range []string{c.SessionID, c.CacheKey, c.User, c.PreviousResponseID} {
			require.Equal(t, strings.TrimSpace(v), v)
		}
		if messages {
			require.Empty(t, c.SessionID+c.CacheKey+c.PreviousResponseID, "Messages name a session only by metadata.user_id")
		}

		hdrName := "x-unrelated"
		if int(hdr) < len(cfg.SessionHeaders) {
			hdrName = cfg.SessionHeaders[hdr]
		}
		if !validHeaderValue(val) {
			val = ""
		}
		header := http.Header{}
		if val != "" {
			header.Set(hdrName, val)
		}
		id := h.g.sessionID(header, c)
		want := c.SessionID
		for _, v := range []string{c.CacheKey, c.User} {
			if want == "" {
				want = v
			}
		}
		if v := strings.TrimSpace(val); v != "" && hdrName != "x-unrelated" {
			want = v
		}
		require.Equal(t, want, id)

		req := httptest.NewRequest(http.MethodPost, ep.Path(), bytes.NewReader(body))
		for k, vs := range header {
			req.Header[k] = vs
		}
		req.Header.Set("x-session-end", "true")
		up.Lock()
		before := up.calls
		up.Unlock()
		rec := httptest.NewRecorder()
		h.g.Handler().ServeHTTP(rec, req)
		up.Lock()
		reached, key := up.calls > before, up.key
		up.Unlock()
		if len(body) > fuzzMaxBody {
			require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
			require.False(t, reached)
			return
		}
		chained := id == "" && !messages && c.PreviousResponseID != ""
		if len(id) > MaxSessionIDBytes || chained && len(chainPrefix+c.PreviousResponseID) > MaxSessionIDBytes {
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			require.False(t, reached)
			return
		}
		require.Equal(t, http.StatusOK, rec.Code, "session id %q: %s", id, rec.Body.String())
		require.True(t, reached)
		switch {
		case id != "":
			require.Equal(t, routingKey(id), key)
		case chained:
			require.Equal(t, routingKey(chainPrefix+c.PreviousResponseID), key, "a chain is keyed by the response it continues")
		case !messages && !c.NoStore:
			require.True(t, strings.HasPrefix(key, chainPrefix), "a chain's first call starts one: %q", key)
		default:
			require.True(t, strings.HasPrefix(key, "anon-"), "routing key %q", key)
		}
		require.True(t, validHeaderValue(key), "routing key %q", key)
	})
}
