// Package trace owns basin's trace format: it reads and writes recorded agent sessions, the
// output the gateway records (Recorder), the input the simulator replays, the file `basin trace
// import` converts to and `basin predictor train` learns from. It sits outside the gateway and the
// simulator so that both, and the tools between them, use one definition of a row and one writer.
//
// A session is a chain of model calls. What a serving deployment feels from it is, per call, the
// prompt length, how much of the prompt repeats what was already sent (and so could be a prefix-cache
// hit), the output length, and the idle gap before the call while a tool ran or a person thought.
// During that gap the session's context sits in the KV cache doing nothing, which is where cache
// pressure comes from. Call and Session keep exactly that, nothing of the text.
//
// # Basin trace format
//
// Basin's own format is JSON Lines, one object per model call. FORMAT.md beside this file has the
// full description; in short:
//
//	{"session_id":"s1","call":0,"start":"2026-06-01T05:40:20.151Z","end":"2026-06-01T05:40:31.647Z","prompt_tokens":32272,"reused_tokens":27217,"output_tokens":931,"gap_before_s":0,"turn":"first","tenant":"acme","task_chars":146}
//	{"session_id":"s1","call":1,"start":"2026-06-01T05:40:50.938Z","prompt_tokens":35740,"output_tokens":1016}
//
// The fields:
//
//   - session_id (string, required, non-empty) and call (int, required, 0-based) place the row.
//     A session's calls must be 0, 1, 2, ... with no gap or repeat, but rows of several sessions
//     may be interleaved and out of order; readers sort.
//   - start (RFC 3339, required) is when the call was sent; end (RFC 3339, optional) when its last
//     token arrived, not before start.
//   - prompt_tokens (required, > 0), output_tokens (required, >= 0).
//   - reused_tokens (optional, 0 <= reused <= prompt): leading prompt tokens sent before. For
//     call 0 these are tokens shared with other sessions (default 0); for a later call, the part
//     of the previous call's prompt and output that this prompt repeats (default
//     min(prompt, previous prompt + previous output)).
//   - gap_before_s (optional, seconds, >= 0): idle time before the call. Default: start minus the
//     previous call's end, clamped at 0, or start minus the previous start when that end is
//     unknown. Always 0 for call 0.
//   - turn (optional): "first" for call 0 (its default), "tool" (the default after) or "human"
//     when a person, not a tool, ended the gap.
//   - tenant (string) and task_chars (int, >= 0), optional, describe the session; rows that state
//     them must agree.
//
// Any other field is an error, so that a misspelt optional field is not silently replaced by its
// default. Blank lines are skipped; a line may be at most MaxLineBytes long. Every error names the
// line and the field, as in "line 7: prompt_tokens: must be > 0, got 0". WriteBasin writes every
// field explicitly (end only when known), timestamps in UTC with as many fractional digits as
// needed and gaps as exact decimal seconds, so that ReadBasin gives back exactly what was written.
//
// # Recording
//
// WriteRow writes one call as one line, with the same encoding as WriteBasin, for writers that
// learn of calls as they finish; a Row may leave reused_tokens to the reader's default when the
// writer does not see prefixes. Recorder appends such rows to a file from many goroutines and
// hashes session ids and tenants with a salt of its own, so a recorded trace holds no raw id,
// tenant or text.
//
// # TraceLab import
//
// ReadTraceLab imports the normalized round traces of the TraceLab project (real Claude Code and
// Codex sessions). A row's input_tokens_total becomes Prompt, prefix_tokens (the provider's cache
// read) Reused, output_tokens plus reasoning_output_tokens Output. Start is the row's first timing
// event, End its last reasoning, text or tool_call event. A round opened by a user message is a
// human turn whose gap runs from the previous round's end to the message; otherwise the gap is the
// tools' run time, from the previous round's last tool call to the last tool result of this round.
//
// Summarize and WriteStats give a quick look at a trace before replaying it.
package trace
