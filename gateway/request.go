package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// endpoint is the OpenAI API a model call came through.
type endpoint int

const (
	chatEndpoint endpoint = iota
	completionEndpoint
)

// callRequest is what the gateway reads from a model call's body. Reading is lenient: a body the
// gateway cannot make sense of is still proxied (the upstream judges it), sized by its length.
type callRequest struct {
	prompt    int64  // prompt estimate in tokens: ceil(chars/4) + 4 per message
	taskText  string // the first user message's text (chat) or the prompt (completions)
	taskChars int    // its length in characters
	lastRole  string // role of the last message: "user" means a person's turn
	metaID    string // metadata.session_id
	user      string // user
}

// perMessageTokens is the chat template's overhead per message (role markers).
const perMessageTokens = 4

// callBody holds the fields the gateway reads. Raw, so that one odd field does not make the
// others unreadable.
type callBody struct {
	User     json.RawMessage `json:"user"`
	Metadata json.RawMessage `json:"metadata"`
	Messages json.RawMessage `json:"messages"`
	Prompt   json.RawMessage `json:"prompt"`
}

type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// tokensOf is the token estimate of chars characters: ceil(chars / 4).
func tokensOf(chars int64) int64 { return (chars + 3) / 4 }

// parseCall reads a model call's body.
func parseCall(ep endpoint, body []byte) callRequest {
	var c callRequest
	var b callBody
	if err := json.Unmarshal(body, &b); err != nil {
		c.prompt = max(1, tokensOf(int64(len(body))))
		return c
	}
	var s string
	if json.Unmarshal(b.User, &s) == nil {
		c.user = strings.TrimSpace(s)
	}
	var meta struct {
		SessionID json.RawMessage `json:"session_id"`
	}
	if json.Unmarshal(b.Metadata, &meta) == nil && json.Unmarshal(meta.SessionID, &s) == nil {
		c.metaID = strings.TrimSpace(s)
	}
	switch ep {
	case chatEndpoint:
		var msgs []chatMessage
		if err := json.Unmarshal(b.Messages, &msgs); err != nil {
			c.prompt = max(1, tokensOf(int64(len(body))))
			return c
		}
		var chars int64
		found := false
		for _, m := range msgs {
			text, n := contentText(m.Content)
			chars += int64(n)
			if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
				// The calls an assistant made are part of the conversation the next prompt repeats.
				chars += int64(utf8.RuneCount(m.ToolCalls))
			}
			if !found && m.Role == "user" {
				c.taskText, c.taskChars, found = text, n, true
			}
			c.lastRole = m.Role
		}
		c.prompt = max(1, tokensOf(chars)+perMessageTokens*int64(len(msgs)))
	case completionEndpoint:
		var text string
		var texts []string
		var ids []int64
		switch {
		case json.Unmarshal(b.Prompt, &text) == nil:
		case json.Unmarshal(b.Prompt, &texts) == nil && len(texts) > 0:
			text = texts[0]
		case json.Unmarshal(b.Prompt, &ids) == nil && len(ids) > 0:
			c.prompt = int64(len(ids))
			return c
		default:
			c.prompt = max(1, tokensOf(int64(len(body))))
			return c
		}
		c.taskText, c.taskChars = text, utf8.RuneCountInString(text)
		c.prompt = max(1, tokensOf(int64(c.taskChars)))
	}
	return c
}

// contentText gives a message content's text and its length in characters: a string, or the text
// parts of an array (other parts, such as images, are not counted).
func contentText(raw json.RawMessage) (string, int) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", 0
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, utf8.RuneCountInString(s)
	}
	var parts []contentPart
	if json.Unmarshal(raw, &parts) != nil {
		return "", 0
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Text == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	return b.String(), utf8.RuneCountInString(b.String())
}

// sessionID is the call's session identity: the first non-empty of the configured headers, then
// the body's metadata.session_id, then user; "" when it has none.
func (g *Gateway) sessionID(h http.Header, c callRequest) string {
	for _, name := range g.cfg.SessionHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			return v
		}
	}
	if c.metaID != "" {
		return c.metaID
	}
	return c.user
}

// headerSessionID is the session identity from headers alone (calls whose bodies are not read).
func (g *Gateway) headerSessionID(h http.Header) string {
	for _, name := range g.cfg.SessionHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			return v
		}
	}
	return ""
}

// tenant is who a call runs for: the tenant header, else a hash of the bearer API key (never the
// key itself), else "".
func (g *Gateway) tenant(h http.Header) string {
	if g.cfg.TenantHeader != "" {
		if v := strings.TrimSpace(h.Get(g.cfg.TenantHeader)); v != "" {
			return v
		}
	}
	if key, ok := bearer(h.Get("Authorization")); ok && key != "" {
		return APIKeyTenant(key)
	}
	return ""
}

// APIKeyTenant is the tenant name of calls made with an API key and no tenant header: "key-"
// and the first 16 hex digits of the SHA-256 of the key. Quotas for such tenants use this name.
func APIKeyTenant(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key-" + hex.EncodeToString(sum[:8])
}

// bearer extracts the credentials of an "Authorization: Bearer …" value.
func bearer(v string) (string, bool) {
	const prefix = "bearer "
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(v[len(prefix):]), true
}

// sessionEnd reads x-session-end: true ends the session when the call finishes.
func sessionEnd(h http.Header) (bool, error) {
	v := strings.TrimSpace(h.Get("x-session-end"))
	if v == "" {
		return false, nil
	}
	return strconv.ParseBool(v)
}

// anonymousID names a one-call session.
func anonymousID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "anon-" + hex.EncodeToString(b[:])
}
