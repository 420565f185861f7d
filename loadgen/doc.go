// Package loadgen drives a scenario's agent sessions over the OpenAI chat API (or OpenAI Responses,
// or Anthropic Messages: Options.API, `--api`) against any endpoint — basin's gateway, `basin sim serve`, or a real engine — and reports what each session got:
// completed, refused, shed, killed, failed or cut short, and the goodput that follows
// (`basin loadgen`).
//
// # Sessions
//
// The sessions are the simulator's. Run takes the scenario's arrival streams from
// scenario.Scenario.Options and draws its arrivals from the simulator's own arrival process
// (sim.Arrivals, and sim.SessionRNG for each session's spec), so the same seed offers the same
// sessions at the same virtual times as a simulator run: Poisson streams between their From and To,
// rate dips thinned, arrival k of stream i drawing its SessionSpec from a generator of its own.
// The package keeps no copy of the simulator's seeds; only the Retry-After jitter is its own
// stream, apart from the session's, so that retries change nothing a session sends.
//
// At a stream's KillAt, its sessions that arrived before it and are still running are stopped,
// their call in flight cancelled, and count as killed; the stream's later arrivals run, as in the
// simulator. Arrivals stop at the scenario's duration; Run then waits for the sessions under way.
//
// While it runs, Options.Progress hears every ProgressEvery (a second) how far it got: virtual
// time, sessions arrived and live, and those ended by outcome — all sessions, not only the
// measured ones. When ctx is done, Run still returns the report of what happened until then,
// marked interrupted, with the sessions cut counted unfinished.
//
// # Clock
//
// Virtual time runs at Speed × wall time. Arrival times and tool pauses (CallSpec.GapBefore) are
// virtual and so divided by Speed; a Retry-After is the server's wall time and is waited as is.
// Every duration in the report is virtual: wall × Speed (against a real engine Speed is 1).
//
// # Calls
//
// A session sends its calls in order, one at a time, to {target}/v1/chat/completions (or
// /v1/responses, /v1/messages), with its id
// in a header (x-session-id: <run id>-<n>, n counting sessions from 1 in arrival order) and
// x-session-end: true on its last call. The conversation grows as an agent's does: a system
// message shared by every session, the user's task, then per call the assistant's answer (the
// text the server returned) and a user message standing for the tool result.
//
// Messages are sized for sim/serve's token count, prompt = ceil(characters / 4) + 4 per message,
// with the leading system message as the shared prefix. The system message has
// 4·(Shared − 4) characters, so it counts Shared tokens. The message that ends call i's prompt (the
// task for call 0, the tool result later) is padded to 4·(Prompt_i − 4·M) − C characters, where M
// is the number of messages including it and C the characters of the messages before it, so the
// whole prompt counts exactly Prompt_i tokens. It overshoots only when the messages before it are
// already longer than that (an answer much longer than the spec's output), and never by more than
// its short heading. The filler is three-letter words, about a token each for a real tokenizer
// too, but a real engine's count differs by its tokenizer and chat template: each session's
// max_prompt_error in the report says by how much.
//
// The other APIs carry the same conversation, sized alike (sim/serve reads them the same way):
// Responses with the system message as instructions, the rest as input messages, the whole
// history re-sent each call with store: false (the scenario's prompts, not a server-kept chain);
// Messages with it as system. Their usage is read as each API gives it — Responses'
// input_tokens and input_tokens_details.cached_tokens, Anthropic's input_tokens plus its cache
// read and creation tokens, with the cache read as the cached part — streamed (up to
// response.completed or message_stop) or not.
//
// # Refusals
//
// AdmitPerf's contract: 503 and 429 are deferrals with Retry-After. The session waits
// Retry-After × (1 + U[0, JitterFraction]) and sends the same call again, up to RetryBudget
// retries and MaxRetryWait of waiting per session; past either it is rejected. 529 means shed:
// retrying soon will not help, so the session ends at once. Reject429Terminal makes 429 a
// rejection too. Any other status, a transport error or a broken stream fails the session with
// outcome error and the message.
//
// # Measurements
//
// A session's first-call wait runs from its start to the first token of its first call (retry
// waits included): what admission control and queueing cost it. A call's time to first token runs
// from sending the attempt that was answered to the first content in its stream; without
// streaming the first token is not seen, so there is none, and the first-call wait runs to the
// whole answer. Both are virtual: against a server on an accelerated clock every millisecond of
// wall overhead (loopback, JSON, the server's scheduling) counts Speed milliseconds, so runs meant
// to measure latency want a modest Speed.
//
// # Ending sessions
//
// Every session the load generator starts, it ends. A completed session ends with its last call
// (x-session-end: true). Any other that sent a call — failed on an upstream error or a broken
// stream, refused, shed, killed at KillAt, cut by a cancelled run — is ended when it stops with
// POST {target}/v1/sessions/{id}/end, on a context of its own bounded by EndTimeout, so that it
// does not hold what the server admitted it with until the server's idle timeout (the gateway's
// is ten minutes). A 404 means the server holds nothing for it (the gateway ends a session whose
// first call failed by itself; a bare engine has no such endpoint). An end that gets no answer (a
// gateway restarting after a crash) is asked again every EndRetryEvery while the run lasts and
// once more as it ends; the report's session_ends counts the sessions ended and names those that
// could not be, and the log warns of them.
//
// # Goodput
//
// A session counts in the report when it arrived (by its scheduled arrival) in the scenario's
// measurement window, as in the simulator; rejected and shed sessions stay in the denominator, so
// a policy cannot win by refusing. A session is good when it completed within SLO.Slowdown × its
// unloaded time. A client cannot know the unloaded time of a remote deployment, so it comes from
// Options.Unloaded; without it good and goodput are null, never zero.
package loadgen
