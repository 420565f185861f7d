// Package gateway is `basin gateway`: a reverse proxy for the OpenAI (chat completions,
// completions, Responses) and Anthropic (Messages) APIs that admits whole agent sessions against a
// token budget, so that the working set of the deployment behind it — the
// contexts of all live sessions, whose prefixes must stay cached between calls — stays out of the
// cache-pressure trap.
//
// A session is identified by a header (x-session-id and the other agents' spellings), else by the
// body's own field (metadata.session_id, prompt_cache_key, user or Anthropic's metadata.user_id),
// else by its Responses previous_response_id chain (chain.go). Its first call asks the admission core (package admission,
// which holds the whole policy) whether the session may start: admitted calls go upstream at
// once; queued ones are held until the core admits them, for at most max_queue_wait, and then get
// 503 with Retry-After; a tenant over its quota gets 429; a shed session gets 529 — each in the
// called API's error format, with x-should-retry telling the SDKs whether retrying can help and a
// Retry-After bounded where it can (errors.go). Once admitted,
// a session's calls always pass: a session is never cut for budget. Its context is tracked from
// the responses' usage (prompt + output tokens, in each API's fields), estimated from the request size before the
// first response. A session ends with x-session-end: true, with POST /v1/sessions/{id}/end, or
// after idle_timeout without a call.
//
// Responses, streamed or not, pass through byte for byte (httputil.ReverseProxy flushing every
// write); the gateway only observes them for usage. The admin API (bearer token, separate
// listener) shows the state and lets the basin daemon change the budget, shed queued sessions and
// switch sticky decode routing (X-SMG-Routing-Key); /metrics beside it exports the working set,
// the queue and the admission counters that basin's collector reads. Finished calls can be
// recorded as a basin trace (hashed ids, no text), and the live-session table survives restarts
// through a state file and its journal, where each admission is fsync'd before its first call
// is forwarded, so that not even a crash between two saves forgets an admitted session.
//
// With a store, several gateways share one budget as replicas of one deployment (package
// replication). Every point where a replica differs from a gateway alone is one interface the
// gateway asks, replicator: a gateway alone answers it itself (single), a replica through its
// admission leader.
//
// See README.md in this directory for the endpoints, the metrics and the configuration.
package gateway
