package gateway

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/agentcall"
)

// Bounds on what an observer keeps, so that a huge response costs no more than this much memory.
const (
	maxCapture = 8 << 20 // a non-streamed JSON body, parsed for usage at the end
	maxSSELine = 1 << 20 // one server-sent event line
)

// usage is a usage object of any of the APIs served: OpenAI chat and completions
// (prompt_tokens, completion_tokens), OpenAI Responses (input_tokens, which include the cached
// ones, and output_tokens) and Anthropic Messages (input_tokens, which do not include the
// cache_read_input_tokens and cache_creation_input_tokens beside them, and output_tokens).
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	CacheRead        int64 `json:"cache_read_input_tokens"`
	CacheCreation    int64 `json:"cache_creation_input_tokens"`
}

// prompt is the prompt's size in tokens: the whole prompt, cached or not.
func (u *usage) prompt() int64 {
	if u.PromptTokens > 0 {
		return u.PromptTokens
	}
	return u.InputTokens + u.CacheRead + u.CacheCreation
}

// output is the generated tokens.
func (u *usage) output() int64 { return u.CompletionTokens + u.OutputTokens }

// merge takes the counts an event gives. A streamed Anthropic answer gives its usage in parts —
// the input counts in message_start, the output count (and, in later versions, the input counts
// again) in message_delta — so a count is replaced only by one that is given (non-zero).
func (u *usage) merge(v *usage) {
	for _, f := range [...]struct {
		dst *int64
		src int64
	}{
		{&u.PromptTokens, v.PromptTokens}, {&u.CompletionTokens, v.CompletionTokens},
		{&u.InputTokens, v.InputTokens}, {&u.OutputTokens, v.OutputTokens},
		{&u.CacheRead, v.CacheRead}, {&u.CacheCreation, v.CacheCreation},
	} {
		if f.src != 0 {
			*f.dst = f.src
		}
	}
}

// usageCarrier is where an answer or a streamed event holds its usage: at the top (chat,
// completions, a whole Responses or Messages answer, Anthropic's message_delta), in "response"
// (Responses events: response.created … response.completed) or in "message" (Anthropic's
// message_start). ID and Response.ID are a Responses answer's id, which a later call continues.
type usageCarrier struct {
	ID       string `json:"id"`
	Object   string `json:"object"`
	Usage    *usage `json:"usage"`
	Response *struct {
		ID    string `json:"id"`
		Usage *usage `json:"usage"`
	} `json:"response"`
	Message *struct {
		Usage *usage `json:"usage"`
	} `json:"message"`
}

// observeMode is how an observer reads a response body.
type observeMode int

const (
	observeNone observeMode = iota // not readable (compressed, unknown type): count bytes only
	observeJSON                    // capture, parse at the end
	observeSSE                     // parse event lines as they pass
)

// observer is the response writer the reverse proxy writes to: it passes every byte through
// unchanged and at once (it unwraps to the real writer, so the proxy's flushes reach the client)
// while reading the usage and the generated text off the response.
type observer struct {
	w   http.ResponseWriter
	now func() time.Time

	status    int
	firstByte time.Time
	mode      observeMode
	bytes     int64

	buf      []byte // JSON: the captured body; SSE: the unfinished line
	overflow bool   // JSON body or SSE line too long to keep

	// api is the shape of the call answered: a Responses answer's id is read.
	api        agentcall.Shape
	usage      *usage
	responseID string
	// onID, when set, is called once with a Responses answer's id as soon as it is read: in a
	// stream that is its first event, long before the answer is complete.
	onID     func(id string)
	outChars int64 // characters of generated text seen (content, reasoning, tool arguments)
}

func newObserver(w http.ResponseWriter, now func() time.Time) *observer {
	return &observer{w: w, now: now}
}

// Header implements http.ResponseWriter.
func (o *observer) Header() http.Header { return o.w.Header() }

// WriteHeader implements http.ResponseWriter, deciding how to read the body from its headers.
func (o *observer) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		o.w.WriteHeader(code) // informational: the real status follows
		return
	}
	if o.status == 0 {
		o.status = code
		o.mode = bodyMode(o.w.Header())
	}
	o.w.WriteHeader(code)
}

func bodyMode(h http.Header) observeMode {
	if ce := h.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return observeNone
	}
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	switch {
	case mt == "text/event-stream":
		return observeSSE
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return observeJSON
	}
	return observeNone
}

// Write implements http.ResponseWriter: the bytes go to the client first, then to the reader.
func (o *observer) Write(p []byte) (int, error) {
	if o.status == 0 {
		o.WriteHeader(http.StatusOK)
	}
	if o.firstByte.IsZero() && len(p) > 0 {
		o.firstByte = o.now()
	}
	n, err := o.w.Write(p)
	o.bytes += int64(n)
	switch o.mode {
	case observeSSE:
		o.readSSE(p[:n])
	case observeJSON:
		if !o.overflow {
			if len(o.buf)+n > maxCapture {
				o.overflow, o.buf = true, nil
			} else {
				o.buf = append(o.buf, p[:n]...)
			}
		}
	}
	return n, err
}

// Unwrap lets http.ResponseController (which the reverse proxy flushes through) reach the real
// writer.
func (o *observer) Unwrap() http.ResponseWriter { return o.w }

// readSSE feeds complete lines to readEvent, keeping an unfinished line for the next write.
func (o *observer) readSSE(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if !o.overflow {
				if len(o.buf)+len(p) > maxSSELine {
					o.overflow, o.buf = true, o.buf[:0]
				} else {
					o.buf = append(o.buf, p...)
				}
			}
			return
		}
		line := p[:i]
		p = p[i+1:]
		if o.overflow { // the rest of a line too long to read
			o.overflow = false
			continue
		}
		if len(o.buf) > 0 {
			o.buf = append(o.buf, line...)
			line = o.buf
		}
		o.readEvent(line)
		o.buf = o.buf[:0]
	}
}

var (
	dataPrefix = []byte("data:")
	doneEvent  = []byte("[DONE]")
)

// readEvent reads one SSE line: a data line's usage and generated text.
func (o *observer) readEvent(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	if !bytes.HasPrefix(line, dataPrefix) {
		return
	}
	data := bytes.TrimLeft(line[len(dataPrefix):], " ")
	if bytes.Equal(data, doneEvent) {
		return
	}
	o.read(data)
}

// read reads one JSON answer or event: the generated text's characters, the usage and, of a
// Responses answer, its id. Only the events that carry a usage (or, until it is known, the
// Responses id) are decoded.
func (o *observer) read(data []byte) {
	chars, hasUsage := scanJSON(data)
	o.outChars += chars
	wantID := o.api == agentcall.Responses && o.responseID == ""
	if !hasUsage && !wantID {
		return
	}
	var v usageCarrier
	if json.Unmarshal(data, &v) != nil {
		return
	}
	if wantID {
		switch {
		case v.Response != nil && v.Response.ID != "":
			o.responseID = v.Response.ID
		case v.Object == "response" && v.ID != "":
			o.responseID = v.ID
		}
		if o.responseID != "" && o.onID != nil {
			o.onID(o.responseID)
		}
	}
	for _, u := range []*usage{v.Usage, responseUsage(&v), messageUsage(&v)} {
		if u == nil {
			continue
		}
		if o.usage == nil {
			o.usage = &usage{}
		}
		o.usage.merge(u)
	}
}

func responseUsage(v *usageCarrier) *usage {
	if v.Response == nil {
		return nil
	}
	return v.Response.Usage
}

func messageUsage(v *usageCarrier) *usage {
	if v.Message == nil {
		return nil
	}
	return v.Message.Usage
}

// finish reads a captured JSON body once it is complete.
func (o *observer) finish() {
	o.onID = nil // the caller records the complete answer's id itself
	if o.mode != observeJSON || o.overflow || len(o.buf) == 0 {
		return
	}
	o.read(o.buf)
	o.buf = nil
}

// scanJSON walks the strings of a JSON text without decoding it — it runs on every streamed
// event, and only feeds an estimate — and returns the characters of the string values of the
// keys that carry generated text (content, reasoning_content, text, arguments, refusal; delta and
// partial_json, the text of Responses and Anthropic stream events), and
// whether a "usage" key holds an object. Each byte is visited about once, mostly by the
// vectorised bytes.IndexByte.
func scanJSON(data []byte) (chars int64, hasUsage bool) {
	for {
		i := bytes.IndexByte(data, '"')
		if i < 0 {
			return chars, hasUsage
		}
		data = data[i+1:]
		end := stringEnd(data)
		if end < 0 {
			return chars, hasUsage
		}
		key := data[:end]
		rest := skipSpace(data[end+1:])
		if len(rest) == 0 || rest[0] != ':' {
			data = rest // a value, not a key
			continue
		}
		rest = skipSpace(rest[1:])
		data = rest
		switch string(key) {
		case "content", "reasoning_content", "text", "arguments", "refusal", "delta", "partial_json":
			if len(rest) == 0 || rest[0] != '"' {
				continue
			}
			rest = rest[1:]
			end = stringEnd(rest)
			if end < 0 {
				return chars + stringChars(rest), hasUsage
			}
			chars += stringChars(rest[:end])
			data = rest[end+1:]
		case "usage":
			hasUsage = hasUsage || len(rest) > 0 && rest[0] == '{'
		}
	}
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// stringEnd finds the closing quote of a JSON string body (one not escaped), -1 if none.
func stringEnd(s []byte) int {
	off := 0
	for {
		j := bytes.IndexByte(s[off:], '"')
		if j < 0 {
			return -1
		}
		k := off + j
		bs := 0
		for p := k - 1; p >= 0 && s[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return k
		}
		off = k + 1
	}
}

var (
	backslash = []byte{'\\'}
	escBack   = []byte{'\\', '\\'}
	escU      = []byte{'\\', 'u'}
)

// stringChars counts the characters a JSON string body stands for: runes, with each escape
// sequence one character (\uXXXX included).
func stringChars(s []byte) int64 {
	n := runeCount(s)
	if bytes.IndexByte(s, '\\') < 0 {
		return n
	}
	escapes := bytes.Count(s, backslash) - bytes.Count(s, escBack)
	return n - int64(escapes) - 4*int64(bytes.Count(s, escU))
}

// runeCount counts UTF-8 runes eight bytes at a time: the length minus the continuation bytes
// (10xxxxxx), whose top bit is set and next bit clear.
func runeCount(s []byte) int64 {
	const hi = 0x8080808080808080
	n := int64(len(s))
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := binary.LittleEndian.Uint64(s[i:])
		if w&hi == 0 {
			continue
		}
		n -= int64(bits.OnesCount64(w &^ (w << 1) & hi))
	}
	for ; i < len(s); i++ {
		if s[i]&0xC0 == 0x80 {
			n--
		}
	}
	return n
}
