// Package agentbody builds the request body of a long coding-agent conversation, in each API the
// gateway serves (chat completions, OpenAI Responses, Anthropic Messages), for the tests and
// benchmarks of what reads one on every call: the gateway and the simulator's server. Every
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

// The rounds of the conversation, shared by the shapes so that they carry the same text.
const (
	systemPrompt = "You are a careful coding agent. Follow the rules.\n"
	toolCode     = "func main() {\n\tfmt.Println(\"héllo, wörld\")\n\tfor i := 0; i < 10; i++ {\n\t\tx[i] = \"\\t\" + y\n\t}\n}\n"
	toolArgs     = `{"path":"main.go","lines":[1,200]}`
	answer       = "I see the problem: the loop bound is wrong. 🎯 Fixing it now."
)

// grow appends rounds with round(i) until body() is at least size bytes, and returns it.
func grow(size int, body func() []byte, round func(i int)) []byte {
	for i := 0; len(body()) < size; i++ {
		round(i)
	}
	return body()
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain values: cannot fail
	}
	return b
}

// Responses is the conversation of Chat as an OpenAI Responses body of at least size bytes: the
// system prompt as instructions, then input items — a user message of input_text, a
// function_call and its function_call_output, the assistant's answer as output_text; streamed,
// with the session id in metadata and prompt_cache_key.
func Responses(size int) []byte {
	var items []any
	body := func() []byte {
		return marshal(map[string]any{"model": "basin-sim", "stream": true, "max_output_tokens": 512,
			"prompt_cache_key": "bench", "metadata": map[string]string{"session_id": "bench"},
			"instructions": strings.Repeat(systemPrompt, 300), "input": items})
	}
	return grow(size, body, func(i int) {
		id := fmt.Sprintf("call_%d", i)
		items = append(items,
			map[string]any{"type": "message", "role": "user",
				"content": []map[string]string{{"type": "input_text", "text": "Please fix the bug in main.go → step " + id}}},
			map[string]any{"type": "function_call", "call_id": id, "name": "read_file", "arguments": toolArgs},
			map[string]any{"type": "function_call_output", "call_id": id, "output": strings.Repeat(toolCode, 20)},
			map[string]any{"type": "message", "role": "assistant",
				"content": []map[string]string{{"type": "output_text", "text": answer}}})
	})
}

// Messages is the conversation of Chat as an Anthropic Messages body of at least size bytes: the
// system prompt as a cached text block, then messages of content blocks — the user's text, the
// assistant's text and tool_use, the tool_result in a user message; streamed, with Claude Code's
// metadata.user_id.
func Messages(size int) []byte {
	var msgs []any
	body := func() []byte {
		return marshal(map[string]any{"model": "basin-sim", "stream": true, "max_tokens": 512,
			"metadata": map[string]string{"user_id": "user_bench_account_bench_session_bench"},
			"system": []map[string]any{{"type": "text", "text": strings.Repeat(systemPrompt, 300),
				"cache_control": map[string]string{"type": "ephemeral"}}},
			"messages": msgs})
	}
	return grow(size, body, func(i int) {
		id := fmt.Sprintf("toolu_%d", i)
		msgs = append(msgs,
			map[string]any{"role": "user", "content": []map[string]any{{"type": "text", "text": "Please fix the bug in main.go → step " + id}}},
			map[string]any{"role": "assistant", "content": []map[string]any{{"type": "text", "text": "Let me look at the file first."},
				{"type": "tool_use", "id": id, "name": "read_file", "input": json.RawMessage(toolArgs)}}},
			map[string]any{"role": "user", "content": []map[string]any{{"type": "tool_result", "tool_use_id": id,
				"content": strings.Repeat(toolCode, 20)}}},
			map[string]any{"role": "assistant", "content": []map[string]any{{"type": "text", "text": answer}}})
	})
}
