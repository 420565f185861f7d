// Package e2e holds basin's end-to-end tests of the observability pack. It has no code of its
// own outside its tests.
//
// TestExamples checks the example configurations in examples/ with the tools that load them:
// `promtool check config` for examples/prometheus.yml (and so the rule file it names),
// `amtool check-config` for examples/alertmanager.yml, and a strict YAML read of the Grafana
// provisioning files.
//
// TestObservabilityPack runs the whole pack with the real tools, as processes on 127.0.0.1:
// `basin sim serve` (the paper's 1 prefill + 1 decode H100 deployment on an accelerated clock),
// `basin gateway` in front of it, `basin daemon` watching both, a real Prometheus scraping all
// three with basin's rules, a real Alertmanager routing basin's alerts to the daemon's webhook and
// to a Slack stand-in, and `basin loadgen` driving the paper's +100% spike. It checks that every
// dashboard query has data, that basin's alert fires before the conventional utilisation alerts,
// that Alertmanager delivers it to the daemon and to Slack, and that the alerts resolve once the
// deployment is out of the trap.
//
// TestFirstHourQuiet is an operator's first hour with the same processes but no Prometheus: an
// acting daemon over an idle deployment that then sees four tiny sessions of one call each. It
// must not call a handful of first calls' misses a trap, nor a quiet deployment blind; and once
// the engine and the gateway are gone it must say it is blind (status, basin_blind, /readyz).
//
// The deployment runs S times faster than the wall clock, and announces S (basin_sim_speed,
// X-Basin-Sim-Speed): the gateway keeps its idle timeout in the deployment's time by itself. Every
// other duration meant in the deployment's time is divided by S here: the daemon's (`basin daemon
// --clock-speed S`) and the rules' for: durations, range windows and offsets (scaleRules).
// Thresholds stay as written.
//
// The tests skip when the tools are not on PATH (prometheus, promtool,
// prometheus-alertmanager or alertmanager, amtool; Debian packages prometheus and
// prometheus-alertmanager), unless the environment variable CI is set, in which case they fail.
// TestObservabilityPack also skips under -short and under the race detector (the processes are
// built without it, so a race run would check nothing new).
package e2e
