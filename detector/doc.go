// Package detector turns the collector's snapshots into assessments: is an agent-serving
// deployment healthy, near its cache knee, drifting into the cache-pressure trap, trapped, or
// recovering — with the numbers behind the verdict, the fluid model's equilibria and how long until
// the trap at the current growth.
//
// # The failure it watches for
//
// A coding-agent session alternates model calls and tool runs, and every call re-sends the whole,
// growing conversation: it is cheap only while its prefix is still cached. The working set W is
// the sum of the contexts of all live sessions, tool-running ones included. While W stays under
// about 1.9 times the cache capacity C (the Basin paper's knee) the prefix hit rate sits on a high
// plateau; past it prefixes are evicted, calls recompute, calls take longer, sessions live longer,
// W grows further. The loop sustains itself: a ten-minute arrival spike can leave a deployment
// stuck long after arrivals return to normal. Utilisation, queue length and KV usage do not show it
// coming; the characteristic signal of this loop is the hit rate against the working set.
//
// # Inputs and blindness
//
// Step reads the seven signals Needs lists from a collector.Snapshot, and the snapshot's At is the
// step's time: the package never reads a clock, so the same code runs against the wall clock, the
// simulator's virtual clock and a synctest bubble. A signal that is stale or missing is never read
// as zero; nor is a value no healthy source produces (a cache of zero tokens, a hit rate of 1.3).
// Either makes the step blind: the state holds, the assessment names the signals in Blind and
// carries the numbers of the last complete step (ObservedAt), and every hold timer starts again —
// a condition must be seen continuously for its hold, so a gap can delay a transition but never
// cause one.
//
// The hit rate is not among the seven: a deployment with no traffic has no hit rate (a ratio of
// no tokens), and it is quiet, not blind. The prompt-token rate, its denominator, is; the hit rate
// is needed only while it is above zero.
//
// # Evidence: when a hit rate is a reading
//
// A window's hit rate counts — may move the state — only when it rests on enough traffic
// (Evidence): at least 20 calls finished in the window, at most half of them sessions' first
// calls (which miss by nature: their context was never cached), and prompt tokens of at least 5%
// of C. Two test sessions saying "hi" read a hit rate of 0.00 and prove nothing about the cache;
// a busy deployment, healthy or trapped, is far above every minimum (50–266 calls a minute, first
// calls at most 17%, at least 1.4 C of prompts a minute in the simulator's spike runs). Without
// a reading, drift and collapse by hit rate are false, and the conditions that need a good hit
// rate (leaving drifting or trapped, recovered) hold only while W fits under the pressure exit,
// 0.7 × knee·C: a deployment whose traffic stops while trapped goes through recovering back to
// healthy instead of holding trapped for as long as it is quiet.
//
// A collapse is a trap only where a trap can be: with W at or past DriftNear × knee·C (0.9), or,
// when W is the engines' KV estimate that cannot exceed C, with the cache at least 90% full — or
// in recovering, since the collapsed branch of the cache's hysteresis reaches below the knee. A
// collapse-level hit rate below that is a cold cache refilling (reasons say so). An engine
// restart — the collector sees its prefix-cache counters go back (Snapshot.CacheRestart) —
// empties its cache: the plateau must then be reached again for PlateauWarmup before a drop
// counts as drift, as after the detector's own start.
//
// # The knee
//
// The knee is where the hit rate leaves its plateau, as W/C. The best source is a calibration: an
// offline step-load (the paper's method) saved as a versioned JSON file (Calibration, strictly
// validated, unknown fields refused). FitKnee finds it on measured points: the plateau is the median
// hit rate of the lowest-W third of the points or of those below W/C 1, whichever set is larger;
// the knee is where the hit rate first falls more than PlateauTolerance below the plateau and stays
// there at the next point, interpolated between the two bracketing points. A single low point that
// the next one contradicts is noise. A curve that never drops gives a lower bound, flagged.
//
// Without a calibration the knee is learnt passively (Passive): each step's (W/C, hit) lands in a
// bin 0.05 wide, each bin a mean of its first 50 samples then an EWMA; once six bins have twenty
// samples each the same fit runs on the bin means. Until then the paper's 1.9 is used, flagged
// "default", while the plateau may already be learnt from the bins below 0.7 × the default knee.
// A fit with no drop raises the knee only if the plateau was seen beyond the default. Samples are
// not learnt while trapped or recovering: the cache has hysteresis (a collapsed deployment stays
// collapsed at working sets a healthy one serves well), and the collapsed branch is not the knee
// the deployment should be kept under. With a calibration the detector learns all the same, but
// judges by the calibration: what it learnt (LearntPoints) is what the daemon refits the knee on
// to rewrite a calibration the deployment has moved away from.
//
// # The fluid model
//
// The population of live sessions N follows dN/dt = λ − X(N)/K, with X(N) the model calls
// completed per second at population N and K the calls per session. X(N) rises with N while the
// cache holds and falls once it does not, so the curve X(N)/K crosses a given arrival rate λ twice:
// first upward, at a stable equilibrium the deployment settles at, then downward, at an unstable
// one. Past the unstable equilibrium the deployment completes fewer sessions than arrive and the
// population grows by itself: that point is the edge of the basin.
//
// Fluid learns X(N) online from (N, call rate) pairs, binned by N — one bin per session up to 20,
// then bins 5% wide, so a 10,000-session deployment has about 150 — each bin an EWMA of its N and
// its X. K is the ratio of long EWMAs (30 minutes) of the call and session completion rates, used
// once thirty sessions have completed, unless the calibration or an option fixes it. λ is the
// arrival rate smoothed with a 10-minute time constant: a spike shifts the equilibria gradually
// while it lasts, a burst barely moves them. The equilibria are the crossings of the learnt curve,
// interpolated linearly. A crossing interpolated across unobserved populations, or a falling side
// never observed at all, is estimated and bounded by the knee: the unstable N is at most the
// population whose working set reaches knee × C at the current mean context. When λ is above the
// curve up to its peak or the knee there is no equilibrium at all, and the assessment says so. The
// distance to the edge is Edge − N, and the time to the trap (Edge − N) / dN/dt while N grows,
// taking for dN/dt the larger of the model's λ − X(N)/K and the observed slope of N (a spike shows
// in the slope before it moves λ).
//
// # States
//
//	healthy ──W ≥ 0.8·knee·C, or arrivals above the peak completion rate, for 15 s──▶ pressure
//	pressure ──W ≤ 0.7·knee·C and arrivals under the peak for 15 s──▶ healthy
//	healthy, pressure ──hit < plateau − 0.05 for 3 min, or N rising with completions 10% under
//	                    arrivals (5-min averages), W ≥ 0.9·knee·C and hit < plateau − 0.025
//	                    for 2 min──▶ drifting
//	healthy, pressure, drifting, recovering ──hit < collapse with W ≥ 0.9·knee·C (recovering: any W)
//	                    for 30 s, or N past the unstable equilibrium for 30 s──▶ trapped
//	drifting ──no drift sign, hit ≥ collapse + 0.05, W < knee·C──▶ recovering
//	trapped ──hit ≥ collapse + 0.05, W < knee·C, N not past an observed edge──▶ recovering
//	recovering ──hit ≥ plateau − 0.03 for 5 min inside the state──▶ healthy if W ≤ 0.7·knee·C,
//	                    else pressure
//
// Arrivals above the peak session completion rate (the calibration's, or the learnt curve's once
// its falling side has been seen) mean the fluid model has no equilibrium at all: the population
// can only grow until it reaches the knee. That is the first sign of a spike that will trap the
// deployment, minutes before W nears the knee, so it enters pressure; it is not drift, because the
// cache has not yet said anything.
//
// Every transition without a hold of its own needs its condition for MinHold (15 s), so no state
// ever changes on one sample; every entry threshold differs from its exit. The collapse line is
// min(0.5, 0.6 × plateau): collapsed deployments hit 0.24–0.37 (paper and simulator), about 0.3 of
// their plateau, because only the shared prompt prefix still hits, while the lowest hit rate of a
// deployment that never collapsed is 0.81 (paper, 1P3D at 1.6–1.7× cache); 0.6 of the plateau
// separates the two for workloads with a lower plateau too, and 0.5 caps it when the plateau is
// high. A population past an unstable equilibrium that was only estimated counts towards trapped
// only while the hit rate corroborates it (below plateau − DriftDrop): an estimate alone does not
// trap, several signals do (Charapko). Recovered is judged by the hit rate, not by the load (the
// metastability literature: leaving the bad state needs a strong push, and a load back under the
// knee does not prove the cache came back). A recovery that leaves W in the pressure band ends in
// pressure rather than in a recovering state that never ends — under basin's own admission, which
// holds W near 0.9 × knee, that is the normal case.
//
// Each Transition carries reasons with numbers ("hit rate 0.41 < collapse 0.50 at W/C 2.10 ≥ 1.71
// for 30s"); each
// Assessment carries the transition's reasons, then the current readings and any condition
// building towards a transition with how long it has held.
//
// # Thresholds
//
// Every threshold is an Options field whose zero value takes a documented default; the Default…
// constants say where each comes from. From the Basin paper (an unverified summary, see the
// project's reference notes): the knee 1.9, the plateau 0.95, the drift-flow line at the
// reference budget 0.9 × knee. From basin's own design (not the paper): the pressure band
// 0.8/0.7, the drift drop 0.05 for 3 minutes, the collapse hold 30 s, the recovery tolerance
// 0.03 for 5 minutes, the plateau tolerance 0.05, the passive bin width 0.05 and the 10-minute λ.
// Chosen here, with the reason next to the constant: the evidence minimums, the collapse line, the 15 s MinHold, the
// 2-minute drift-flow hold and its 5-minute averages, the 1-minute overload hold, the plateau
// warm-up, the EWMA memories, the bin counts and the N bins.
//
// # Risk
//
// Risk applies the paper's classifier to a deployment's shape: the cache limit, knee × C ÷ mean
// context, against the decode-memory limit, decode KV ÷ mean context ÷ the fraction of live
// sessions in a call (SGLang reserves decode KV for calls still waiting for prefill, so those count
// as served). Whichever is smaller binds first; cache-first deployments are the ones the trap can
// reach. More decode instances and longer tool runs make cache-first more likely.
//
// # Concurrency
//
// A Detector serialises Step behind a mutex and keeps the last assessment for status readers
// (Last). The package starts no goroutine and reads no clock: the caller steps it with snapshots,
// whose At is the step's time (the daemon on its ticker, the simulator's harness in virtual time).
package detector
