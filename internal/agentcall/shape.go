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
	// Responses is OpenAI Responses: input as a string or a list of items, instructions as the
	// shared prefix; previous_response_id continues a conversation the server keeps.
	Responses
	// Messages is Anthropic Messages: system as the shared prefix, messages of content blocks.
	Messages
)

// shapeSpec is one shape's entry: where it is served, the field holding its prompt (a server's
// errors about the prompt's size name it) and the top-level fields it reads. Adding an API is
// adding an entry and the readers of its own fields.
type shapeSpec struct {
	name, path, promptField string
	// userSource is where Call.User comes from: "user", or Anthropic's "metadata.user_id".
	userSource string
	fields     []field
}

// field reads one top-level field of a body.
type field struct {
	name string
	read func(r *reader, n int32)
}

// The fields every shape (model, stream) or several read.
var (
	modelField  = field{"model", func(r *reader, n int32) { r.c.Model = r.str("model", n) }}
	streamField = field{"stream", func(r *reader, n int32) { r.c.Stream = r.boolean("stream", n) }}
	userField   = field{"user", func(r *reader, n int32) { r.c.User = strings.TrimSpace(r.str("user", n)) }}
)

// maxTokensField reads the output limit, which each API names its own way, into MaxTokens.
func maxTokensField(name string) field {
	return field{name, func(r *reader, n int32) { r.c.MaxTokens = r.integer(name, n) }}
}

// openAIFields are the top-level fields both OpenAI shapes share.
var openAIFields = []field{
	modelField,
	streamField,
	{"stream_options", readStreamOptions},
	maxTokensField("max_tokens"),
	{"max_completion_tokens", func(r *reader, n int32) {
		r.c.MaxCompletionTokens = r.integer("max_completion_tokens", n)
	}},
	{"n", func(r *reader, n int32) { r.c.N = r.integer("n", n) }},
	userField,
	{"metadata", readMetadata},
}

var shapes = [...]shapeSpec{
	Chat: {name: "chat", path: "/v1/chat/completions", promptField: "messages", userSource: "user",
		fields: append(openAIFields[:len(openAIFields):len(openAIFields)], field{"messages", readMessages})},
	Completions: {name: "completions", path: "/v1/completions", promptField: "prompt", userSource: "user",
		fields: append(openAIFields[:len(openAIFields):len(openAIFields)], field{"prompt", readPrompt})},
	Responses: {name: "responses", path: "/v1/responses", promptField: "input", userSource: "user",
		fields: responsesFields},
	Messages: {name: "messages", path: "/v1/messages", promptField: "messages", userSource: "metadata.user_id",
		fields: anthropicFields},
}

func (s Shape) valid() bool { return s > 0 && int(s) < len(shapes) && shapes[s].name != "" }

// String is the shape's name: "chat", "completions", "responses", "messages".
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

// item is an element of a list of messages (or of a Responses input), for paths in errors.
type item struct {
	list string
	i    int
}

// path is the path of the item's field, such as "messages[2].content" for ".content".
func (at item) path(field string) string { return fmt.Sprintf("%s[%d]%s", at.list, at.i, field) }

// chatMessage reads chat messages: role, content as a string or text parts, tool calls by their
// JSON text (the calls an assistant made are part of the conversation the next prompt repeats).
var chatMessage = messageSpec{
	keys: []string{"role", "content", "tool_calls"},
	content: func(r *reader, at item, n int32, task bool) int {
		return r.textParts(at, n, task, func(typ string) bool { return typ == "text" })
	},
}

// messageSpec is how a shape's messages are read: the keys read (role and content first, then
// those counted by their JSON text), and the reader of a content.
type messageSpec struct {
	keys    []string
	content func(r *reader, at item, n int32, task bool) int
}

// readMessages sizes a chat prompt: every message's characters and PerMessageTokens a message;
// apart, the leading system and developer messages.
func readMessages(r *reader, n int32) { r.messages("messages", n, &chatMessage) }

// messages reads the list of messages at node n, field list.
func (r *reader) messages(list string, n int32, spec *messageSpec) {
	switch r.kind(n) {
	case kindArray:
	case kindNull:
		r.problem(list, "required")
		r.unreadable = true
		return
	default:
		r.problem(list, "must be an array of messages")
		r.unreadable = true
		return
	}
	if r.t.nodes[n].next == n+1 {
		r.problem(list, "must not be empty")
	}
	i := 0
	for m := range r.t.members(n) {
		r.message(item{list, i}, m, spec)
		i++
	}
}

// message reads one message, node m.
func (r *reader) message(at item, m int32, spec *messageSpec) {
	var role string
	roleErr := false
	content := int32(-1)
	var chars int64
	switch r.kind(m) {
	case kindObject:
		r.keyed(m, spec.keys, func() string { return at.path("") }, func(k int, c int32) {
			switch k {
			case 0:
				switch r.kind(c) {
				case kindString:
					role = r.t.str(c)
				case kindNull:
				default:
					if !roleErr && r.promptErr == nil {
						r.problem(at.path(".role"), "must be a string, got JSON %s", r.kind(c).name())
					}
					roleErr = true
				}
			case 1:
				content = c
			default:
				if r.kind(c) != kindNull {
					chars += int64(runeCount(r.t.raw(c)))
				}
			}
		})
	case kindNull: // a message with nothing in it
	default:
		if r.promptErr == nil {
			r.problem(at.path(""), "must be a message object")
		}
		r.unreadable = true
		return
	}
	if roleErr {
		r.unreadable = true
		return
	}
	if role == "" && r.promptErr == nil {
		r.problem(at.path(".role"), "required")
	}
	task := !r.taskFound && role == "user"
	if content >= 0 {
		chars += int64(spec.content(r, at, content, task))
	}
	r.add(role, chars)
	if task {
		r.taskFound = true
		r.c.TaskChars = utf8.RuneCountInString(r.c.Task)
	}
	r.c.LastRole = role
}

// add counts a message of role with chars characters.
func (r *reader) add(role string, chars int64) {
	r.chars += chars
	r.msgs++
	if !r.pastShared && (role == "system" || role == "developer") {
		r.sharedChars += chars
		r.sharedMsgs++
	} else {
		r.pastShared = true
	}
}

// partKeys are the keys of a content part the readers read.
var partKeys = []string{"type", "text"}

// textParts is the number of characters of a message's content (node n): a string, or the text
// of an array of parts (each part's text; parts of other types, such as images, have none); null
// is an assistant message that only calls tools. A part whose type isText refuses is a problem
// (a server reads only text). When task, the text is kept as the call's Task, parts joined by
// newlines. A content of another shape counts nothing.
func (r *reader) textParts(at item, n int32, task bool, isText func(typ string) bool) int {
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
			r.problem(at.path(".content"), "must be a string or an array of text parts")
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
			r.keyed(p, partKeys, func() string { return at.path(fmt.Sprintf(".content[%d]", j)) }, func(k int, c int32) {
				switch {
				case r.kind(c) != kindString && r.kind(c) != kindNull:
					bad = true
				case k == 0:
					typ = c
				default:
					text = c
				}
			})
			if notText < 0 && (typ < 0 || r.kind(typ) != kindString || !isText(r.t.str(typ))) {
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
			r.problem(at.path(".content"), "must be a string or an array of text parts")
		}
		return 0
	}
	if notText >= 0 && r.promptErr == nil {
		r.problem(at.path(fmt.Sprintf(".content[%d].type", notText)), "only text parts are read, got %q", notTextType)
	}
	if task {
		r.c.Task = r.joinTexts(texts)
	}
	return chars
}

// joinTexts is the text of string nodes, the empty ones left out, joined by newlines.
func (r *reader) joinTexts(texts []int32) string {
	var b strings.Builder
	for _, t := range texts {
		if s := r.t.str(t); s != "" {
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(s)
		}
	}
	return b.String()
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
