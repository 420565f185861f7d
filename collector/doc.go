// Package collector turns the /metrics endpoints of inference engines (SGLang, vLLM) and of
// basin's session gateway into a Snapshot of the signals basin's consumers declare: working set,
// cache capacity, windowed prefix-cache hit rate, decode KV, TTFT quantiles, queue depths and the
// gateway's admission state.
//
// Two paths lead to the same signals. Run scrapes every target each interval over HTTP (text
// exposition format only, bounded in time, size and concurrency). Ingest, IngestGathered and
// IngestText take metric families directly, with the caller's timestamp, so that the simulator's
// virtual-time harness computes signals with exactly the code a deployment uses.
//
// Every signal carries a freshness State. A signal is OK when all of its inputs are recent, Stale
// when its oldest input is older than StaleAfter intervals (a target that stops answering keeps
// its last good data until then), and Missing when it was never computed. Missing is never
// reported as zero: Snapshot.Get returns ok false for anything not OK.
//
// Rates and quantiles are computed from counter and histogram-bucket deltas over a sliding
// window per target. A counter that decreases means the engine restarted: that target's window
// restarts from the post-reset sample, so a restart yields neither a negative rate nor a spike.
// When a windowed signal cannot be computed (no traffic in the window, or a target's window was
// just restarted) the signal keeps its last value with its old timestamp, so it turns Stale on
// its own instead of flapping to a made-up number.
//
// The README next to this file tabulates every signal with the metrics it is derived from, per
// engine and version, and the choices made where engines disagree.
package collector
