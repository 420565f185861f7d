package gateway

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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

// fastChatBody is a chat body decoded in one encoding/json pass: the bodies of long agent
// conversations are hundreds of KB and every call carries one, so the messages are decoded in
// place (Content as any: a string, or an array of parts as []any of map[string]any) instead of
// being copied out raw and unmarshalled again per message and per content.
type fastChatBody struct {
	User     json.RawMessage `json:"user"`
	Metadata json.RawMessage `json:"metadata"`
	Messages []fastMessage   `json:"messages"`
}

type fastMessage struct {
	Role      string          `json:"role"`
	Content   any             `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// fastCompletionBody is a completion body decoded in one pass (a prompt string can be long too).
type fastCompletionBody struct {
	User     json.RawMessage `json:"user"`
	Metadata json.RawMessage `json:"metadata"`
	Prompt   any             `json:"prompt"`
}

// parseCall reads a model call's body. It decodes the body in one encoding/json pass (each
// Unmarshal is a validity scan plus a decode scan, and the former path made about six of them
// over the messages of a body of hundreds of KB); any body the one pass cannot read exactly as
// parseCallSlow does (a decode error, an odd shape, keys that may repeat) is read by
// parseCallSlow, so the result is always parseCallSlow's.
func parseCall(ep endpoint, body []byte) callRequest {
	if c, ok := parseCallFast(ep, body); ok {
		return c
	}
	return parseCallSlow(ep, body)
}

// parseCallFast is parseCall's one-pass reading; ok is false when the body needs parseCallSlow.
func parseCallFast(ep endpoint, body []byte) (callRequest, bool) {
	var c callRequest
	switch ep {
	case chatEndpoint:
		var b fastChatBody
		if json.Unmarshal(body, &b) != nil || b.Messages == nil {
			// nil: no messages key, or messages null; parseCallSlow tells the two apart.
			return c, false
		}
		if !keysSafe(body) {
			return c, false
		}
		c.user, c.metaID = sessionFields(b.User, b.Metadata)
		var size callSize
		for _, m := range b.Messages {
			text, n, ok := fastContentText(m.Content)
			if !ok {
				return c, false
			}
			size.add(&c, m.Role, text, n, m.ToolCalls)
		}
		size.finish(&c)
		return c, true
	case completionEndpoint:
		var b fastCompletionBody
		if json.Unmarshal(body, &b) != nil {
			return c, false
		}
		var text string
		switch p := b.Prompt.(type) {
		case string:
			text = p
		case []any:
			// parseCallSlow reads an array of strings (nulls read as ""); anything else, such as
			// token ids, is left to it.
			if len(p) == 0 {
				return c, false
			}
			for _, e := range p {
				if _, ok := e.(string); !ok {
					return c, false
				}
			}
			text = p[0].(string)
		default:
			// nil (no prompt, or null) and other shapes.
			return c, false
		}
		c.user, c.metaID = sessionFields(b.User, b.Metadata)
		c.taskText, c.taskChars = text, utf8.RuneCountInString(text)
		c.prompt = max(1, tokensOf(int64(c.taskChars)))
		return c, true
	}
	return c, false
}

// sessionFields reads user and metadata.session_id as parseCallSlow does, quirks included: the
// string the user field left is kept when session_id is null.
func sessionFields(user, metadata json.RawMessage) (u, metaID string) {
	var s string
	if json.Unmarshal(user, &s) == nil {
		u = strings.TrimSpace(s)
	}
	var meta struct {
		SessionID json.RawMessage `json:"session_id"`
	}
	if json.Unmarshal(metadata, &meta) == nil && json.Unmarshal(meta.SessionID, &s) == nil {
		metaID = strings.TrimSpace(s)
	}
	return u, metaID
}

// fastContentText is contentText over a content decoded as any; ok is false for a shape it cannot
// read exactly as contentText does.
func fastContentText(content any) (string, int, bool) {
	switch v := content.(type) {
	case nil:
		return "", 0, true
	case string:
		return v, utf8.RuneCountInString(v), true
	case []any:
		var b strings.Builder
		for _, e := range v {
			var text string
			switch p := e.(type) {
			case nil: // a null part decodes to an empty contentPart
				continue
			case map[string]any:
				for k, x := range p {
					switch k {
					case "text":
						switch t := x.(type) {
						case string:
							text = t
						case nil:
							// A null text keeps an earlier duplicate's value in contentPart.
							return "", 0, false
						default:
							return "", 0, true // contentPart fails to decode
						}
					case "type":
						switch x.(type) {
						case string, nil:
						default:
							return "", 0, true
						}
					default:
						if strings.EqualFold(k, "text") || strings.EqualFold(k, "type") {
							// encoding/json matches struct fields case-insensitively, in document
							// order, which the map does not keep.
							return "", 0, false
						}
					}
				}
			default:
				return "", 0, true // not an object: []contentPart fails to decode
			}
			if text == "" {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(text)
		}
		return b.String(), utf8.RuneCountInString(b.String()), true
	default:
		return "", 0, true // a number, bool or object: neither a string nor parts
	}
}

// keysSafe reports that the body has no object key whose repetition could make the one-pass
// reading differ from parseCallSlow's: a second top-level "messages" (encoding/json decodes it
// into the first one's structs, keeping fields the second lacks, where parseCallSlow keeps only
// the last) and a "text" or "type" key with a value other than a string or null (a map keeps
// only the last of repeated keys, where contentPart fails on any bad one). It is conservative: it
// looks at every key anywhere, found by a byte search for colons, much cheaper than a JSON scan.
// body must be valid JSON.
func keysSafe(body []byte) bool {
	messages := 0
	for i := 0; ; {
		j := bytes.IndexByte(body[i:], ':')
		if j < 0 {
			return true
		}
		colon := i + j
		i = colon + 1
		// The key's closing quote: the last non-space byte before the colon, not escaped.
		q := colon - 1
		for q >= 0 && isSpace(body[q]) {
			q--
		}
		if q < 0 || body[q] != '"' || escaped(body, q) {
			continue
		}
		// The key's opening quote: the previous unescaped quote (no key of interest is longer
		// than 48 bytes, escapes included).
		o := q - 1
		for o >= 0 && q-o <= 49 && (body[o] != '"' || escaped(body, o)) {
			o--
		}
		if o < 0 || q-o > 49 {
			continue
		}
		key := body[o+1 : q]
		if bytes.IndexByte(key, '\\') >= 0 {
			var s string
			if json.Unmarshal(body[o:q+1], &s) != nil {
				return false
			}
			key = []byte(s)
		}
		if bytes.EqualFold(key, []byte("messages")) {
			if messages++; messages > 1 {
				return false
			}
		}
		if bytes.EqualFold(key, []byte("text")) || bytes.EqualFold(key, []byte("type")) {
			v := colon + 1
			for v < len(body) && isSpace(body[v]) {
				v++
			}
			if v < len(body) && body[v] != '"' && body[v] != 'n' {
				return false
			}
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// escaped reports that body[i] is preceded by an odd number of backslashes.
func escaped(body []byte, i int) bool {
	n := 0
	for i--; i >= 0 && body[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// parseCallSlow is the former reading of a model call's body, in several passes: the body into
// raw fields, the messages, then each content. parseCall falls back to it for bodies its one pass
// does not read exactly, and the tests check that the two agree.
func parseCallSlow(ep endpoint, body []byte) callRequest {
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
		var size callSize
		for _, m := range msgs {
			text, n := contentText(m.Content)
			size.add(&c, m.Role, text, n, m.ToolCalls)
		}
		size.finish(&c)
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

// callSize sizes a chat call message by message, for both readings of a body: every message's
// characters (its content's, and its tool calls' raw JSON: the calls an assistant made are part
// of the conversation the next prompt repeats), the first user message (the task) and the last
// role.
type callSize struct {
	chars, msgs int64
	found       bool
}

func (z *callSize) add(c *callRequest, role, text string, n int, toolCalls json.RawMessage) {
	z.chars += int64(n)
	z.msgs++
	if len(toolCalls) > 0 && string(toolCalls) != "null" {
		z.chars += int64(utf8.RuneCount(toolCalls))
	}
	if !z.found && role == "user" {
		c.taskText, c.taskChars, z.found = text, n, true
	}
	c.lastRole = role
}

func (z *callSize) finish(c *callRequest) {
	c.prompt = max(1, tokensOf(z.chars)+perMessageTokens*z.msgs)
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

// MaxSessionIDBytes bounds a session id. Ids are kept per live session, in the state file and
// the journal, and logged; agents' ids are UUIDs or short hashes, so anything longer is a client
// putting something else in the header (a prompt, a token), refused with 400 naming where it came
// from.
const MaxSessionIDBytes = 256

// sessionID is the call's session identity: the first non-empty of the configured headers, then
// the body's metadata.session_id, then user; "" when it has none.
func (g *Gateway) sessionID(h http.Header, c callRequest) string {
	id, _ := g.sessionIDSource(h, c)
	return id
}

// sessionIDSource is sessionID and where it came from: the header's name, "metadata.session_id"
// or "user".
func (g *Gateway) sessionIDSource(h http.Header, c callRequest) (id, source string) {
	for _, name := range g.cfg.SessionHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			return v, name
		}
	}
	if c.metaID != "" {
		return c.metaID, "metadata.session_id"
	}
	return c.user, "user"
}

// checkSessionID refuses an id over MaxSessionIDBytes, naming its source.
func checkSessionID(id, source string) error {
	if len(id) > MaxSessionIDBytes {
		return fmt.Errorf("%s: session id is %d bytes, longer than the %d allowed", source, len(id), MaxSessionIDBytes)
	}
	return nil
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
