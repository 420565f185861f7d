package harness

import (
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
