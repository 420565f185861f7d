package daemon

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/store"
	"github.com/basin-dev/basin/internal/yamlconf"
	"github.com/basin-dev/basin/lender"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/remediate/alerts"
	"github.com/basin-dev/basin/scaler"
)

// Defaults of the daemon's own settings.
const (
	// DefaultListen keeps the API on loopback unless configured otherwise.
	DefaultListen = "127.0.0.1:9095"
	// DefaultInterval is the loop period: the collector's scrape interval.
	DefaultInterval = 5 * time.Second
	// DefaultDailySummary posts the summary at 09:00 UTC (robfig/cron with seconds).
	DefaultDailySummary = "CRON_TZ=UTC 0 0 9 * * *"
	// DefaultKneeReestimate re-estimates the knee passively every hour.
	DefaultKneeReestimate = "@every 1h"
	// DefaultSpikeToleranceMargin: a deployment should take +50% arrivals for ten minutes and come
	// back by itself. The paper's deployment recovers from +33% and is trapped by +100%; a margin
	// between the two warns while a spike the size of ordinary bursts can still be absorbed.
	DefaultSpikeToleranceMargin = 0.5
	// DefaultLeaseTTL is store.lease_ttl's default for the daemon: a crashed acting daemon is
	// replaced within it. Longer than the gateway's (5s): the daemon acts every interval, not
	// on every session, and a takeover reconciles the audit before it acts.
	DefaultLeaseTTL = 15 * time.Second
	// TokenEnv, GatewayTokenEnv, SlackTokenEnv and SlackWebhookEnv hold secrets when no file is
	// configured.
	TokenEnv        = "BASIN_DAEMON_TOKEN"
	GatewayTokenEnv = "BASIN_GATEWAY_ADMIN_TOKEN"
	SlackTokenEnv   = "BASIN_SLACK_TOKEN"
	SlackWebhookEnv = "BASIN_SLACK_WEBHOOK_URL"
)

// Duration is a time.Duration written the Go way in YAML ("30s").
type Duration = yamlconf.Duration

// Config is `basin daemon --config`'s file. Relative paths are resolved against its directory.
type Config struct {
	// Deployment names the deployment in messages and metrics.
	Deployment string `yaml:"deployment"`
	// Listen is the address of /metrics, /healthz, /readyz, the status page and the API
	// (DefaultListen).
	Listen string `yaml:"listen"`
	// TokenFile holds the bearer token of the control API (pause, alerts webhook); else TokenEnv.
	TokenFile string `yaml:"token_file"`
	// WebConfigFile is a Prometheus exporter-toolkit web configuration file (TLS, basic auth) for
	// the listener; empty: plain HTTP. Basic auth there applies to every endpoint, /metrics and the
	// webhook included, on top of the token the control endpoints need.
	WebConfigFile string `yaml:"web_config_file"`
	// DataDir keeps the audit log and the state across restarts (required).
	DataDir string `yaml:"data_dir"`
	// Interval is the loop period (DefaultInterval).
	Interval Duration `yaml:"interval"`
	// DryRun decides, audits and notifies but never acts.
	DryRun bool `yaml:"dry_run"`
	// Calibration is the file `basin calibrate` wrote; empty: the knee is learnt passively.
	Calibration string `yaml:"calibration"`
	// SpikeToleranceMargin is the spike the deployment should always be able to absorb, as a
	// fraction of its arrival rate over ten minutes (DefaultSpikeToleranceMargin, +50%): the
	// BasinSpikeToleranceLow alert warns when the spike tolerance stays under 1 + this. The daemon
	// exports it as basin_spike_tolerance_alert_ratio so the rule reads it from here.
	SpikeToleranceMargin float64 `yaml:"spike_tolerance_margin"`
	// Detector tunes the detector (zero: the defaults of package detector).
	Detector DetectorConfig `yaml:"detector"`
	// Collector is what to scrape.
	Collector CollectorConfig `yaml:"collector"`
	// Gateway is the admission gateway's admin API.
	Gateway GatewayConfig `yaml:"gateway"`
	// Remediate tunes the budget controller and shedding (zero: the defaults of package remediate).
	Remediate remediate.Options `yaml:"remediate"`
	// Lending switches KV lending; off unless a backend is configured.
	Lending LendingConfig `yaml:"lending"`
	// Capacity sizes the deployment in instances of each role, exported for autoscalers as
	// basin_capacity_needed_instances (zero: the defaults of package scaler).
	Capacity CapacityConfig `yaml:"capacity"`
	// Scaling asks for instances itself; off unless a backend is configured.
	Scaling ScalingConfig `yaml:"scaling"`
	// Alerts configures the Alertmanager webhook at /api/v1/alerts.
	Alerts AlertsConfig `yaml:"alerts"`
	// Slack is where transitions and actions are posted; empty: nowhere.
	Slack SlackConfig `yaml:"slack"`
	// Cron schedules the daily summary and the knee re-estimation (robfig/cron specs with seconds).
	Cron CronConfig `yaml:"cron"`
	// Store is the Redis or Valkey server two daemons of one deployment share to run active and
	// standby (docs/daemon.md, "Running two daemons (HA)"). Without store.url the daemon runs
	// alone, exactly as without the block.
	Store store.Config `yaml:"store"`
	// Instance names this daemon in the store's lease and in its status (default: the host name
	// and the process id); it needs store.url.
	Instance string `yaml:"instance"`
}

// DetectorConfig is what an operator may tune of the detector.
type DetectorConfig struct {
	// OverloadHold is how long arrivals must run above the peak completion rate before the
	// detector enters pressure (DefaultOverloadHold). Longer: fewer pressure spells, and a later
	// first warning of a spike; pressure pages no one (docs/simulator.md, "What bounds the lead",
	// has the trade measured).
	OverloadHold Duration `yaml:"overload_hold"`
}

// CollectorConfig is the scrape configuration (see package collector).
type CollectorConfig struct {
	// Targets are the /metrics endpoints scraped every interval: the engines' and the gateway's
	// (required unless TargetFile gives them).
	Targets []collector.Target `yaml:"targets"`
	// TargetFile is a Prometheus file_sd file (JSON, or YAML when it ends in .yml or .yaml) with
	// more targets, re-read whenever it changes.
	TargetFile string `yaml:"target_file"`
	// Timeout bounds one scrape, body included, in wall time even against a simulated deployment
	// served faster than real time (default: the collector's, capped at the daemon's interval).
	Timeout Duration `yaml:"timeout"`
	// Window is the span of rates and quantiles (default: the collector's, at least two
	// intervals).
	Window Duration `yaml:"window"`
}

// GatewayConfig reaches the gateway's admin listener.
type GatewayConfig struct {
	// AdminURL is the gateway's admin listener (required unless dry_run).
	AdminURL string `yaml:"admin_url"`
	// TokenFile holds the gateway's admin token; else GatewayTokenEnv.
	TokenFile string `yaml:"token_file"`
}

// LendingConfig is the lender and its backend.
type LendingConfig struct {
	// Backend is where lending decisions go; an empty kind disables lending control.
	Backend lender.BackendConfig `yaml:"backend"`
	// MaxFraction caps what each decode instance lends, as a fraction of its KV capacity (0: the
	// lender's default).
	MaxFraction float64 `yaml:"max_fraction"`
	// MinDwell is the minimum time between toggles, except a reclaim for memory pressure (0: the
	// lender's default).
	MinDwell Duration `yaml:"min_dwell"`
}

// CapacityConfig sizes the deployment (scaler.NeedOptions; zero fields take its defaults).
type CapacityConfig struct {
	// SpikeSize is the spike the deployment is sized to absorb, as a fraction of its long-run
	// arrival rate (0.5: +50%), held for SpikeDuration.
	SpikeSize float64 `yaml:"spike_size"`
	// SpikeDuration is how long that spike lasts.
	SpikeDuration Duration `yaml:"spike_duration"`
	// KneeShare is the share of the knee the steady population's working set may reach.
	KneeShare float64 `yaml:"knee_share"`
	// DecodeHeadroom is the share of each decode instance's KV kept free.
	DecodeHeadroom float64 `yaml:"decode_headroom"`
	// DecodeFloor is the fewest decode instances an autoscaler scaling the decode pool on
	// basin_capacity_needed_instances keeps (its minReplicaCount, minReplicas): the prefill need
	// then counts the cache lent by the decode instances that stay (that many, or as many as
	// decode needs), not by every one serving now, which the autoscaler may remove. 0: the decode
	// pool is not scaled on basin's need. With basin's own scaling of decode, its floor is used.
	DecodeFloor int `yaml:"decode_floor"`
}

// Need is the sizing's options.
func (c CapacityConfig) Need() scaler.NeedOptions {
	return scaler.NeedOptions{SpikeSize: c.SpikeSize, SpikeDuration: time.Duration(c.SpikeDuration), KneeShare: c.KneeShare,
		DecodeHeadroom: c.DecodeHeadroom}
}

// ScalingConfig is basin's own scaling: the backend that asks for instances and the policy's
// bounds and pacing (zero durations and shares take package scaler's defaults).
type ScalingConfig struct {
	// Backend is where the asks go; an empty kind disables scaling.
	Backend scaler.BackendConfig `yaml:"backend"`
	// Floor is the fewest instances of each scaled role basin asks for (default 1).
	Floor map[scaler.Role]int `yaml:"floor"`
	// Ceiling is the most instances of each role basin asks for: the GPUs set aside. A role is
	// scaled when it has a ceiling.
	Ceiling map[scaler.Role]int `yaml:"ceiling"`
	// UpCoolDown is the least time between two scale-outs of a role.
	UpCoolDown Duration `yaml:"up_cool_down"`
	// DownCoolDown is the least time between a role's scale-out and its scale-in.
	DownCoolDown Duration `yaml:"down_cool_down"`
	// ScaleInBelow is the share of the limits (the knee, the decode KV) what runs now may reach
	// after a scale-in; with the sizing's planned spike on top it must stay under the limits.
	ScaleInBelow float64 `yaml:"scale_in_below"`
	// ScaleInHold is the window a scale-in looks back over: it goes to the largest size any step
	// of it found enough, and not before the daemon has watched a whole window.
	ScaleInHold Duration `yaml:"scale_in_hold"`
}

// Enabled reports whether a scaling backend is configured.
func (c ScalingConfig) Enabled() bool { return c.Backend.Kind != "" }

// Options is the scaling policy's options, the roles scaled being those with a ceiling.
func (c ScalingConfig) Options(need scaler.NeedOptions) scaler.Options {
	roles := make([]scaler.Role, 0, len(c.Ceiling))
	for _, r := range scaler.Roles() {
		if _, ok := c.Ceiling[r]; ok {
			roles = append(roles, r)
		}
	}
	for r := range c.Ceiling {
		if !slices.Contains(roles, r) {
			roles = append(roles, r) // an unknown role, for Validate to name
		}
	}
	return scaler.Options{Need: need, Roles: roles, Floor: c.Floor, Ceiling: c.Ceiling,
		UpCoolDown: time.Duration(c.UpCoolDown), DownCoolDown: time.Duration(c.DownCoolDown),
		ScaleInBelow: c.ScaleInBelow, ScaleInHold: time.Duration(c.ScaleInHold)}
}

// AlertsConfig is the webhook receiver.
type AlertsConfig struct {
	// Matchers are the alerts that put basin in incident mode (default: BasinMetastableDrift,
	// BasinTrapped, BasinHitRateCollapsed).
	Matchers []alerts.Matcher `yaml:"matchers"`
	// BasicUser is the user name of the HTTP basic auth accepted besides the token (Alertmanager's
	// http_config.basic_auth); set it with BasicPasswordFile.
	BasicUser string `yaml:"basic_user"`
	// BasicPasswordFile holds the password of BasicUser.
	BasicPasswordFile string `yaml:"basic_password_file"`
}

// SlackConfig is the Slack outlet: a bot token and channel, or an incoming webhook.
type SlackConfig struct {
	// BotTokenFile holds a Slack bot token (xoxb-…, chat:write); else SlackTokenEnv. Needs Channel.
	BotTokenFile string `yaml:"bot_token_file"`
	// Channel is the channel ID (C…) or name the bot posts to; the bot must be a member.
	Channel string `yaml:"channel"`
	// WebhookURLFile holds an incoming-webhook URL, instead of a bot token and channel; else
	// SlackWebhookEnv.
	WebhookURLFile string `yaml:"webhook_url_file"`
	// APIURL overrides Slack's API (tests, proxies).
	APIURL string `yaml:"api_url"`
	// DashboardURL is linked from every message; "{deployment}" in it is replaced by the
	// deployment, query-escaped.
	DashboardURL string `yaml:"dashboard_url"`
	// StatusURL is linked from every message, like DashboardURL: typically the daemon's status
	// page.
	StatusURL string `yaml:"status_url"`
}

// CronConfig schedules the periodic jobs; "-" disables one.
type CronConfig struct {
	// DailySummary posts the summary of the period to Slack and starts a new period; "-" disables
	// it.
	DailySummary string `yaml:"daily_summary"`
	// KneeReestimate refits the knee on what the daemon observed and, when it moved, writes it back
	// to the calibration file (nothing to do without one); "-" disables it.
	KneeReestimate string `yaml:"knee_reestimate"`
}

// LoadConfig reads, defaults and validates a configuration file; errors name the key and line.
func LoadConfig(path string) (*Config, error) {
	return yamlconf.Load(path, "daemon config", ParseConfig, func(c *Config) []*string {
		return []*string{&c.TokenFile, &c.WebConfigFile, &c.DataDir, &c.Calibration, &c.Collector.TargetFile, &c.Gateway.TokenFile,
			&c.Lending.Backend.TokenFile, &c.Scaling.Backend.TokenFile, &c.Scaling.Backend.Kubernetes.TokenFile,
			&c.Scaling.Backend.Kubernetes.CAFile, &c.Alerts.BasicPasswordFile, &c.Slack.BotTokenFile, &c.Slack.WebhookURLFile}
	})
}

// ParseConfig reads a configuration from YAML, fills the defaults and validates it.
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	root, err := yamlconf.Decode(data, &c)
	if err != nil {
		err = removedKeys(data, err)
		if root == nil {
			return nil, err
		}
		// What did decode is validated too: one run names every mistake of the file.
		return nil, yamlconf.Join(err, c.validate(root))
	}
	if err := c.validate(root); err != nil {
		return nil, err
	}
	return &c, nil
}

// clockSpeedGone is what an old configuration's clock_speed gets: the key is gone, the daemon
// keeps the time of the clock it is given.
const clockSpeedGone = "removed: the daemon keeps the time of the clock it is given, the wall clock for real " +
	"engines; a simulated deployment served faster than real time is watched on its own clock, which " +
	"`basin daemon` takes from the speed the engines announce (basin_sim_speed) and `basin demo` injects"

// removedKeys rewrites the decoder's "unknown key" error about the top-level clock_speed, a key
// the configuration once had, into one that says what replaced it; the error's other parts are
// kept as they are.
func removedKeys(data []byte, err error) error {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return err
	}
	line := yamlconf.LineOf(&root, "clock_speed")
	if line == 0 {
		return err
	}
	parts := strings.Split(err.Error(), "; ")
	for i, m := range parts {
		if m == fmt.Sprintf("line %d: unknown key %q", line, "clock_speed") {
			parts[i] = fmt.Sprintf("line %d: clock_speed: %s", line, clockSpeedGone)
		}
	}
	return errors.New(strings.Join(parts, "; "))
}

func (c *Config) validate(root *yaml.Node) error {
	probs := yamlconf.NewProblems(root)
	bad := probs.Add
	if c.Deployment == "" {
		c.Deployment = "default"
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Interval == 0 {
		c.Interval = Duration(DefaultInterval)
	}
	if c.Interval < Duration(time.Second) {
		bad([]string{"interval"}, "%v, must be at least 1s", time.Duration(c.Interval))
	}
	if c.SpikeToleranceMargin == 0 {
		c.SpikeToleranceMargin = DefaultSpikeToleranceMargin
	}
	if !(c.SpikeToleranceMargin > 0 && c.SpikeToleranceMargin < detector.MaxSpikeRatio-1) {
		bad([]string{"spike_tolerance_margin"}, "%v outside (0, %v)", c.SpikeToleranceMargin, detector.MaxSpikeRatio-1)
	}
	if c.DataDir == "" {
		bad([]string{"data_dir"}, "required: where the audit log and state are kept")
	}
	if len(c.Collector.Targets) == 0 && c.Collector.TargetFile == "" {
		bad([]string{"collector", "targets"}, "required (or collector.target_file): the engines' and the gateway's /metrics")
	}
	validateTargets(probs, root, c.Collector.Targets)
	if c.Gateway.AdminURL == "" && !c.DryRun {
		bad([]string{"gateway", "admin_url"}, "required unless dry_run: the gateway's admin listener")
	} else if c.Gateway.AdminURL != "" {
		if u, err := url.Parse(c.Gateway.AdminURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad([]string{"gateway", "admin_url"}, "%q is not an http(s) URL", c.Gateway.AdminURL)
		}
	}
	if err := c.Remediate.Validate(); err != nil {
		bad([]string{"remediate"}, "%v", err)
	}
	if !(c.Lending.MaxFraction >= 0 && c.Lending.MaxFraction <= 1) { // NaN too
		bad([]string{"lending", "max_fraction"}, "%v outside [0, 1]", c.Lending.MaxFraction)
	}
	if err := c.Capacity.Need().Validate(); err != nil {
		bad([]string{"capacity"}, "%v", err)
	}
	if c.Capacity.DecodeFloor < 0 {
		bad([]string{"capacity", "decode_floor"}, "%d, must be ≥ 0 (0: the decode pool is not scaled on basin's need)", c.Capacity.DecodeFloor)
	}
	if c.Scaling.Enabled() {
		if _, err := scaler.New(c.Scaling.Options(c.Capacity.Need())); err != nil {
			bad([]string{"scaling"}, "%v", err)
		}
	} else if len(c.Scaling.Ceiling) > 0 || len(c.Scaling.Floor) > 0 {
		bad([]string{"scaling", "backend", "kind"}, "required with scaling.ceiling or scaling.floor: where to ask for instances")
	}
	s := c.Slack
	switch {
	case s.WebhookURLFile != "" && (s.BotTokenFile != "" || s.Channel != ""):
		bad([]string{"slack", "webhook_url_file"}, "give a webhook or a bot token and channel, not both")
	case s.BotTokenFile != "" && s.Channel == "":
		bad([]string{"slack", "channel"}, "required with bot_token_file")
	}
	if c.Cron.DailySummary == "" {
		c.Cron.DailySummary = DefaultDailySummary
	}
	if c.Cron.KneeReestimate == "" {
		c.Cron.KneeReestimate = DefaultKneeReestimate
	}
	// The scheduler's own parser (cron.WithSeconds), so a spec that passes here also schedules.
	parser := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	for _, j := range []struct{ key, spec string }{{"daily_summary", c.Cron.DailySummary}, {"knee_reestimate", c.Cron.KneeReestimate}} {
		key, spec := j.key, j.spec
		if spec == "-" {
			continue
		}
		if _, err := parser.Parse(spec); err != nil {
			bad([]string{"cron", key}, "%q: %v (six fields with seconds, or @every 1h, @daily, …)", spec, err)
		}
	}
	c.validateStore(root, bad)
	return probs.Err()
}

// validateStore checks the store block and the instance name; with a store it fills the
// defaults (the prefix from the deployment, the lease's TTL from DefaultLeaseTTL).
func (c *Config) validateStore(root *yaml.Node, bad func([]string, string, ...any)) {
	if !c.Store.Enabled() {
		for _, p := range c.Store.Check() {
			bad([]string{"store", p.Field}, "%s", p.Message)
		}
		if yamlconf.LineOf(root, "instance") != 0 {
			bad([]string{"instance"}, "needs store.url: it names this daemon in the store's lease")
		}
		return
	}
	c.Store = c.Store.WithDefaults(c.Deployment, DefaultLeaseTTL)
	c.Store.Prefix = strings.TrimSuffix(c.Store.Prefix, ":")
	for _, p := range c.Store.Check() {
		bad([]string{"store", p.Field}, "%s", p.Message)
	}
	if strings.ContainsFunc(c.Instance, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		bad([]string{"instance"}, "no whitespace or control characters, got %q", c.Instance)
	}
}

// validateTargets checks each configured target here, where the YAML's lines are known, so an
// error says which line of the file to fix (the collector checks them again, without lines). A
// problem with a key that is written is reported at that key's line, one with a missing key at the
// target's.
func validateTargets(probs *yamlconf.Problems, root *yaml.Node, targets []collector.Target) {
	roles := collector.Roles()
	seen := map[string]int{}
	for i, t := range targets {
		item := []string{"collector", "targets", strconv.Itoa(i)}
		label := ""
		if t.Name != "" {
			label = fmt.Sprintf(" (target %s)", t.Name)
		}
		bad := func(key, format string, args ...any) {
			path, msg := item, key+": "+fmt.Sprintf(format, args...)
			if withKey := append(slices.Clone(item), key); yamlconf.LineOf(root, withKey...) > 0 {
				path, msg = withKey, fmt.Sprintf(format, args...)
			}
			probs.Add(path, "%s%s", msg, label)
		}
		if t.Name == "" {
			bad("name", "required: names the target in metrics and logs")
		} else if j, dup := seen[t.Name]; dup {
			bad("name", "%q already names target %d", t.Name, j)
		} else {
			seen[t.Name] = i
		}
		if u, err := url.Parse(t.URL); t.URL == "" {
			bad("url", "required: the target's /metrics URL")
		} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("url", "%q is not an http(s) URL with a host", t.URL)
		}
		if !slices.Contains(roles, t.Role) {
			bad("role", "%q, want one of %v", t.Role, roles)
		}
		dialects := collector.Dialects()
		switch {
		case t.Dialect != "" && !slices.Contains(dialects, t.Dialect):
			bad("dialect", "%q, want one of %v (or leave it out: auto)", t.Dialect, dialects)
		case t.Role == collector.RoleGateway && t.Dialect != "" && t.Dialect != collector.DialectAuto && t.Dialect != collector.DialectGateway:
			bad("dialect", "%s does not fit role gateway (the gateway speaks %s)", t.Dialect, collector.DialectGateway)
		case t.Role != collector.RoleGateway && slices.Contains(roles, t.Role) && t.Dialect == collector.DialectGateway:
			bad("dialect", "%s does not fit role %s (engines speak %s or %s)", t.Dialect, t.Role, collector.DialectSGLang, collector.DialectVLLM)
		}
	}
}
