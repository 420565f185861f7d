package rules

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/lab/experiment"
)

const (
	ruleFile   = "basin.rules.yml"
	testGlob   = "tests/*.yml"
	runbook    = "../docs/runbook.md"
	runbookURL = "https://github.com/basin-dev/basin/blob/main/docs/runbook.md#"
)

var (
	recordName = regexp.MustCompile(`^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$`)
	alertName  = regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`)
	severities = map[string]bool{"critical": true, "warning": true, "info": true}
)

// promtool returns promtool's path. Without it the test is skipped on a workstation and fails in
// CI, which installs the Debian package.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("promtool is not on PATH (%v), and CI is set: CI must install it (Debian package prometheus)", err)
		}
		t.Skipf("promtool is not on PATH (%v): skipping the rule checks; install Prometheus' promtool "+
			"(Debian: apt-get install prometheus) to run them (with CI set, this test fails instead)", err)
	}
	return path
}

func TestPromtool(t *testing.T) {
	bin := promtool(t)
	tests, err := filepath.Glob(testGlob)
	require.NoError(t, err)
	require.NotEmpty(t, tests, "no promtool unit tests match %s", testGlob)

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"check rules", []string{"check", "rules", ruleFile}},
		{"test rules", append([]string{"test", "rules"}, tests...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, tc.args...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
			}
			t.Logf("%s:\n%s", strings.Join(cmd.Args, " "), out)
		})
	}
}

// ruleGroups is the part of a Prometheus 2.x rule file basin writes; unknown keys fail the parse,
// so a misspelt `annotation:` or `label:` is caught here rather than silently ignored.
type ruleGroups struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Limit    int    `yaml:"limit"`
		Rules    []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) (ruleGroups, *yaml.Node) {
	t.Helper()
	data, err := os.ReadFile(ruleFile)
	require.NoError(t, err)
	var rg ruleGroups
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&rg), "parsing %s", ruleFile)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(data, &doc))
	return rg, &doc
}

func TestRecordingRuleNames(t *testing.T) {
	rg, _ := loadRules(t)
	n := 0
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Record == "" {
				continue
			}
			n++
			assert.Regexp(t, recordName, r.Record, "recording rule in group %s: want level:metric:operation", g.Name)
			assert.NotEmpty(t, r.Expr, "recording rule %s", r.Record)
		}
	}
	assert.NotZero(t, n, "no recording rules in %s", ruleFile)
}

func TestAlertsDocumented(t *testing.T) {
	rg, _ := loadRules(t)
	anchors := runbookAnchors(t, runbook)
	seen := map[string]bool{}
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			t.Run(r.Alert, func(t *testing.T) {
				assert.False(t, seen[r.Alert], "alert defined twice")
				seen[r.Alert] = true
				assert.Regexp(t, alertName, r.Alert, "alert names are CamelCase")
				assert.True(t, severities[r.Labels["severity"]], "severity %q, want critical, warning or info", r.Labels["severity"])
				for _, k := range []string{"summary", "description", "runbook_url"} {
					assert.NotEmpty(t, strings.TrimSpace(r.Annotations[k]), "annotation %s", k)
				}
				u := r.Annotations["runbook_url"]
				require.True(t, strings.HasPrefix(u, runbookURL), "runbook_url %q, want %s<anchor>", u, runbookURL)
				anchor := strings.TrimPrefix(u, runbookURL)
				assert.Equal(t, strings.ToLower(anchor), anchor, "anchors are lowercase")
				assert.True(t, anchors[anchor], "runbook_url anchor #%s is not a heading of %s", anchor, runbook)
			})
		}
	}
	assert.NotEmpty(t, seen, "no alerts in %s", ruleFile)
}

// TestForDurationsExplained checks that every alert states its for: duration, with a comment
// directly above it saying why.
func TestForDurationsExplained(t *testing.T) {
	_, doc := loadRules(t)
	require.Equal(t, yaml.DocumentNode, doc.Kind)
	groups := mapValue(doc.Content[0], "groups")
	require.NotNil(t, groups, "no groups")
	for _, g := range groups.Content {
		rules := mapValue(g, "rules")
		require.NotNil(t, rules, "group at line %d has no rules", g.Line)
		for _, r := range rules.Content {
			alert := mapValue(r, "alert")
			if alert == nil {
				continue
			}
			key := mapKey(r, "for")
			if !assert.NotNil(t, key, "alert %s: state for: explicitly (0s included)", alert.Value) {
				continue
			}
			assert.NotEmpty(t, strings.TrimSpace(key.HeadComment), "alert %s (line %d): say why for: is what it is, in a comment above it", alert.Value, key.Line)
		}
	}
}

// TestAlertsHaveTests checks that the promtool unit tests have, for every alert, a case where it
// fires and a case where it does not.
func TestAlertsHaveTests(t *testing.T) {
	rg, _ := loadRules(t)
	files, err := filepath.Glob(testGlob)
	require.NoError(t, err)
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var tf struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		require.NoError(t, yaml.Unmarshal(data, &tf), "parsing %s", f)
		for _, tc := range tf.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
		}
	}
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			assert.True(t, firing[r.Alert], "%s: no test case where it fires (%s)", r.Alert, testGlob)
			assert.True(t, quiet[r.Alert], "%s: no test case where it stays quiet (%s)", r.Alert, testGlob)
		}
	}
}

func TestGitHubAnchor(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"BasinMetastableDrift", "basinmetastabledrift"},
		{"Pausing basin", "pausing-basin"},
		{"What `basin` did", "what-basin-did"},
		{"W/C and the knee (B_ref)", "wc-and-the-knee-b_ref"},
		{"Before you start: two addresses", "before-you-start-two-addresses"},
	} {
		assert.Equal(t, tc.want, githubAnchor(tc.heading), "heading %q", tc.heading)
	}
}

// runbookAnchors returns the GitHub anchors of the headings of a Markdown file, outside fenced
// code blocks, with GitHub's -1, -2 … suffixes for repeated headings.
func runbookAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	heading := regexp.MustCompile(`^#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$`)
	anchors, count := map[string]bool{}, map[string]int{}
	fence := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		case strings.HasPrefix(trimmed, "```"):
			fence = "```"
			continue
		case strings.HasPrefix(trimmed, "~~~"):
			fence = "~~~"
			continue
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := githubAnchor(m[1])
		if n := count[a]; n > 0 {
			count[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			count[a] = 1
		}
		anchors[a] = true
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, anchors, "no headings in %s", path)
	return anchors
}

// githubAnchor is the id GitHub gives a heading: lowercase, letters, digits, hyphens and
// underscores kept, spaces turned into hyphens, everything else dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// mapKey returns the key node of key in a mapping node, or nil.
func mapKey(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i]
		}
	}
	return nil
}

// mapValue returns the value node of key in a mapping node, or nil.
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

// TestPageForMatchesTheRules keeps the simulator's false-page count (experiment.PageFor, `basin sim
// detect`) on the for: the paging alerts ship with, so the measured number is the shipped rule's.
func TestPageForMatchesTheRules(t *testing.T) {
	rg, _ := loadRules(t)
	want := map[string]detector.State{"BasinMetastableDrift": detector.Drifting, "BasinTrapped": detector.Trapped}
	seen := 0
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			state, ok := want[r.Alert]
			if !ok {
				continue
			}
			seen++
			d, err := time.ParseDuration(r.For)
			require.NoError(t, err, "%s for: %q", r.Alert, r.For)
			assert.Equal(t, experiment.PageFor[state], d, "%s for: against experiment.PageFor[%s]", r.Alert, state)
		}
	}
	assert.Equal(t, len(want), seen)
	info := false
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "BasinCacheKneeApproaching" {
				d, err := time.ParseDuration(r.For)
				require.NoError(t, err)
				assert.Equal(t, experiment.InfoFor, d, "BasinCacheKneeApproaching for: against experiment.InfoFor")
				info = true
			}
		}
	}
	assert.True(t, info, "BasinCacheKneeApproaching is in the rules")
}
