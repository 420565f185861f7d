package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// AutoscalerParams set the utilisation-based autoscaler, the baseline basin's scaling is measured
// against: what a deployment gets from the Kubernetes Horizontal Pod Autoscaler fed with engine
// metrics through KEDA, as NVIDIA Dynamo's load-based planner and llm-d's autoscaling guides set it
// up. Decode scales on KV usage, prefill on queued requests. DefaultAutoscaler gives the peers'
// documented values; docs/simulator.md lists each with its source.
type AutoscalerParams struct {
	// DecodeKVTarget is the mean KV usage (sglang:token_usage, used ÷ total tokens) the decode
	// instances are scaled to: an HPA Value target.
	DecodeKVTarget float64
	// PrefillQueueTarget is the queued requests per prefill instance (sglang:num_queue_reqs) the
	// prefill instances are scaled to: an HPA AverageValue target.
	PrefillQueueTarget float64
	// Prefill and Decode bound each role's instance count (minReplicas, maxReplicas).
	Prefill, Decode ScaleBounds
	// SyncPeriod is how often the HPA computes a desired count.
	SyncPeriod time.Duration
	// PollingInterval is how often the metrics are read: KEDA's scaler polling, its value
	// served to the HPA in between.
	PollingInterval time.Duration
	// Tolerance: the HPA leaves the count alone while metric ÷ target is within 1 ± Tolerance.
	Tolerance float64
	// ScaleDownWindow: a scale-down goes only to the highest count recommended over this window
	// (the HPA's scale-down stabilisation). Scale-up has no window.
	ScaleDownWindow time.Duration
	// ScaleUpPods, ScaleUpPercent and ScaleUpPeriod are the HPA's default scale-up policies: in any
	// ScaleUpPeriod the count may grow by ScaleUpPods instances or ScaleUpPercent per cent,
	// whichever allows more. Scale-down is not rate-limited (the default 100% per period).
	ScaleUpPods    int
	ScaleUpPercent float64
	ScaleUpPeriod  time.Duration
}

// ScaleBounds are a role's floor and ceiling.
type ScaleBounds struct {
	Min, Max int
}

// DefaultAutoscaler returns the baseline's parameters, each a peer's documented default.
func DefaultAutoscaler() AutoscalerParams {
	return AutoscalerParams{
		// llm-d's workload-variant autoscaler counts a replica saturated at 80% KV usage
		// (kvCacheThreshold: 0.80); Dynamo's load planner keeps decode between 50% and 90%.
		DecodeKVTarget: 0.8,
		// Dynamo's load planner adds a prefill worker above 5 queued requests per worker
		// (prefill_queue_scale_up_threshold 5.0); llm-d's queueLengthThreshold is 5 too.
		PrefillQueueTarget: 5,
		// The HPA's minReplicas defaults to 1; Dynamo's planner defaults to a budget of 8 GPUs,
		// one per instance here.
		Prefill: ScaleBounds{Min: 1, Max: 8},
		Decode:  ScaleBounds{Min: 1, Max: 8},
		// kube-controller-manager --horizontal-pod-autoscaler-sync-period and
		// --horizontal-pod-autoscaler-tolerance defaults.
		SyncPeriod: 15 * time.Second,
		Tolerance:  0.1,
		// KEDA's ScaledObject pollingInterval default.
		PollingInterval: 30 * time.Second,
		// The HPA's default behavior: scale-down stabilisation 300 s; scale-up by 4 pods or
		// 100% per 15 s, whichever is more, with no stabilisation.
		ScaleDownWindow: 5 * time.Minute,
		ScaleUpPods:     4,
		ScaleUpPercent:  100,
		ScaleUpPeriod:   15 * time.Second,
	}
}

// Validate names the first parameter out of range.
func (p AutoscalerParams) Validate() error {
	var errs []error
	pos := func(name string, ok bool, v any) {
		if !ok {
			errs = append(errs, fmt.Errorf("autoscaler.%s: must be > 0, got %v", name, v))
		}
	}
	if !(p.DecodeKVTarget > 0 && p.DecodeKVTarget <= 1) {
		errs = append(errs, fmt.Errorf("autoscaler.decode_kv_target: must be in (0, 1] (a usage), got %v", p.DecodeKVTarget))
	}
	pos("prefill_queue_target", p.PrefillQueueTarget > 0 && !math.IsInf(p.PrefillQueueTarget, 0), p.PrefillQueueTarget)
	pos("sync_period", p.SyncPeriod > 0, p.SyncPeriod)
	pos("polling_interval", p.PollingInterval > 0, p.PollingInterval)
	pos("scale_up_period", p.ScaleUpPeriod > 0, p.ScaleUpPeriod)
	if !(p.Tolerance >= 0 && p.Tolerance < 1) {
		errs = append(errs, fmt.Errorf("autoscaler.tolerance: must be in [0, 1), got %v", p.Tolerance))
	}
	if p.ScaleDownWindow < 0 {
		errs = append(errs, fmt.Errorf("autoscaler.scale_down_window: must be ≥ 0, got %v", p.ScaleDownWindow))
	}
	switch {
	case p.ScaleUpPods < 0:
		errs = append(errs, fmt.Errorf("autoscaler.scale_up_pods: must be ≥ 0, got %d", p.ScaleUpPods))
	case !(p.ScaleUpPercent >= 0) || math.IsInf(p.ScaleUpPercent, 0):
		errs = append(errs, fmt.Errorf("autoscaler.scale_up_percent: must be ≥ 0, got %v", p.ScaleUpPercent))
	case p.ScaleUpPods == 0 && p.ScaleUpPercent == 0:
		errs = append(errs, errors.New("autoscaler.scale_up_pods: must be > 0 when scale_up_percent is 0 (else nothing scales up)"))
	}
	for _, b := range []struct {
		name string
		b    ScaleBounds
	}{{"prefill", p.Prefill}, {"decode", p.Decode}} {
		if b.b.Min < 1 || b.b.Max < b.b.Min {
			errs = append(errs, fmt.Errorf("autoscaler.%s: need 1 ≤ min ≤ max, got min %d max %d", b.name, b.b.Min, b.b.Max))
		}
	}
	return errors.Join(errs...)
}

// UtilisationAutoscaler is the baseline autoscaler: the HPA algorithm on each role, every
// SyncPeriod,
//
//	desired = ceil(current × metric ÷ target)
//
// left at current while metric ÷ target is within the tolerance, then stabilised (a fall goes
// only to the highest desired count of the last ScaleDownWindow), rate-limited upwards and bounded.
// Decode's metric is the mean KV usage over the decode instances that report metrics, a Value
// target, so current is the running (ready) instances, as the HPA counts ready pods for it;
// prefill's is the queued requests summed over the prefill instances, an AverageValue target,
// which makes the count ceil(sum ÷ target) whatever current is. It reads what a Prometheus
// scrape of the engines would (Control.Stats) and acts through Control.SetInstances. It is not
// safe for concurrent use; one autoscaler serves one run.
type UtilisationAutoscaler struct {
	p     AutoscalerParams
	roles [2]hpaRole

	nextPoll, nextSync time.Duration
	polled             bool
}

// hpaRole is the HPA state of one role: its last metric, recent recommendations (for the
// stabilisation window) and recent scale-ups (for the rate limit).
type hpaRole struct {
	metric float64
	recs   []timedCount
	// changes are the scale events of the last ScaleUpPeriod, signed.
	changes []timedCount
}

type timedCount struct {
	at time.Duration
	n  int
}

// NewUtilisationAutoscaler checks the parameters and makes an autoscaler.
func NewUtilisationAutoscaler(p AutoscalerParams) (*UtilisationAutoscaler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &UtilisationAutoscaler{p: p}, nil
}

// Controller runs the autoscaler in a simulation: every tick polls the metrics or syncs, or both,
// when they are due.
func (a *UtilisationAutoscaler) Controller() *Controller {
	return &Controller{Every: gcd(a.p.SyncPeriod, a.p.PollingInterval), Tick: a.Tick}
}

func gcd(x, y time.Duration) time.Duration {
	for y != 0 {
		x, y = y, x%y
	}
	return x
}

// Tick polls the metrics if a poll is due and syncs if a sync is due (both at the first tick).
// Controllers that combine it with others call it at their own ticks, which must fall on the
// polling and sync times to be exact.
func (a *UtilisationAutoscaler) Tick(now time.Duration, c Control) {
	if !a.polled || now >= a.nextPoll {
		a.poll(c)
		a.polled = true
		a.nextPoll = now + a.p.PollingInterval
	}
	if now >= a.nextSync {
		a.sync(now, c)
		a.nextSync = now + a.p.SyncPeriod
	}
}

// poll reads the metrics: mean decode KV usage, total queued prefill requests, over the instances
// that report metrics.
func (a *UtilisationAutoscaler) poll(c Control) {
	var usage, queued float64
	decodes := 0
	for _, st := range c.Stats() {
		switch st.Role {
		case RoleDecode:
			if st.MaxTotalTokens > 0 {
				usage += float64(st.UsedTokens) / float64(st.MaxTotalTokens)
				decodes++
			}
		case RolePrefill:
			queued += float64(st.Queued)
		}
	}
	if decodes > 0 {
		a.roles[roleDecode].metric = usage / float64(decodes)
	}
	a.roles[rolePrefill].metric = queued
}

// sync runs the HPA's computation for each role and applies its result.
func (a *UtilisationAutoscaler) sync(now time.Duration, c Control) {
	for _, r := range []struct {
		role   Role
		i      int
		bounds ScaleBounds
	}{{RolePrefill, rolePrefill, a.p.Prefill}, {RoleDecode, roleDecode, a.p.Decode}} {
		running, starting := c.Instances(r.role)
		current := running + starting
		h := &a.roles[r.i]
		var proposal int
		if r.i == roleDecode {
			proposal = hpaValue(current, running, h.metric, a.p.DecodeKVTarget, a.p.Tolerance)
		} else {
			proposal = hpaAverageValue(current, h.metric, a.p.PrefillQueueTarget, a.p.Tolerance)
		}
		desired := h.normalize(now, current, proposal, r.bounds, a.p)
		if desired != current {
			c.SetInstances(r.role, desired)
			h.changes = append(h.changes, timedCount{at: now, n: desired - current})
		}
	}
}

// hpaValue is the HPA's count for a Value target (the metric is one number for the whole
// target): current when metric ÷ target is within 1 ± tolerance, else ceil(ratio × ready).
func hpaValue(current, ready int, metric, target, tolerance float64) int {
	ratio := metric / target
	if math.Abs(ratio-1) <= tolerance {
		return current
	}
	return int(math.Ceil(ratio * float64(ready)))
}

// hpaAverageValue is the HPA's count for an AverageValue target (the metric is a total to spread
// at target per instance): current when total ÷ (target × current) is within 1 ± tolerance, else
// ceil(total ÷ target).
func hpaAverageValue(current int, total, target, tolerance float64) int {
	if math.Abs(total/(target*float64(current))-1) <= tolerance {
		return current
	}
	return int(math.Ceil(total / target))
}

// normalize turns a proposal into the count to set, as the HPA's behaviours do: it records the
// proposal, takes the highest of the window's proposals for a fall (the lowest of an empty
// scale-up window is the proposal itself), limits a rise to the scale-up policies and bounds the
// result.
func (h *hpaRole) normalize(now time.Duration, current, proposal int, b ScaleBounds, p AutoscalerParams) int {
	h.recs = append(h.recs, timedCount{at: now, n: proposal})
	cut := 0
	for cut < len(h.recs) && h.recs[cut].at <= now-p.ScaleDownWindow && h.recs[cut].at < now {
		cut++
	}
	h.recs = h.recs[cut:]
	down := proposal
	for _, r := range h.recs {
		down = max(down, r.n)
	}
	desired := current
	if proposal > desired {
		desired = proposal // no scale-up stabilisation
	}
	desired = min(desired, down)
	// The scale-up policies limit the count relative to what it was at the start of the period:
	// what was added within it counts against the limit, what was removed for it.
	keep := h.changes[:0]
	start := current
	for _, c := range h.changes {
		if c.at > now-p.ScaleUpPeriod {
			start -= c.n
			keep = append(keep, c)
		}
	}
	h.changes = keep
	if desired > current {
		limit := max(start+p.ScaleUpPods, int(math.Ceil(float64(start)*(1+p.ScaleUpPercent/100))))
		desired = min(desired, max(limit, current))
	}
	return min(max(desired, b.Min), b.Max)
}
