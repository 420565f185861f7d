package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/dashboards"
)

// dashQuery is one query of a generated dashboard, as Grafana would send it.
type dashQuery struct {
	// key names it: uid/row/panel/refId, uid/annotation/name or uid/variable/name.
	key string
	// expr is the PromQL expression; for a variable, the series selector of label_values.
	expr string
	// label is, for a variable, the label whose values it lists; empty otherwise.
	label string
}

// noData are the dashboard queries that cannot return data in the end-to-end test, with the
// reason. Every other query must; and each of these must not, so that the list stays true.
var noData = map[string]string{
	"basin-overview/Lending, latency and signals/Time to first token/C": "vLLM only: the simulator exports SGLang's names",
	"basin-overview/Lending, latency and signals/Time to first token/D": "vLLM only: the simulator exports SGLang's names",
	"basin-overview/Admission and remediation/Queue waits/B": "no session queues: the gateway's budget is out of reach (the daemon runs dry), " +
		"so basin_gateway_queue_wait_seconds has no observation and its quantile is NaN",
	"basin-overview/Admission and remediation/Queue waits/C": "no session queues (see Queue waits/B)",
	"basin-overview/Admission and remediation/Budget vs reserved/D": "the daemon runs dry: it sets no budget, so basin_budget_tokens is absent " +
		"(E, basin_dry_run_budget_tokens, is what it would set)",
	"basin-engines/vLLM/Queue/A":               "vLLM only",
	"basin-engines/vLLM/Running requests/A":    "vLLM only",
	"basin-engines/vLLM/KV usage/A":            "vLLM only",
	"basin-engines/vLLM/Prefix hit rate/A":     "vLLM only",
	"basin-engines/vLLM/Time to first token/A": "vLLM only",
	"basin-engines/vLLM/Time to first token/B": "vLLM only",
	"basin-engines/vLLM/Inter-token latency/A": "vLLM only",
	"basin-engines/vLLM/Inter-token latency/B": "vLLM only",
	"basin-engines/vLLM/Request throughput/A":  "vLLM only",
	"basin-engines/vLLM/Token throughput/A":    "vLLM only",
	"basin-engines/vLLM/Token throughput/B":    "vLLM only",
}

var labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

// dashboardQueries lists every query of the dashboards the code generates (dashboards.All, as
// the checked-in JSON renders them): panel targets, annotations and the label_values variables.
func dashboardQueries(t *testing.T) []dashQuery {
	t.Helper()
	ds, err := dashboards.All()
	require.NoError(t, err)
	type panel struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var out []dashQuery
	for _, d := range ds {
		b, err := dashboards.Marshal(d)
		require.NoError(t, err)
		var j struct {
			UID         string            `json:"uid"`
			Panels      []json.RawMessage `json:"panels"`
			Annotations struct {
				List []struct {
					Name string `json:"name"`
					Expr string `json:"expr"`
				} `json:"list"`
			} `json:"annotations"`
			Templating struct {
				List []struct {
					Name  string `json:"name"`
					Type  string `json:"type"`
					Query any    `json:"query"`
				} `json:"list"`
			} `json:"templating"`
		}
		require.NoError(t, json.Unmarshal(b, &j))
		row := ""
		var walk func(raw []json.RawMessage)
		walk = func(raw []json.RawMessage) {
			for _, r := range raw {
				var p panel
				require.NoError(t, json.Unmarshal(r, &p))
				if p.Type == "row" {
					row = p.Title
					walk(p.Panels) // a collapsed row holds its panels
					continue
				}
				for _, tg := range p.Targets {
					out = append(out, dashQuery{key: strings.Join([]string{j.UID, row, p.Title, tg.RefID}, "/"), expr: tg.Expr})
				}
			}
		}
		walk(j.Panels)
		for _, a := range j.Annotations.List {
			if a.Expr != "" { // Grafana's built-in annotations have none
				out = append(out, dashQuery{key: j.UID + "/annotation/" + a.Name, expr: a.Expr})
			}
		}
		for _, v := range j.Templating.List {
			if v.Type != "query" {
				continue
			}
			q, ok := v.Query.(string)
			require.True(t, ok, "%s: variable %s: query %v is not a string", j.UID, v.Name, v.Query)
			m := labelValuesRE.FindStringSubmatch(q)
			require.NotNil(t, m, "%s: variable %s: want label_values(selector, label), got %s", j.UID, v.Name, q)
			out = append(out, dashQuery{key: j.UID + "/variable/" + v.Name, expr: m[1], label: m[2]})
		}
	}
	require.Greater(t, len(out), 40, "expected every panel, annotation and variable query")
	return out
}

var variableRE = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// substitute replaces the dashboards' variables as Grafana would with "All" selected (their
// allValue is .*), and Grafana's interval macros by window; any other variable is an error.
func substitute(expr, window string) (string, error) {
	var unknown []string
	out := variableRE.ReplaceAllStringFunc(expr, func(m string) string {
		sub := variableRE.FindStringSubmatch(m)
		switch name := sub[1] + sub[2] + sub[3]; name {
		case "job", "instance", "pool":
			return ".*"
		case "__rate_interval", "__interval":
			return window
		default:
			unknown = append(unknown, m)
			return m
		}
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown variables %v in %s", unknown, expr)
	}
	return out, nil
}
