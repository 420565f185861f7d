package agentcall

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Shape is the API a call's body is written for.
type Shape uint8

// The shapes basin reads.
const (
	// Chat is OpenAI chat completions: a prompt of messages.
	Chat Shape = iota + 1
	// Completions is OpenAI (legacy) completions: a prompt string, or token ids.
	Completions
)

// shapeSpec is one shape's entry: where it is served, the field holding its prompt (a server's
// errors about the prompt's size name it) and the top-level fields it reads. Adding an API is
// adding an entry and the readers of its own fields.
type shapeSpec struct {
	name, path, promptField string
	fields                  []field
}

// field reads one top-level field of a body.
type field struct {
	name string
	read func(r *reader, n int32)
}

// openAIFields are the top-level fields both OpenAI shapes share.
var openAIFields = []field{
	{"model", func(r *reader, n int32) { r.c.Model = r.str("model", n) }},
	{"stream", func(r *reader, n int32) { r.c.Stream = r.boolean("stream", n) }},
	{"stream_options", readStreamOptions},
	{"max_tokens", func(r *reader, n int32) { r.c.MaxTokens = r.integer("max_tokens", n) }},
	{"max_completion_tokens", func(r *reader, n int32) {
		r.c.MaxCompletionTokens = r.integer("max_completion_tokens", n)
	}},
	{"n", func(r *reader, n int32) { r.c.N = r.integer("n", n) }},
	{"user", func(r *reader, n int32) { r.c.User = strings.TrimSpace(r.str("user", n)) }},
	{"metadata", readMetadata},
}

var shapes = [...]shapeSpec{
	Chat: {name: "chat", path: "/v1/chat/completions", promptField: "messages",
		fields: append(openAIFields[:len(openAIFields):len(openAIFields)], field{"messages", readMessages})},
	Completions: {name: "completions", path: "/v1/completions", promptField: "prompt",
		fields: append(openAIFields[:len(openAIFields):len(openAIFields)], field{"prompt", readPrompt})},
}

func (s Shape) valid() bool { return s > 0 && int(s) < len(shapes) && shapes[s].name != "" }

// String is the shape's name: "chat", "completions".
func (s Shape) String() string {
	if !s.valid() {
		return "shape(" + strconv.Itoa(int(s)) + ")"
	}
	return shapes[s].name
}

// Path is the route of the shape's API, such as "/v1/chat/completions".
func (s Shape) Path() string {
	if !s.valid() {
		return ""
	}
	return shapes[s].path
}

// PromptField is the body field that holds the prompt: "messages" for Chat, "prompt" for
// Completions.
func (s Shape) PromptField() string {
	if !s.valid() {
		return ""
	}
	return shapes[s].promptField
}

// reader reads one body's tree into a Call.
type reader struct {
	t *tree
	c *Call
	// ambiguous, typeErr and promptErr are the first problem of each rank (see Read).
	ambiguous, typeErr, promptErr *FieldError
	// unreadable: the prompt cannot be sized from its fields; the body's length sizes it.
	unreadable bool
	// The prompt's size so far: characters and messages, and those of the shared prefix.
	chars, msgs, sharedChars, sharedMsgs int64
	pastShared, taskFound                bool
}

// readTree reads a body's tree as shape s.
func readTree(s Shape, t *tree) (Call, error) {
	c := Call{Shape: s}
	r := reader{t: t, c: &c}
	spec := &shapes[s]
	if k := t.nodes[0].kind; k != kindObject {
		return unread(s, t.body), &FieldError{Problem: "must be a JSON object, got JSON " + k.name()}
	}
	var seen uint64
	promptSeen := false
	for m := range t.members(0) {
		i := -1
		for j := range spec.fields {
			if string(t.key(m)) == spec.fields[j].name {
				i = j
				break
			}
		}
		if i < 0 {
			continue
		}
		f := &spec.fields[i]
		if seen&(1<<i) != 0 {
			r.repeated(f.name)
			break
		}
		seen |= 1 << i
		promptSeen = promptSeen || f.name == spec.promptField
		f.read(&r, m)
	}
	if r.ambiguous != nil {
		return unread(s, t.body), r.ambiguous
	}
	if !promptSeen {
		r.problem(spec.promptField, "required")
		r.unreadable = true
	}
	switch {
	case r.unreadable: // nothing of the prompt is kept
		c.Prompt, c.Shared, c.Task, c.TaskChars, c.LastRole = unread(s, t.body).Prompt, 0, "", 0, ""
	case c.Prompt == 0: // not set from a completion prompt
		c.Prompt = max(1, Tokens(r.chars)+PerMessageTokens*r.msgs)
		if r.sharedMsgs > 0 {
			c.Shared = Tokens(r.sharedChars) + PerMessageTokens*r.sharedMsgs
		}
	}
	if r.typeErr != nil {
		return c, r.typeErr
	}
	if r.promptErr != nil {
		return c, r.promptErr
	}
	return c, nil
}

// keyed reads the members of object node n whose keys are in names (exactly, once each),
// calling f with the name's index; a name repeated makes the body ambiguous (path names the
// object for the error, built only then).
func (r *reader) keyed(n int32, names []string, path func() string, f func(i int, c int32)) {
	var seen uint64
	for c := range r.t.members(n) {
		key := r.t.key(c)
		for i, name := range names {
			if string(key) != name {
				continue
			}
			if seen&(1<<i) != 0 {
				r.repeated(path() + "." + name)
				return
			}
			seen |= 1 << i
			f(i, c)
		}
	}
}

// repeated notes an ambiguous body: key path repeated in one object.
func (r *reader) repeated(path string) {
	if r.ambiguous == nil {
		r.ambiguous = &FieldError{Field: path,
			Problem: "key repeated; JSON parsers disagree on which one counts, so the call is not read (send it once)"}
	}
}

// typeProblem notes a top-level field (or one inside a top-level object) of the wrong type.
func (r *reader) typeProblem(path, want string, n int32) {
	if r.typeErr == nil {
		r.typeErr = &FieldError{Field: path, Problem: fmt.Sprintf("must be %s, got JSON %s", want, r.kind(n).name())}
	}
}

// problem notes a problem of the prompt; only the first is kept, so later ones cost nothing.
func (r *reader) problem(path string, format string, args ...any) {
	if r.promptErr == nil {
		r.promptErr = &FieldError{Field: path, Problem: fmt.Sprintf(format, args...)}
	}
}

func (r *reader) kind(n int32) kind { return r.t.nodes[n].kind }

// str reads a string field; null reads as "".
func (r *reader) str(path string, n int32) string {
	switch r.kind(n) {
	case kindString:
		return r.t.str(n)
	case kindNull:
	default:
		r.typeProblem(path, "a string", n)
	}
	return ""
}

// boolean reads a boolean field; null reads as false.
func (r *reader) boolean(path string, n int32) bool {
	switch r.kind(n) {
	case kindBool:
		return r.t.raw(n)[0] == 't'
	case kindNull:
	default:
		r.typeProblem(path, "a boolean", n)
	}
	return false
}

// integer reads an integer field (as int64, as encoding/json reads one); null reads as nil.
func (r *reader) integer(path string, n int32) *int64 {
	switch r.kind(n) {
	case kindNumber:
		if v, ok := int64Of(r.t.raw(n)); ok {
			return &v
		}
	case kindNull:
		return nil
	}
	r.typeProblem(path, "an integer", n)
	return nil
}

func int64Of(raw []byte) (int64, bool) {
	v, err := strconv.ParseInt(string(raw), 10, 64)
	return v, err == nil
}

// object reads the members of a top-level object field named in names with f; null reads as
// nothing.
func (r *reader) object(path string, n int32, names []string, f func(i int, c int32)) {
	switch r.kind(n) {
	case kindObject:
		r.keyed(n, names, func() string { return path }, f)
	case kindNull:
	default:
		r.typeProblem(path, "an object", n)
	}
}

func readStreamOptions(r *reader, n int32) {
	r.object("stream_options", n, []string{"include_usage"}, func(_ int, c int32) {
		r.c.IncludeUsage = r.boolean("stream_options.include_usage", c)
	})
}

func readMetadata(r *reader, n int32) {
	r.object("metadata", n, []string{"session_id"}, func(_ int, c int32) {
		r.c.SessionID = strings.TrimSpace(r.str("metadata.session_id", c))
	})
}

// messageKeys are the keys of a chat message the readers read.
var messageKeys = []string{"role", "content", "tool_calls"}

// readMessages sizes a chat prompt: every message's characters (its content's text, and its tool
// calls' JSON text: the calls an assistant made are part of the conversation the next prompt
// repeats) and PerMessageTokens a message; apart, the leading system and developer messages.
func readMessages(r *reader, n int32) {
	switch r.kind(n) {
	case kindArray:
	case kindNull:
		r.problem("messages", "required")
		r.unreadable = true
		return
	default:
		r.problem("messages", "must be an array of messages")
		r.unreadable = true
		return
	}
	if r.t.nodes[n].next == n+1 {
		r.problem("messages", "must not be empty")
	}
	i := 0
	for m := range r.t.members(n) {
		r.message(i, m)
		i++
	}
}

func messagePath(i int, field string) string { return fmt.Sprintf("messages[%d]%s", i, field) }

// message reads the i-th chat message, node m.
func (r *reader) message(i int, m int32) {
	var role string
	roleErr := false
	content, toolCalls := int32(-1), int32(-1)
	switch r.kind(m) {
	case kindObject:
		r.keyed(m, messageKeys, func() string { return messagePath(i, "") }, func(k int, c int32) {
			switch k {
			case 0:
				switch r.kind(c) {
				case kindString:
					role = r.t.str(c)
				case kindNull:
				default:
					if !roleErr && r.promptErr == nil {
						r.problem(messagePath(i, ".role"), "must be a string, got JSON %s", r.kind(c).name())
					}
					roleErr = true
				}
			case 1:
				content = c
			case 2:
				toolCalls = c
			}
		})
	case kindNull: // a message with nothing in it
	default:
		if r.promptErr == nil {
			r.problem(messagePath(i, ""), "must be a message object")
		}
		r.unreadable = true
		return
	}
	if roleErr {
		r.unreadable = true
		return
	}
	if role == "" && r.promptErr == nil {
		r.problem(messagePath(i, ".role"), "required")
	}
	task := !r.taskFound && role == "user"
	chars := int64(r.content(i, content, task))
	if toolCalls >= 0 && r.kind(toolCalls) != kindNull {
		chars += int64(utf8.RuneCount(r.t.raw(toolCalls)))
	}
	r.chars += chars
	r.msgs++
	if !r.pastShared && (role == "system" || role == "developer") {
		r.sharedChars += chars
		r.sharedMsgs++
	} else {
		r.pastShared = true
	}
	if task {
		r.taskFound = true
		r.c.TaskChars = utf8.RuneCountInString(r.c.Task)
	}
	r.c.LastRole = role
}

// partKeys are the keys of a content part the readers read.
var partKeys = []string{"type", "text"}

// content is the number of characters of message i's content (node n, -1 when absent): a string,
// or the text of an array of parts (each part's text; parts of other types, such as images, have
// none); null is an assistant message that only calls tools. When task, the text is kept as the
// call's Task, parts joined by newlines. A content of another shape counts nothing.
func (r *reader) content(i int, n int32, task bool) int {
	if n < 0 {
		return 0
	}
	switch r.kind(n) {
	case kindNull:
		return 0
	case kindString:
		if task {
			r.c.Task = r.t.str(n)
		}
		return r.t.runes(n)
	case kindArray:
	default:
		if r.promptErr == nil {
			r.problem(messagePath(i, ".content"), "must be a string or an array of text parts")
		}
		return 0
	}
	chars, j := 0, 0
	bad := false
	notText, notTextType := -1, ""
	var texts []int32
	for p := range r.t.members(n) {
		switch r.kind(p) {
		case kindObject:
			typ, text := int32(-1), int32(-1)
			r.keyed(p, partKeys, func() string { return messagePath(i, fmt.Sprintf(".content[%d]", j)) }, func(k int, c int32) {
				switch {
				case r.kind(c) != kindString && r.kind(c) != kindNull:
					bad = true
				case k == 0:
					typ = c
				default:
					text = c
				}
			})
			if notText < 0 && (typ < 0 || r.kind(typ) != kindString || r.t.str(typ) != "text") {
				notText = j
				if typ >= 0 && r.kind(typ) == kindString {
					notTextType = r.t.str(typ)
				}
			}
			if text >= 0 && r.kind(text) == kindString {
				chars += r.t.runes(text)
				if task {
					texts = append(texts, text)
				}
			}
		case kindNull: // no type, no text
			if notText < 0 {
				notText = j
			}
		default:
			bad = true
		}
		j++
	}
	if bad {
		if r.promptErr == nil {
			r.problem(messagePath(i, ".content"), "must be a string or an array of text parts")
		}
		return 0
	}
	if notText >= 0 && r.promptErr == nil {
		r.problem(messagePath(i, fmt.Sprintf(".content[%d].type", notText)), "only text parts are read, got %q", notTextType)
	}
	if task {
		var b strings.Builder
		for _, t := range texts {
			if s := r.t.str(t); s != "" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(s)
			}
		}
		r.c.Task = b.String()
	}
	return chars
}

// readPrompt sizes a completion prompt: a string (ceil(characters / 4), at least 1), an array of
// strings (the first is read; a server takes exactly one), or an array of token ids (one token
// each). A null element reads as "" among strings and as an id among ids, as encoding/json
// decodes it into a string or an int64.
func readPrompt(r *reader, n int32) {
	const want = "must be a string, an array of one string or an array of token ids"
	switch r.kind(n) {
	case kindString:
		r.setPromptText(n)
		return
	case kindArray:
	case kindNull:
		r.problem("prompt", "required")
		r.unreadable = true
		return
	default:
		r.problem("prompt", want)
		r.unreadable = true
		return
	}
	count, strs, ids := 0, true, true
	first := int32(-1)
	for e := range r.t.members(n) {
		if count == 0 {
			first = e
		}
		count++
		switch r.kind(e) {
		case kindNull:
		case kindString:
			ids = false
		case kindNumber:
			strs = false
			if _, ok := int64Of(r.t.raw(e)); !ok {
				ids = false
			}
		default:
			strs, ids = false, false
		}
	}
	switch {
	case strs:
		if count != 1 {
			r.problem("prompt", "exactly one prompt is supported, got %d", count)
		}
		if count == 0 {
			r.unreadable = true
			return
		}
		if r.kind(first) == kindString {
			r.setPromptText(first)
		} else {
			r.c.Prompt = 1 // "" from a null
		}
	case ids:
		r.c.Prompt = int64(count)
	default:
		r.problem("prompt", want)
		r.unreadable = true
	}
}

// setPromptText sizes a completion prompt of text (string node n), kept as the task.
func (r *reader) setPromptText(n int32) {
	r.c.Task = r.t.str(n)
	r.c.TaskChars = utf8.RuneCountInString(r.c.Task)
	r.c.Prompt = max(1, Tokens(int64(r.c.TaskChars)))
}
