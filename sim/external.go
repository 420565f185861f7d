package sim

import (
	"errors"
	"fmt"
	"time"
)

// CallEventKind says what happened to an external call.
type CallEventKind uint8

// External call events, in the order a call sees them.
const (
	// FirstToken: prefill and the KV transfer are done; decode streams from here.
	FirstToken CallEventKind = iota
	// Progress: decode produced more tokens (reported at every batch change).
	Progress
	// Done: the last token is out.
	Done
	// Aborted: the session was cancelled while the call was in flight.
	Aborted
)

// CallEvent reports an external call's progress. Tokens is the number of output tokens produced so
// far; PromptTokens and CachedTokens describe the prefill (usage fields of an OpenAI response).
type CallEvent struct {
	Kind         CallEventKind
	At           time.Duration
	Tokens       int
	PromptTokens int
	CachedTokens int
}

// ExternalCall is a call that arrives from outside the simulator (the HTTP front of `basin sim
// serve`) rather than from a generated workload.
type ExternalCall struct {
	// Session identifies the conversation; calls of one session share a cached prefix.
	Session string
	// Shared is how many leading prompt tokens every session shares (a system prompt); only the
	// first call's value is used.
	Shared int
	Prompt int
	Output int
	// Notify receives the call's events on the simulator's goroutine; it must not block or call
	// back into the simulator.
	Notify func(CallEvent)
}

// ErrBusy is returned when a session submits a call while its previous one is still running.
var ErrBusy = errors.New("session has a call in flight")

// Submit makes an external call arrive now. A new session starts with its first call; later calls
// are assumed to extend the conversation (the prompt repeats the previous prompt and output).
func (s *Sim) Submit(c ExternalCall) error {
	if c.Prompt <= 0 {
		return fmt.Errorf("prompt tokens: must be > 0, got %d", c.Prompt)
	}
	if c.Output <= 0 {
		return fmt.Errorf("output tokens: must be > 0, got %d", c.Output)
	}
	if s.ext == nil {
		s.ext = map[string]*session{}
	}
	ss, ok := s.ext[c.Session]
	if ok && ss.inFlight != nil {
		return ErrBusy
	}
	call := CallSpec{Prompt: c.Prompt, Output: c.Output}
	if !ok {
		call.Reused = min(c.Shared, c.Prompt)
		spec := SessionSpec{Shared: call.Reused, Calls: []CallSpec{call}}
		ss = &session{id: s.nextID, class: "external", stream: -2, spec: spec, arrival: s.now, started: -1,
			extKey: c.Session}
		s.nextID++
		ss.prefill = s.pickPrefill(ss.id)
		s.sessions = append(s.sessions, ss)
		s.byID[ss.id] = ss
		s.ext[c.Session] = ss
		s.minute().Arrivals++
		ss.notify = c.Notify
		ss.state = stLive
		s.live++
		s.sendCall(ss)
		return nil
	}
	last := ss.spec.Calls[len(ss.spec.Calls)-1]
	call.Reused = min(c.Prompt, last.Prompt+last.Output)
	ss.spec.Calls = append(ss.spec.Calls, call)
	ss.notify = c.Notify
	s.sendCall(ss)
	return nil
}

// EndSession ends an external session (its client said so, or it went idle). A call in flight is
// aborted.
func (s *Sim) EndSession(key string) bool {
	ss, ok := s.ext[key]
	if !ok {
		return false
	}
	delete(s.ext, key)
	if ss.inFlight != nil {
		s.kill(ss)
		return true
	}
	s.endSession(ss, stDone)
	return true
}

// ExternalSessions reports how many external sessions are live.
func (s *Sim) ExternalSessions() int { return len(s.ext) }

func (s *Sim) notify(r *request, kind CallEventKind) {
	fn := r.s.notify
	if fn == nil {
		return
	}
	ev := CallEvent{Kind: kind, At: s.now, PromptTokens: r.spec.Prompt, CachedTokens: r.cached}
	switch kind {
	case FirstToken:
		ev.Tokens = 1
	case Progress:
		ev.Tokens = max(1, r.spec.Output-int(r.steps+0.5))
	case Done:
		ev.Tokens = r.spec.Output
	}
	fn(ev)
}
