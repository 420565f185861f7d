package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/basin-dev/basin/sim"
)

// apiError is an OpenAI-style error answer.
type apiError struct {
	status  int
	message string
	typ     string
	param   string // empty: null
	code    string // empty: null
}

func (e *apiError) Error() string { return e.message }

func invalid(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...),
		typ: "invalid_request_error", param: param}
}

// errorBody is the OpenAI error shape: {"error":{"message","type","param","code"}}.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func (e *apiError) body() errorBody {
	var b errorBody
	b.Error.Message, b.Error.Type = e.message, e.typ
	if e.param != "" {
		b.Error.Param = &e.param
	}
	if e.code != "" {
		b.Error.Code = &e.code
	}
	return b
}

func writeError(w http.ResponseWriter, e *apiError) { writeJSON(w, e.status, e.body()) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *apiError) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
				message: fmt.Sprintf("request body: larger than %d bytes", mbe.Limit)}
		}
		return nil, invalid("", "request body: read: %v", err)
	}
	return b, nil
}

// decodeError turns a JSON decoding error into a 400 naming the field when there is one.
func decodeError(err error) *apiError {
	if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) && te.Field != "" {
		return invalid(te.Field, "%s: must be %s, got JSON %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if name, uerr := strconv.Unquote(f); uerr == nil {
			return invalid(name, "%s: unknown field", name)
		}
	}
	return invalid("", "request body: invalid JSON: %v", err)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "int", "int64", "int32":
		return "an integer"
	case "float64", "float32":
		return "a number"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return "of another type"
}

// endpoint is the OpenAI API a request came through.
type endpoint int

const (
	chatEndpoint endpoint = iota
	completionEndpoint
)

// genRequest is a parsed chat or completion request, in the simulator's terms.
type genRequest struct {
	endpoint     endpoint
	model        string
	stream       bool
	includeUsage bool
	prompt       int // tokens
	shared       int // leading tokens every session shares (system prompt)
	output       int
	session      string // the client's session id; empty: a one-call session
	endAfter     bool
}

// requestBody holds the fields both endpoints read.
type requestBody struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	N                   *int64 `json:"n"`
	User                string `json:"user"`
	Metadata            *struct {
		SessionID string `json:"session_id"`
	} `json:"metadata"`

	Messages json.RawMessage `json:"messages"` // chat
	Prompt   json.RawMessage `json:"prompt"`   // completions
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

// sessionHeaders are the headers that carry a session id, first match wins: basin's own, then
// those of Claude Code, SGLang's router, LiteLLM-style proxies and NVIDIA Dynamo.
var sessionHeaders = []string{"x-session-id", "x-claude-code-session-id", "session-id", "session_id",
	"x-session-affinity", "x-dynamo-session-id"}

// parseGenerate reads a chat or completion request: body, session identity and the token counts
// the simulator needs.
//
// A chat body is first tried on the fast path, parseChatFast, which decodes it in one pass; at
// 90× speed the repeated decoding of parseGenerateSlow dominates the simulator's CPU. Any body
// the fast path is not sure about goes to parseGenerateSlow, so errors read the same either way.
func (s *Server) parseGenerate(ep endpoint, h http.Header, body []byte) (genRequest, *apiError) {
	if ep == chatEndpoint {
		if b, counts, ok := parseChatFast(body); ok {
			return s.finishGenerate(ep, h, &b.requestBody, &counts)
		}
	}
	return s.parseGenerateSlow(ep, h, body)
}

// parseGenerateSlow is the reference parser: it decodes the body, then the messages, then each
// message, then each content, and answers every malformed request with its own error. It is
// what parseGenerate falls back to, and what the fast path is tested against.
func (s *Server) parseGenerateSlow(ep endpoint, h http.Header, body []byte) (genRequest, *apiError) {
	var b requestBody
	if err := json.Unmarshal(body, &b); err != nil {
		return genRequest{}, decodeError(err)
	}
	return s.finishGenerate(ep, h, &b, nil)
}

// promptCounts are a prompt's token counts, computed ahead by the fast path.
type promptCounts struct{ prompt, shared int }

// finishGenerate checks a decoded body and builds the request. counts, when not nil, are the
// prompt's token counts already computed; otherwise they are computed here from b.Messages or
// b.Prompt, with their errors.
func (s *Server) finishGenerate(ep endpoint, h http.Header, b *requestBody, counts *promptCounts) (genRequest, *apiError) {
	req := genRequest{endpoint: ep, model: b.Model, stream: b.Stream, output: DefaultOutputTokens}
	if req.model == "" {
		req.model = s.o.ModelName
	}
	if b.StreamOptions != nil {
		req.includeUsage = b.StreamOptions.IncludeUsage
	}
	if b.N != nil && *b.N != 1 {
		return req, invalid("n", "n: only 1 choice is supported, got %d", *b.N)
	}
	var apiErr *apiError
	switch {
	case counts != nil:
		req.prompt, req.shared = counts.prompt, counts.shared
	case ep == chatEndpoint:
		req.prompt, req.shared, apiErr = chatTokens(b.Messages)
	case ep == completionEndpoint:
		req.prompt, apiErr = completionTokens(b.Prompt)
	}
	if apiErr != nil {
		return req, apiErr
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"max_tokens", b.MaxTokens}, {"max_completion_tokens", b.MaxCompletionTokens}} {
		if f.v == nil {
			continue
		}
		if *f.v < 1 {
			return req, invalid(f.name, "%s: must be ≥ 1, got %d", f.name, *f.v)
		}
		if *f.v > int64(s.maxTokens) {
			return req, s.tooLong(ep, req.prompt, *f.v)
		}
		req.output = int(*f.v) // max_completion_tokens, checked last, wins
	}
	if req.prompt+req.output > s.maxTokens {
		return req, s.tooLong(ep, req.prompt, int64(req.output))
	}

	for _, name := range sessionHeaders {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			req.session = v
			break
		}
	}
	if req.session == "" && b.Metadata != nil {
		req.session = strings.TrimSpace(b.Metadata.SessionID)
	}
	if req.session == "" {
		req.session = strings.TrimSpace(b.User)
	}
	if v := strings.TrimSpace(h.Get("x-session-end")); v != "" {
		end, err := strconv.ParseBool(v)
		if err != nil {
			return req, invalid("x-session-end", "x-session-end: header must be true or false, got %q", v)
		}
		req.endAfter = end
	}
	return req, nil
}

// tooLong refuses a call whose prompt and output cannot fit one decode instance's KV memory, the
// simulated deployment's context limit.
func (s *Server) tooLong(ep endpoint, prompt int, output int64) *apiError {
	param := "messages"
	if ep == completionEndpoint {
		param = "prompt"
	}
	e := invalid(param, "%s: this deployment's context is %d tokens; the request has %d prompt tokens and asks for %d output tokens",
		param, s.maxTokens, prompt, output)
	e.code = "context_length_exceeded"
	return e
}

// tokens is the prompt size of chars characters: about four characters a token.
func tokens(chars int) int { return (chars + 3) / 4 }

// perMessageTokens is the chat template's overhead per message (role markers).
const perMessageTokens = 4

// chatTokens sizes a chat prompt: ceil(characters / 4) + 4 per message. The leading system (or
// developer) messages are the shared prefix, a system prompt a radix cache keeps for every session.
func chatTokens(raw json.RawMessage) (prompt, shared int, _ *apiError) {
	if isNull(raw) {
		return 0, 0, invalid("messages", "messages: required")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return 0, 0, invalid("messages", "messages: must be an array of messages")
	}
	if len(items) == 0 {
		return 0, 0, invalid("messages", "messages: must not be empty")
	}
	var size promptSize
	for i, item := range items {
		var m chatMessage
		if err := json.Unmarshal(item, &m); err != nil {
			param := fmt.Sprintf("messages[%d]", i)
			if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) && te.Field != "" {
				param += "." + te.Field
				return 0, 0, invalid(param, "%s: must be %s, got JSON %s", param, jsonKind(te.Type.Kind().String()), te.Value)
			}
			return 0, 0, invalid(param, "%s: must be a message object", param)
		}
		if m.Role == "" {
			return 0, 0, invalid(fmt.Sprintf("messages[%d].role", i), "messages[%d].role: required", i)
		}
		n, apiErr := contentChars(m.Content, i)
		if apiErr != nil {
			return 0, 0, apiErr
		}
		size.add(m.Role, n, isNull(m.ToolCalls), m.ToolCalls)
	}
	c := size.counts()
	return c.prompt, c.shared, nil
}

// promptSize sizes a chat prompt message by message, for both parsers: every message's characters
// (its content's, and its tool calls' raw JSON: the calls an assistant made are part of the
// conversation the next prompt repeats), and apart those of the leading system and developer
// messages, the prefix every session of an agent shares.
type promptSize struct {
	chars, sharedChars, msgs, sharedMsgs int
	past                                 bool // past the leading system and developer messages
}

func (p *promptSize) add(role string, contentChars int, noToolCalls bool, toolCalls []byte) {
	n := contentChars
	if !noToolCalls {
		n += utf8.RuneCount(toolCalls)
	}
	p.chars += n
	p.msgs++
	if !p.past && (role == "system" || role == "developer") {
		p.sharedChars += n
		p.sharedMsgs++
	} else {
		p.past = true
	}
}

func (p *promptSize) counts() promptCounts {
	c := promptCounts{prompt: tokens(p.chars) + perMessageTokens*p.msgs}
	if p.sharedMsgs > 0 {
		c.shared = tokens(p.sharedChars) + perMessageTokens*p.sharedMsgs
	}
	return c
}

// contentChars counts the characters of one message's content: a string, an array of text parts,
// or null (an assistant message that only calls tools).
func contentChars(raw json.RawMessage, i int) (int, *apiError) {
	param := fmt.Sprintf("messages[%d].content", i)
	if isNull(raw) {
		return 0, nil
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return utf8.RuneCountInString(text), nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, invalid(param, "%s: must be a string or an array of text parts", param)
	}
	n := 0
	for j, p := range parts {
		if p.Type != "text" {
			pp := fmt.Sprintf("%s[%d].type", param, j)
			return 0, invalid(pp, "%s: only text parts are simulated, got %q", pp, p.Type)
		}
		n += utf8.RuneCountInString(p.Text)
	}
	return n, nil
}

// chatBodyFast is a chat request body decoded in one pass: requestBody's fields, with the
// messages decoded as messages rather than kept raw. The outer Messages field, being shallower,
// takes the "messages" key from the embedded requestBody.Messages, which stays empty.
type chatBodyFast struct {
	requestBody
	Messages []chatMessage `json:"messages"`
}

// parseChatFast decodes a chat body with a single json.Unmarshal and sizes its prompt exactly as
// chatTokens does. parseGenerateSlow unmarshals the body, then the messages, then each message,
// then each content: each json.Unmarshal validates and then decodes, so a long conversation's
// text is scanned about six times, which dominates the CPU of a simulator driven at 90× speed.
// Here the text is scanned once by encoding/json, then once more, cheaply, to count runes.
//
// ok is false for anything parseGenerateSlow would reject, and for the few valid bodies whose
// single-pass decoding could differ from its (a top-level key matching "messages" twice); the
// caller then runs parseGenerateSlow, so that error answers stay exactly the same.
func parseChatFast(body []byte) (b chatBodyFast, counts promptCounts, ok bool) {
	if err := json.Unmarshal(body, &b); err != nil || len(b.Messages) == 0 {
		return b, counts, false
	}
	var size promptSize
	for i := range b.Messages {
		m := &b.Messages[i]
		if m.Role == "" {
			return b, counts, false
		}
		n, ok := contentCharsFast(m.Content)
		if !ok {
			return b, counts, false
		}
		size.add(m.Role, n, isNullBytes(m.ToolCalls), m.ToolCalls)
	}
	// A second "messages" key decodes into the elements the first one left, so a field the
	// second omits would keep the first's value, where the slow path sees only the second.
	if messagesKeyRepeated(body) {
		return b, counts, false
	}
	return b, size.counts(), true
}

// contentCharsFast is contentChars for content decoded as part of a valid body: a string's
// characters are counted from its JSON text, without decoding it again. ok is false where
// contentChars would answer an error.
func contentCharsFast(raw json.RawMessage) (n int, ok bool) {
	raw = bytes.TrimSpace(raw)
	if isNullBytes(raw) {
		return 0, true
	}
	switch raw[0] {
	case '"':
		return jsonStringRunes(raw), true
	case '[':
		// Parts are rarer than strings; decoding them as contentChars does keeps the same
		// answer for duplicate or differently cased keys, which a map[string]any would lose.
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return 0, false
		}
		for _, p := range parts {
			if p.Type != "text" {
				return 0, false
			}
			n += utf8.RuneCountInString(p.Text)
		}
		return n, true
	}
	return 0, false
}

// isNullBytes is isNull without copying raw to a string.
func isNullBytes(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// jsonStringRunes counts the characters of the string a valid JSON string literal decodes to, as
// utf8.RuneCountInString would after json.Unmarshal: each escape is one character, but for a
// valid UTF-16 surrogate pair, also one; each byte of invalid UTF-8 is one (encoding/json turns it
// into U+FFFD, utf8.RuneCount counts it as one), as is a lone surrogate (U+FFFD).
func jsonStringRunes(lit []byte) int {
	s := lit[1 : len(lit)-1]
	n := 0
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return n + utf8.RuneCount(s)
		}
		n += utf8.RuneCount(s[:i]) + 1
		if s[i+1] != 'u' {
			s = s[i+2:]
			continue
		}
		r := hex4(s[i+2 : i+6])
		s = s[i+6:]
		if utf16.IsSurrogate(r) && len(s) >= 6 && s[0] == '\\' && s[1] == 'u' &&
			utf16.DecodeRune(r, hex4(s[2:6])) != unicode.ReplacementChar {
			s = s[6:] // the pair's second half
		}
	}
}

// hex4 decodes the four hexadecimal digits of a \u escape; -1 if they are not.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// messagesKeyRepeated reports whether the top-level object of a valid JSON body may hold more
// than one key encoding/json matches to the messages field (it matches case-insensitively). A key
// with an escape or a non-ASCII byte counts as a match, to be safe. It skips values without
// decoding them, a pass much cheaper than encoding/json's scanner.
func messagesKeyRepeated(body []byte) bool {
	i := skipJSONSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return true
	}
	i++
	seen := 0
	for {
		i = skipJSONSpace(body, i)
		if i >= len(body) {
			return true
		}
		switch body[i] {
		case '}':
			return false
		case ',':
			i++
			continue
		case '"':
		default:
			return true
		}
		end := jsonStringEnd(body, i)
		if end > len(body) {
			return true
		}
		if key := body[i+1 : end-1]; bytes.EqualFold(key, []byte("messages")) ||
			bytes.IndexByte(key, '\\') >= 0 || !isASCII(key) {
			if seen++; seen > 1 {
				return true
			}
		}
		i = skipJSONSpace(body, end)
		if i >= len(body) || body[i] != ':' {
			return true
		}
		i = skipJSONValue(body, skipJSONSpace(body, i+1))
	}
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// jsonStringEnd returns the index just after the string literal starting at b[i], or len(b)+1 if
// it does not end.
func jsonStringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			break
		}
		j += k
		backslashes := 0
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return j + 1
		}
	}
	return len(b) + 1
}

// skipJSONValue returns the index just after the valid JSON value starting at b[i].
func skipJSONValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return jsonStringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = jsonStringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && skipJSONSpace(b, i) == i {
		i++
	}
	return i
}

// completionTokens sizes a completion prompt: a string (ceil(characters / 4), at least 1), an
// array holding one string, or an array of token ids.
func completionTokens(raw json.RawMessage) (int, *apiError) {
	if isNull(raw) {
		return 0, invalid("prompt", "prompt: required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return max(1, tokens(utf8.RuneCountInString(text))), nil
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err == nil {
		if len(texts) != 1 {
			return 0, invalid("prompt", "prompt: exactly one prompt is supported, got %d", len(texts))
		}
		return max(1, tokens(utf8.RuneCountInString(texts[0]))), nil
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return len(ids), nil
	}
	return 0, invalid("prompt", "prompt: must be a string, an array of one string or an array of token ids")
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// fillerWords make up the generated text. Each is three letters, so that n words joined by spaces
// are 4n−1 characters: n tokens again when a client sends the answer back in its next prompt.
var fillerWords = [...]string{"the", "sim", "ran", "one", "big", "red", "fox", "sat", "far", "day",
	"new", "old", "sun", "and", "cat", "dog"}

// filler returns words from (inclusive) to to (exclusive) of the generated text, each after a
// space but the first of the text, so that the pieces of a stream concatenate to the whole.
func filler(from, to int) string {
	var b strings.Builder
	b.Grow(4 * max(0, to-from))
	for i := from; i < to; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(fillerWords[i%len(fillerWords)])
	}
	return b.String()
}

// usage is the OpenAI usage block.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func newUsage(prompt, cached, completion int) *usage {
	u := &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	u.PromptTokensDetails.CachedTokens = cached
	return u
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type delta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

// choice covers both endpoints; the fields of the other one are left out.
type choice struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *delta          `json:"delta,omitempty"`
	Text         *string         `json:"text,omitempty"`
	Logprobs     *struct{}       `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type response struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
}

// generation is what one request writes back.
type generation struct {
	req     genRequest
	id      string
	created int64
}

func (g *generation) object(chunk bool) string {
	switch {
	case g.req.endpoint == completionEndpoint:
		return "text_completion"
	case chunk:
		return "chat.completion.chunk"
	}
	return "chat.completion"
}

// choice builds the one choice: text from word from to to; stop marks the last.
func (g *generation) choice(chunk bool, from, to int, stop bool) choice {
	c := choice{}
	if stop {
		reason := "stop"
		c.FinishReason = &reason
	}
	text := filler(from, to)
	switch {
	case g.req.endpoint == completionEndpoint:
		c.Text = &text
	case chunk:
		c.Delta = &delta{Content: text}
		if from == 0 && to > 0 {
			c.Delta.Role = "assistant"
		}
	default:
		c.Message = &chatMessageOut{Role: "assistant", Content: text}
	}
	return c
}

func (g *generation) response(chunk bool, choices []choice, u *usage) response {
	return response{ID: g.id, Object: g.object(chunk), Created: g.created, Model: g.req.model, Choices: choices, Usage: u}
}

// serveGenerate handles POST /v1/chat/completions and /v1/completions.
func (s *Server) serveGenerate(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, apiErr := readBody(w, r, s.o.MaxBodyBytes)
		if apiErr != nil {
			writeError(w, apiErr)
			return
		}
		req, apiErr := s.parseGenerate(ep, r.Header, body)
		if apiErr != nil {
			writeError(w, apiErr)
			return
		}
		c, apiErr := s.submit(req)
		if apiErr != nil {
			writeError(w, apiErr)
			return
		}
		prefix := "chatcmpl-sim-"
		if ep == completionEndpoint {
			prefix = "cmpl-sim-"
		}
		g := &generation{req: req, id: prefix + strconv.FormatUint(s.ids.Add(1), 10), created: s.o.Now().Unix()}
		if req.stream {
			s.stream(w, r, c, g)
		} else {
			s.respond(w, r, c, g)
		}
	}
}

// submit hands the call to the simulator.
func (s *Server) submit(req genRequest) (*call, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stopped:
		return nil, errStopped()
	default:
	}
	s.advanceLocked(s.virtualNow())
	var key string
	if req.session == "" {
		s.mu.anon++
		key = "anon/" + strconv.FormatUint(s.mu.anon, 10)
	} else {
		key = "session/" + req.session
	}
	ss, known := s.mu.sessions[key]
	if known && ss.call != nil {
		return nil, errBusy(req.session)
	}
	if !known {
		ss = &session{key: key, id: req.session, endAfterCall: req.session == ""}
	}
	c := newCall(s, req.stream)
	c.sess = ss
	err := s.mu.sim.Submit(sim.ExternalCall{Session: key, Shared: req.shared, Prompt: req.prompt,
		Output: req.output, Notify: c.notify})
	switch {
	case errors.Is(err, sim.ErrBusy):
		return nil, errBusy(req.session)
	case err != nil:
		return nil, &apiError{status: http.StatusInternalServerError, typ: "server_error",
			message: fmt.Sprintf("submit call: %v", err)}
	}
	s.mu.sessions[key] = ss
	ss.call = c
	ss.endAfterCall = ss.endAfterCall || req.endAfter
	s.o.Logger.Debug("call submitted", "session", req.session, "prompt_tokens", req.prompt,
		"shared_tokens", req.shared, "output_tokens", req.output, "stream", req.stream, "virtual_now", s.mu.sim.Now())
	s.kick()
	return c, nil
}

func errBusy(id string) *apiError {
	return &apiError{status: http.StatusConflict, typ: "invalid_request_error", param: "session_id",
		code: "session_busy", message: fmt.Sprintf("session %q has a call in flight; a session sends one call at a time", id)}
}

func errStopped() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "simulator_stopped",
		message: "the simulator is not running"}
}

func errEnded() *apiError {
	return &apiError{status: http.StatusConflict, typ: "invalid_request_error", code: "session_ended",
		message: "the session was ended while this call was in flight"}
}

// abandon aborts a call whose client is gone: the simulator has no way to drop one call, so the
// session ends, as an engine frees a request's KV when its client disconnects.
func (s *Server) abandon(c *call, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(s.virtualNow())
	if c.finished {
		return
	}
	s.endLocked(c.sess.key)
	s.kick()
	s.o.Logger.Info("call aborted; session ended", "session", c.sess.id, "reason", why, "virtual_now", s.mu.sim.Now())
}

// respond waits for the call to finish and writes one response.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, c *call, g *generation) {
	for {
		select {
		case <-c.ready:
		case <-r.Context().Done():
			s.abandon(c, "client disconnected")
			return
		case <-s.stopped:
		}
		for _, ev := range c.take() {
			switch ev.Kind {
			case sim.Done:
				w.Header().Set("x-basin-sim-prompt-tokens", strconv.Itoa(ev.PromptTokens))
				w.Header().Set("x-basin-sim-cached-tokens", strconv.Itoa(ev.CachedTokens))
				u := newUsage(ev.PromptTokens, ev.CachedTokens, g.req.output)
				writeJSON(w, http.StatusOK, g.response(false, []choice{g.choice(false, 0, g.req.output, true)}, u))
				return
			case sim.Aborted:
				writeError(w, errEnded())
				return
			}
		}
		if isClosed(s.stopped) {
			writeError(w, errStopped())
			return
		}
	}
}

// stream writes the call as server-sent events, one chunk per simulator event that produced
// words, as the simulator produces them.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, c *call, g *generation) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.Header().Set("x-basin-sim-prompt-tokens", strconv.Itoa(g.req.prompt))
	w.WriteHeader(http.StatusOK)
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := rc.Flush(); err != nil {
		s.abandon(c, "flush failed: "+err.Error())
		return
	}
	sent := 0
	for {
		select {
		case <-c.ready:
		case <-r.Context().Done():
			s.abandon(c, "client disconnected")
			return
		case <-s.stopped:
		}
		for _, ev := range c.take() {
			var err error
			switch ev.Kind {
			case sim.FirstToken, sim.Progress:
				if n := min(ev.Tokens, g.req.output); n > sent {
					err = send(g.response(true, []choice{g.choice(true, sent, n, false)}, nil))
					sent = n
				}
			case sim.Done:
				if sent < g.req.output {
					err = send(g.response(true, []choice{g.choice(true, sent, g.req.output, false)}, nil))
				}
				if err == nil {
					err = send(g.response(true, []choice{g.choice(true, 0, 0, true)}, nil))
				}
				if err == nil && g.req.includeUsage {
					err = send(g.response(true, []choice{}, newUsage(ev.PromptTokens, ev.CachedTokens, g.req.output)))
				}
				if err == nil {
					_, err = io.WriteString(w, "data: [DONE]\n\n")
				}
				if err == nil {
					_ = rc.Flush()
				}
				return // the call is over whether or not the client got the end
			case sim.Aborted:
				writeStreamError(w, rc, errEnded())
				return
			}
			if err != nil {
				s.abandon(c, "write failed: "+err.Error())
				return
			}
		}
		if isClosed(s.stopped) {
			writeStreamError(w, rc, errStopped())
			return
		}
	}
}

// writeStreamError ends a stream with an error event, as OpenAI's API does once a stream has
// begun (no [DONE] follows).
func writeStreamError(w http.ResponseWriter, rc *http.ResponseController, e *apiError) {
	b, _ := json.Marshal(e.body()) // cannot fail: strings and pointers to strings
	_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
	_ = rc.Flush()
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
	}
	return false
}
