package dashboards_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	grafprom "github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	promclient "github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/dashboards"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/enginemetrics"
)

// jsonDir holds the checked-in dashboards, relative to this package.
const jsonDir = "json"

func TestCheckedInJSONIsCurrent(t *testing.T) {
	ds, err := dashboards.All()
	require.NoError(t, err)
	require.Len(t, ds, 2)

	var want []string
	for _, d := range ds {
		name := dashboards.FileName(d)
		want = append(want, name)
		fresh, err := dashboards.Marshal(d)
		require.NoError(t, err)
		onDisk, err := os.ReadFile(filepath.Join(jsonDir, name))
		require.NoError(t, err, "dashboards/json/%s is missing: run `make dashboards`", name)
		if line, want, have, differ := firstDiff(string(fresh), string(onDisk)); differ {
			assert.Failf(t, "stale dashboard JSON", "dashboards/json/%s is stale: run `make dashboards` "+
				"(line %d: generated %q, checked in %q)", name, line, want, have)
		}
	}
	got, err := filepath.Glob(filepath.Join(jsonDir, "*.json"))
	require.NoError(t, err)
	for i := range got {
		got[i] = filepath.Base(got[i])
	}
	assert.ElementsMatch(t, want, got, "dashboards/json holds a file no dashboard writes (or lacks one): run `make dashboards` and remove stale files")
}

// firstDiff finds the first line where two texts differ.
func firstDiff(a, b string) (line int, la, lb string, differ bool) {
	if a == b {
		return 0, "", "", false
	}
	as, bs := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(as), len(bs)) {
		la, lb = "", ""
		if i < len(as) {
			la = as[i]
		}
		if i < len(bs) {
			lb = bs[i]
		}
		if la != lb || i >= len(as) || i >= len(bs) {
			return i + 1, la, lb, true
		}
	}
	return 0, "", "", true
}

func TestWriteAllIsDeterministic(t *testing.T) {
	ds, err := dashboards.All()
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "json") // WriteAll creates it
	for run := range 2 {
		require.NoError(t, dashboards.WriteAll(dir))
		files := readDir(t, dir)
		require.Len(t, files, len(ds))
		for _, d := range ds {
			want, err := dashboards.Marshal(d)
			require.NoError(t, err)
			have, ok := files[dashboards.FileName(d)]
			require.True(t, ok, "run %d: no %s", run, dashboards.FileName(d))
			if line, w, h, differ := firstDiff(string(want), have); differ {
				assert.Failf(t, "WriteAll wrote something else", "run %d, %s line %d: want %q, wrote %q",
					run, dashboards.FileName(d), line, w, h)
			}
			assert.True(t, strings.HasSuffix(have, "}\n"), "%s must end in a newline", dashboards.FileName(d))
			assert.True(t, strings.HasPrefix(have, "{\n  \""), "%s must be indented", dashboards.FileName(d))
		}
	}
}

func readDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = string(b)
	}
	return out
}

// Marshal writes <, > and & as themselves; the result must still mean what encoding/json wrote.
func TestMarshalKeepsMeaning(t *testing.T) {
	ds, err := dashboards.All()
	require.NoError(t, err)
	for _, d := range ds {
		ours, err := dashboards.Marshal(d)
		require.NoError(t, err)
		std, err := json.Marshal(d)
		require.NoError(t, err)
		var a, b any
		require.NoError(t, json.Unmarshal(ours, &a))
		require.NoError(t, json.Unmarshal(std, &b))
		assert.Equal(t, b, a, d.Uid)
		assert.NotContains(t, string(ours), `\u003e`)
	}

	// A string holding an escaped backslash before "u003e" must survive.
	d := dashboards.Dashboard{Uid: "x", Title: `a > b & c < d \u003e`}
	out, err := dashboards.Marshal(d)
	require.NoError(t, err)
	var back dashboards.Dashboard
	require.NoError(t, json.Unmarshal(out, &back))
	assert.Equal(t, d.Title, back.Title)
	assert.Contains(t, string(out), `"a > b & c < d \\u003e"`)
}

// loaded are the checked-in dashboards as the SDK's schema reads them: panels, variables,
// annotations and links decoded into its types and validated by its rules.
func loaded(t *testing.T) []dashboards.Dashboard {
	t.Helper()
	plugins.RegisterDefaultPlugins()
	var out []dashboards.Dashboard
	for _, uid := range []string{dashboards.OverviewUID, dashboards.EnginesUID} {
		b, err := os.ReadFile(filepath.Join(jsonDir, uid+".json"))
		require.NoError(t, err, "run `make dashboards`")
		// Not UnmarshalJSONStrict: in foundation-sdk v0.0.22 it silently drops every panel.
		var d dashboards.Dashboard
		require.NoError(t, json.Unmarshal(b, &d), uid)
		require.NoError(t, d.Validate(), uid)
		require.Equal(t, uid, d.Uid)
		require.Equal(t, dashboards.SchemaVersion, int(d.SchemaVersion), uid)
		out = append(out, d)
	}
	return out
}

// panels flattens top-level panels and those inside (collapsed) rows.
func panels(d dashboards.Dashboard) []dashboard.Panel {
	var out []dashboard.Panel
	for _, p := range d.Panels {
		switch {
		case p.Panel != nil:
			out = append(out, *p.Panel)
		case p.RowPanel != nil:
			out = append(out, p.RowPanel.Panels...)
		}
	}
	return out
}

func promQuery(t *testing.T, q variants.Dataquery) grafprom.Dataquery {
	t.Helper()
	switch v := q.(type) {
	case *grafprom.Dataquery:
		return *v
	case grafprom.Dataquery:
		return v
	}
	require.Failf(t, "not a Prometheus query", "%T", q)
	return grafprom.Dataquery{}
}

func TestPanelsRoundTrip(t *testing.T) {
	for _, d := range loaded(t) {
		ps := panels(d)
		require.NotEmpty(t, ps, d.Uid)
		ids := map[uint32]bool{}
		for _, p := range ps {
			require.NotNil(t, p.Title, "%s: a panel without a title", d.Uid)
			where := d.Uid + "/" + *p.Title
			require.NotNil(t, p.Id, where)
			assert.False(t, ids[*p.Id], "%s: id %d used twice", where, *p.Id)
			ids[*p.Id] = true
			require.NotNil(t, p.FieldConfig, where)
			assert.NotEmpty(t, deref(p.FieldConfig.Defaults.Unit), "%s: no unit", where)
			assert.NotEmpty(t, deref(p.Description), "%s: no description", where)
			require.NotNil(t, p.Datasource, where)
			assert.Equal(t, "${datasource}", deref(p.Datasource.Uid), where)
			switch o := p.Options.(type) {
			case *timeseries.Options:
				assert.True(t, o.Legend.ShowLegend, "%s: legend off", where)
			case *statetimeline.Options:
				assert.True(t, o.Legend.ShowLegend, "%s: legend off", where)
			default:
				assert.Failf(t, "unexpected panel options", "%s: %T", where, p.Options)
			}
			require.NotEmpty(t, p.Targets, where)
			refs := map[string]bool{}
			for _, q := range p.Targets {
				pq := promQuery(t, q)
				assert.NotEmpty(t, pq.Expr, where)
				assert.NotEmpty(t, deref(pq.LegendFormat), "%s: no legend format", where)
				ref := deref(pq.RefId)
				assert.NotEmpty(t, ref, where)
				assert.False(t, refs[ref], "%s: refId %s twice", where, ref)
				refs[ref] = true
			}
		}
		var vars []string
		for _, v := range d.Templating.List {
			vars = append(vars, v.Name)
		}
		assert.Contains(t, vars, "datasource", d.Uid)
		assert.Contains(t, vars, "job", d.Uid)
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// expr is one PromQL expression of a dashboard, with where it comes from.
type expr struct {
	where, text string
	selector    bool // a series selector (label_values' first argument), not an expression
}

var labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

func exprs(t *testing.T, d dashboards.Dashboard) []expr {
	t.Helper()
	var out []expr
	for _, p := range panels(d) {
		for _, q := range p.Targets {
			pq := promQuery(t, q)
			out = append(out, expr{where: fmt.Sprintf("%s/%s/%s", d.Uid, *p.Title, deref(pq.RefId)), text: pq.Expr})
		}
	}
	for _, a := range d.Annotations.List {
		require.NotNil(t, a.Expr, a.Name)
		out = append(out, expr{where: d.Uid + "/annotation " + a.Name, text: *a.Expr})
		require.NotNil(t, a.Target, a.Name)
		assert.Equal(t, *a.Expr, promQuery(t, a.Target).Expr, "%s: the annotation's target and expr differ", a.Name)
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		require.NotNil(t, v.Query, v.Name)
		require.NotNil(t, v.Query.String, v.Name)
		m := labelValuesRE.FindStringSubmatch(*v.Query.String)
		require.NotNil(t, m, "variable %s: want label_values(selector, label), got %s", v.Name, *v.Query.String)
		out = append(out, expr{where: d.Uid + "/variable " + v.Name, text: m[1], selector: true})
	}
	return out
}

// grafanaMacros are Grafana's interval and range variables, replaced by values of their kind.
var grafanaMacros = map[string]string{
	"__interval": "1m", "__rate_interval": "1m", "__range": "1h",
	"__interval_ms": "60000", "__rate_interval_ms": "60000", "__range_s": "3600", "__range_ms": "3600000",
}

var variableRE = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// substitute replaces Grafana's macros and the dashboard's own variables (by a value valid in a
// label matcher); anything else that looks like a variable is an error.
func substitute(text string, vars map[string]bool) (string, error) {
	var unknown []string
	out := variableRE.ReplaceAllStringFunc(text, func(m string) string {
		sub := variableRE.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		if v, ok := grafanaMacros[name]; ok {
			return v
		}
		if vars[name] {
			return "x"
		}
		unknown = append(unknown, m)
		return m
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("undefined variables %v", unknown)
	}
	if strings.Contains(out, "$") {
		return "", fmt.Errorf("a $ is left after substitution: %s", out)
	}
	return out, nil
}

// parsed is a dashboard expression after parsing: the metric names it reads and its selectors'
// matchers.
type parsed struct {
	expr
	names     []string
	selectors [][]*labels.Matcher
}

func parseAll(t *testing.T, d dashboards.Dashboard) []parsed {
	t.Helper()
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	p := parser.NewParser(parser.Options{})
	var out []parsed
	for _, e := range exprs(t, d) {
		text, err := substitute(e.text, vars)
		if !assert.NoError(t, err, e.where) {
			continue
		}
		r := parsed{expr: e}
		if e.selector {
			ms, err := p.ParseMetricSelector(text)
			if !assert.NoError(t, err, "%s: %s", e.where, text) {
				continue
			}
			r.selectors = append(r.selectors, ms)
			r.names = selectorNames(ms)
		} else {
			ast, err := p.ParseExpr(text)
			if !assert.NoError(t, err, "%s: %s", e.where, text) {
				continue
			}
			parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok {
					r.selectors = append(r.selectors, vs.LabelMatchers)
					r.names = append(r.names, selectorNames(vs.LabelMatchers)...)
				}
				return nil
			})
		}
		out = append(out, r)
	}
	return out
}

// selectorNames are the metric names a selector can match: its __name__ equality, or each name of
// a regexp that is a plain alternation of names. A pattern (basin_.+) names nothing.
func selectorNames(ms []*labels.Matcher) []string {
	var out []string
	for _, m := range ms {
		if m.Name != model.MetricNameLabel {
			continue
		}
		switch m.Type {
		case labels.MatchEqual:
			out = append(out, m.Value)
		case labels.MatchRegexp:
			alts := strings.Split(m.Value, "|")
			if !slices.ContainsFunc(alts, func(s string) bool { return !metricNameRE.MatchString(s) }) {
				out = append(out, alts...)
			}
		}
	}
	return out
}

var metricNameRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

func TestQueriesParse(t *testing.T) {
	n := 0
	for _, d := range loaded(t) {
		n += len(parseAll(t, d))
	}
	assert.Greater(t, n, 40, "expected every panel, annotation and variable query")
}

// Every series selector honours the dashboard's variables, so picking a job (or an instance or a
// pool) narrows every panel.
func TestSelectorsUseVariables(t *testing.T) {
	has := func(ms []*labels.Matcher, name string) bool {
		return slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return m.Name == name && m.Type == labels.MatchRegexp })
	}
	for _, d := range loaded(t) {
		for _, p := range parseAll(t, d) {
			if p.selector && strings.HasSuffix(p.where, "variable job") {
				continue // the job variable's own query
			}
			for _, ms := range p.selectors {
				assert.True(t, has(ms, "job"), "%s: a selector without job=~\"$job\": %s", p.where, p.text)
				if d.Uid != dashboards.EnginesUID || p.selector {
					continue
				}
				assert.True(t, has(ms, "instance"), "%s: a selector without instance=~\"$instance\": %s", p.where, p.text)
				if slices.ContainsFunc(ms, func(m *labels.Matcher) bool {
					return m.Name == model.MetricNameLabel && strings.HasPrefix(m.Value, "sglang:")
				}) {
					assert.True(t, has(ms, "engine_type"), "%s: an SGLang selector without engine_type=~\"$pool\": %s", p.where, p.text)
				}
			}
		}
	}
}

// Engine metric names from the project's engines reference (engines.md: SGLang §1.2–1.4, vLLM §2), as
// exposed. sglang:cache_hit_rate is deliberately absent: it is the last prefill batch's hit rate.
var (
	sglangMetrics = []string{
		"num_running_reqs", "num_queue_reqs", "num_grammar_queue_reqs", "gen_throughput", "decode_sum_seq_lens",
		"token_usage", "num_used_tokens", "kv_available_tokens", "kv_evictable_tokens", "kv_used_tokens",
		"max_total_num_tokens", "pending_prealloc_token_usage", "num_retracted_requests_total", "utilization",
		"realtime_tokens_total", "prefill_effective_tokens_total", "hicache_host_used_tokens", "hicache_host_total_tokens",
		"num_prefill_bootstrap_queue_reqs", "num_prefill_prealloc_queue_reqs", "num_prefill_inflight_queue_reqs",
		"num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs", "num_bootstrap_failed_reqs_total",
		"num_transfer_failed_reqs_total", "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total",
		"num_requests_total", "num_aborted_requests_total", "evicted_tokens_total", "load_back_tokens_total",
	}
	sglangHistograms = []string{
		"time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds", "queue_time_seconds",
	}
	vllmMetrics = []string{
		"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "gpu_cache_usage_perc",
		"prefix_cache_queries_total", "prefix_cache_hits_total", "gpu_prefix_cache_queries_total",
		"gpu_prefix_cache_hits_total", "external_prefix_cache_queries_total", "external_prefix_cache_hits_total",
		"num_preemptions_total", "prompt_tokens_total", "generation_tokens_total", "request_success_total",
		"cache_config_info",
	}
	vllmHistograms = []string{
		"time_to_first_token_seconds", "inter_token_latency_seconds", "time_per_output_token_seconds",
		"e2e_request_latency_seconds", "request_queue_time_seconds",
	}
)

// daemonMetrics are the daemon's own basin_* families (daemon needs a whole config to
// start, so they are listed); TestDaemonMetricsDocumented keeps the list honest against
// docs/daemon.md.
var daemonMetrics = []string{
	"basin_state", "basin_remediation_mode", "basin_working_set_over_cache", "basin_hit_rate",
	"basin_plateau_hit_rate", "basin_knee_ratio", "basin_live_sessions", "basin_equilibrium_stable_sessions",
	"basin_equilibrium_unstable_sessions", "basin_time_to_trap_seconds", "basin_budget_tokens",
	"basin_dry_run_budget_tokens", "basin_reference_budget_tokens", "basin_remediation_paused", "basin_lending_enabled",
	"basin_remediation_actions_total", "basin_slack_messages_total", "basin_cron_runs_total", "basin_cron_panics_total",
	"basin_blind", "basin_gateway_admin_up", "basin_dry_run", "basin_daemon_ready",
	"basin_spike_tolerance_ratio", "basin_spike_tolerance_sessions", "basin_spike_tolerance_alert_ratio",
	"basin_capacity_needed_instances", "basin_capacity_instances", "basin_capacity_binding", "basin_scale_desired_instances",
}

func TestDaemonMetricsDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "daemon.md"))
	require.NoError(t, err)
	var row string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| `GET /metrics`") {
			row = line
		}
	}
	require.NotEmpty(t, row, "docs/daemon.md has no GET /metrics row in its API table")
	for _, name := range daemonMetrics {
		assert.Regexp(t, "`"+regexp.QuoteMeta(name)+"[`{]", row, "%s is not in docs/daemon.md's metrics table", name)
	}
}

// recorder registers collectors on a real registry and records the families each one describes
// (Gather alone would miss vectors without children).
type recorder struct {
	reg   *promclient.Registry
	names map[string]bool
}

func newRecorder() *recorder {
	return &recorder{reg: promclient.NewRegistry(), names: map[string]bool{}}
}

var descNameRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*")`)

func (r *recorder) Register(c promclient.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	ch := make(chan *promclient.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := descNameRE.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("cannot read the name of %s", d)
		}
		name, err := strconv.Unquote(m[1])
		if err != nil {
			return err
		}
		r.names[name] = true
	}
	return nil
}

func (r *recorder) MustRegister(cs ...promclient.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(c promclient.Collector) bool { return r.reg.Unregister(c) }

// exported is every metric family basin or the engines export, and which of them are histograms.
func exported(t *testing.T) (names, histograms map[string]bool) {
	t.Helper()
	names, histograms = map[string]bool{}, map[string]bool{}
	gather := func(r *recorder) {
		mfs, err := r.reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			names[mf.GetName()] = true
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				histograms[mf.GetName()] = true
			}
		}
		for n := range r.names {
			names[n] = true
		}
	}

	// The gateway: the admission core's collector on its own, then a whole gateway (which
	// registers that collector again, plus its histograms and refusal counters).
	core, err := admission.New(admission.Options{Budget: 1_000_000})
	require.NoError(t, err)
	adm := newRecorder()
	require.NoError(t, adm.Register(admission.NewCollector(core, time.Now, nil)))
	gather(adm)
	cfg, err := gateway.ParseConfig([]byte("upstreams: [\"http://127.0.0.1:9\"]\nadmission:\n  budget_tokens: 1000000\n"))
	require.NoError(t, err)
	gw := newRecorder()
	_, err = gateway.New(gateway.Options{Config: cfg, Registerer: gw, Gatherer: gw.reg,
		Getenv: func(k string) string {
			if k == gateway.AdminTokenEnv {
				return "test-token"
			}
			return ""
		}})
	require.NoError(t, err)
	gather(gw)

	// The collector's basin_signal_* and basin_scrape_* families.
	col := newRecorder()
	_, err = collector.New(collector.Options{Registerer: col})
	require.NoError(t, err)
	gather(col)

	// The simulator's engines: one prefill and one decode instance, HiCache on.
	h := sim.Histogram{Bounds: []float64{0.1, 1}, Counts: []float64{1, 1, 0}, Sum: 0.6, Count: 2}
	stats := []sim.InstanceStats{
		{Role: sim.RolePrefill, Name: "prefill-0", MaxTotalTokens: 1000, HostTotalTokens: 2000, TTFT: h, ITL: h, E2E: h},
		{Role: sim.RoleDecode, Name: "decode-0", MaxTotalTokens: 1000, LentTokens: 10, TTFT: h, ITL: h, E2E: h},
	}
	for _, inst := range []string{"prefill-0", "decode-0"} {
		c, err := enginemetrics.NewCollector(func() []sim.InstanceStats { return stats }, inst, enginemetrics.Options{})
		require.NoError(t, err)
		r := newRecorder()
		require.NoError(t, r.Register(c))
		gather(r)
	}

	for _, n := range daemonMetrics {
		names[n] = true
	}
	for prefix, list := range map[string][2][]string{
		"sglang:": {sglangMetrics, sglangHistograms},
		"vllm:":   {vllmMetrics, vllmHistograms},
	} {
		for _, n := range list[0] {
			names[prefix+n] = true
		}
		for _, n := range list[1] {
			names[prefix+n] = true
			histograms[prefix+n] = true
		}
	}
	require.True(t, names["basin_gateway_working_set_tokens"] && names["basin_signal_up"] && names["basin_sim_lent_tokens"],
		"gathering basin's metrics found too little")
	require.True(t, histograms["basin_gateway_queue_wait_seconds"])
	return names, histograms
}

// family maps a histogram's _bucket, _sum and _count series to the family's name.
func family(name string, histograms map[string]bool) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := strings.CutSuffix(name, suffix); ok && histograms[f] {
			return f
		}
	}
	return name
}

func TestQueriesReadExportedMetrics(t *testing.T) {
	names, histograms := exported(t)
	for _, d := range loaded(t) {
		for _, p := range parseAll(t, d) {
			for _, n := range p.names {
				assert.True(t, names[family(n, histograms)], "%s reads %s, which neither basin nor SGLang/vLLM export", p.where, n)
				assert.NotEqual(t, "sglang:cache_hit_rate", n, "%s: hit rates come from counters, never sglang:cache_hit_rate", p.where)
				if names[n] && histograms[n] {
					assert.Failf(t, "histogram read by its family name", "%s reads %s; use its _bucket series", p.where, n)
				}
			}
		}
	}
}

// The overview shows every signal of the trap the issue asks for.
func TestDashboardsShowTheTrap(t *testing.T) {
	want := map[string][]string{
		dashboards.OverviewUID: {
			"basin_state", "basin_working_set_over_cache", "basin_knee_ratio", "basin_gateway_working_set_tokens",
			"basin_hit_rate", "basin_plateau_hit_rate", "basin_live_sessions", "basin_equilibrium_stable_sessions",
			"basin_equilibrium_unstable_sessions", "basin_gateway_session_arrivals_total",
			"basin_gateway_session_completions_total", "basin_gateway_budget_tokens", "basin_gateway_reserved_tokens",
			"basin_reference_budget_tokens", "basin_gateway_sessions_queued", "basin_gateway_queue_oldest_wait_seconds",
			"basin_gateway_queue_wait_seconds_bucket", "basin_remediation_actions_total", "basin_lending_enabled",
			"basin_sim_lent_tokens", "sglang:time_to_first_token_seconds_bucket", "basin_signal_up",
		},
		dashboards.EnginesUID: {
			"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:prefill_effective_tokens_total",
			"sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
			"sglang:generation_tokens_total", "vllm:num_requests_waiting", "vllm:num_requests_running",
			"vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
			"vllm:inter_token_latency_seconds_bucket", "vllm:generation_tokens_total",
		},
	}
	for _, d := range loaded(t) {
		used := map[string]bool{}
		for _, p := range parseAll(t, d) {
			for _, n := range p.names {
				used[n] = true
			}
		}
		for _, n := range want[d.Uid] {
			assert.True(t, used[n], "%s shows nothing from %s", d.Uid, n)
		}
	}

	var annotations []string
	for _, d := range loaded(t) {
		if d.Uid != dashboards.OverviewUID {
			continue
		}
		for _, a := range d.Annotations.List {
			annotations = append(annotations, *a.Expr)
			require.NotNil(t, a.Datasource)
			assert.Equal(t, "prometheus", deref(a.Datasource.Type))
		}
	}
	assert.True(t, slices.ContainsFunc(annotations, func(s string) bool { return strings.Contains(s, "basin_remediation_actions_total") }),
		"remediation actions must be annotations on the overview")
}

func TestSubstitute(t *testing.T) {
	vars := map[string]bool{"job": true}
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: `rate(x{job=~"$job"}[$__rate_interval])`, want: `rate(x{job=~"x"}[1m])`},
		{in: `x{job=~"${job}"}[${__range}]`, want: `x{job=~"x"}[1h]`},
		{in: `x{job=~"${job:regex}", a="[[job]]"}`, want: `x{job=~"x", a="x"}`},
		{in: `x{instance=~"$instance"}`, err: "undefined variables [$instance]"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := substitute(tc.in, vars)
			if tc.err != "" {
				assert.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
