package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/remediate"
)

// minimalYAML is the smallest configuration that validates.
const minimalYAML = `data_dir: /var/lib/basin
collector:
  targets:
    - {name: gateway, url: "http://127.0.0.1:8081/metrics", role: gateway}
gateway:
  admin_url: http://127.0.0.1:8081
`

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(minimalYAML))
	require.NoError(t, err)
	assert.Equal(t, "default", c.Deployment)
	assert.Equal(t, "127.0.0.1:9095", c.Listen, "loopback unless configured")
	assert.Equal(t, 5*time.Second, time.Duration(c.Interval))
	assert.Equal(t, "CRON_TZ=UTC 0 0 9 * * *", c.Cron.DailySummary)
	assert.Equal(t, "@every 1h", c.Cron.KneeReestimate)
	assert.False(t, c.DryRun)
	assert.Equal(t, "/var/lib/basin", c.DataDir)
	assert.Equal(t, []collector.Target{{Name: "gateway", URL: "http://127.0.0.1:8081/metrics", Role: collector.RoleGateway}},
		c.Collector.Targets)
	assert.Equal(t, remediate.Options{}, c.Remediate, "zero: the policy's own defaults apply")
}

func TestParseConfigKeepsWhatIsSet(t *testing.T) {
	c, err := ParseConfig([]byte(minimalYAML + `deployment: llama-70b
listen: 0.0.0.0:9999
interval: 10s
dry_run: true
remediate:
  step: 0.1
  step_interval: 30s
  incident_fraction: 0.6
detector:
  overload_hold: 1m
cron:
  daily_summary: "-"
  knee_reestimate: "@every 30m"
alerts:
  matchers:
    - {alertname: BasinTrapped, labels: {deployment: llama-70b}}
`))
	require.NoError(t, err)
	assert.Equal(t, "llama-70b", c.Deployment)
	assert.Equal(t, "0.0.0.0:9999", c.Listen)
	assert.Equal(t, 10*time.Second, time.Duration(c.Interval))
	assert.True(t, c.DryRun)
	assert.Equal(t, 0.1, c.Remediate.Step)
	assert.Equal(t, 30*time.Second, c.Remediate.StepInterval, "remediate durations are written the Go way")
	assert.Equal(t, 0.6, c.Remediate.IncidentFraction)
	assert.Equal(t, time.Minute, time.Duration(c.Detector.OverloadHold))
	assert.Equal(t, "-", c.Cron.DailySummary, "- disables a job and is kept")
	assert.Equal(t, "@every 30m", c.Cron.KneeReestimate)
	require.Len(t, c.Alerts.Matchers, 1)
	assert.Equal(t, "BasinTrapped", c.Alerts.Matchers[0].AlertName)
	assert.Equal(t, map[string]string{"deployment": "llama-70b"}, c.Alerts.Matchers[0].Labels)
}

// TestParseConfigErrorsNameKeyAndLine: every rejected configuration says which key is wrong and,
// when the key is in the file, on which line.
func TestParseConfigErrorsNameKeyAndLine(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"missing data_dir", `collector:
  targets: [{name: g, url: "http://h:1/metrics", role: gateway}]
gateway: {admin_url: "http://h:2"}
`, []string{"data_dir: required"}},
		{"missing targets", `data_dir: /d
gateway: {admin_url: "http://h:2"}
`, []string{"collector.targets: required"}},
		{"empty targets list", `data_dir: /d
collector:
  targets: []
gateway: {admin_url: "http://h:2"}
`, []string{"line 3: collector.targets: required"}},
		{"missing admin_url", `data_dir: /d
collector:
  targets: [{name: g, url: "http://h:1/metrics", role: gateway}]
`, []string{"gateway.admin_url: required unless dry_run"}},
		{"admin_url not http", minimalYAML[:len(minimalYAML)-len("  admin_url: http://127.0.0.1:8081\n")] +
			"  admin_url: ftp://127.0.0.1:8081\n", []string{`line 6: gateway.admin_url: "ftp://127.0.0.1:8081" is not an http(s) URL`}},
		{"admin_url without host", `data_dir: /d
collector:
  targets: [{name: g, url: "http://h:1/metrics", role: gateway}]
gateway:
  admin_url: "http://"
`, []string{"line 5: gateway.admin_url:", "not an http(s) URL"}},
		{"interval under 1s", minimalYAML + "interval: 500ms\n", []string{"line 7: interval: 500ms, must be at least 1s"}},
		{"interval not a duration", minimalYAML + "interval: often\n", []string{"line 7: interval:", `"often"`}},
		{"slack webhook and bot", minimalYAML + `slack:
  bot_token_file: /s/bot
  channel: C1
  webhook_url_file: /s/hook
`, []string{"line 10: slack.webhook_url_file: give a webhook or a bot token and channel, not both"}},
		{"slack bot without channel", minimalYAML + `slack:
  bot_token_file: /s/bot
`, []string{"slack.channel: required with bot_token_file"}},
		{"bad remediate option", minimalYAML + `remediate:
  step: 0.9
`, []string{"line 7: remediate:", "step: 0.9 outside (0, 0.5]"}},
		{"inconsistent remediate options", minimalYAML + `remediate:
  incident_fraction: 0.3
`, []string{"line 7: remediate:", "incident_fraction: 0.3 below min_fraction 0.5"}},
		{"remediate duration not a duration", minimalYAML + `remediate:
  step_interval: soon
`, []string{"line 8:", "remediate.step_interval"}},
		{"lending max_fraction", minimalYAML + `lending:
  max_fraction: 1.5
`, []string{"line 8: lending.max_fraction: 1.5 outside [0, 1]"}},
		{"negative overload_hold", minimalYAML + `detector:
  overload_hold: -1s
`, []string{`line 8: detector.overload_hold: duration "-1s": must not be negative`}},
		{"unknown key", minimalYAML + "dryrun: true\n", []string{`line 7: unknown key "dryrun"`}},
		{"unknown nested key", minimalYAML + `remediate:
  stepp: 0.1
`, []string{`line 8: unknown key "stepp"`}},
		{"several problems at once", `interval: 10ms
`, []string{"line 1: interval:", "data_dir: required", "collector.targets: required", "gateway.admin_url: required"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			require.Error(t, err)
			assert.Nil(t, c)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestParseConfigAccepts(t *testing.T) {
	cases := []struct{ name, yaml string }{
		{"dry run without admin_url", `data_dir: /d
dry_run: true
collector:
  targets: [{name: g, url: "http://h:1/metrics", role: gateway}]
`},
		{"target file instead of targets", `data_dir: /d
collector: {target_file: targets.json}
gateway: {admin_url: "https://gw.example:8081/prefix"}
`},
		{"slack webhook alone", minimalYAML + "slack: {webhook_url_file: /s/hook}\n"},
		{"slack bot with channel", minimalYAML + "slack: {bot_token_file: /s/bot, channel: C0BASIN}\n"},
		{"interval exactly 1s", minimalYAML + "interval: 1s\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			assert.NoError(t, err)
		})
	}
}

// TestParseConfigRejectsBadCronSpec: a cron spec robfig/cron cannot parse is a configuration
// error, found when the file is read like every other one, not when Serve schedules it.
func TestParseConfigRejectsBadCronSpec(t *testing.T) {
	for _, spec := range []string{"at nine", "0 9 * * *"} { // the second lacks the seconds field
		_, err := ParseConfig([]byte(minimalYAML + "cron:\n  daily_summary: \"" + spec + "\"\n"))
		require.Error(t, err, spec)
		assert.Contains(t, err.Error(), "line 8: cron.daily_summary")
	}
}

// TestServeFailsOnBadCronSpec: a configuration changed after ParseConfig still cannot start with a
// bad spec: Serve refuses, naming the job and the spec.
func TestServeFailsOnBadCronSpec(t *testing.T) {
	e := newEnv(t, "")
	e.cfg.Cron.KneeReestimate = "every hour"
	d := e.daemon()
	ln := listen(t)
	err := d.Serve(t.Context(), ln)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `cron.knee_reestimate: "every hour"`)
}

func TestLoadConfigResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "etc")
	require.NoError(t, os.Mkdir(sub, 0o700))
	path := filepath.Join(sub, "basin.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`token_file: secrets/token
data_dir: ../var/basin
calibration: calibration.json
collector:
  target_file: targets.json
gateway:
  admin_url: http://127.0.0.1:8081
  token_file: /abs/gateway-token
lending:
  backend: {kind: http, url: "http://lend:1", token_file: lend-token}
alerts:
  basic_user: am
  basic_password_file: am-password
slack:
  webhook_url_file: hook
`), 0o600))
	c, err := LoadConfig(path)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(sub, "secrets/token"), c.TokenFile)
	assert.Equal(t, filepath.Join(dir, "var/basin"), c.DataDir)
	assert.Equal(t, filepath.Join(sub, "calibration.json"), c.Calibration)
	assert.Equal(t, filepath.Join(sub, "targets.json"), c.Collector.TargetFile)
	assert.Equal(t, "/abs/gateway-token", c.Gateway.TokenFile, "absolute paths are kept")
	assert.Equal(t, filepath.Join(sub, "lend-token"), c.Lending.Backend.TokenFile)
	assert.Equal(t, filepath.Join(sub, "am-password"), c.Alerts.BasicPasswordFile)
	assert.Equal(t, filepath.Join(sub, "hook"), c.Slack.WebhookURLFile)
	assert.Equal(t, "http://127.0.0.1:8081", c.Gateway.AdminURL, "URLs are not paths")

	// Errors name the file, the key and the line.
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(minimalYAML+"interval: 1ms\n"), 0o600))
	_, err = LoadConfig(bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), bad)
	assert.Contains(t, err.Error(), "line 7: interval")

	_, err = LoadConfig(filepath.Join(dir, "absent.yaml"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestNewNamesWhatItCannotUse: New fails at start, naming the setting, rather than run half-blind.
func TestNewNamesWhatItCannotUse(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(e *env)
		want   string
	}{
		{"no token", func(e *env) { e.cfg.TokenFile = "" }, "token_file: no control API token"},
		{"token file absent", func(e *env) { e.cfg.TokenFile = filepath.Join(e.dir, "absent") }, "token_file"},
		{"token file empty", func(e *env) {
			require.NoError(t, os.WriteFile(e.cfg.TokenFile, []byte("\n"), 0o600))
		}, ": empty"},
		{"calibration absent", func(e *env) { e.cfg.Calibration = filepath.Join(e.dir, "absent.json") }, "calibration:"},
		{"calibration invalid", func(e *env) {
			require.NoError(t, os.WriteFile(e.cfg.Calibration, []byte(`{"version": 7}`), 0o600))
		}, "calibration:"},
		{"target role", func(e *env) { e.cfg.Collector.Targets[0].Role = "prefil" }, "role"},
		{"slack bot token file absent", func(e *env) {
			e.cfg.Slack.BotTokenFile, e.cfg.Slack.Channel = filepath.Join(e.dir, "absent"), "C1"
		}, "slack.bot_token_file"},
		{"basic auth without password", func(e *env) { e.cfg.Alerts.BasicUser = "am" }, "alerts.basic_password_file"},
		{"lending backend kind", func(e *env) { e.cfg.Lending.Backend.Kind = "carrier-pigeon" }, "lending.backend"},
		{"web config file absent", func(e *env) { e.cfg.WebConfigFile = filepath.Join(e.dir, "absent-web.yml") }, "web_config_file"},
		{"target file absent", func(e *env) { e.cfg.Collector.TargetFile = filepath.Join(e.dir, "absent-targets.json") }, "absent-targets.json"},
		{"state file corrupt", func(e *env) {
			require.NoError(t, os.MkdirAll(e.cfg.DataDir, 0o700))
			require.NoError(t, os.WriteFile(statePath(e.cfg.DataDir), []byte("{"), 0o600))
		}, "move it aside"},
		{"audit log corrupt", func(e *env) {
			require.NoError(t, os.MkdirAll(e.cfg.DataDir, 0o700))
			require.NoError(t, os.WriteFile(auditPath(e.cfg.DataDir), []byte("garbage\n{}\n"), 0o600))
		}, "line 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(TokenEnv, "")
			t.Setenv(SlackTokenEnv, "")
			t.Setenv(SlackWebhookEnv, "")
			e := newEnv(t, "")
			tc.mutate(e)
			_, statErr := os.Stat(e.cfg.DataDir)
			existed := statErr == nil
			_, err := New(e.cfg, Options{Clock: e.deploymentClock(), Gateway: e.gw})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			if !existed {
				// Nothing is created before everything the configuration names has been checked.
				_, statErr = os.Stat(e.cfg.DataDir)
				assert.ErrorIs(t, statErr, os.ErrNotExist, "data_dir created by a daemon that did not start")
			}
		})
	}
}

// TestTargetErrorsNameFileAndLine: a bad target in daemon.yaml is reported with the file and the
// line to fix, every one of them at once.
func TestTargetErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "daemon.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`data_dir: data
dry_run: true
collector:
  targets:
    - {name: prefill-0, url: "http://p:30000/metrics", role: prefill, dialect: sglang}
    - name: decode-0
      url: "ftp://d:30001/metrics"
      role: decoder
    - {name: prefill-0, url: "http://p2:30000/metrics", role: prefill}
    - {url: "http://g:8081/metrics", role: gateway, dialect: sglang}
    - {name: router, role: unified, dialect: basin-gateway}
`), 0o600))
	_, err := LoadConfig(path)
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{
		"daemon config " + path + ": ",
		`line 7: collector.targets.1.url: "ftp://d:30001/metrics" is not an http(s) URL with a host (target decode-0)`,
		`line 8: collector.targets.1.role: "decoder", want one of [prefill decode unified gateway] (target decode-0)`,
		`line 9: collector.targets.2.name: "prefill-0" already names target 0`,
		`line 10: collector.targets.3: name: required`,
		`line 10: collector.targets.3.dialect: sglang does not fit role gateway`,
		`line 11: collector.targets.4: url: required`,
		`line 11: collector.targets.4.dialect: basin-gateway does not fit role unified (engines speak sglang or vllm) (target router)`,
	} {
		assert.Contains(t, msg, want)
	}
	_, statErr := os.Stat(filepath.Join(dir, "data"))
	assert.ErrorIs(t, statErr, os.ErrNotExist)
}

// TestStartSaysWhichSignalCannotBeProvided: a daemon whose targets cannot feed a signal the
// detector needs says which one at start, naming the missing target, rather than only staying
// blind later.
func TestStartSaysWhichSignalCannotBeProvided(t *testing.T) {
	for _, tc := range []struct {
		name    string
		targets []collector.Target
		want    []string
	}{
		{"every target", nil, nil},
		{"no gateway target", []collector.Target{
			{Name: "prefill-0", URL: "http://127.0.0.1:1/metrics/prefill-0", Role: collector.RolePrefill, Dialect: collector.DialectSGLang},
			{Name: "decode-0", URL: "http://127.0.0.1:1/metrics/decode-0", Role: collector.RoleDecode, Dialect: collector.DialectSGLang},
		}, []string{"live_sessions (needed by detector): missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "")
			if tc.targets != nil {
				e.cfg.Collector.Targets = tc.targets
			}
			var buf bytes.Buffer
			e.log = slog.New(slog.NewTextHandler(&buf, nil))
			e.daemon()
			logged := buf.String()
			if len(tc.want) == 0 {
				assert.NotContains(t, logged, "cannot provide a signal")
			}
			for _, w := range tc.want {
				assert.Contains(t, logged, w)
			}
		})
	}
}

// TestConfigReportsEveryBadValue: a daemon configuration with several bad values — bad
// durations and numbers the decoder refuses, and values that decode but do not validate — names
// every one with its key and line in one run, not the first alone.
func TestConfigReportsEveryBadValue(t *testing.T) {
	_, err := ParseConfig([]byte(`data_dir: /x
interval: fast
spike_tolerance_margin: lots
collector:
  targets: [{name: g, url: "http://a/metrics", role: gateway}]
  timeout: soon
gateway: {admin_url: "ftp://a"}
lending: {max_fraction: 2}
`))
	require.Error(t, err)
	for _, want := range []string{`line 2: interval: duration "fast"`, "line 3: spike_tolerance_margin:", `line 6: collector.timeout: duration "soon"`,
		`line 7: gateway.admin_url: "ftp://a" is not an http(s) URL`, "line 8: lending.max_fraction: 2 outside [0, 1]"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NotContains(t, err.Error(), "must be at least 1s", "no second message about the interval the decoder refused")
}
