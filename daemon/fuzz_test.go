package daemon

import (
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/yamlconftest"
)

// FuzzParseConfig feeds arbitrary files to ParseConfig. It must never panic; every problem of a
// rejection says where (its line) or what (its key path), except a YAML syntax error the parser
// cannot place; an accepted configuration satisfies everything the daemon relies on at start.
func FuzzParseConfig(f *testing.F) {
	example, err := os.ReadFile("../examples/daemon.yaml")
	require.NoError(f, err)
	f.Add(example)
	for _, s := range []string{
		minimalYAML,
		minimalYAML + "interval: 500ms\n",
		minimalYAML + "lending:\n  max_fraction: 1.5\n",
		minimalYAML + "clock_speed: 60\n", // removed: the error says what replaced it
		minimalYAML + "cron:\n  daily_summary: \"0 0 9 * *\"\n  knee_reestimate: \"-\"\n",
		minimalYAML + "slack:\n  bot_token_file: t\n",
		minimalYAML + "remediate:\n  step: -1\n",
		"data_dir: d\ndry_run: true\ncollector: {target_file: t.json}\n",
		"data_dir: d\ncollector:\n  targets: [{name: g, url: x, role: gateway}]\ngateway: {admin_url: \"ftp://a\"}\n",
		"interval: soon\n",
		"collector: [\n",
		"",
	} {
		f.Add([]byte(s))
	}
	parser := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			require.Nil(t, c)
			yamlconftest.RequireNamed(t, data, err)
			return
		}
		require.NotNil(t, c)
		require.NotEmpty(t, c.Deployment)
		require.NotEmpty(t, c.Listen)
		require.GreaterOrEqual(t, time.Duration(c.Interval), time.Second)
		require.NotEmpty(t, c.DataDir)
		require.True(t, len(c.Collector.Targets) > 0 || c.Collector.TargetFile != "")
		if !c.DryRun || c.Gateway.AdminURL != "" {
			u, err := url.Parse(c.Gateway.AdminURL)
			require.NoError(t, err)
			require.Contains(t, []string{"http", "https"}, u.Scheme)
			require.NotEmpty(t, u.Host)
		}
		require.NoError(t, c.Remediate.Validate())
		require.True(t, c.Lending.MaxFraction >= 0 && c.Lending.MaxFraction <= 1,
			"lending.max_fraction %v", c.Lending.MaxFraction)
		if c.Slack.BotTokenFile != "" {
			require.NotEmpty(t, c.Slack.Channel)
		}
		for _, spec := range []string{c.Cron.DailySummary, c.Cron.KneeReestimate} {
			require.NotEmpty(t, spec)
			if spec != "-" {
				_, err := parser.Parse(spec)
				require.NoError(t, err, "cron spec %q", spec)
			}
		}
	})
}
