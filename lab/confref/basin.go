package confref

import (
	"fmt"
	"github.com/basin-dev/basin/detector"
	"strings"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/daemon"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/lender"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/remediate/alerts"
	"github.com/basin-dev/basin/scaler"
)

// The smallest valid files: every key they set is required (validate in gateway/config.go and
// daemon/config.go).
const (
	gatewayMinimal = `upstreams: [http://127.0.0.1:8000]
admission:
  budget_tokens: 1000000
`
	daemonMinimal = `data_dir: /var/lib/basin
collector:
  targets:
    - {name: decode-0, url: "http://127.0.0.1:30000/metrics", role: decode}
gateway:
  admin_url: http://127.0.0.1:8081
`
)

// Files are basin's two configuration files.
func Files() []File {
	return []File{
		{
			Title: "Gateway: `basin gateway --config`",
			Intro: "The session gateway's file (`gateway.Config`, read by `gateway.LoadConfig`). " +
				"Annotated example: [gateway/testdata/gateway.example.yaml](../gateway/testdata/gateway.example.yaml).",
			Minimal: gatewayMinimal,
			Parse:   func(b []byte) (any, error) { return gateway.ParseConfig(b) },
			Defaults: map[string]string{
				// Filled by the admission core (gateway/admission), past ParseConfig.
				"admission.reference_budget_tokens": "= `admission.budget_tokens`",
				"admission.priority_tokens_per_sec": code(fmt.Sprint(admission.DefaultTokensPerSecond)),
			},
			Provenance: map[string]string{
				"affinity.header": "github.com/basin-dev/basin/gateway.DefaultAffinityHeader",
			},
		},
		{
			Title: "Daemon: `basin daemon --config`",
			Intro: "The remediation daemon's file (`daemon.Config`, read by `daemon.LoadConfig`). " +
				"Annotated example: [examples/daemon.yaml](../examples/daemon.yaml).",
			Minimal: daemonMinimal,
			Parse:   func(b []byte) (any, error) { return daemon.ParseConfig(b) },
			Downstream: func(cfg any) {
				c := cfg.(*daemon.Config)
				// ParseConfig validates remediate with its defaults; the policy fills them.
				if p, err := remediate.NewPolicy(c.Remediate); err == nil {
					c.Remediate = p.Options()
				}
			},
			Defaults: daemonDefaults(),
			Required: map[string]string{
				"collector.targets": "unless `collector.target_file` gives them",
				"gateway.admin_url": "unless `dry_run`",
			},
			Provenance: map[string]string{
				"lending.max_fraction":     "github.com/basin-dev/basin/lender.DefaultMaxFraction",
				"lending.min_dwell":        "github.com/basin-dev/basin/lender.DefaultMinDwell",
				"detector.overload_hold":   "github.com/basin-dev/basin/detector.DefaultOverloadHold",
				"capacity.spike_size":      "github.com/basin-dev/basin/scaler.DefaultSpikeSize",
				"capacity.knee_share":      "github.com/basin-dev/basin/scaler.DefaultKneeShare",
				"capacity.decode_headroom": "github.com/basin-dev/basin/scaler.DefaultDecodeHeadroom",
				"scaling.up_cool_down":     "github.com/basin-dev/basin/scaler.DefaultUpCoolDown",
				"scaling.down_cool_down":   "github.com/basin-dev/basin/scaler.DefaultDownCoolDown",
				"scaling.scale_in_below":   "github.com/basin-dev/basin/scaler.DefaultScaleInBelow",
				"scaling.scale_in_hold":    "github.com/basin-dev/basin/scaler.DefaultScaleInHold",
			},
		},
	}
}

// daemonDefaults are the daemon's defaults applied after ParseConfig: by daemon.New (the
// collector's timeout and window, from the default interval), by the collector (a target's
// dialect), the lender and the alerts receiver.
func daemonDefaults() map[string]string {
	timeout, window := daemon.CollectorDefaults(daemon.DefaultInterval)
	matchers := make([]string, 0, 3)
	for _, m := range alerts.DefaultMatchers() {
		matchers = append(matchers, code(m.AlertName))
	}
	return map[string]string{
		"collector.timeout": code(timeout.String()) +
			" (the collector's default, at most `interval`)",
		"collector.window": code(window.String()) +
			" (the collector's default, at least 2 × `interval`)",
		"collector.targets[].name":    "required",
		"collector.targets[].url":     "required",
		"collector.targets[].role":    "required",
		"collector.targets[].dialect": code(string(collector.DialectAuto)),
		"lending.backend.kind":        "— (lending off)",
		"lending.backend.timeout": fmt.Sprintf("%s (http, affinity), %s (exec)",
			code(lender.DefaultHTTPTimeout.String()), code(lender.DefaultExecTimeout.String())),
		"lending.max_fraction":     code(fmt.Sprint(lender.DefaultMaxFraction)),
		"lending.min_dwell":        code(time.Duration(lender.DefaultMinDwell).String()),
		"alerts.matchers":          "alertname " + strings.Join(matchers, ", "),
		"detector.overload_hold":   code(detector.DefaultOverloadHold.String()),
		"capacity.spike_size":      code(fmt.Sprint(scaler.DefaultSpikeSize)),
		"capacity.spike_duration":  code(scaler.DefaultSpikeDuration.String()),
		"capacity.knee_share":      code(fmt.Sprint(scaler.DefaultKneeShare)),
		"capacity.decode_headroom": code(fmt.Sprint(scaler.DefaultDecodeHeadroom)),
		"capacity.decode_floor":    code("0") + " (the decode pool not scaled on basin's need)",
		"scaling.backend.kind":     "— (scaling off)",
		"scaling.floor":            "1 a role",
		"scaling.ceiling":          "required with a backend",
		"scaling.up_cool_down":     code(scaler.DefaultUpCoolDown.String()),
		"scaling.down_cool_down":   code(scaler.DefaultDownCoolDown.String()),
		"scaling.scale_in_below":   code(fmt.Sprint(scaler.DefaultScaleInBelow)),
		"scaling.scale_in_hold":    code(scaler.DefaultScaleInHold.String()),
	}
}

// Intro opens the page.
const Intro = `# Configuration reference

basin reads two YAML files: the **gateway**'s (` + "`basin gateway --config`" + `), the session-aware
admission proxy in front of the engines, and the **daemon**'s (` + "`basin daemon --config`" + `), the
loop that scrapes the engines and the gateway, detects metastable drift and remediates. Both are
read strictly: an unknown key or a bad value is an error naming the key and its line. Relative
paths are resolved against the file's directory; durations are written the Go way (` + "`30s`, `10m`, `1h30m`" + `).

This page is generated from the code by ` + "`" + Command + "`" + ` and checked by a test
(` + "`go test ./lab/confref/`" + `), so it cannot drift: keys and types come from the config structs,
defaults from running the real ` + "`ParseConfig`" + ` (and the defaults applied after it) on a minimal
file, meanings from the fields' doc comments. Do not edit it by hand. "required" marks the keys the
minimal file must set; "—" means unset, and the meaning says what unset does. Keys under ` + "`x[]`" + ` are
the fields of each element of the list ` + "`x`" + `.

[gateway/testdata/gateway.example.yaml](../gateway/testdata/gateway.example.yaml) and
[examples/daemon.yaml](../examples/daemon.yaml) are annotated example files.
`

// Page renders docs/configuration.md from the module rooted at root.
func Page(root, module string) ([]byte, error) {
	return NewGenerator(root, module).Generate(Intro, Files())
}
