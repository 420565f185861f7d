package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/httpjson"
	"github.com/basin-dev/basin/sim"
)

// apiError is an OpenAI-style error answer.
type apiError struct {
	status  int
	message string
	typ     string
	param   string // empty: null
	code    string // empty: null
}

func (e *apiError) Error() string { return e.message }

func invalid(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...),
		typ: "invalid_request_error", param: param}
}

func writeError(w http.ResponseWriter, e *apiError) {
	httpjson.WriteError(w, e.status, e.typ, e.code, e.param, e.message)
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *apiError) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
				message: fmt.Sprintf("request body: larger than %d bytes", mbe.Limit)}
		}
		return nil, invalid("", "request body: read: %v", err)
	}
	return b, nil
}

// decodeError turns a JSON decoding error into a 400 naming the field when there is one.
func decodeError(err error) *apiError {
	if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) && te.Field != "" {
		return invalid(te.Field, "%s: must be %s, got JSON %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if name, uerr := strconv.Unquote(f); uerr == nil {
			return invalid(name, "%s: unknown field", name)
		}
	}
	return invalid("", "request body: invalid JSON: %v", err)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "int", "int64", "int32":
		return "an integer"
	case "float64", "float32":
		return "a number"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return "of another type"
}

// endpoint is the API shape a request came through.
type endpoint = agentcall.Shape

const (
	chatEndpoint       = agentcall.Chat
	completionEndpoint = agentcall.Completions
)

// genRequest is a parsed chat or completion request, in the simulator's terms.
type genRequest struct {
	endpoint     endpoint
	model        string
	stream       bool
	includeUsage bool
	prompt       int // tokens
	shared       int // leading tokens every session shares (system prompt)
	// limit is the most output tokens the call may have: max_completion_tokens, else
	// max_tokens (max_output_tokens), else what fits the context (with a Workload) or
	// DefaultOutputTokens (without). limited says the client set it.
	limit   int
	limited bool
	// ignoreEOS is SGLang's and vLLM's ignore_eos: generate exactly limit tokens.
	ignoreEOS bool
	// output is the answer's length, set when the call is submitted (limit until then), and
	// truncated says the limit, not the model's end of turn, ended it (finish_reason length).
	output    int
	truncated bool
	session   string // the client's session id; empty: a one-call session
	endAfter  bool
	// previousResponseID continues a Responses conversation the server keeps; noStore: the
	// call's response is not kept (store: false).
	previousResponseID string
	noStore            bool
}

// parseGenerate reads a chat or completion request with agentcall, the reader the gateway uses:
// body, session identity and the token counts the simulator needs. Unlike the gateway, which
// proxies a malformed body for the upstream to judge, the simulator is the upstream: it answers
// the first problem agentcall finds with a 400 naming the field, then checks what it supports.
func (s *Server) parseGenerate(ep endpoint, h http.Header, body []byte) (genRequest, *apiError) {
	c, err := agentcall.Read(ep, body)
	req := genRequest{endpoint: ep, model: c.Model, stream: c.Stream, includeUsage: c.IncludeUsage,
		limit: DefaultOutputTokens}
	if err != nil {
		if fe := (*agentcall.FieldError)(nil); errors.As(err, &fe) {
			return req, invalid(fe.Field, "%s", fe.Error())
		}
		return req, invalid("", "request body: %v", err)
	}
	var apiErr *apiError
	if req.model == "" {
		req.model = s.o.ModelName
	}
	if c.N != nil && *c.N != 1 {
		return req, invalid("n", "n: only 1 choice is supported, got %d", *c.N)
	}
	req.prompt, req.shared = int(c.Prompt), int(c.Shared)
	req.previousResponseID, req.noStore = c.PreviousResponseID, c.NoStore
	maxName := "max_tokens"
	if ep == agentcall.Responses {
		maxName = "max_output_tokens"
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{maxName, c.MaxTokens}, {"max_completion_tokens", c.MaxCompletionTokens}} {
		if f.v == nil {
			continue
		}
		if *f.v < 1 {
			return req, invalid(f.name, "%s: must be ≥ 1, got %d", f.name, *f.v)
		}
		if *f.v > int64(s.maxTokens) {
			return req, s.tooLong(ep, req.prompt, *f.v)
		}
		req.limit, req.limited = int(*f.v), true // max_completion_tokens, checked last, wins
	}
	if !req.limited && s.o.Workload != nil {
		// No limit but the context: a model answering at its own length may use what is left.
		req.limit = max(1, s.maxTokens-req.prompt)
	}
	if req.prompt+req.limit > s.maxTokens {
		return req, s.tooLong(ep, req.prompt, int64(req.limit))
	}
	req.output = req.limit
	if req.ignoreEOS, apiErr = readIgnoreEOS(body); apiErr != nil {
		return req, apiErr
	}
	req.session, _ = c.Identity(h, agentcall.SessionHeaders())
	if v := strings.TrimSpace(h.Get("x-session-end")); v != "" {
		end, err := strconv.ParseBool(v)
		if err != nil {
			return req, invalid("x-session-end", "x-session-end: header must be true or false, got %q", v)
		}
		req.endAfter = end
	}
	return req, nil
}

// tooLong refuses a call whose prompt and output cannot fit one decode instance's KV memory, the
// simulated deployment's context limit.
func (s *Server) tooLong(ep endpoint, prompt int, output int64) *apiError {
	param := ep.PromptField()
	e := invalid(param, "%s: this deployment's context is %d tokens; the request has %d prompt tokens and asks for %d output tokens",
		param, s.maxTokens, prompt, output)
	e.code = "context_length_exceeded"
	return e
}

// ignoreEOSKey is the sampling parameter of SGLang and vLLM that makes a call generate exactly its
// max_tokens (benchmark clients send it to fix output lengths).
const ignoreEOSKey = "ignore_eos"

// readIgnoreEOS reads the body's top-level ignore_eos, which internal/agentcall does not read (the
// gateway has no use for it). Bodies without the key, nearly all, are not decoded again. Like
// agentcall, it refuses the key sent twice: JSON parsers disagree on which one counts.
func readIgnoreEOS(body []byte) (bool, *apiError) {
	if !bytes.Contains(body, []byte(`"`+ignoreEOSKey+`"`)) {
		return false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false, nil // not an object: agentcall has judged the body already
	}
	var v *bool
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false, invalid(ignoreEOSKey, "%s: reading the body for it: %v", ignoreEOSKey, err)
		}
		if tok != ignoreEOSKey {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return false, invalid(ignoreEOSKey, "%s: reading the body for it: %v", ignoreEOSKey, err)
			}
			continue
		}
		if seen {
			return false, invalid(ignoreEOSKey, "%s: sent twice; which one counts is ambiguous", ignoreEOSKey)
		}
		seen = true
		if err := dec.Decode(&v); err != nil {
			return false, invalid(ignoreEOSKey, "%s: must be a boolean: %v", ignoreEOSKey, err)
		}
	}
	return v != nil && *v, nil
}

// fillerWords make up the generated text. Each is three letters, so that n words joined by spaces
// are 4n−1 characters: n tokens again when a client sends the answer back in its next prompt.
var fillerWords = [...]string{"the", "sim", "ran", "one", "big", "red", "fox", "sat", "far", "day",
	"new", "old", "sun", "and", "cat", "dog"}

// filler returns words from (inclusive) to to (exclusive) of the generated text, each after a
// space but the first of the text, so that the pieces of a stream concatenate to the whole.
func filler(from, to int) string {
	var b strings.Builder
	b.Grow(4 * max(0, to-from))
	for i := from; i < to; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(fillerWords[i%len(fillerWords)])
	}
	return b.String()
}

// usage is the OpenAI usage block.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func newUsage(prompt, cached, completion int) *usage {
	u := &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	u.PromptTokensDetails.CachedTokens = cached
	return u
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type delta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

// choice covers both endpoints; the fields of the other one are left out.
type choice struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *delta          `json:"delta,omitempty"`
	Text         *string         `json:"text,omitempty"`
	Logprobs     *struct{}       `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type response struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
}

// generation is what one request writes back.
type generation struct {
	req     genRequest
	id      string
	created int64
	seq     int // the next Responses stream event's sequence_number
}

func (g *generation) object(chunk bool) string {
	switch {
	case g.req.endpoint == completionEndpoint:
		return "text_completion"
	case chunk:
		return "chat.completion.chunk"
	}
	return "chat.completion"
}

// choice builds the one choice: text from word from to to; stop marks the last.
func (g *generation) choice(chunk bool, from, to int, stop bool) choice {
	c := choice{}
	if stop {
		reason := "stop"
		if g.req.truncated {
			reason = "length"
		}
		c.FinishReason = &reason
	}
	text := filler(from, to)
	switch {
	case g.req.endpoint == completionEndpoint:
		c.Text = &text
	case chunk:
		c.Delta = &delta{Content: text}
		if from == 0 && to > 0 {
			c.Delta.Role = "assistant"
		}
	default:
		c.Message = &chatMessageOut{Role: "assistant", Content: text}
	}
	return c
}

func (g *generation) response(chunk bool, choices []choice, u *usage) response {
	return response{ID: g.id, Object: g.object(chunk), Created: g.created, Model: g.req.model, Choices: choices, Usage: u}
}

// serveGenerate handles POST /v1/chat/completions, /v1/completions, /v1/responses and
// /v1/messages.
func (s *Server) serveGenerate(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, apiErr := readBody(w, r, s.o.MaxBodyBytes)
		if apiErr != nil {
			writeErrorFor(ep, w, apiErr)
			return
		}
		req, apiErr := s.parseGenerate(ep, r.Header, body)
		if apiErr != nil {
			writeErrorFor(ep, w, apiErr)
			return
		}
		id := idPrefix(ep) + strconv.FormatUint(s.ids.Add(1), 10)
		c, apiErr := s.submit(&req, id)
		if apiErr != nil {
			writeErrorFor(ep, w, apiErr)
			return
		}
		g := &generation{req: req, id: id, created: s.o.Now().Unix()}
		em := emitterFor(g)
		if req.stream {
			s.stream(w, r, c, em)
		} else {
			s.respond(w, r, c, em)
		}
	}
}

// idPrefix starts the ids of an API's answers, as the real services spell them.
func idPrefix(ep endpoint) string {
	switch ep {
	case completionEndpoint:
		return "cmpl-sim-"
	case agentcall.Responses:
		return "resp_sim_"
	case agentcall.Messages:
		return "msg_sim_"
	}
	return "chatcmpl-sim-"
}

// submit hands the call to the simulator, setting its output length. id is the answer's id,
// which a Responses call continuing it names.
func (s *Server) submit(req *genRequest, id string) (*call, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stopped:
		return nil, errStopped()
	default:
	}
	s.advanceLocked(s.virtualNow())
	var key string
	var link chainLink
	if prev := req.previousResponseID; prev != "" {
		var ok bool
		if link, ok = s.mu.chains[prev]; !ok {
			return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "previous_response_id",
				code: "previous_response_not_found", message: fmt.Sprintf("previous response with id %q not found", prev)}
		}
		// The server holds the conversation: the prompt is all of it, then the new input.
		req.prompt += link.context
	}
	chained := req.endpoint == agentcall.Responses && !req.noStore
	oneCall := false
	switch {
	case req.session != "":
		key = "session/" + req.session
	case link.key != "":
		key = link.key
	case chained:
		// A conversation the server keeps, with no other identity: the chain is the session.
		s.mu.anon++
		key = "chain/" + strconv.FormatUint(s.mu.anon, 10)
	default:
		s.mu.anon++
		key, oneCall = "anon/"+strconv.FormatUint(s.mu.anon, 10), true
	}
	ss, known := s.mu.sessions[key]
	if known && ss.call != nil {
		return nil, errBusy(req.session)
	}
	if !known {
		ss = &session{key: key, id: req.session, endAfterCall: oneCall}
	}
	req.output, req.truncated = s.outputLocked(ss, req)
	c := newCall(s, req.stream)
	c.sess = ss
	err := s.mu.sim.Submit(sim.ExternalCall{Session: key, Shared: req.shared, Prompt: req.prompt,
		Output: req.output, Notify: c.notify})
	switch {
	case errors.Is(err, sim.ErrBusy):
		return nil, errBusy(req.session)
	case err != nil:
		return nil, &apiError{status: http.StatusInternalServerError, typ: "server_error",
			message: fmt.Sprintf("submit call: %v", err)}
	}
	s.mu.sessions[key] = ss
	ss.call = c
	ss.calls++
	if chained {
		s.mu.chains[id] = chainLink{key: key, context: req.prompt + req.output}
		ss.responses = append(ss.responses, id)
	}
	ss.endAfterCall = ss.endAfterCall || req.endAfter
	s.o.Logger.Debug("call submitted", "session", req.session, "prompt_tokens", req.prompt,
		"shared_tokens", req.shared, "output_tokens", req.output, "stream", req.stream, "virtual_now", s.mu.sim.Now())
	s.kick()
	return c, nil
}

// outputLocked is the length of the session's next answer and whether its limit cut it: the
// length the workload gives the session's call (see Options.Workload), at most the call's limit;
// the limit itself without a workload or with ignore_eos.
func (s *Server) outputLocked(ss *session, req *genRequest) (int, bool) {
	if req.ignoreEOS {
		return req.limit, true
	}
	if s.o.Workload == nil {
		return req.limit, false
	}
	for len(ss.outputs) <= ss.calls {
		// The session's calls so far have used up the outputs of the workload sessions drawn for
		// it: it goes on with another's.
		for _, c := range s.o.Workload.Session(s.mu.rng).Calls {
			ss.outputs = append(ss.outputs, c.Output)
		}
	}
	natural := max(1, ss.outputs[ss.calls])
	return min(natural, req.limit), natural > req.limit
}

func errBusy(id string) *apiError {
	return &apiError{status: http.StatusConflict, typ: "invalid_request_error", param: "session_id",
		code: "session_busy", message: fmt.Sprintf("session %q has a call in flight; a session sends one call at a time", id)}
}

func errStopped() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "simulator_stopped",
		message: "the simulator is not running"}
}

func errEnded() *apiError {
	return &apiError{status: http.StatusConflict, typ: "invalid_request_error", code: "session_ended",
		message: "the session was ended while this call was in flight"}
}

// abandon aborts a call whose client is gone: the simulator has no way to drop one call, so the
// session ends, as an engine frees a request's KV when its client disconnects.
func (s *Server) abandon(c *call, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(s.virtualNow())
	if c.finished {
		return
	}
	s.endLocked(c.sess.key)
	s.kick()
	s.o.Logger.Info("call aborted; session ended", "session", c.sess.id, "reason", why, "virtual_now", s.mu.sim.Now())
}

// await hands the events the simulator reports for c to handle, in order, as they come, until
// handle says the answer is over. A client that goes away abandons the call; a server that stops
// ends the wait once the events already reported are handled. It reports whether the server
// stopped before the answer was over, which the caller tells its client in its own way.
func (s *Server) await(ctx context.Context, c *call, handle func(sim.CallEvent) (over bool)) (stopped bool) {
	for {
		select {
		case <-c.ready:
		case <-ctx.Done():
			s.abandon(c, "client disconnected")
			return false
		case <-s.stopped:
		}
		for _, ev := range c.take() {
			if handle(ev) {
				return false
			}
		}
		if isClosed(s.stopped) {
			return true
		}
	}
}

// respond waits for the call to finish and writes one response.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, c *call, em emitter) {
	stopped := s.await(r.Context(), c, func(ev sim.CallEvent) bool {
		switch ev.Kind {
		case sim.Done:
			w.Header().Set("x-basin-sim-prompt-tokens", strconv.Itoa(ev.PromptTokens))
			w.Header().Set("x-basin-sim-cached-tokens", strconv.Itoa(ev.CachedTokens))
			httpjson.Write(w, http.StatusOK, em.whole(ev))
			return true
		case sim.Aborted:
			writeErrorFor(em.api(), w, errEnded())
			return true
		}
		return false
	})
	if stopped {
		writeErrorFor(em.api(), w, errStopped())
	}
}

// stream writes the call as server-sent events, as the simulator produces the words: the API's
// opening events once prefill is done, a text event per simulator event that produced words, and
// its closing events with the usage.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, c *call, em emitter) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.Header().Set("x-basin-sim-prompt-tokens", strconv.Itoa(em.prompt()))
	w.WriteHeader(http.StatusOK)
	send := func(event string, v any) error {
		var err error
		if event != "" {
			_, err = fmt.Fprintf(w, "event: %s\n", event)
		}
		if err != nil {
			return err
		}
		if raw, ok := v.(rawData); ok {
			_, err = fmt.Fprintf(w, "data: %s\n\n", raw)
			return err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "data: %s\n\n", b)
		return err
	}
	if err := rc.Flush(); err != nil {
		s.abandon(c, "flush failed: "+err.Error())
		return
	}
	sent, opened, output := 0, false, em.output()
	stopped := s.await(r.Context(), c, func(ev sim.CallEvent) bool {
		var err error
		if !opened && ev.Kind != sim.Aborted {
			err, opened = em.open(send, ev), true
		}
		switch ev.Kind {
		case sim.FirstToken, sim.Progress:
			if n := min(ev.Tokens, output); err == nil && n > sent {
				err = em.text(send, sent, n)
				sent = n
			}
		case sim.Done:
			if err == nil && sent < output {
				err = em.text(send, sent, output)
			}
			if err == nil {
				err = em.close(send, ev)
			}
			if err == nil {
				_ = rc.Flush()
			}
			return true // the call is over whether or not the client got the end
		case sim.Aborted:
			em.fail(send, errEnded())
			_ = rc.Flush()
			return true
		}
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			s.abandon(c, "write failed: "+err.Error())
			return true
		}
		return false
	})
	if stopped {
		em.fail(send, errStopped())
		_ = rc.Flush()
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
	}
	return false
}
