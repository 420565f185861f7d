package sim

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
)

// Deployment describes the simulated serving deployment: the prefill pool with its prefix cache,
// the decode pool with its KV memory, the link between them, KV lending and how instances are
// added. Every field is a model parameter; docs/simulator.md gives each default and where it comes
// from.
type Deployment struct {
	Prefill  PrefillPool  `yaml:"prefill"`
	Decode   DecodePool   `yaml:"decode"`
	Transfer Transfer     `yaml:"transfer"`
	Lending  LendingState `yaml:"lending"`
	Scaling  Scaling      `yaml:"scaling"`
}

// Scaling describes what adding an engine instance costs (Control.SetInstances): the instances
// named in Prefill and Decode are up when the run starts; one asked for later holds its GPU from
// the moment it is asked for and serves only after StartupDelay, with an empty cache.
type Scaling struct {
	// StartupDelay is from asking for an instance to its serving: pod start, weight loading,
	// compilation, CUDA-graph capture, warm-up. Zero (unset) means DefaultStartupDelay.
	StartupDelay time.Duration `yaml:"startup_delay"`
}

// DefaultStartupDelay is a cold start of the presets' engine, Qwen3.6-35B-A3B with FP8 weights
// (≈ 35 GB) on one H100, with the container image and the weights already on the node. Summed from
// phases measured in public vLLM reports: container start 16 s, weights 18 s for 21.8 GiB (≈ 27 s
// for 35 GB) and a first torch.compile of 43 s for this very model (vLLM issue #44881, whose
// 210 s of warm-up came from FP4 kernels its GPU lacks and does not carry over to FP8 on an H100),
// and ≈ 60 s of CUDA-graph capture for an FP8 model on H100s (vLLM issue #19824): ≈ 2.5 minutes,
// rounded up to 3 for the readiness probe and the router picking the instance up. Pulling the
// image, downloading the weights or provisioning a node would add minutes; docs/simulator.md has
// the arithmetic.
const DefaultStartupDelay = 3 * time.Minute

// PrefillPool is the prefill side: instances, their GPU prefix cache, the optional host tier and
// the cost of a prefill.
type PrefillPool struct {
	Instances int `yaml:"instances"`
	// CacheTokens is the GPU radix-cache capacity of one instance (SGLang max_total_num_tokens).
	CacheTokens int `yaml:"cache_tokens"`
	// HostCacheTokens is the HiCache host tier of one instance; 0 disables it.
	HostCacheTokens int `yaml:"host_cache_tokens"`
	// LoadBackTokensPerSec is the host→GPU load-back bandwidth of the host tier.
	LoadBackTokensPerSec float64 `yaml:"load_back_tokens_per_sec"`
	// TokensPerSec is the prefill compute rate for uncached tokens at zero context.
	TokensPerSec float64 `yaml:"tokens_per_sec"`
	// ContextScaleTokens makes a prefill slower as its context grows (attention cost):
	// time = overhead + u/TokensPerSec × (1 + (hit + u/2)/ContextScaleTokens).
	ContextScaleTokens float64 `yaml:"context_scale_tokens"`
	// OverheadMs is the fixed cost of one prefill batch.
	OverheadMs float64 `yaml:"overhead_ms"`
}

// DecodePool is the decode side.
//
// A decode step reads, from the GPU's HBM, the weights the batch's tokens route to, the KV of
// every running sequence and each sequence's fixed-size state; decode is memory-bound, so the step
// takes those bytes over the achievable bandwidth, plus a fixed overhead:
//
//	step = step_overhead_ms + (weight_bytes + expert_weight_bytes × coverage(n)
//	        + kv_bytes_per_token × batch context tokens + state_bytes_per_seq × n)
//	        / (hbm_gb_per_sec × 1e9 × bandwidth_efficiency)
//
// where coverage(n) = 1 − (1 − experts_per_token/experts)^n is the expected share of experts a
// batch of n sequences routes to (uniform, independent routing). docs/simulator.md derives the
// presets' values from the served model and the GPUs.
//
// The older empirical form, step_base_ms + step_per_ktoken_ms × context/1000 + step_per_seq_ms × n,
// still works when hbm_gb_per_sec is 0; setting both is an error.
type DecodePool struct {
	Instances int `yaml:"instances"`
	// KVTokens is the KV memory of one instance, in tokens.
	KVTokens int `yaml:"kv_tokens"`

	// HBMGBPerSec is the peak memory bandwidth of one decode GPU (GB/s, 10^9 bytes); > 0 selects
	// the bandwidth-derived step.
	HBMGBPerSec float64 `yaml:"hbm_gb_per_sec"`
	// BandwidthEfficiency is the fraction of peak bandwidth decode kernels achieve (in (0, 1]).
	BandwidthEfficiency float64 `yaml:"bandwidth_efficiency"`
	// WeightBytes are the weights every step reads whatever the batch: attention and linear
	// attention projections, shared experts, router, LM head.
	WeightBytes float64 `yaml:"weight_bytes"`
	// ExpertWeightBytes are the routed experts' weights; a step reads the share its tokens route
	// to. With Experts 0 they are read in full (a dense model: put everything in WeightBytes).
	ExpertWeightBytes float64 `yaml:"expert_weight_bytes"`
	// Experts and ExpertsPerToken describe the routing (256 and 8 for the paper's model).
	Experts         int `yaml:"experts"`
	ExpertsPerToken int `yaml:"experts_per_token"`
	// KVBytesPerToken is the attention KV of one context token (all layers, K and V).
	KVBytesPerToken float64 `yaml:"kv_bytes_per_token"`
	// StateBytesPerSeq is what a step reads and writes per sequence whatever its length (the
	// recurrent and convolution state of linear-attention layers).
	StateBytesPerSeq float64 `yaml:"state_bytes_per_seq"`
	// StepOverheadMs is the part of a step that moves no bytes worth counting: scheduling, kernel
	// launches, sampling.
	StepOverheadMs float64 `yaml:"step_overhead_ms"`

	// StepBaseMs, StepPerKTokenMs and StepPerSeqMs are the empirical step formula, used only when
	// HBMGBPerSec is 0: base + perKToken × (batch context tokens / 1000) + perSeq × batch size.
	StepBaseMs      float64 `yaml:"step_base_ms"`
	StepPerKTokenMs float64 `yaml:"step_per_ktoken_ms"`
	StepPerSeqMs    float64 `yaml:"step_per_seq_ms"`
}

// bandwidthModel reports whether the decode step is derived from bandwidth (else the empirical
// formula).
func (q DecodePool) bandwidthModel() bool { return q.HBMGBPerSec != 0 }

// expertCoverage is the expected share of routed experts a batch of n sequences reads in one step.
func (q DecodePool) expertCoverage(n int) float64 {
	if q.Experts <= 0 {
		return 1
	}
	return 1 - math.Pow(1-float64(q.ExpertsPerToken)/float64(q.Experts), float64(n))
}

// StepBytes is what one decode step reads from HBM for a batch of n sequences holding tokens of
// context (bandwidth model only).
func (q DecodePool) StepBytes(n int, tokens int64) float64 {
	return q.WeightBytes + q.ExpertWeightBytes*q.expertCoverage(n) + q.KVBytesPerToken*float64(tokens) +
		q.StateBytesPerSeq*float64(n)
}

// Transfer is the prefill→decode KV link, also used by lending write-backs.
type Transfer struct {
	LatencyMs    float64 `yaml:"latency_ms"`
	TokensPerSec float64 `yaml:"tokens_per_sec"`
}

// LendingState switches KV lending: decode keeps the KV of a finished call, up to MaxFraction of
// its memory, and writes the missing part of a prefix back to prefill instead of recomputing it.
type LendingState struct {
	Enabled     bool    `yaml:"enabled"`
	MaxFraction float64 `yaml:"max_fraction"`
}

// Validate reports the first field that cannot describe a deployment.
func (d Deployment) Validate() error {
	var errs []error
	pos := func(name string, v float64) {
		if !(v > 0) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s: must be > 0, got %v", name, v))
		}
	}
	nonNeg := func(name string, v float64) {
		if !(v >= 0) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s: must be ≥ 0, got %v", name, v))
		}
	}
	pos("deployment.prefill.instances", float64(d.Prefill.Instances))
	pos("deployment.prefill.cache_tokens", float64(d.Prefill.CacheTokens))
	nonNeg("deployment.prefill.host_cache_tokens", float64(d.Prefill.HostCacheTokens))
	if d.Prefill.HostCacheTokens > 0 {
		pos("deployment.prefill.load_back_tokens_per_sec", d.Prefill.LoadBackTokensPerSec)
	}
	pos("deployment.prefill.tokens_per_sec", d.Prefill.TokensPerSec)
	pos("deployment.prefill.context_scale_tokens", d.Prefill.ContextScaleTokens)
	nonNeg("deployment.prefill.overhead_ms", d.Prefill.OverheadMs)
	pos("deployment.decode.instances", float64(d.Decode.Instances))
	pos("deployment.decode.kv_tokens", float64(d.Decode.KVTokens))
	errs = append(errs, d.Decode.validateStep())
	nonNeg("deployment.transfer.latency_ms", d.Transfer.LatencyMs)
	pos("deployment.transfer.tokens_per_sec", d.Transfer.TokensPerSec)
	if f := d.Lending.MaxFraction; !(f >= 0 && f <= 1) {
		errs = append(errs, fmt.Errorf("deployment.lending.max_fraction: must be in [0, 1], got %v", f))
	}
	if d.Scaling.StartupDelay < 0 {
		errs = append(errs, fmt.Errorf("deployment.scaling.startup_delay: must be ≥ 0 (0: the default, %v), got %v",
			DefaultStartupDelay, d.Scaling.StartupDelay))
	}
	return errors.Join(errs...)
}

// validateStep checks the decode step's parameters: the bandwidth model's when hbm_gb_per_sec is
// set, else the empirical formula's; a file mixing both is refused, because one of them would be
// silently ignored.
func (q DecodePool) validateStep() error {
	var errs []error
	bad := func(name, want string, v any) {
		errs = append(errs, fmt.Errorf("deployment.decode.%s: must be %s, got %v", name, want, v))
	}
	finite := func(v float64) bool { return !math.IsInf(v, 0) && !math.IsNaN(v) }
	if !q.bandwidthModel() {
		if !(q.StepBaseMs > 0) || !finite(q.StepBaseMs) {
			bad("step_base_ms", "> 0 (or describe the hardware with hbm_gb_per_sec and the fields that go with it)", q.StepBaseMs)
		}
		if !(q.StepPerKTokenMs >= 0) || !finite(q.StepPerKTokenMs) {
			bad("step_per_ktoken_ms", "≥ 0", q.StepPerKTokenMs)
		}
		if !(q.StepPerSeqMs >= 0) || !finite(q.StepPerSeqMs) {
			bad("step_per_seq_ms", "≥ 0", q.StepPerSeqMs)
		}
		return errors.Join(errs...)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"step_base_ms", q.StepBaseMs}, {"step_per_ktoken_ms", q.StepPerKTokenMs}, {"step_per_seq_ms", q.StepPerSeqMs}} {
		if f.v != 0 {
			errs = append(errs, fmt.Errorf("deployment.decode.%s: the empirical step formula cannot be combined "+
				"with hbm_gb_per_sec (the bandwidth-derived step); set hbm_gb_per_sec: 0 to use it, or remove %s",
				f.name, f.name))
		}
	}
	if !(q.HBMGBPerSec > 0) || !finite(q.HBMGBPerSec) {
		bad("hbm_gb_per_sec", "> 0", q.HBMGBPerSec)
	}
	if !(q.BandwidthEfficiency > 0 && q.BandwidthEfficiency <= 1) {
		bad("bandwidth_efficiency", "in (0, 1]", q.BandwidthEfficiency)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"weight_bytes", q.WeightBytes}, {"expert_weight_bytes", q.ExpertWeightBytes},
		{"kv_bytes_per_token", q.KVBytesPerToken}, {"state_bytes_per_seq", q.StateBytesPerSeq},
		{"step_overhead_ms", q.StepOverheadMs}} {
		if !(f.v >= 0) || !finite(f.v) {
			bad(f.name, "≥ 0", f.v)
		}
	}
	if q.WeightBytes+q.ExpertWeightBytes <= 0 {
		bad("weight_bytes", "> 0 (with expert_weight_bytes: a step reads the model's weights)", q.WeightBytes)
	}
	switch {
	case q.Experts < 0:
		bad("experts", "≥ 0", q.Experts)
	case q.Experts == 0 && q.ExpertsPerToken != 0:
		bad("experts_per_token", "0 when experts is 0 (a dense model)", q.ExpertsPerToken)
	case q.Experts > 0 && (q.ExpertsPerToken < 1 || q.ExpertsPerToken > q.Experts):
		bad("experts_per_token", fmt.Sprintf("in [1, experts = %d]", q.Experts), q.ExpertsPerToken)
	}
	return errors.Join(errs...)
}

// prefillTime is the service time of one prefill: u uncached tokens computed on top of hit cached
// ones, overlapped layer by layer with hostLoad tokens loaded from the host tier and lent tokens
// written back from decode (both overlap with compute, as HiCache and layer-wise transfer do).
func (d *Deployment) prefillTime(u, hit, hostLoad, lent int) time.Duration {
	p := d.Prefill
	compute := float64(u) / p.TokensPerSec * (1 + (float64(hit)+float64(u)/2)/p.ContextScaleTokens)
	wait := compute
	if hostLoad > 0 {
		wait = math.Max(wait, float64(hostLoad)/p.LoadBackTokensPerSec)
	}
	if lent > 0 {
		wait = math.Max(wait, float64(lent)/d.Transfer.TokensPerSec)
	}
	return seconds(p.OverheadMs/1000 + wait)
}

// transferTime is the prefill→decode KV transfer of a prompt.
func (d *Deployment) transferTime(prompt int) time.Duration {
	return seconds(d.Transfer.LatencyMs/1000 + float64(prompt)/d.Transfer.TokensPerSec)
}

// stepTime is one decode step for a batch of n sequences holding tokens of context.
func (d *Deployment) stepTime(n int, tokens int64) time.Duration {
	q := &d.Decode
	if q.bandwidthModel() {
		return seconds(q.StepOverheadMs/1000 + q.StepBytes(n, tokens)/(q.HBMGBPerSec*1e9*q.BandwidthEfficiency))
	}
	return seconds((q.StepBaseMs + q.StepPerKTokenMs*float64(tokens)/1000 + q.StepPerSeqMs*float64(n)) / 1000)
}

// StepTime is one decode step of this deployment for a batch of n sequences holding tokens of
// context: what the simulator charges, exported so tools and docs can tabulate it.
func (d Deployment) StepTime(n int, tokens int64) time.Duration { return d.stepTime(n, tokens) }

// UnloadedTime is the session's duration alone on this deployment: every call finds its previous
// prompt cached, nothing queues, decode runs a batch of one. It uses the same cost functions as
// the run itself.
func (d *Deployment) UnloadedTime(spec SessionSpec) time.Duration {
	var t time.Duration
	cached := 0
	for i, c := range spec.Calls {
		t += c.GapBefore
		hit := min(c.Prompt, max(min(spec.Shared, c.Prompt), min(cached, c.Reused)))
		if i == 0 {
			hit = min(spec.Shared, c.Prompt)
		}
		if hit > d.Prefill.CacheTokens {
			hit = d.Prefill.CacheTokens
		}
		t += d.prefillTime(c.Prompt-hit, hit, 0, 0) + d.transferTime(c.Prompt)
		for k := 0; k < c.Output; k += 64 {
			n := min(64, c.Output-k)
			t += time.Duration(n) * d.stepTime(1, int64(c.Prompt+k))
		}
		cached = c.Prompt
	}
	return t
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// deploymentPresets are the hardware setups of the Basin evaluation. Values and their sources are
// tabulated in docs/simulator.md; change them there too.
var deploymentPresets = map[string]Deployment{
	// One H100 prefill and one H100 decode, as in the paper's reference run (Qwen3.6-35B-A3B).
	// Cache, prefill cost and transfer follow the calibrated prototype in the project's
	// simulator-calibration notes, which reproduced the paper's 1P1D observations.
	"paper-1p1d-h100": {
		Prefill: PrefillPool{
			Instances: 1, CacheTokens: 560_000, LoadBackTokensPerSec: 300_000,
			TokensPerSec: 24_000, ContextScaleTokens: 256_000, OverheadMs: 3,
		},
		Decode:   qwen36Decode(1, 800_000, 3350),
		Transfer: Transfer{LatencyMs: 120, TokensPerSec: 1_000_000},
		Lending:  LendingState{MaxFraction: 0.5},
	},
	// One H200 prefill and three H200 decode, the paper's hardware testbed. H200 has 141 GB
	// against H100's 80 GB: with the same weights the KV pool is about 1.9× larger; compute is
	// the same, so prefill speed is kept.
	"paper-1p3d-h200": {
		Prefill: PrefillPool{
			Instances: 1, CacheTokens: 1_250_000, LoadBackTokensPerSec: 300_000,
			TokensPerSec: 24_000, ContextScaleTokens: 256_000, OverheadMs: 3,
		},
		Decode:   qwen36Decode(3, 1_500_000, 4800),
		Transfer: Transfer{LatencyMs: 120, TokensPerSec: 1_000_000},
		Lending:  LendingState{MaxFraction: 0.5},
	},
}

// qwen36Decode is a decode pool serving the paper's model, Qwen3.6-35B-A3B, with FP8 weights
// (one GPU per instance: bf16 weights, ≈ 70 GB, would leave an 80 GB H100 no room for KV) and a
// bf16 KV cache, on GPUs of the given peak HBM bandwidth. docs/simulator.md has the arithmetic:
// 40 layers of which 10 use attention (2 KV heads × 256) and 30 Gated DeltaNet (float32 state,
// SGLang's default), 256 experts with 8 routed per token.
func qwen36Decode(instances, kvTokens int, hbmGBPerSec float64) DecodePool {
	return DecodePool{Instances: instances, KVTokens: kvTokens,
		HBMGBPerSec: hbmGBPerSec, BandwidthEfficiency: 0.7,
		WeightBytes: 2.45e9, ExpertWeightBytes: 32.2e9, Experts: 256, ExpertsPerToken: 8,
		KVBytesPerToken: 20_480, StateBytesPerSeq: 128.8e6, StepOverheadMs: 3}
}

// DeploymentPreset returns a copy of a named deployment preset.
func DeploymentPreset(name string) (Deployment, error) {
	d, ok := deploymentPresets[name]
	if !ok {
		return Deployment{}, fmt.Errorf("unknown deployment preset %q (known: %v)", name, DeploymentPresetNames())
	}
	return d, nil
}

// DeploymentPresetNames lists the presets in order.
func DeploymentPresetNames() []string {
	names := make([]string, 0, len(deploymentPresets))
	for n := range deploymentPresets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// SLO is the paper's goodput definition: a session is good when it completes within Slowdown × its
// unloaded time and at least TPOTFraction of its decode steps take at most TPOTMs.
type SLO struct {
	Slowdown     float64 `yaml:"slowdown"`
	TPOTMs       float64 `yaml:"tpot_ms"`
	TPOTFraction float64 `yaml:"tpot_fraction"`
}

// DefaultSLO is the Basin paper's: 4× unloaded time, 95% of decode steps within 50 ms.
func DefaultSLO() SLO { return SLO{Slowdown: 4, TPOTMs: 50, TPOTFraction: 0.95} }

// Validate reports a field that cannot describe an SLO.
func (s SLO) Validate() error {
	switch {
	case !(s.Slowdown >= 1):
		return fmt.Errorf("slo.slowdown: must be ≥ 1, got %v", s.Slowdown)
	case !(s.TPOTMs > 0):
		return fmt.Errorf("slo.tpot_ms: must be > 0, got %v", s.TPOTMs)
	case !(s.TPOTFraction >= 0 && s.TPOTFraction <= 1):
		return fmt.Errorf("slo.tpot_fraction: must be in [0, 1], got %v", s.TPOTFraction)
	}
	return nil
}
