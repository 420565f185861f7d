package harness

import (
	"math/rand/v2"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim"
)

// RiskOf applies the detector's risk rule (the code `basin risk` and the daemon run) to a
// simulated deployment and a workload's shape. The cache counted is the prefill GPU and host
// tiers; knee is W/C (0: the detector's default, the paper's 1.9).
func RiskOf(dep sim.Deployment, sh WorkloadShape, knee float64) (detector.RiskReport, error) {
	return detector.Risk(detector.RiskInputs{
		CacheTokens:     float64(dep.Prefill.CacheTokens * dep.Prefill.Instances),
		HostTokens:      float64(dep.Prefill.HostCacheTokens * dep.Prefill.Instances),
		DecodeKVTokens:  float64(dep.Decode.KVTokens),
		DecodeInstances: dep.Decode.Instances,
		MeanContext:     sh.MeanContext,
		ServedFraction:  sh.ServedFraction,
		KneeFactor:      knee,
	})
}

// DetectorRule is the risk rule under validation: the detector's Risk with the default knee.
func DetectorRule(dep sim.Deployment, sh WorkloadShape) (string, float64, float64) {
	r, err := RiskOf(dep, sh, 0)
	if err != nil {
		return "error: " + err.Error(), 0, 0
	}
	return r.Binding, r.CacheLimitSessions, r.DecodeLimitSessions
}

// WorkloadShape is what the risk rule needs to know of a workload on a deployment: the mean
// context of a live session and the fraction of live sessions being served (in a call rather than
// running a tool).
type WorkloadShape struct {
	MeanContext    float64 `json:"mean_context_tokens"`
	MeanCall       float64 `json:"mean_call_seconds"`
	MeanTool       float64 `json:"mean_tool_seconds"`
	ServedFraction float64 `json:"served_fraction"`
	CallsPerSess   float64 `json:"calls_per_session"`
}

// Shape estimates a workload's shape on a deployment from n sessions drawn from it: the context
// is averaged over each session's lifetime (each call's prompt held for its call and the tool run
// after it); call times are the unloaded ones.
func Shape(dep sim.Deployment, w sim.Workload, seed uint64, n int) WorkloadShape {
	rng := rand.New(rand.NewPCG(seed^0x5AFE, 0x5A9E))
	var ctxTime, lifetime, call, tool, calls float64
	for range n {
		s := w.Session(rng)
		var gaps time.Duration
		for _, c := range s.Calls {
			gaps += c.GapBefore
		}
		total := dep.UnloadedTime(s)
		busy := (total - gaps).Seconds()
		per := busy / float64(len(s.Calls))
		for i, c := range s.Calls {
			held := per
			if i+1 < len(s.Calls) {
				held += s.Calls[i+1].GapBefore.Seconds()
			}
			ctxTime += float64(c.Prompt) * held
		}
		lifetime += total.Seconds()
		call += busy
		tool += gaps.Seconds()
		calls += float64(len(s.Calls))
	}
	sh := WorkloadShape{MeanContext: ctxTime / lifetime, MeanCall: call / calls, CallsPerSess: calls / float64(n)}
	if calls > float64(n) {
		sh.MeanTool = tool / (calls - float64(n))
	}
	sh.ServedFraction = call / (call + tool)
	return sh
}
