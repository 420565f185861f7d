package loadgen

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// perMessageTokens is what sim/serve counts per message for the chat template's role markers.
const perMessageTokens = 4

// message is one chat message as sent.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// conversation is a session's growing message list, sized for sim/serve's count: ceil(characters
// / 4) + 4 per message.
type conversation struct {
	id    string
	msgs  []message
	chars int // characters (runes) of all contents so far
}

// newConversation starts a conversation with the shared system prompt (none when empty).
func newConversation(id, system string) *conversation {
	c := &conversation{id: id}
	if system != "" {
		c.add("system", system)
	}
	return c
}

func (c *conversation) add(role, content string) {
	c.msgs = append(c.msgs, message{Role: role, Content: content})
	c.chars += utf8.RuneCountInString(content)
}

// prompt returns the messages of call i, whose prompt should count tokens: the task for call 0;
// for a later call the previous answer, then a tool result. The last message is padded so the
// whole prompt counts tokens, if the rest leaves room for it.
func (c *conversation) prompt(i int, answer string, tokens int) []message {
	head := "Task of session " + c.id + ":"
	if i > 0 {
		c.add("assistant", answer)
		head = "Result of tool call " + strconv.Itoa(i) + ":"
	}
	n := len(c.msgs) + 1
	want := 4*(tokens-perMessageTokens*n) - c.chars
	c.add("user", head+filler(want-len(head)))
	return c.msgs
}

// systemPrompt is the shared prefix of shared tokens: the same text for every session with the
// same Shared, so a real engine's prefix cache can share it as sim/serve assumes.
func systemPrompt(shared int) string {
	if shared <= 0 {
		return ""
	}
	const head = "You are a coding agent. Tools:"
	return head + filler(4*(shared-perMessageTokens)-len(head))
}

// fillerWords are three letters each: with the space before each, n words are 4n characters.
var fillerWords = [...]string{"map", "key", "run", "log", "git", "cat", "sed", "arg", "env", "tmp",
	"src", "bin", "pkg", "dir", "ref", "api"}

// filler returns exactly n characters (none when n ≤ 0) of space-led words.
func filler(n int) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(n + 4)
	for i := 0; b.Len() < n; i++ {
		b.WriteByte(' ')
		b.WriteString(fillerWords[i%len(fillerWords)])
	}
	return b.String()[:n]
}
