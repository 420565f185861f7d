package experiment

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/basin-dev/basin/sim"
)

// Limit names which capacity a deployment runs out of first as its live sessions grow.
const (
	CacheFirst  = "cache-first"
	DecodeFirst = "decode-first"
)

// GroundTruth is what the simulator shows a deployment running into when the number of live
// sessions grows: the population at which the prefix hit rate leaves its plateau, and the one at
// which decode memory fills up (requests queue for decode KV).
type GroundTruth struct {
	Binding string `json:"binding"`
	// CacheN and DecodeN are the smallest populations measured at which each limit showed; +Inf
	// when it never did in the range scanned (null in JSON).
	CacheN  float64 `json:"-"`
	DecodeN float64 `json:"-"`
	Plateau float64 `json:"plateau_hit_rate"`
}

// MarshalJSON writes unreached limits as null.
func (g GroundTruth) MarshalJSON() ([]byte, error) {
	fin := func(v float64) *float64 {
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		Binding string   `json:"binding"`
		CacheN  *float64 `json:"cache_limit_sessions"`
		DecodeN *float64 `json:"decode_limit_sessions"`
		Plateau *float64 `json:"plateau_hit_rate"`
	}{g.Binding, fin(g.CacheN), fin(g.DecodeN), fin(g.Plateau)})
}

// Thresholds of the ground-truth measurement: the cache limit is reached when the hit rate is
// more than CacheDrop below its low-load plateau; the decode limit when, on average over the
// measurement, decode KV is at least DecodeFull reserved and calls wait for it.
const (
	CacheDrop  = 0.10
	DecodeFull = 0.90
)

// MeasureGroundTruth holds N sessions live (closed loop) for growing N until one limit shows, and
// reports which came first. Populations step by step from 2; each is simulated for warmup +
// measure of virtual time.
func MeasureGroundTruth(dep sim.Deployment, w sim.Workload, seed uint64, step, maxN int) (GroundTruth, error) {
	const warmup, measure = 15 * time.Minute, 15 * time.Minute
	gt := GroundTruth{CacheN: math.Inf(1), DecodeN: math.Inf(1), Plateau: math.NaN()}
	for n := 2; n <= maxN; n += step {
		hit, decodeFull, queued, err := closedLoop(dep, w, seed, n, warmup, measure)
		if err != nil {
			return gt, err
		}
		if math.IsNaN(gt.Plateau) {
			gt.Plateau = hit
		}
		if math.IsInf(gt.CacheN, 1) && hit < gt.Plateau-CacheDrop {
			gt.CacheN = float64(n)
		}
		if math.IsInf(gt.DecodeN, 1) && decodeFull >= DecodeFull && queued > 0.5 {
			gt.DecodeN = float64(n)
		}
		if !math.IsInf(gt.CacheN, 1) || !math.IsInf(gt.DecodeN, 1) {
			break
		}
	}
	switch {
	case gt.CacheN <= gt.DecodeN && !math.IsInf(gt.CacheN, 1):
		gt.Binding = CacheFirst
	case !math.IsInf(gt.DecodeN, 1):
		gt.Binding = DecodeFirst
	default:
		return gt, fmt.Errorf("no limit reached up to %d sessions", maxN)
	}
	return gt, nil
}

// closedLoop runs n sessions in closed loop and returns the window's hit rate, mean decode KV
// reservation fraction and mean decode pre-allocation queue length.
func closedLoop(dep sim.Deployment, w sim.Workload, seed uint64, n int, warmup, measure time.Duration) (hit, full, queued float64, err error) {
	var fullSum, queueSum float64
	samples := 0
	o := sim.Options{Seed: seed, Deployment: dep, ClosedLoop: n, ClosedWorkload: w, Duration: warmup + measure,
		MeasureFrom: warmup, MeasureTo: warmup + measure, NoDrain: true,
		Controller: &sim.Controller{Every: 10 * time.Second, Tick: func(now time.Duration, c sim.Control) {
			if now < warmup {
				return
			}
			var used, kv, q float64
			for _, st := range c.Stats() {
				if st.Role == sim.RoleDecode {
					used += float64(st.UsedTokens)
					kv += float64(st.MaxTotalTokens)
					q += float64(st.PreallocQueue)
				}
			}
			fullSum += used / kv
			queueSum += q
			samples++
		}}}
	s, err := sim.New(o)
	if err != nil {
		return 0, 0, 0, err
	}
	r := s.Run()
	hit = math.NaN()
	if r.HitRateMeanWindow != nil {
		hit = *r.HitRateMeanWindow
	}
	if samples > 0 {
		full, queued = fullSum/float64(samples), queueSum/float64(samples)
	}
	return hit, full, queued, nil
}
