package experiment

import (
	"fmt"
	"github.com/basin-dev/basin/sim/harness"
	"sync"

	"github.com/basin-dev/basin/sim"
)

// GridDeployment is one point of the risk-validation grid.
type GridDeployment struct {
	Name       string         `json:"name"`
	Deployment sim.Deployment `json:"-"`
	Workload   *sim.Synthetic `json:"-"`
	CacheK     int            `json:"prefill_cache_ktokens"`
	DecodeK    int            `json:"decode_kv_ktokens_per_instance"`
	Decodes    int            `json:"decode_instances"`
	ToolMedian float64        `json:"tool_median_seconds"`
}

// RiskGrid is the grid the risk rule is validated on: 3 prefill cache sizes (400K, 650K, 1M) × 2
// decode KV sizes per instance (150K, 400K) × 1 or 2 decode instances × 3 tool-time medians (3, 6,
// 12 s) = 36 deployments around the paper's 1P1D H100 preset, with the terminal-bench workload.
// The decode sizes are small enough that about as many deployments are decode-first as
// cache-first (21 and 15 in the simulator), like the paper's 17 and 19: on a one-sided grid a rule
// that always answered "cache-first" would score well.
func RiskGrid() ([]GridDeployment, error) {
	base, err := sim.DeploymentPreset("paper-1p1d-h100")
	if err != nil {
		return nil, err
	}
	var out []GridDeployment
	for _, cache := range []int{400, 650, 1000} {
		for _, kv := range []int{150, 400} {
			for _, decodes := range []int{1, 2} {
				for _, tool := range []float64{3, 6, 12} {
					w, err := sim.SyntheticWorkload("terminal-bench")
					if err != nil {
						return nil, err
					}
					w.ToolTime.Median = tool
					d := base
					d.Prefill.CacheTokens = cache * 1000
					d.Decode.KVTokens = kv * 1000
					d.Decode.Instances = decodes
					out = append(out, GridDeployment{Name: fmt.Sprintf("C%dK-D%dx%dK-tool%gs", cache, decodes, kv, tool),
						Deployment: d, Workload: w, CacheK: cache, DecodeK: kv, Decodes: decodes, ToolMedian: tool})
				}
			}
		}
	}
	return out, nil
}

// GridResult is the rule's prediction and the simulator's ground truth for one deployment.
type GridResult struct {
	GridDeployment
	Shape     harness.WorkloadShape `json:"shape"`
	Predicted string                `json:"predicted"`
	CacheN    float64               `json:"predicted_cache_limit_sessions"`
	DecodeN   float64               `json:"predicted_decode_limit_sessions"`
	Truth     GroundTruth           `json:"truth"`
	Correct   bool                  `json:"correct"`
}

// Predictor is the risk rule under test: from the deployment and the workload's shape, which
// limit binds first and at how many sessions.
type Predictor func(dep sim.Deployment, sh harness.WorkloadShape) (binding string, cacheN, decodeN float64)

// ValidateRisk runs the grid, two deployments at a time.
func ValidateRisk(grid []GridDeployment, predict Predictor, seed uint64) ([]GridResult, error) {
	out := make([]GridResult, len(grid))
	errs := make([]error, len(grid))
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i, g := range grid {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sh := harness.Shape(g.Deployment, g.Workload, seed, 2000)
			binding, cn, dn := predict(g.Deployment, sh)
			// Scan in steps of about a twentieth of the smaller predicted limit, at least 1.
			step := max(1, int(min(cn, dn)/20))
			truth, err := MeasureGroundTruth(g.Deployment, g.Workload, seed, step, int(4*max(cn, dn))+20)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", g.Name, err)
				return
			}
			out[i] = GridResult{GridDeployment: g, Shape: sh, Predicted: binding, CacheN: cn, DecodeN: dn,
				Truth: truth, Correct: binding == truth.Binding}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
