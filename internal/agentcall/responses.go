package agentcall

import (
	"strings"
	"unicode/utf8"
)

// responsesFields are the top-level fields of an OpenAI Responses body that are read.
var responsesFields = []field{
	modelField,
	streamField,
	maxTokensField("max_output_tokens"),
	userField,
	{"metadata", readMetadata},
	{"prompt_cache_key", func(r *reader, n int32) { r.c.CacheKey = strings.TrimSpace(r.str("prompt_cache_key", n)) }},
	{"store", func(r *reader, n int32) {
		// null is the default (kept); another type is a type problem, read as the default.
		stored := r.boolean("store", n)
		r.c.NoStore = r.kind(n) == kindBool && !stored
	}},
	{"previous_response_id", func(r *reader, n int32) {
		r.c.PreviousResponseID = strings.TrimSpace(r.str("previous_response_id", n))
	}},
	// instructions come before input whatever their place in the body: they are the system
	// prompt, the shared prefix.
	{"instructions", readInstructions},
	{"input", readInput},
}

// readInstructions counts a Responses body's instructions as a leading system message. A body's
// fields are read in its order; instructions sent after input are counted as shared all the same,
// as the server puts them first.
func readInstructions(r *reader, n int32) {
	switch r.kind(n) {
	case kindString:
		chars := int64(r.t.runes(n))
		r.chars += chars
		r.msgs++
		r.sharedChars += chars
		r.sharedMsgs++
	case kindNull:
	default:
		r.typeProblem("instructions", "a string", n)
	}
}

// responsesMessage reads the message items of a Responses input: their content is a string or a
// list of input_text / output_text parts.
var responsesMessage = messageSpec{
	keys: []string{"role", "content"},
	content: func(r *reader, at item, n int32, task bool) int {
		return r.textParts(at, n, task, func(typ string) bool { return typ == "input_text" || typ == "output_text" })
	},
}

// readInput sizes a Responses input: a string is one user message; a list holds message items
// (read as chat messages are) and other items — function calls and their outputs, reasoning —
// counted by their JSON text, as chat counts tool calls.
func readInput(r *reader, n int32) {
	switch r.kind(n) {
	case kindString:
		r.c.Task = r.t.str(n)
		r.c.TaskChars = utf8.RuneCountInString(r.c.Task)
		r.taskFound = true
		r.add("user", int64(r.t.runes(n)))
		r.c.LastRole = "user"
		return
	case kindArray:
	case kindNull:
		r.problem("input", "required")
		r.unreadable = true
		return
	default:
		r.problem("input", "must be a string or an array of items")
		r.unreadable = true
		return
	}
	if r.t.nodes[n].next == n+1 {
		r.problem("input", "must not be empty")
	}
	i := 0
	for m := range r.t.members(n) {
		at := item{"input", i}
		i++
		typ := int32(-1)
		if r.kind(m) == kindObject {
			r.keyed(m, []string{"type"}, func() string { return at.path("") }, func(_ int, c int32) { typ = c })
		}
		if typ < 0 || r.kind(typ) == kindString && r.t.str(typ) == "message" {
			r.message(at, m, &responsesMessage)
			continue
		}
		// A function call, its output, a reasoning item: the text the next prompt repeats.
		r.add("", int64(runeCount(r.t.raw(m))))
		r.c.LastRole = ""
	}
}
