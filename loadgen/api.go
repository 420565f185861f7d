package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/basin-dev/basin/internal/agentcall"
)

// The APIs a run can speak. Each sends the same conversation, sized alike by the engine's count
// (sim/serve reads the three the same way): chat messages; Responses with the system prompt as
// instructions and the rest as input messages; Anthropic Messages with it as system.
var apis = map[string]agentcall.Shape{
	"chat":      agentcall.Chat,
	"responses": agentcall.Responses,
	"messages":  agentcall.Messages,
}

// ParseAPI reads an API's name: chat, responses or messages.
func ParseAPI(name string) (agentcall.Shape, error) {
	if s, ok := apis[name]; ok {
		return s, nil
	}
	return 0, fmt.Errorf("want chat, responses or messages, got %q", name)
}

// responsesRequest is the body of an OpenAI Responses call. The whole conversation is sent each
// time, as a chat client does, and the server is asked not to keep it (store: false): the run
// measures the deployment with the prompts the scenario gives, not a server-side history.
type responsesRequest struct {
	Model           string    `json:"model"`
	Instructions    string    `json:"instructions,omitempty"`
	Input           []message `json:"input"`
	MaxOutputTokens int       `json:"max_output_tokens"`
	Stream          bool      `json:"stream"`
	Store           bool      `json:"store"`
	IgnoreEOS       bool      `json:"ignore_eos,omitempty"`
}

// messagesRequest is the body of an Anthropic Messages call.
type messagesRequest struct {
	Model     string    `json:"model"`
	System    string    `json:"system,omitempty"`
	Messages  []message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	Stream    bool      `json:"stream"`
	IgnoreEOS bool      `json:"ignore_eos,omitempty"`
}

// request is the body of a call with the conversation msgs, in the run's API.
func (r *runner) request(msgs []message, output int) any {
	stream, exact := !r.o.NoStream, !r.o.StopAtEOS
	system, rest := "", msgs
	if len(msgs) > 0 && msgs[0].Role == "system" {
		system, rest = msgs[0].Content, msgs[1:]
	}
	switch r.o.API {
	case agentcall.Responses:
		return responsesRequest{Model: r.o.Model, Instructions: system, Input: rest, MaxOutputTokens: output, Stream: stream,
			IgnoreEOS: exact}
	case agentcall.Messages:
		return messagesRequest{Model: r.o.Model, System: system, Messages: rest, MaxTokens: output, Stream: stream, IgnoreEOS: exact}
	}
	req := chatRequest{Model: r.o.Model, Messages: msgs, MaxTokens: output, Stream: stream, IgnoreEOS: exact}
	if req.Stream {
		req.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return req
}

// shapeUsage is the usage of a Responses or Messages answer: Responses counts the whole prompt in
// input_tokens with the cached part beside it; Anthropic's input_tokens leave out the tokens read
// from (or written to) the cache.
type shapeUsage struct {
	InputTokens        int `json:"input_tokens"`
	OutputTokens       int `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CacheRead     int `json:"cache_read_input_tokens"`
	CacheCreation int `json:"cache_creation_input_tokens"`
}

// openAI turns it into the report's usage: the prompt, cached or not, and its cached part.
func (u *shapeUsage) openAI(api agentcall.Shape) *usage {
	out := &usage{CompletionTokens: u.OutputTokens}
	cached := u.CacheRead
	out.PromptTokens = u.InputTokens + u.CacheRead + u.CacheCreation
	if api == agentcall.Responses {
		out.PromptTokens, cached = u.InputTokens, 0
		if u.InputTokensDetails != nil {
			cached = u.InputTokensDetails.CachedTokens
		}
	}
	out.PromptTokensDetails = &struct {
		CachedTokens int `json:"cached_tokens"`
	}{cached}
	return out
}

// shapeAnswer is a whole Responses or Messages answer, or one event of its stream, as far as the
// report reads it.
type shapeAnswer struct {
	Type string `json:"type"`
	// Responses: output items of message content; Messages: content blocks.
	Output []struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Usage *shapeUsage `json:"usage"`
	// Stream events: a text delta (a string in Responses, a block delta in Messages), the final
	// response (Responses), the opening message (Messages).
	Delta    json.RawMessage `json:"delta"`
	Response *shapeAnswer    `json:"response"`
	Message  *shapeAnswer    `json:"message"`
	Error    json.RawMessage `json:"error"`
}

// text is the answer's text: its output_text parts (Responses) or text blocks (Messages).
func (a *shapeAnswer) text() string {
	var b strings.Builder
	for _, o := range a.Output {
		for _, c := range o.Content {
			if c.Type == "output_text" {
				b.WriteString(c.Text)
			}
		}
	}
	for _, c := range a.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// readShapeAnswer reads a whole Responses or Messages answer.
func (r *runner) readShapeAnswer(body io.Reader, a *attempt) error {
	a.first = r.o.Now()
	var ans shapeAnswer
	if err := decodeAnswer(body, &ans); err != nil {
		return err
	}
	if len(ans.Error) > 0 && string(ans.Error) != "null" {
		return fmt.Errorf("answer: error: %s", ans.Error)
	}
	a.content = ans.text()
	if ans.Usage != nil {
		a.usage = ans.Usage.openAI(r.o.API)
	}
	return nil
}

// readShapeStream reads a Responses stream up to response.completed (or response.incomplete), or
// a Messages stream up to message_stop: the text deltas make the answer, the usage comes from the
// last Responses event or from message_start and message_delta (Messages), and an error event
// fails the call.
func (r *runner) readShapeStream(body io.Reader, a *attempt) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxResponseBody)
	var content strings.Builder
	var u shapeUsage
	seen := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // event: lines name the type the data repeats
		}
		var ev shapeAnswer
		if err := json.Unmarshal(bytes.TrimSpace(data), &ev); err != nil {
			return fmt.Errorf("decode stream event: %w", err)
		}
		text := ""
		switch ev.Type {
		case "error", "response.failed":
			return fmt.Errorf("stream: error: %s", bytes.TrimSpace(data))
		case "response.output_text.delta":
			_ = json.Unmarshal(ev.Delta, &text)
		case "content_block_delta":
			var d struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(ev.Delta, &d) == nil && d.Type == "text_delta" {
				text = d.Text
			}
		case "message_start":
			if ev.Message != nil && ev.Message.Usage != nil {
				u, seen = *ev.Message.Usage, true
			}
		case "message_delta":
			if ev.Usage != nil {
				u.OutputTokens, seen = ev.Usage.OutputTokens, true
			}
		case "response.completed", "response.incomplete":
			if ev.Response != nil && ev.Response.Usage != nil {
				u, seen = *ev.Response.Usage, true
			}
		}
		if text != "" {
			if a.first.IsZero() {
				a.first = r.o.Now()
			}
			content.WriteString(text)
		}
		// response.incomplete is a Responses answer cut at max_output_tokens: with ignore_eos,
		// every answer is.
		if ev.Type == "response.completed" || ev.Type == "response.incomplete" || ev.Type == "message_stop" {
			a.content = content.String()
			if seen {
				a.usage = u.openAI(r.o.API)
			}
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	return errors.New("read stream: ended before its last event (response.completed or response.incomplete, message_stop)")
}
