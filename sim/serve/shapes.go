package serve

import (
	"net/http"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/httpjson"
	"github.com/basin-dev/basin/sim"
)

// emitter writes one call's answer in its API's shape: the whole answer, or its stream as
// opening events (once prefill is done), text events and closing events with the usage. The
// usage is filled as the engines fill it: OpenAI's prompt tokens and Responses' input tokens
// count the whole prompt with the cached part beside it; Anthropic's input_tokens count only
// what was not read from the cache, cache_read_input_tokens the rest.
type emitter interface {
	api() agentcall.Shape
	prompt() int
	output() int
	whole(done sim.CallEvent) any
	open(send sendFunc, first sim.CallEvent) error
	text(send sendFunc, from, to int) error
	close(send sendFunc, done sim.CallEvent) error
	fail(send sendFunc, e *apiError)
}

// sendFunc writes one server-sent event: an event line when event is not empty, then v as the
// data line (JSON, or rawData as it is).
type sendFunc func(event string, v any) error

// rawData is an event's data written as it is ([DONE]).
type rawData string

func emitterFor(g *generation) emitter {
	switch g.req.endpoint {
	case agentcall.Responses:
		return responsesEmitter{g}
	case agentcall.Messages:
		return messagesEmitter{g}
	}
	return chatEmitter{g}
}

// writeErrorFor writes an error in the shape of the API called: Anthropic's for Messages,
// OpenAI's for the rest.
func writeErrorFor(ep endpoint, w http.ResponseWriter, e *apiError) {
	if ep == agentcall.Messages {
		httpjson.Write(w, e.status, anthropicErrorBody(e))
		return
	}
	writeError(w, e)
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func anthropicErrorBody(e *apiError) anthropicError {
	var a anthropicError
	a.Type = "error"
	a.Error.Message = e.message
	switch e.status {
	case http.StatusBadRequest, http.StatusConflict:
		a.Error.Type = "invalid_request_error"
	case http.StatusNotFound:
		a.Error.Type = "not_found_error"
	case http.StatusRequestEntityTooLarge:
		a.Error.Type = "request_too_large"
	case http.StatusServiceUnavailable:
		a.Error.Type = "overloaded_error"
	default:
		a.Error.Type = "api_error"
	}
	return a
}

// chatEmitter writes chat completions and completions.
type chatEmitter struct{ g *generation }

func (e chatEmitter) api() agentcall.Shape { return e.g.req.endpoint }
func (e chatEmitter) prompt() int          { return e.g.req.prompt }
func (e chatEmitter) output() int          { return e.g.req.output }

func (e chatEmitter) whole(ev sim.CallEvent) any {
	g := e.g
	return g.response(false, []choice{g.choice(false, 0, g.req.output, true)},
		newUsage(ev.PromptTokens, ev.CachedTokens, g.req.output))
}

func (chatEmitter) open(sendFunc, sim.CallEvent) error { return nil }

func (e chatEmitter) text(send sendFunc, from, to int) error {
	return send("", e.g.response(true, []choice{e.g.choice(true, from, to, false)}, nil))
}

func (e chatEmitter) close(send sendFunc, ev sim.CallEvent) error {
	g := e.g
	if err := send("", g.response(true, []choice{g.choice(true, 0, 0, true)}, nil)); err != nil {
		return err
	}
	if g.req.includeUsage {
		if err := send("", g.response(true, []choice{}, newUsage(ev.PromptTokens, ev.CachedTokens, g.req.output))); err != nil {
			return err
		}
	}
	return send("", rawData("[DONE]"))
}

// fail ends a stream with an error event, as OpenAI's API does once a stream has begun (no
// [DONE] follows).
func (chatEmitter) fail(send sendFunc, e *apiError) {
	_ = send("", httpjson.NewError(e.typ, e.code, e.param, e.message))
}

// responsesEmitter writes OpenAI Responses: a response object with one output message, or its
// stream of typed events (response.created … response.completed, the usage in the last).
type responsesEmitter struct{ g *generation }

func (e responsesEmitter) api() agentcall.Shape { return agentcall.Responses }
func (e responsesEmitter) prompt() int          { return e.g.req.prompt }
func (e responsesEmitter) output() int          { return e.g.req.output }

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type outputMessage struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type responseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	Model              string          `json:"model"`
	Output             []outputMessage `json:"output"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Usage              *responsesUsage `json:"usage"`
	// IncompleteDetails says why an incomplete response stopped: max_output_tokens.
	IncompleteDetails *incompleteDetails `json:"incomplete_details"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

func (e responsesEmitter) object(status string, u *responsesUsage, text *string) responseObject {
	g := e.g
	r := responseObject{ID: g.id, Object: "response", CreatedAt: g.created, Status: status, Model: g.req.model,
		Output: []outputMessage{}, Usage: u}
	if g.req.previousResponseID != "" {
		prev := g.req.previousResponseID
		r.PreviousResponseID = &prev
	}
	if text != nil {
		r.Output = append(r.Output, e.message(status, *text))
	}
	if status == "incomplete" {
		r.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	return r
}

// endStatus is the finished response's status: completed when the model's own length ended it,
// incomplete when max_output_tokens (or the context) cut it, as OpenAI reports it.
func (e responsesEmitter) endStatus() string {
	if e.g.req.truncated {
		return "incomplete"
	}
	return "completed"
}

func (e responsesEmitter) message(status, text string) outputMessage {
	m := outputMessage{Type: "message", ID: "msg_" + e.g.id, Status: status, Role: "assistant", Content: []outputText{}}
	if status != "in_progress" {
		m.Content = append(m.Content, outputText{Type: "output_text", Text: text, Annotations: []any{}})
	}
	return m
}

func (e responsesEmitter) usage(ev sim.CallEvent) *responsesUsage {
	u := &responsesUsage{InputTokens: ev.PromptTokens, OutputTokens: e.g.req.output,
		TotalTokens: ev.PromptTokens + e.g.req.output}
	u.InputTokensDetails.CachedTokens = ev.CachedTokens
	return u
}

func (e responsesEmitter) whole(ev sim.CallEvent) any {
	text := filler(0, e.g.req.output)
	return e.object(e.endStatus(), e.usage(ev), &text)
}

// responsesEvent is a Responses stream event; only the fields of its type are set.
type responsesEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *responseObject `json:"response,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	Item           *outputMessage  `json:"item,omitempty"`
	Part           *outputText     `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
}

// emit sends a Responses event, numbering it; the event line is its type.
func (e responsesEmitter) emit(send sendFunc, ev responsesEvent) error {
	ev.SequenceNumber = e.g.seq
	e.g.seq++
	return send(ev.Type, ev)
}

func (e responsesEmitter) open(send sendFunc, _ sim.CallEvent) error {
	zero := 0
	created := e.object("in_progress", nil, nil)
	item := e.message("in_progress", "")
	for _, ev := range []responsesEvent{
		{Type: "response.created", Response: &created},
		{Type: "response.in_progress", Response: &created},
		{Type: "response.output_item.added", OutputIndex: &zero, Item: &item},
		{Type: "response.content_part.added", OutputIndex: &zero, ContentIndex: &zero, ItemID: item.ID,
			Part: &outputText{Type: "output_text", Text: "", Annotations: []any{}}},
	} {
		if err := e.emit(send, ev); err != nil {
			return err
		}
	}
	return nil
}

func (e responsesEmitter) text(send sendFunc, from, to int) error {
	zero := 0
	d := filler(from, to)
	return e.emit(send, responsesEvent{Type: "response.output_text.delta", OutputIndex: &zero, ContentIndex: &zero,
		ItemID: "msg_" + e.g.id, Delta: &d})
}

func (e responsesEmitter) close(send sendFunc, ev sim.CallEvent) error {
	zero := 0
	text := filler(0, e.g.req.output)
	part := outputText{Type: "output_text", Text: text, Annotations: []any{}}
	status := e.endStatus()
	item := e.message(status, text)
	done := e.object(status, e.usage(ev), &text)
	for _, x := range []responsesEvent{
		{Type: "response.output_text.done", OutputIndex: &zero, ContentIndex: &zero, ItemID: item.ID, Text: &text},
		{Type: "response.content_part.done", OutputIndex: &zero, ContentIndex: &zero, ItemID: item.ID, Part: &part},
		{Type: "response.output_item.done", OutputIndex: &zero, Item: &item},
		{Type: "response." + status, Response: &done},
	} {
		if err := e.emit(send, x); err != nil {
			return err
		}
	}
	return nil
}

// fail ends a Responses stream with an error event.
func (e responsesEmitter) fail(send sendFunc, err *apiError) {
	_ = send("error", struct {
		Type           string  `json:"type"`
		SequenceNumber int     `json:"sequence_number"`
		Code           *string `json:"code"`
		Message        string  `json:"message"`
		Param          *string `json:"param"`
	}{Type: "error", SequenceNumber: e.g.seq, Code: strPtr(err.code), Message: err.message, Param: strPtr(err.param)})
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// messagesEmitter writes Anthropic Messages: a message with one text block, or its stream
// (message_start with the input counts, text deltas, message_delta with the output count).
type messagesEmitter struct{ g *generation }

func (e messagesEmitter) api() agentcall.Shape { return agentcall.Messages }
func (e messagesEmitter) prompt() int          { return e.g.req.prompt }
func (e messagesEmitter) output() int          { return e.g.req.output }

type messagesUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type messageObject struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []textBlock    `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        *messagesUsage `json:"usage"`
}

// usage is the Anthropic usage of a call whose prompt had cached tokens read from the cache and
// output tokens generated: the rest of the prompt was written to the cache.
func (e messagesEmitter) usage(ev sim.CallEvent, output int) *messagesUsage {
	return &messagesUsage{InputTokens: ev.PromptTokens - ev.CachedTokens, CacheReadInputTokens: ev.CachedTokens,
		OutputTokens: output}
}

func (e messagesEmitter) message(ev sim.CallEvent, stop bool, output int) messageObject {
	m := messageObject{ID: e.g.id, Type: "message", Role: "assistant", Model: e.g.req.model, Content: []textBlock{},
		Usage: e.usage(ev, output)}
	if stop {
		reason := e.stopReason()
		m.StopReason = &reason
		m.Content = append(m.Content, textBlock{Type: "text", Text: filler(0, e.g.req.output)})
	}
	return m
}

// stopReason is end_turn when the model's own length ended the answer, max_tokens when the
// request's limit cut it.
func (e messagesEmitter) stopReason() string {
	if e.g.req.truncated {
		return "max_tokens"
	}
	return "end_turn"
}

func (e messagesEmitter) whole(ev sim.CallEvent) any { return e.message(ev, true, e.g.req.output) }

func (e messagesEmitter) open(send sendFunc, first sim.CallEvent) error {
	start := e.message(first, false, 1)
	if err := send("message_start", struct {
		Type    string        `json:"type"`
		Message messageObject `json:"message"`
	}{"message_start", start}); err != nil {
		return err
	}
	return send("content_block_start", struct {
		Type         string    `json:"type"`
		Index        int       `json:"index"`
		ContentBlock textBlock `json:"content_block"`
	}{"content_block_start", 0, textBlock{Type: "text"}})
}

func (e messagesEmitter) text(send sendFunc, from, to int) error {
	return send("content_block_delta", struct {
		Type  string    `json:"type"`
		Index int       `json:"index"`
		Delta textBlock `json:"delta"`
	}{"content_block_delta", 0, textBlock{Type: "text_delta", Text: filler(from, to)}})
}

func (e messagesEmitter) close(send sendFunc, ev sim.CallEvent) error {
	if err := send("content_block_stop", struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}{"content_block_stop", 0}); err != nil {
		return err
	}
	reason := e.stopReason()
	if err := send("message_delta", struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason   *string `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage *messagesUsage `json:"usage"`
	}{Type: "message_delta", Delta: struct {
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}{StopReason: &reason}, Usage: e.usage(ev, e.g.req.output)}); err != nil {
		return err
	}
	return send("message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
}

// fail ends a Messages stream with an error event, as Anthropic's API does mid-stream.
func (e messagesEmitter) fail(send sendFunc, err *apiError) {
	_ = send("error", anthropicErrorBody(err))
}
