package gateway

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/agentcall"
)

// TestParseCall checks what the gateway keeps of a body (agentcall's tests cover the reading):
// a malformed or ambiguous body is still sized, never refused.
func TestParseCall(t *testing.T) {
	c := parseCall(chatEndpoint, []byte(`{"messages":[{"role":"system","content":"be brief"},`+
		`{"role":"user","content":[{"type":"text","text":"fix it"},{"type":"image_url","image_url":{"url":"u"}}]},`+
		`{"role":"assistant","content":"ok"}],"metadata":{"session_id":" s1 "},"user":"u1"}`))
	assert.Equal(t, kept{prompt: tokensOf(8+6+2) + 3*4, taskText: "fix it", taskChars: 6, lastRole: "assistant",
		metaID: "s1", user: "u1"}, keptOf(c))

	c = parseCall(completionEndpoint, []byte(`{"prompt":"héllo 🙂","user":" u "}`))
	assert.Equal(t, kept{prompt: 2, taskText: "héllo 🙂", taskChars: 7, user: "u"}, keptOf(c))

	for _, body := range []string{`{"messages":`, `{"messages":"x"}`, `[1]`,
		`{"messages":[{"role":"user","content":"a"}],"user":"a","user":"b"}`} {
		c := parseCall(chatEndpoint, []byte(body))
		assert.Equal(t, kept{prompt: max(1, tokensOf(int64(len(body))))}, keptOf(c), "sized by its length: %s", body)
	}
}

// kept is what the gateway reads of a call: its prompt size, task, last role and identity fields.
type kept struct {
	prompt                           int64
	taskText, lastRole, metaID, user string
	taskChars                        int
}

func keptOf(c agentcall.Call) kept {
	return kept{prompt: c.Prompt, taskText: c.Task, taskChars: c.TaskChars, lastRole: c.LastRole, metaID: c.SessionID, user: c.User}
}

// TestSessionIDSource checks the order of the gateway's identity sources, with its configured
// headers.
func TestSessionIDSource(t *testing.T) {
	g := &Gateway{cfg: Config{SessionHeaders: []string{"x-a", "x-b"}}}
	body := agentcall.Call{SessionID: "m", User: "u"}
	for _, tc := range []struct {
		header     http.Header
		c          agentcall.Call
		id, source string
	}{
		{http.Header{"X-B": {"b"}, "X-A": {" a "}}, body, "a", "x-a"},
		{http.Header{"X-B": {"b"}, "X-Session-Id": {"s"}}, body, "b", "x-b"},
		{http.Header{"X-Session-Id": {"s"}}, body, "m", "metadata.session_id"},
		{http.Header{}, agentcall.Call{User: "u"}, "u", "user"},
		{http.Header{}, agentcall.Call{}, "", "user"},
	} {
		id, source := g.sessionIDSource(tc.header, tc.c)
		require.Equal(t, tc.id, id)
		require.Equal(t, tc.source, source)
	}
	assert.Equal(t, "b", g.headerSessionID(http.Header{"X-B": {"b"}}))
	assert.Empty(t, g.headerSessionID(http.Header{"X-Session-Id": {"s"}}))
}

func TestTenant(t *testing.T) {
	g := &Gateway{cfg: Config{TenantHeader: "x-tenant-id"}}
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   string
	}{
		{"the tenant header first", map[string]string{"x-tenant-id": " acme ", "Authorization": "Bearer sk-1"}, "acme"},
		{"an OpenAI client's bearer key", map[string]string{"Authorization": "Bearer sk-1"}, APIKeyTenant("sk-1")},
		{"an Anthropic client's x-api-key", map[string]string{"x-api-key": "sk-ant-1"}, APIKeyTenant("sk-ant-1")},
		{"the bearer key before x-api-key", map[string]string{"Authorization": "Bearer sk-1", "x-api-key": "sk-ant-1"}, APIKeyTenant("sk-1")},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			assert.Equal(t, tc.want, g.tenant(h))
		})
	}
}
