// Package sim is a discrete-event simulator of an SGLang-style deployment with prefill/decode
// disaggregation serving coding-agent sessions. It is the instrument every basin number is
// measured with: no GPU is needed, an hour of traffic takes tens of milliseconds, and the same seed
// gives the same bytes.
//
// # Why it exists
//
// Agent sessions re-send their whole conversation on every call and live on the prefix cache.
// When the working set (the contexts of all live sessions, tool-running ones included) outgrows
// the cache, calls recompute, sessions live longer and the working set grows further: a short
// spike can leave a deployment stuck long after arrivals return to normal (the Basin paper's
// metastable failure). The simulator reproduces that loop mechanistically, from the parts that
// cause it, rather than scripting its outcome: an LRU prefix cache that does not protect queued
// requests, an FCFS prefill queue, decode memory reserved before prefill starts.
//
// # The model
//
// Sessions (SessionSpec) are sequences of calls; each call re-sends the previous prompt and output
// plus new tokens, then the session runs a tool for a while. Workload generators (Synthetic) and
// trace replay (Replay) produce them; Stream arrival processes (Poisson, with spikes and extra
// streams that can be killed) bring them in.
//
// A call's life: it reserves decode KV (the decode pre-allocation queue, in order), then waits in
// its prefill instance's queue; when it starts, its session's cached prefix is matched, the rest of
// the prompt is inserted (evicting unreferenced prefixes, least recently used first, tails first),
// and the prefill takes a time that grows with the uncached tokens and the context; the KV is
// transferred to decode, which advances every running request one token per step at a step time
// that grows with the batch. When the call finishes, decode frees its KV — or, with KV lending on,
// keeps it (up to a cap) to write the prefix back to prefill on the session's next call.
//
// Engine baselines are Policy values: SGLang's default, HiCache's host tier, and a Continuum-like
// scheduler that pins sessions' KV across tool calls. basin's own policies are not here: a Gate
// decides when sessions start, a Controller runs every few seconds with a Control to read the
// engines' stats, switch lending and add or remove engine instances (an added instance starts
// after Deployment.Scaling.StartupDelay with an empty cache; a removed one drains first). The
// simulator offers the mechanism; the policy code that ships plugs into it, so a comparison
// measures the real thing. UtilisationAutoscaler is the scaling baseline: the Kubernetes HPA on
// engine metrics, as the peers run it.
//
// # Clocks
//
// Time is a time.Duration since the start of the run. Run (or RunUntil) processes events in
// virtual time; `basin sim serve` (package sim/serve) advances the same model against the wall
// clock and feeds it calls through Submit. Results (Result, Minute) and per-instance engine stats
// (InstanceStats, exported under SGLang's metric names by sim/enginemetrics) come out of both.
//
// docs/simulator.md lists every parameter, its default and its source; docs/fidelity.md shows how
// closely the model reproduces the paper's observations.
package sim
