package sim

import (
	"fmt"
	"time"
)

// Policy names the engine behaviour a run assumes. These are baselines: what a deployment does
// without basin. basin's own policies plug in through Gate and Controller and live outside this
// package.
type Policy string

// Engine policies.
const (
	// PolicyNone is SGLang's default: FCFS scheduling, LRU radix cache on the GPU only.
	PolicyNone Policy = "none"
	// PolicyHiCache adds SGLang's hierarchical cache: a host-memory tier holding prefixes evicted
	// from the GPU, loaded back at host bandwidth.
	PolicyHiCache Policy = "hicache"
	// PolicyContinuum pins a session's KV across its tool calls with a time-to-live and orders
	// queues by session (program-level FCFS), as in the Continuum paper.
	PolicyContinuum Policy = "continuum"
)

// Policies lists the engine policies in a stable order.
func Policies() []Policy { return []Policy{PolicyNone, PolicyHiCache, PolicyContinuum} }

// ParsePolicy checks a policy name.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies() {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q (known: none, hicache, continuum)", s)
}

// ContinuumParams set the Continuum-like baseline. The paper chooses a TTL from the reload cost
// and the distribution of tool-call durations; we pin for the TTLQuantile of the tool durations
// observed so far (bounded by TTLMin and TTLMax) and pin only when a reload would cost more than
// MinReload of prefill time. docs/simulator.md states the mapping and its sources.
type ContinuumParams struct {
	TTLQuantile float64
	TTLMin      time.Duration
	TTLMax      time.Duration
	MinReload   time.Duration
	// Window is how many recent tool durations feed the quantile.
	Window int
}

// DefaultContinuum returns the baseline's parameters.
func DefaultContinuum() ContinuumParams {
	return ContinuumParams{TTLQuantile: 0.9, TTLMin: time.Second, TTLMax: 120 * time.Second,
		MinReload: 50 * time.Millisecond, Window: 1000}
}

// Action is a gate's verdict on a session.
type Action int

// Gate verdicts.
const (
	// Admit lets the session send its first call now.
	Admit Action = iota
	// Hold keeps it waiting at the gate; a later Poll releases or refuses it.
	Hold
	// Reject refuses it (queue timeout, quota): it counts as a failed session.
	Reject
	// Shed drops a waiting session because capacity is truly short: a failed session too.
	Shed
)

// SessionInfo is what a gate knows of an arriving session: what a real gateway sees on the first
// call, plus the true peak for oracle experiments.
type SessionInfo struct {
	ID          int64
	Arrival     time.Duration
	FirstPrompt int
	TaskChars   int
	// Class is the arrival stream ("base", "spike", "extra-0", …).
	Class string
	// TruePeak is the session's real peak context. Only oracle policies may use it.
	TruePeak int
	// SignalNoise is SessionSpec.SignalNoise: per-session noise for noisy-oracle predictors,
	// which blend it with TruePeak into a feature of known rank correlation with the peak (the
	// stand-in for task text the synthetic workloads do not have). Only such predictors may use it.
	SignalNoise float64
}

// Verdict is a gate's answer to an arrival.
type Verdict struct {
	Action Action
	// Priority orders the session in the engine's queues when Options.PriorityQueues is set;
	// lower runs first.
	Priority time.Duration
}

// Release is a later decision on a held session.
type Release struct {
	ID       int64
	Action   Action
	Priority time.Duration
}

// Gate is the admission hook a session gateway fills. The simulator tells it about arrivals and
// progress and asks it, after each change and at every control tick, which held sessions may go.
// The simulator holds no admission logic of its own.
type Gate interface {
	Arrive(now time.Duration, s SessionInfo) Verdict
	// CallStart is a live session's later call (not its first, which Arrive covers) reaching the
	// gateway with its prompt: the conversation has grown by the tool's output since the last
	// answer, and a gateway sees that in the call's body before any usage comes back. It reports
	// whether the call goes on to the engines now; false holds it at the gateway until a Release
	// with Action Admit for the session (a hold of an admitted session's calls: it stays live).
	CallStart(now time.Duration, id int64, promptTokens int) bool
	CallDone(now time.Duration, id int64, contextTokens int)
	SessionDone(now time.Duration, id int64)
	Poll(now time.Duration) []Release
}

// Control is the simulator seen by a controller: what it can read and the levers it can pull.
type Control interface {
	Stats() []InstanceStats
	Observe() Observation
	SetLending(enabled bool, maxFraction float64)
	// SetInstances makes n (at least 1) the role's running plus starting instances; see
	// Sim.SetInstances for what adding and removing an instance does.
	SetInstances(role Role, n int)
	// Instances reports the role's running instances and those still starting.
	Instances(role Role) (running, starting int)
}

// Controller runs every Every of simulated time, as a daemon's loop would.
type Controller struct {
	Every time.Duration
	Tick  func(now time.Duration, c Control)
}

// Observation is the simulator's ground truth at one instant, for tests and timelines; a real
// controller reads InstanceStats and the gateway instead.
type Observation struct {
	Now          time.Duration
	LiveSessions int
	// HeldSessions are sessions waiting at the gate for their first call; HeldCalls live
	// sessions whose next call the gate holds.
	HeldSessions     int
	HeldCalls        int
	WorkingSetTokens int64
	CacheCapacity    int64
	CallsCompleted   int64
	Lending          LendingState
}
