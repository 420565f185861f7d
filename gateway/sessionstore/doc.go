// Package sessionstore keeps the admission leader's session table in Redis or Valkey, so that
// when the leader of a replicated gateway dies, the replica that takes its lease starts from the
// same live sessions, budget and memories instead of treating every session in flight as new.
//
// Only the leader writes, and every write goes through its lease's fenced write (a Fencer:
// *lease.Campaign): a leader paused past its term cannot overwrite what its successor wrote. Reads
// (Load, Leader, Replicas) are plain commands.
//
// The table is a hash of sessions (field = session id, value = the JSON of an
// admission.LiveSession) and a hash of the rest (meta, retry and shed memories), so that a change
// rewrites one field, not the table. Three kinds of write keep it current:
//
//   - Save writes the whole state as a diff against what this Store last wrote or loaded.
//     The leader saves periodically, and at 100,000 live sessions of which a few hundred change
//     per period, rewriting all of them every time would spend the store on nothing; the diff
//     costs a map lookup and a comparison per session on the gateway. Sessions go in chunks of at
//     most MaxChunk per script call, a few calls in flight at once (see MaxChunk for why).
//   - Admit makes one admission durable before the session's first call is forwarded, so that a
//     leader dying right after admitting cannot have it forgotten. A write costs a round trip
//     (and, with appendfsync always, a disk flush); admissions arrive in bursts of thousands a
//     second, so concurrent Admits are group-committed: those arriving while a write is in
//     flight share the next one. Under load a write carries many admissions; alone, an Admit
//     costs one round trip as before.
//   - End deletes ended sessions the same way (optional: the next Save deletes them too).
//
// Save and the group commits race: a Save's state may have been exported before an Admit that
// completes first. Save therefore leaves alone every session an Admit or End touched since the
// previous Save built its diff, and settles it at the next Save, so a durable admission is never
// undone by an older export; an ended session is deleted at most one Save later. This holds when
// each Save's state is exported after the previous Save returned, as in a periodic loop that
// exports and then saves.
package sessionstore
