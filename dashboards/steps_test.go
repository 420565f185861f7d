package dashboards

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// selectors parses expr as PromQL, Grafana's range macros read as a minute, and returns its
// series selectors.
func selectors(t *testing.T, expr string) []*parser.VectorSelector {
	t.Helper()
	expr = strings.NewReplacer(rateInterval, "1m", "$__interval", "1m").Replace(expr)
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	require.NoError(t, err, expr)
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// matchers are the selector's matchers on the label name, as PromQL writes them.
func matchers(vs *parser.VectorSelector, name string) []string {
	var out []string
	for _, m := range vs.LabelMatchers {
		if m.Name == name {
			out = append(out, m.String())
		}
	}
	return out
}

// TestStateCode: each state, and blind, has its own number, shown as its name in its colour, and
// blind's number is the largest, so the max over a deployment's series shows blind over the state
// held meanwhile.
func TestStateCode(t *testing.T) {
	expr, mapping := stateCode(jobMatch)
	tests := []struct {
		code         int
		metric, name string
		color        string
	}{
		{0, "basin_state", "healthy", "green"},
		{1, "basin_state", "pressure", "yellow"},
		{2, "basin_state", "drifting", "orange"},
		{3, "basin_state", "trapped", "red"},
		{4, "basin_state", "recovering", "blue"},
		{5, "basin_blind", "blind", "text"},
	}
	require.Len(t, mapping, len(tests))
	vss := selectors(t, expr)
	require.Len(t, vss, len(tests))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, valueText{value: fmt.Sprint(tc.code), text: tc.name, color: tc.color}, mapping[tc.code])
			vs := vss[tc.code]
			assert.Equal(t, tc.metric, vs.Name)
			assert.Equal(t, []string{jobMatch}, matchers(vs, "job"))
			if tc.metric == "basin_state" {
				assert.Equal(t, []string{`state="` + tc.name + `"`}, matchers(vs, "state"))
				assert.Contains(t, expr, fmt.Sprintf("%d * (%s == 1)", tc.code, sel(tc.metric, jobMatch, `state="`+tc.name+`"`)))
			}
		})
	}
	assert.True(t, strings.HasPrefix(expr, "max by (deployment) ("), "one series per deployment")
}

// TestSglangHitRate: the hit rate reads prefill and unified instances only, with the row's
// matchers, and prefers the sources in the collector's order.
func TestSglangHitRate(t *testing.T) {
	row := []string{jobMatch, instMatch, poolMatch}
	expr := sglangHitRate(row)
	assert.NotContains(t, expr, "cache_hit_rate", "the last batch's gauge, never")
	for _, vs := range selectors(t, expr) {
		assert.Equal(t, []string{poolMatch, `engine_type!="decode"`}, matchers(vs, "engine_type"), vs.String())
		assert.Equal(t, []string{jobMatch}, matchers(vs, "job"), vs.String())
		assert.Equal(t, []string{instMatch}, matchers(vs, "instance"), vs.String())
	}
	tests := []struct {
		source string
		before string // the source it comes after ("" for the first)
	}{
		{"sglang:prefill_effective_tokens_total", ""},
		{"sglang:realtime_tokens_total", "sglang:prefill_effective_tokens_total"},
		{`sglang:cached_tokens_total{job=~"$job", instance=~"$instance", engine_type=~"$pool", engine_type!="decode", cache_source!="total"}`,
			"sglang:realtime_tokens_total"},
		{`sglang:cached_tokens_total{job=~"$job", instance=~"$instance", engine_type=~"$pool", engine_type!="decode", cache_source="total"}`,
			`cache_source!="total"`},
	}
	for _, tc := range tests {
		t.Run(tc.source, func(t *testing.T) {
			i := strings.Index(expr, tc.source)
			require.GreaterOrEqual(t, i, 0, "the source is read")
			if tc.before != "" {
				assert.Less(t, strings.Index(expr, tc.before), i, "preferred over it")
			}
		})
	}
	assert.Equal(t, []string{jobMatch, instMatch, poolMatch}, row, "the row's matchers are left as they were")
}

// TestVllmITL: the inter-token latency reads the histogram under either of vLLM's names, with the
// row's matchers, at the quantile asked.
func TestVllmITL(t *testing.T) {
	row := []string{jobMatch, instMatch}
	for _, q := range []string{"0.5", "0.99"} {
		t.Run(q, func(t *testing.T) {
			expr := vllmITL(q, row)
			assert.True(t, strings.HasPrefix(expr, "histogram_quantile("+q+", "), expr)
			var names []string
			for _, vs := range selectors(t, expr) {
				names = append(names, vs.Name)
				assert.Equal(t, []string{jobMatch}, matchers(vs, "job"))
				assert.Equal(t, []string{instMatch}, matchers(vs, "instance"))
			}
			assert.Equal(t, []string{"vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket"}, names)
		})
	}
}

// TestWith: a panel's extra matchers never leak into the row's, whatever the row slice's capacity.
func TestWith(t *testing.T) {
	base := make([]string, 1, 4)
	base[0] = jobMatch
	tests := []struct {
		name  string
		extra []string
		want  []string
	}{
		{"none", nil, []string{jobMatch}},
		{"one", []string{`a="1"`}, []string{jobMatch, `a="1"`}},
		{"two", []string{`a="1"`, `b="2"`}, []string{jobMatch, `a="1"`, `b="2"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := with(base, tc.extra...)
			assert.Equal(t, tc.want, got)
			other := with(base, `z="9"`)
			assert.Equal(t, tc.want, got, "a later call did not overwrite it")
			assert.Equal(t, []string{jobMatch, `z="9"`}, other)
		})
	}
}
