// Package agentbody builds the request body of a long coding-agent conversation, for the tests
// and benchmarks of what reads one on every call: the gateway and the simulator's server. Every
// call of an agent session re-sends its whole conversation, so such bodies run to hundreds of KB.
package agentbody

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Chat is a chat-completions body of at least size bytes: a long system prompt, then rounds of a
// user message (as text parts), an assistant tool call, the tool's result (code with tabs,
// quotes, newlines and some Unicode) and the assistant's answer; streamed, with the session id
// in metadata and a user.
func Chat(size int) []byte {
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type toolCall struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	type msg struct {
		Role       string     `json:"role"`
		Content    any        `json:"content"`
		ToolCalls  []toolCall `json:"tool_calls,omitempty"`
		ToolCallID string     `json:"tool_call_id,omitempty"`
	}
	code := "func main() {\n\tfmt.Println(\"héllo, wörld\")\n\tfor i := 0; i < 10; i++ {\n\t\tx[i] = \"\\t\" + y\n\t}\n}\n"
	msgs := []msg{{Role: "system", Content: strings.Repeat("You are a careful coding agent. Follow the rules.\n", 300)}}
	body := func() []byte {
		b, err := json.Marshal(map[string]any{"model": "basin-sim", "stream": true, "max_tokens": 512, "user": "bench-user",
			"metadata": map[string]string{"session_id": "bench"}, "messages": msgs})
		if err != nil {
			panic(err) // plain values: cannot fail
		}
		return b
	}
	for i := 0; len(body()) < size; i++ {
		id := fmt.Sprintf("call_%d", i)
		msgs = append(msgs,
			msg{Role: "user", Content: []map[string]string{{"type": "text", "text": "Please fix the bug in main.go → step " + id}}},
			msg{Role: "assistant", Content: "Let me look at the file first.", ToolCalls: []toolCall{{ID: id, Type: "function",
				Function: fn{Name: "read_file", Arguments: `{"path":"main.go","lines":[1,200]}`}}}},
			msg{Role: "tool", ToolCallID: id, Content: strings.Repeat(code, 20)},
			msg{Role: "assistant", Content: "I see the problem: the loop bound is wrong. 🎯 Fixing it now."})
	}
	return body()
}
