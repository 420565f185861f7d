package agentcall

import (
	"fmt"
	"strings"
)

// anthropicFields are the top-level fields of an Anthropic Messages body that are read.
var anthropicFields = []field{
	modelField,
	streamField,
	maxTokensField("max_tokens"),
	{"metadata", func(r *reader, n int32) {
		r.object("metadata", n, []string{"user_id"}, func(_ int, c int32) {
			r.c.User = strings.TrimSpace(r.str("metadata.user_id", c))
		})
	}},
	{"system", readSystem},
	{"messages", func(r *reader, n int32) { r.messages("messages", n, &anthropicMessage) }},
}

// readSystem counts an Anthropic system prompt, a string or a list of text blocks, as a leading
// system message: the shared prefix, whatever its place in the body.
func readSystem(r *reader, n int32) {
	var chars int
	switch r.kind(n) {
	case kindString:
		chars = r.t.runes(n)
	case kindArray:
		chars = r.blocks(item{"system", -1}, n, false)
	case kindNull:
		return
	default:
		r.typeProblem("system", "a string or an array of text blocks", n)
		return
	}
	r.chars += int64(chars)
	r.msgs++
	r.sharedChars += int64(chars)
	r.sharedMsgs++
}

// anthropicMessage reads the messages of an Anthropic body: content is a string or a list of
// blocks.
var anthropicMessage = messageSpec{
	keys: []string{"role", "content"},
	content: func(r *reader, at item, n int32, task bool) int {
		switch r.kind(n) {
		case kindString:
			if task {
				r.c.Task = r.t.str(n)
			}
			return r.t.runes(n)
		case kindArray:
			return r.blocks(at, n, task)
		case kindNull:
			return 0
		}
		if r.promptErr == nil {
			r.problem(at.path(".content"), "must be a string or an array of content blocks")
		}
		return 0
	},
}

// blockKeys are the keys of an Anthropic content block that are read: the block's type, and
// what each type counts — text, thinking, a tool call's input and name, a tool result's content.
var blockKeys = [...]string{"type", "text", "thinking", "input", "name", "content"}

// blocks is the number of characters of a list of content blocks (node n): the text of text
// blocks, the reasoning of thinking blocks, a tool call's name and input (its JSON text) and a
// tool result's content (a string or blocks again); images and documents count nothing, as a
// chat image part does. When task, the text blocks' text is the call's Task.
func (r *reader) blocks(at item, n int32, task bool) int {
	chars, j := 0, 0
	var texts []int32
	for b := range r.t.members(n) {
		if r.kind(b) != kindObject {
			if r.promptErr == nil {
				r.problem(r.blockPath(at, j), "must be a content block object")
			}
			j++
			continue
		}
		fields := [len(blockKeys)]int32{-1, -1, -1, -1, -1, -1}
		r.keyed(b, blockKeys[:], func() string { return r.blockPath(at, j) }, func(k int, c int32) { fields[k] = c })
		typ := ""
		if fields[0] >= 0 && r.kind(fields[0]) == kindString {
			typ = r.t.str(fields[0])
		}
		switch typ {
		case "text":
			if t := fields[1]; t >= 0 && r.kind(t) == kindString {
				chars += r.t.runes(t)
				texts = append(texts, t)
			}
		case "thinking":
			if t := fields[2]; t >= 0 && r.kind(t) == kindString {
				chars += r.t.runes(t)
			}
		case "tool_use", "server_tool_use":
			if in := fields[3]; in >= 0 {
				chars += runeCount(r.t.raw(in))
			}
			if nm := fields[4]; nm >= 0 && r.kind(nm) == kindString {
				chars += r.t.runes(nm)
			}
		case "tool_result":
			switch c := fields[5]; {
			case c < 0:
			case r.kind(c) == kindString:
				chars += r.t.runes(c)
			case r.kind(c) == kindArray:
				chars += r.blocks(item{r.blockPath(at, j) + ".content", -1}, c, false)
			}
		}
		j++
	}
	if task {
		r.c.Task = r.joinTexts(texts)
	}
	return chars
}

// blockPath is the path of block j of the list at at ("messages[1].content[2]", "system[0]").
func (r *reader) blockPath(at item, j int) string {
	if at.i < 0 {
		return fmt.Sprintf("%s[%d]", at.list, j)
	}
	return at.path(fmt.Sprintf(".content[%d]", j))
}
