package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/dashboards"
	"github.com/basin-dev/basin/remediate/alerts"
)

// The example files, relative to the module root.
const (
	examplePrometheus   = "examples/prometheus.yml"
	exampleAlertmanager = "examples/alertmanager.yml"
	exampleDatasource   = "examples/grafana/provisioning/datasources/prometheus.yml"
	exampleDashboards   = "examples/grafana/provisioning/dashboards/basin.yml"
)

// The addresses the examples use: the defaults of examples/daemon.yaml, the gateway's example
// configuration, `basin sim serve` in the README and Alertmanager's own.
const (
	exampleDaemon       = "127.0.0.1:9095"
	exampleGatewayAdmin = "127.0.0.1:8081"
	exampleSim          = "127.0.0.1:8000"
	exampleAMAddr       = "127.0.0.1:9093"
	exampleDeployment   = "agents-prod"
)

// basinAlerts are the alerts that put the daemon in incident mode by default, and so the ones
// examples/alertmanager.yml routes to it.
var basinAlerts = func() []string {
	var out []string
	for _, m := range alerts.DefaultMatchers() {
		out = append(out, m.AlertName)
	}
	return out
}()

func TestExamples(t *testing.T) {
	root := moduleRoot(t)

	t.Run("prometheus", func(t *testing.T) {
		// promtool resolves rule_files against the configuration's directory, so checking the
		// file in place also checks ../rules/basin.rules.yml.
		out := run(t, root, time.Minute, promtoolPath(t), "check", "config", examplePrometheus)
		t.Log(out)
		assert.Contains(t, out, "SUCCESS: 1 rule files found")
		assert.Contains(t, out, "Checking rules/basin.rules.yml")

		var cfg struct {
			RuleFiles     []string `yaml:"rule_files"`
			ScrapeConfigs []struct {
				JobName       string `yaml:"job_name"`
				HonorLabels   bool   `yaml:"honor_labels"`
				StaticConfigs []struct {
					Targets []string          `yaml:"targets"`
					Labels  map[string]string `yaml:"labels"`
				} `yaml:"static_configs"`
			} `yaml:"scrape_configs"`
		}
		require.NoError(t, yaml.Unmarshal(readFile(t, root, examplePrometheus), &cfg))
		assert.Equal(t, []string{"../rules/basin.rules.yml"}, cfg.RuleFiles)
		jobs := map[string]bool{}
		for _, sc := range cfg.ScrapeConfigs {
			jobs[sc.JobName] = true
			// The rules' label expectations (rules/basin.rules.yml, its header).
			assert.Equal(t, sc.JobName == "basin-daemon", sc.HonorLabels, "%s: honor_labels only on the daemon's job", sc.JobName)
			engine := sc.JobName != "basin-daemon" && sc.JobName != "basin-gateway"
			for _, st := range sc.StaticConfigs {
				assert.Equal(t, exampleDeployment, st.Labels["deployment"], "%s %v: deployment label", sc.JobName, st.Targets)
				if engine {
					assert.Contains(t, []string{"prefill", "decode", "unified"}, st.Labels["pool"], "%s %v: pool label", sc.JobName, st.Targets)
				}
			}
		}
		for _, j := range []string{"basin-daemon", "basin-gateway", "sglang", "basin-sim"} {
			assert.True(t, jobs[j], "no %s job", j)
		}
	})

	t.Run("alertmanager", func(t *testing.T) {
		t.Log(run(t, root, time.Minute, amtoolPath(t), "check-config", exampleAlertmanager))

		var cfg amConfig
		dec := yaml.NewDecoder(bytes.NewReader(readFile(t, root, exampleAlertmanager)))
		require.NoError(t, dec.Decode(&cfg))
		require.Len(t, cfg.Route.Routes, 2)
		basin, slack := cfg.Route.Routes[0], cfg.Route.Routes[1]
		assert.Equal(t, "basin", basin.Receiver)
		assert.Equal(t, []string{`alertname=~"` + strings.Join(basinAlerts, "|") + `"`}, basin.Matchers)
		assert.Equal(t, "1m", basin.GroupInterval)
		assert.Equal(t, "3m", basin.RepeatInterval)
		assert.True(t, basin.Continue, "the basin route must continue to Slack")
		assert.Equal(t, "slack", slack.Receiver)
		assert.Empty(t, slack.Matchers, "the Slack route catches every alert")
		recv := map[string]amReceiver{}
		for _, r := range cfg.Receivers {
			recv[r.Name] = r
		}
		require.Len(t, recv["basin"].WebhookConfigs, 1)
		wh := recv["basin"].WebhookConfigs[0]
		assert.Equal(t, "http://"+exampleDaemon+"/api/v1/alerts", wh.URL)
		assert.True(t, wh.SendResolved)
		assert.NotEmpty(t, wh.HTTPConfig.Authorization.CredentialsFile)
		require.Len(t, recv["slack"].SlackConfigs, 1)
		assert.True(t, recv["slack"].SlackConfigs[0].SendResolved)
	})

	// What TestObservabilityPack derives from the examples loads too, and says what it should.
	t.Run("end-to-end copies", func(t *testing.T) {
		dir := t.TempDir()
		rules, err := scaleRules(readFile(t, root, "rules/basin.rules.yml"), 30)
		require.NoError(t, err)
		writeTestFile(t, dir, "basin.rules.yml", string(rules))
		a := addrs{sim: "127.0.0.1:1001", gateway: "127.0.0.1:1002", gatewayAdmin: "127.0.0.1:1003", daemon: "127.0.0.1:1004",
			prometheus: "127.0.0.1:1005", alertmanager: "127.0.0.1:1006"}
		pc, err := prometheusConfig(readFile(t, root, examplePrometheus), a, "basin.rules.yml")
		require.NoError(t, err)
		writeTestFile(t, dir, "prometheus.yml", string(pc))
		t.Log(run(t, dir, time.Minute, promtoolPath(t), "check", "config", "prometheus.yml"))
		for _, want := range []string{"scrape_interval: 1s", "- basin.rules.yml", a.daemon, a.gatewayAdmin, a.sim, a.alertmanager} {
			assert.Contains(t, string(pc), want)
		}
		assert.NotContains(t, string(pc), "job_name: sglang")

		ac, err := alertmanagerConfig(readFile(t, root, exampleAlertmanager), a.daemon, filepath.Join(dir, "token"), "http://127.0.0.1:1007/slack", 30)
		require.NoError(t, err)
		writeTestFile(t, dir, "alertmanager.yml", string(ac))
		t.Log(run(t, dir, time.Minute, amtoolPath(t), "check-config", "alertmanager.yml"))
		var cfg amConfig
		require.NoError(t, yaml.Unmarshal(ac, &cfg))
		basin := cfg.Route.Routes[0]
		assert.Equal(t, "2s", basin.GroupInterval, "1m at speed 30")
		assert.Equal(t, "6s", basin.RepeatInterval, "3m at speed 30")
		for _, want := range []string{"url: http://" + a.daemon + "/api/v1/alerts", "credentials_file: " + filepath.Join(dir, "token"),
			"api_url: http://127.0.0.1:1007/slack"} {
			assert.Contains(t, string(ac), want)
		}
		assert.NotContains(t, string(ac), "api_url_file")
	})

	t.Run("grafana", func(t *testing.T) {
		var ds struct {
			APIVersion  int `yaml:"apiVersion"`
			Datasources []struct {
				Name      string         `yaml:"name"`
				UID       string         `yaml:"uid"`
				Type      string         `yaml:"type"`
				Access    string         `yaml:"access"`
				URL       string         `yaml:"url"`
				IsDefault bool           `yaml:"isDefault"`
				Editable  bool           `yaml:"editable"`
				JSONData  map[string]any `yaml:"jsonData"`
			} `yaml:"datasources"`
		}
		strictYAML(t, readFile(t, root, exampleDatasource), &ds)
		assert.Equal(t, 1, ds.APIVersion)
		require.Len(t, ds.Datasources, 1)
		d := ds.Datasources[0]
		assert.Equal(t, "prometheus", d.Type)
		assert.Equal(t, "proxy", d.Access)
		assert.Equal(t, "http://127.0.0.1:9090", d.URL, "Prometheus' default listen address")
		// The dashboards' datasource variable defaults to the default Prometheus data source.
		assert.True(t, d.IsDefault)
		assert.Equal(t, "15s", d.JSONData["timeInterval"], "Grafana's minimum interval is examples/prometheus.yml's scrape_interval")

		var dp struct {
			APIVersion int `yaml:"apiVersion"`
			Providers  []struct {
				Name                  string `yaml:"name"`
				Folder                string `yaml:"folder"`
				Type                  string `yaml:"type"`
				DisableDeletion       bool   `yaml:"disableDeletion"`
				AllowUIUpdates        bool   `yaml:"allowUiUpdates"`
				UpdateIntervalSeconds int    `yaml:"updateIntervalSeconds"`
				Options               struct {
					Path                      string `yaml:"path"`
					FoldersFromFilesStructure bool   `yaml:"foldersFromFilesStructure"`
				} `yaml:"options"`
			} `yaml:"providers"`
		}
		strictYAML(t, readFile(t, root, exampleDashboards), &dp)
		assert.Equal(t, 1, dp.APIVersion)
		require.Len(t, dp.Providers, 1)
		p := dp.Providers[0]
		assert.Equal(t, "file", p.Type)
		assert.True(t, strings.HasSuffix(p.Options.Path, "/dashboards/json"), "the provider reads basin's dashboards/json, got %s", p.Options.Path)
		// What that directory holds in this repository: the dashboards the code generates.
		ds2, err := dashboards.All()
		require.NoError(t, err)
		var want, got []string
		for _, d := range ds2 {
			want = append(want, dashboards.FileName(d))
		}
		files, err := filepath.Glob(filepath.Join(root, "dashboards", "json", "*.json"))
		require.NoError(t, err)
		for _, f := range files {
			got = append(got, filepath.Base(f))
		}
		assert.ElementsMatch(t, want, got)
	})
}

func writeTestFile(t *testing.T, dir, name, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
}

func readFile(t *testing.T, root, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	require.NoError(t, err)
	return b
}

// strictYAML decodes refusing keys v does not name, so a misspelt key fails here rather than
// being ignored by Grafana.
func strictYAML(t *testing.T, b []byte, v any) {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(v))
}

// amConfig is the part of an Alertmanager configuration the tests read.
type amConfig struct {
	Route struct {
		Receiver string    `yaml:"receiver"`
		Routes   []amRoute `yaml:"routes"`
	} `yaml:"route"`
	Receivers []amReceiver `yaml:"receivers"`
}

type amRoute struct {
	Receiver       string   `yaml:"receiver"`
	Matchers       []string `yaml:"matchers"`
	GroupInterval  string   `yaml:"group_interval"`
	RepeatInterval string   `yaml:"repeat_interval"`
	Continue       bool     `yaml:"continue"`
}

type amReceiver struct {
	Name           string `yaml:"name"`
	WebhookConfigs []struct {
		URL          string `yaml:"url"`
		SendResolved bool   `yaml:"send_resolved"`
		HTTPConfig   struct {
			Authorization struct {
				CredentialsFile string `yaml:"credentials_file"`
			} `yaml:"authorization"`
		} `yaml:"http_config"`
	} `yaml:"webhook_configs"`
	SlackConfigs []struct {
		SendResolved bool `yaml:"send_resolved"`
	} `yaml:"slack_configs"`
}

// addrs are where the end-to-end test's processes listen.
type addrs struct {
	sim, gateway, gatewayAdmin, daemon, prometheus, alertmanager string
}

// replaceAll replaces each old string of pairs with its new one, and fails if one is missing
// (the example changed and the test would silently run something else).
func replaceAll(src string, pairs ...string) (string, error) {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(src, pairs[i]) {
			return "", fmt.Errorf("%q not found", pairs[i])
		}
		src = strings.ReplaceAll(src, pairs[i], pairs[i+1])
	}
	return src, nil
}

// prometheusConfig is examples/prometheus.yml for the end-to-end test: the example's addresses
// replaced by the test's, scraping and evaluating every second, the scaled rule file, and
// without the job for real SGLang engines (the simulator's job scrapes the deployment).
func prometheusConfig(example []byte, a addrs, rules string) ([]byte, error) {
	src, err := replaceAll(string(example),
		exampleDaemon, a.daemon, exampleGatewayAdmin, a.gatewayAdmin, exampleSim, a.sim, exampleAMAddr, a.alertmanager)
	if err != nil {
		return nil, fmt.Errorf("prometheus config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		return nil, fmt.Errorf("prometheus config: %w", err)
	}
	top := doc.Content[0]
	global := mapValue(top, "global")
	for _, k := range []string{"scrape_interval", "evaluation_interval", "scrape_timeout"} {
		setMapValue(global, k, scalar("1s"))
	}
	setMapValue(top, "rule_files", &yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{scalar(rules)}})
	scs := mapValue(top, "scrape_configs")
	if scs == nil {
		return nil, fmt.Errorf("prometheus config: no scrape_configs")
	}
	n := len(scs.Content)
	scs.Content = slices.DeleteFunc(scs.Content, func(sc *yaml.Node) bool { return mapValue(sc, "job_name").Value == "sglang" })
	if len(scs.Content) != n-1 {
		return nil, fmt.Errorf("prometheus config: no sglang job to drop")
	}
	return yaml.Marshal(&doc)
}

// alertmanagerConfig is examples/alertmanager.yml for the end-to-end test: the daemon's address,
// its token file and the Slack stand-in's URL replaced, and every group_wait, group_interval and
// repeat_interval divided by speed (at least a second), so that notifications keep pace with a
// deployment that runs speed× faster than the wall clock.
func alertmanagerConfig(example []byte, daemonAddr, tokenFile, slackURL string, speed float64) ([]byte, error) {
	src, err := replaceAll(string(example), "http://"+exampleDaemon+"/", "http://"+daemonAddr+"/",
		"/etc/alertmanager/basin-daemon-token", tokenFile)
	if err != nil {
		return nil, fmt.Errorf("alertmanager config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		return nil, fmt.Errorf("alertmanager config: %w", err)
	}
	top := doc.Content[0]
	var scaleRoute func(r *yaml.Node) error
	scaleRoute = func(r *yaml.Node) error {
		for _, k := range []string{"group_wait", "group_interval", "repeat_interval"} {
			v := mapValue(r, k)
			if v == nil {
				continue
			}
			d, err := model.ParseDuration(v.Value)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			v.Value = scaleDuration(time.Duration(d), speed, time.Second).String()
		}
		if rs := mapValue(r, "routes"); rs != nil {
			for _, c := range rs.Content {
				if err := scaleRoute(c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := scaleRoute(mapValue(top, "route")); err != nil {
		return nil, fmt.Errorf("alertmanager config: %w", err)
	}
	found := false
	for _, r := range mapValue(top, "receivers").Content {
		sc := mapValue(r, "slack_configs")
		if sc == nil {
			continue
		}
		for _, c := range sc.Content {
			deleteMapKey(c, "api_url_file")
			setMapValue(c, "api_url", scalar(slackURL))
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("alertmanager config: no slack_configs")
	}
	return yaml.Marshal(&doc)
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

// setMapValue sets key in a mapping node, adding it if missing.
func setMapValue(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, scalar(key), v)
}

func deleteMapKey(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}
