// Package agentcall reads an agent's model call: who sent it (the session identity: a header,
// then the body's metadata.session_id, then its user), how large its prompt is (the token estimate
// admission books), and the request fields a server needs (model, stream, output limits). The
// gateway reads every call it proxies with it and the simulator's server every call it serves,
// so the two cannot drift apart on what a body means.
//
// # Shapes
//
// A Shape is the API a body is written for: OpenAI chat completions (Chat) and completions
// (Completions), OpenAI Responses and Anthropic Messages, which the gateway and the simulator
// serve alike. A shape is an entry of a table — its route,
// the field that holds its prompt and a small reader per top-level field it reads — so a new API
// is a table entry and its readers, on the same scanner and the same counting.
//
// # Two builders, one reading
//
// Long agent conversations re-send their whole history with every call, so bodies run to
// hundreds of KB and reading them is the gateway's main cost per call. Read scans a body once
// with its own validating scanner into a tree of value spans, decoding only the few short strings
// it needs (roles, ids, the task) and counting the characters of the rest in place. A body the
// scanner leaves (invalid JSON, a key with escapes, very deep nesting) is read into the same tree
// by encoding/json's tokenizer instead; the readers of the shapes walk the tree either way. The
// fuzz test checks that both builders give the same tree for every input the fast one accepts,
// and that Read agrees with a reading through encoding/json alone.
//
// # Duplicate keys
//
// JSON parsers disagree on a repeated key: Python's json module and most C++ and JavaScript
// parsers keep the last, Rust's serde refuses the body, Go's encoding/json keeps the last for a
// scalar but merges two objects or arrays decoded into the same struct. A proxy that picked one
// of these readings could admit and route a call by a session id or a prompt size the engine
// behind it never sees — the JSON cousin of HTTP's conflicting Content-Length, which RFC 9112
// has a proxy refuse. So the rule is: keys are matched exactly as the API spells them
// (encoding/json's case-insensitive matching is another reading no engine shares), and a key
// that any reader of the shape reads, repeated in the same object, makes the body ambiguous. An
// ambiguous body is unread: Read returns a *FieldError naming the key (a server answers 400) and
// a Call with no identity, sized by the body's length (the gateway still proxies it and lets the
// engine judge it, booked by its size and as a one-call session). Repeated keys the readers
// do not read (inside tools, say) change nothing basin decides and are left to the engine.
package agentcall

import (
	"fmt"
	"net/http"
	"strings"
)

// Call is what basin reads from one model call's body.
type Call struct {
	// Shape is the API the body was read as.
	Shape Shape
	// Prompt is the prompt's size estimate in tokens, at least 1: ceil(characters / 4), plus
	// PerMessageTokens per chat message; the number of token ids of a completion prompt given as
	// ids; ceil(bytes / 4) of a body that cannot be read.
	Prompt int64
	// Shared is the estimate of the leading system and developer messages: the prefix every
	// session of an agent shares, which a radix cache keeps once.
	Shared int64
	// Task is the first user message's text (text parts joined by newlines), or a completion's
	// prompt: what the session was started to do. TaskChars is its length in characters.
	Task      string
	TaskChars int
	// LastRole is the role of the last chat message: "user" means a person's turn.
	LastRole string
	// SessionID is metadata.session_id, CacheKey is prompt_cache_key (Responses) and User is
	// user (metadata.user_id in Anthropic Messages), all trimmed.
	SessionID string
	CacheKey  string
	User      string
	// PreviousResponseID is a Responses call's previous_response_id: the rest of its
	// conversation is kept by the server, and is not in Prompt.
	PreviousResponseID string
	// NoStore is a Responses call's "store": false: the server keeps no response for a later
	// previous_response_id to continue, so the call cannot start a chain.
	NoStore bool
	// Model, Stream and IncludeUsage (stream_options.include_usage) are read as sent.
	Model        string
	Stream       bool
	IncludeUsage bool
	// MaxTokens (max_tokens; max_output_tokens of Responses), MaxCompletionTokens and N are nil
	// when absent or null.
	MaxTokens           *int64
	MaxCompletionTokens *int64
	N                   *int64
}

// PerMessageTokens is a chat template's overhead per message (role markers).
const PerMessageTokens = 4

// Tokens is the token estimate of chars characters: ceil(chars / 4), about four characters a
// token for English text and code.
func Tokens(chars int64) int64 { return (chars + 3) / 4 }

// FieldError is what is wrong with a body, naming the field in the API's own terms
// ("messages[2].content"), or none for the body as a whole. A server refuses the call with it; the
// gateway proxies the call anyway and lets the engine judge it.
type FieldError struct {
	// Field is the path of the field at fault; "" for the whole body.
	Field string
	// Problem says what is wrong with it.
	Problem string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "request body: " + e.Problem
	}
	return e.Field + ": " + e.Problem
}

// Read reads a call's body written for shape s. It never gives up on a body: a field it cannot
// read is left zero, and a prompt it cannot read is sized by the body's length, so a proxy can
// still book and forward the call. The error, a *FieldError, is the first problem found, for a
// server that refuses malformed calls: an ambiguous body (see the package documentation), then
// invalid JSON or a body that is not an object, then a top-level field of the wrong type, then
// the prompt's first problem.
func Read(s Shape, body []byte) (Call, error) {
	if !s.valid() {
		return Call{}, fmt.Errorf("read call: unknown shape %d", s)
	}
	t, ok := buildFast(body)
	if !ok {
		var err error
		if t, err = buildRef(body); err != nil {
			return unread(s, body), &FieldError{Problem: "invalid JSON: " + err.Error()}
		}
	}
	return readTree(s, t)
}

// unread is the Call of a body whose prompt cannot be read: sized by its length.
func unread(s Shape, body []byte) Call {
	return Call{Shape: s, Prompt: max(1, Tokens(int64(len(body))))}
}

// SessionHeaders returns the headers that carry a session id, first non-empty wins: basin's
// own, Claude Code's, Codex's two spellings, OpenCode's and NVIDIA Dynamo's (the lists llm-d's
// agent-identity and Dynamo use). The gateway's session_headers default to them; the simulator's
// server reads them.
func SessionHeaders() []string {
	return []string{"x-session-id", "x-claude-code-session-id", "session-id", "session_id",
		"x-session-affinity", "x-dynamo-session-id"}
}

// Identity is the call's session id and where it came from: the first non-empty of headers (the
// header's name), then the body's metadata.session_id, then its prompt_cache_key, then its user
// (the field's name); "" when it has none. Header values are trimmed.
func (c *Call) Identity(h http.Header, headers []string) (id, source string) {
	for _, name := range headers {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			return v, name
		}
	}
	switch {
	case c.SessionID != "":
		return c.SessionID, "metadata.session_id"
	case c.CacheKey != "":
		return c.CacheKey, "prompt_cache_key"
	case c.Shape.valid():
		return c.User, shapes[c.Shape].userSource
	}
	return c.User, "user"
}
