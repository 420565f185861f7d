package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// minWindow is the shortest range window scaleRules writes: four scrapes at the end-to-end test's
// 1 s scrape interval, so that rate() always has at least two samples (Grafana's $__rate_interval
// is at least four scrape intervals for the same reason).
const minWindow = 4 * time.Second

// scaleRules rewrites a Prometheus rule file for a deployment that runs speed times faster than
// the wall clock (`basin sim serve --speed S`). Prometheus evaluates on the wall clock, while the
// rules' durations are meant in the deployment's time: "drifting for 1 minute" is 1/S of a wall
// minute, and a 5-minute rate window over a deployment that lives S× faster covers S× as much of
// its life. So every for: (and keep_firing_for:) duration, every range window ([5m], subquery
// ranges and steps) and every offset is divided by speed — for: down to 0s, windows and steps
// down to minWindow. Everything else stays as written: the metrics, the labels, the thresholds
// (hit rates, ratios and token counts do not depend on the clock) and the rules' names.
//
// Rates per second are per wall second, S times the deployment's; no alert compares one with a
// fixed number (hit rates are ratios of two rates), so none needs converting. The one threshold
// in seconds, BasinGatewayQueueStuck's 900 s, compares a gauge the gateway measures on the wall
// clock and is left alone; nobody queues in the end-to-end test, so it cannot fire either way.
//
// Expressions are parsed with Prometheus' PromQL parser and printed back, so every duration is
// found (not just text that looks like one); the result is the same expression in Prometheus'
// canonical formatting.
func scaleRules(src []byte, speed float64) ([]byte, error) {
	if speed < 1 {
		return nil, fmt.Errorf("scale rules: speed %v, want ≥ 1", speed)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("scale rules: %w", err)
	}
	if len(doc.Content) != 1 {
		return nil, fmt.Errorf("scale rules: want one YAML document")
	}
	groups := mapValue(doc.Content[0], "groups")
	if groups == nil || groups.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("scale rules: no groups")
	}
	for _, g := range groups.Content {
		if iv := mapValue(g, "interval"); iv != nil {
			return nil, fmt.Errorf("scale rules: group interval %s: not supported", iv.Value)
		}
		rules := mapValue(g, "rules")
		if rules == nil {
			continue
		}
		for _, r := range rules.Content {
			name := mapValue(r, "alert")
			if name == nil {
				name = mapValue(r, "record")
			}
			if name == nil {
				return nil, fmt.Errorf("scale rules: line %d: a rule without alert or record", r.Line)
			}
			if e := mapValue(r, "expr"); e != nil {
				out, err := scaleExpr(e.Value, speed)
				if err != nil {
					return nil, fmt.Errorf("scale rules: %s: %w", name.Value, err)
				}
				e.Value, e.Style = out, yaml.DoubleQuotedStyle
			}
			for _, key := range []string{"for", "keep_firing_for"} {
				f := mapValue(r, key)
				if f == nil {
					continue
				}
				d, err := model.ParseDuration(f.Value)
				if err != nil {
					return nil, fmt.Errorf("scale rules: %s: %s: %w", name.Value, key, err)
				}
				f.Value = scaleDuration(time.Duration(d), speed, 0).String()
			}
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("scale rules: %w", err)
	}
	return buf.Bytes(), nil
}

// scaleDuration divides d by speed, rounded down to a millisecond (Prometheus' resolution) and
// not below floor; a zero duration stays zero.
func scaleDuration(d time.Duration, speed float64, floor time.Duration) model.Duration {
	if d == 0 {
		return 0
	}
	s := time.Duration(float64(d) / speed).Truncate(time.Millisecond)
	return model.Duration(max(s, floor))
}

// scaleExpr divides every range window, subquery range and step, and offset of a PromQL
// expression by speed.
func scaleExpr(expr string, speed float64) (string, error) {
	return mapDurations(expr, func(d time.Duration, offset bool) time.Duration {
		if offset {
			return time.Duration(scaleDuration(d, speed, 0))
		}
		return time.Duration(scaleDuration(d, speed, minWindow))
	})
}

// mapDurations parses expr, replaces every range, subquery step and offset with f's value
// (offset says which kind it is) and prints the expression back.
func mapDurations(expr string, f func(d time.Duration, offset bool) time.Duration) (string, error) {
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return "", fmt.Errorf("parse %q: %w", expr, err)
	}
	var errs []string
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.MatrixSelector:
			if n.RangeExpr != nil {
				errs = append(errs, "a range that is an expression: "+n.RangeExpr.String())
			}
			n.Range = f(n.Range, false)
		case *parser.SubqueryExpr:
			if n.RangeExpr != nil || n.StepExpr != nil || n.OriginalOffsetExpr != nil {
				errs = append(errs, "a subquery duration that is an expression")
			}
			n.Range, n.Step = f(n.Range, false), f(n.Step, false)
			if n.OriginalOffset > 0 {
				n.OriginalOffset = f(n.OriginalOffset, true)
			}
		case *parser.VectorSelector:
			if n.OriginalOffsetExpr != nil {
				errs = append(errs, "an offset that is an expression: "+n.OriginalOffsetExpr.String())
			}
			if n.OriginalOffset > 0 {
				n.OriginalOffset = f(n.OriginalOffset, true)
			}
		}
		return nil
	})
	if len(errs) > 0 {
		return "", fmt.Errorf("%q: not supported: %s", expr, strings.Join(errs, "; "))
	}
	return ast.String(), nil
}

// mapValue is the value of key in a YAML mapping node, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// ruleFile is the part of a rule file the tests read back.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert  string `yaml:"alert"`
			Record string `yaml:"record"`
			Expr   string `yaml:"expr"`
			For    string `yaml:"for"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestScaleExpr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`rate(x[5m])`, `rate(x[10s])`},
		{`rate(x[1m])`, `rate(x[4s])`}, // 2 s, raised to minWindow
		{`x offset 15m`, `x offset 30s`},
		{`sum(increase(x{a="b"}[10m] offset 1h))`, `sum(increase(x{a="b"}[20s] offset 2m))`},
		{`max_over_time(rate(x[5m])[30m:1m])`, `max_over_time(rate(x[10s])[1m:4s])`},
		{`up{job="basin-daemon"} == 0`, `up{job="basin-daemon"} == 0`},
		{`x > 900`, `x > 900`}, // thresholds stay
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := scaleExpr(tc.in, 30)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestScaleRules scales basin's own rule file, checks that only durations changed, and that
// promtool accepts the result.
func TestScaleRules(t *testing.T) {
	root := moduleRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "rules", "basin.rules.yml"))
	require.NoError(t, err)
	const speed = 30
	out, err := scaleRules(src, speed)
	require.NoError(t, err)

	var before, after ruleFile
	require.NoError(t, yaml.Unmarshal(src, &before))
	require.NoError(t, yaml.Unmarshal(out, &after))
	require.Equal(t, len(before.Groups), len(after.Groups))
	same := func(time.Duration, bool) time.Duration { return time.Minute }
	scaled := 0
	for i, g := range before.Groups {
		require.Equal(t, len(g.Rules), len(after.Groups[i].Rules), g.Name)
		for j, r := range g.Rules {
			a := after.Groups[i].Rules[j]
			name := r.Alert + r.Record
			assert.Equal(t, name, a.Alert+a.Record)
			// With every duration set to the same value, the two expressions are one.
			x, err := mapDurations(r.Expr, same)
			require.NoError(t, err, name)
			y, err := mapDurations(a.Expr, same)
			require.NoError(t, err, name)
			assert.Equal(t, x, y, "%s: scaling changed more than durations", name)
			if a.Expr != x {
				scaled++
			}
			if r.For != "" {
				d, err := model.ParseDuration(r.For)
				require.NoError(t, err)
				assert.Equal(t, scaleDuration(time.Duration(d), speed, 0).String(), a.For, name)
			}
		}
	}
	assert.Greater(t, scaled, 10, "expected the rules' rate windows to be scaled")
	for _, want := range []string{`[10s]`, `for: 2s`, `offset 30s`} {
		assert.Contains(t, string(out), want)
	}

	path := filepath.Join(t.TempDir(), "basin.rules.yml")
	require.NoError(t, os.WriteFile(path, out, 0o644))
	t.Log(run(t, root, time.Minute, promtoolPath(t), "check", "rules", path))
}
