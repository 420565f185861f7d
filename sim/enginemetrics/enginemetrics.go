// Package enginemetrics exposes the simulator's engine instances as Prometheus metrics with
// SGLang's names, types, labels and HELP texts, so that basin's collector scrapes a simulated
// prefill/decode deployment exactly as it scrapes SGLang: one registry, and so one /metrics
// endpoint, per instance.
//
// Every scrape reads a fresh snapshot of sim.InstanceStats through a Source and turns it into
// constant metrics; the package keeps no state between scrapes. The simulator is single-threaded,
// so the package never calls into it: the caller supplies the Source and makes it safe.
//
// Labels follow current SGLang in PD mode. Scheduler families carry engine_type ("prefill" or
// "decode"), model_name, tp_rank, pp_rank and moe_ep_rank (the ranks are always "0": one
// simulated instance is one TP group); tokenizer families (token and request counters, latency
// histograms) carry engine_type and model_name. Newer SGLang also puts is_streaming on some
// tokenizer families; the simulator has no notion of streaming and leaves it out, as older SGLang
// versions do, so consumers must aggregate by name and not by exact label set.
//
// Deliberate differences from SGLang:
//
//   - sglang:cache_hit_rate is never exposed. SGLang sets it to the hit rate of the last prefill
//     batch (0 on decode), a point sample basin must never read (hit rates come from counter
//     deltas of sglang:prefill_effective_tokens_total); the simulator does not keep the last
//     batch's hit rate and refuses to fake one.
//   - KV that a decode instance lends back to prefill is reported as a storage-like tier:
//     cache_source="storage_lent" on sglang:cached_tokens_total and mode="storage_hit" on
//     sglang:prefill_effective_tokens_total.
//   - basin_sim_lent_tokens (decode) is the one series SGLang has no counterpart for: no SGLang
//     version lends decode KV, so it carries no sglang: prefix.
//   - Series SGLang has but the simulator does not model (gen_throughput, num_grammar_queue_reqs,
//     pending_prealloc_token_usage, kv_transfer_*, queue_time_seconds, utilization on decode, …)
//     are absent rather than zero.
package enginemetrics

import (
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/basin-dev/basin/sim"
)

// Source returns the current stats of every simulated instance. It is called once per scrape of
// each instance, possibly from several goroutines at once; the caller makes that safe (for
// example by taking the lock that guards the simulator — exclusively, since (*sim.Sim).Stats
// brings decode batches up to date and so writes to the simulator).
type Source func() []sim.InstanceStats

// DefaultModelName is the model_name label when Options.ModelName is empty.
const DefaultModelName = "basin-sim"

// Options configure the exported series.
type Options struct {
	// ModelName is the model_name label (SGLang's --served-model-name); empty means
	// DefaultModelName.
	ModelName string
}

// withDefaults fills empty fields.
func (o Options) withDefaults() Options {
	if o.ModelName == "" {
		o.ModelName = DefaultModelName
	}
	return o
}

// Validate reports an option NewCollector refuses, so that a bad option fails when the collector
// is built rather than on every scrape; zero fields stand for their defaults.
func (o Options) Validate() error {
	if o = o.withDefaults(); !utf8.ValidString(o.ModelName) {
		return fmt.Errorf("model name: not valid UTF-8: %q", o.ModelName)
	}
	return nil
}

// NewCollector returns a collector exposing the instance named instance (e.g. "prefill-0") from
// src. Each Collect calls src once; if src returns no instance with that name, the collector emits
// nothing (no zeros), as an engine that is not running exposes nothing.
func NewCollector(src Source, instance string, o Options) (prometheus.Collector, error) {
	if src == nil {
		return nil, errors.New("new collector: source is nil")
	}
	if instance == "" {
		return nil, errors.New("new collector: instance name is empty")
	}
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("new collector %s: %w", instance, err)
	}
	o = o.withDefaults()
	d, err := newDescs(o.ModelName)
	if err != nil {
		return nil, fmt.Errorf("new collector %s: %w", instance, err)
	}
	return &collector{src: src, instance: instance, d: d}, nil
}

// Registries builds one registry per instance name, each holding only that instance's collector,
// so every instance gets its own /metrics endpoint as real engines have. Instances of src whose
// names are not listed get no registry; a listed name src never returns gets a registry that
// gathers nothing.
func Registries(src Source, names []string, o Options) (map[string]*prometheus.Registry, error) {
	regs := make(map[string]*prometheus.Registry, len(names))
	for _, name := range names {
		if _, dup := regs[name]; dup {
			return nil, fmt.Errorf("registries: instance %q listed twice", name)
		}
		c, err := NewCollector(src, name, o)
		if err != nil {
			return nil, fmt.Errorf("registries: %w", err)
		}
		reg := prometheus.NewRegistry()
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registries: register %s: %w", name, err)
		}
		regs[name] = reg
	}
	return regs, nil
}

// Handler serves the metrics of g (one instance's registry) in the Prometheus text format, or in
// protobuf if the scraper asks for it. It never compresses (scrapes of a simulator are local) and
// logs nothing: a failed gather answers 500 with the error in the body.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{DisableCompression: true})
}
