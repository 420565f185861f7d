// Package serve runs the simulator against the wall clock and serves it over HTTP (`basin sim
// serve`), so that real clients — basin's gateway, OpenAI SDKs, curl — talk to a simulated
// prefill/decode deployment as they would to SGLang, and basin's daemon scrapes and steers it as it
// would a real one.
//
// # Clock
//
// Virtual time is (wall − the time of New) × Speed. Run drives it: it brings the simulator up to
// the wall clock, then sleeps until the wall time of the next simulated event (at most 20 ms, at
// least 1 ms) or until a request wakes it. Every request that touches the simulator first brings it
// up to the wall clock too, so what it reads is current. The simulator is single-threaded: one
// mutex guards it, and the simulator's call events (which it reports on whichever goroutine drives
// it) are queued per call for the waiting request.
//
// # Calls
//
// A chat, completion, Responses or Messages request becomes one sim.ExternalCall. Its body is read by
// internal/agentcall, the reader the gateway uses, so the two count the same tokens and name the
// same session; a malformed or ambiguous body (a key it reads, sent twice) is a 400 naming the
// field. The simulator sees sizes, not text:
//
//   - prompt tokens = ceil(characters of all message contents / 4) + 4 per message (an assistant
//     message's tool_calls count as content); completions: ceil(characters / 4), at least 1, or the
//     number of token ids;
//   - shared tokens (a system prompt every session shares, which a radix cache keeps resident) = the
//     same formula over the leading system or developer messages;
//   - output tokens = the length Options.Workload gives the session's call, at most the request's
//     limit (max_completion_tokens, else max_tokens or max_output_tokens, else what is left of the
//     context), as a model ends its turn whatever limit the client set; finish_reason "stop"
//     (end_turn; Responses "completed") when the workload's length ended it, "length"
//     (max_tokens; "incomplete") when the limit cut it. Without a Workload, and with ignore_eos,
//     exactly the limit (256 without one). Prompt plus limit must fit one decode instance's KV
//     memory (400 context_length_exceeded otherwise).
//
// A later call of a session is taken to extend the conversation, so its cached prefix is the
// previous prompt (unless evicted). The answer is filler text of exactly completion_tokens
// three-letter words: sent back in the next prompt, n words are n tokens again.
//
// A session is named by the first non-empty of the headers x-session-id, x-claude-code-session-id,
// session-id, session_id, x-session-affinity, x-dynamo-session-id, then the body's
// metadata.session_id, then prompt_cache_key, then user (Anthropic's metadata.user_id). A request
// with none is a one-call session, ended when its call finishes — but for a Responses call the
// server keeps (store not false), which starts a chain: a call continuing it
// (previous_response_id) joins its session, with the whole conversation as its prompt, as an engine
// that keeps responses serves it; `x-session-end: true` ends a named session after this call. A session with no call in
// flight for Options.IdleTimeout of virtual time is ended. A session sends one call at a time; a
// second call while one is in flight gets 409. A client that disconnects before its call is done
// aborts it: the session ends in the simulator (the only way it can drop a call).
//
// Streaming answers send one chunk per simulator event that produced words: the first token, then
// decode progress, then the rest with the final chunk. The simulator reports decode progress only
// when a batch changes, so while a streaming call is decoding, Run also refreshes the decode
// instances on each tick (as a metrics scrape does); chunks therefore follow the simulated decode
// rate, at most 20 ms of wall time apart.
//
// # Endpoints
//
//	POST /v1/chat/completions   OpenAI chat completions (stream, stream_options.include_usage)
//	POST /v1/completions        OpenAI completions
//	POST /v1/responses          OpenAI Responses (stream: its typed events, the usage in response.completed)
//	POST /v1/messages           Anthropic Messages (stream: message_start … message_stop; Anthropic's errors)
//	GET  /v1/models             the one model (Options.ModelName)
//	POST /v1/sessions/{id}/end  end a session now: {"ended":true}, or 404
//	GET  /metrics               plain-text index of the per-instance paths
//	GET  /metrics/{instance}    one engine instance ("prefill-0", "decode-0", …) in SGLang's names
//	GET  /admin/lending         {"enabled":bool,"max_fraction":float}
//	PUT  /admin/lending         switch lending ({"enabled":…, "max_fraction":…}; POST works too)
//	GET  /admin/state           the simulator's ground truth: virtual time, sessions, working set, …
//	GET  /healthz               "ok"
//
// Every answer carries X-Basin-Sim-Speed (SpeedHeader), the speed in decimal, and every
// /metrics/{instance} the gauge basin_sim_speed (SpeedMetric): a simulated deployment announces its
// speed so that what reads it converts its rates and windows; a real engine sends neither.
//
// Non-streaming answers carry x-basin-sim-prompt-tokens and x-basin-sim-cached-tokens headers;
// streaming ones carry x-basin-sim-prompt-tokens. Errors have OpenAI's shape (Anthropic's,
// {"type":"error","error":{"type","message"}}, on /v1/messages),
// {"error":{"message","type","param","code"}}, with param naming the offending field: 400 for bad
// requests, 404, 405 (with Allow), 409 (session busy, or ended while its call was in flight), 413
// (body over Options.MaxBodyBytes) and 503 (the simulator stopped). The /metrics paths answer in
// the Prometheus text format (see package enginemetrics).
package serve
