// Package lender decides how much decode KV memory a prefill/decode-disaggregated deployment lends
// to its prefix cache, and hands that decision to whatever switch the deployment has.
//
// # Why lend
//
// KV lending is the Basin paper's second lever against the cache-pressure trap. When a model call
// finishes, its decode instance holds the KV of the whole conversation; by default it frees it.
// With lending on, decode keeps it and lends its idle memory to the prefix cache: the session's
// next call, after its tool run, finds its prefix there instead of recomputing it. At most half of
// decode memory is lent, and decode takes lent pages back when a new call needs memory. Lending
// widens the cache exactly where the trap bites — in cache-first deployments, where the working set
// reaches the cache knee before decode memory fills. In decode-first deployments decode memory is
// the binding limit, and lending would only hand out memory that is about to be reclaimed.
//
// # The decision
//
// Decide is pure: it reads Inputs (per decode instance: capacity, free, reserved and lent tokens
// and requests waiting for decode KV; whether the deployment is cache-first, and the caller's
// reason) and the Lender's own state (on or off, since when), and never reads a clock — the
// daemon, the simulator's virtual clock and tests drive the same code.
//
// Each decode instance's grant is min(free + lent − headroom, MaxFraction × capacity), never
// negative, and zero while requests wait for its KV or while lending is off. Lent tokens count as
// free because they are the grant being used: a grant that shrank as it filled would switch
// itself off.
//
// The switch has hysteresis on two axes. On the pressure axis, the hottest decode instance's
// reserved fraction must be at most PressureOff to switch lending on, and reaching PressureOn (or
// requests waiting for decode KV for WaitingHold) switches it off. On the time axis, a toggle
// waits MinDwell after the previous one — except the reclaim for memory pressure, which is
// immediate: decode memory is what serves calls, and lent KV only saves recomputation. A
// decode-first verdict switches lending off after the dwell; it says where the deployment will
// bind as load grows, not that decode is short now (the pressure rule covers that).
//
// A reading that cannot be a decode instance (no capacity, negative or non-finite tokens) makes
// that instance's grant zero and keeps lending from switching on, but never switches it off by
// itself: as in package detector, a gap can delay a change but not cause one.
//
// # Backends
//
// A Backend applies a Decision. SimBackend switches the simulator's lending; AffinityBackend
// switches the gateway's sticky decode routing, which on SGLang lets the decode radix cache keep
// serving a session's prefix; HTTPBackend and ExecBackend hand the decision to an operator's own
// switch (an endpoint, or a script such as a blue/green switch between two engine launch
// configurations), because no engine has a public "lend decode KV to prefill" control today.
// Backends are level-triggered: Apply receives the whole desired state and applying the same
// decision twice equals applying it once, so a caller may apply every decision and a failed or
// missed apply is repaired by the next one. README.md says what each backend does on a real engine.
package lender
