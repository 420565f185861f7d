// Package rules holds basin's Prometheus rules, in basin.rules.yml: recording rules that
// dashboards and alerts share (prefix-cache hit rate from counters, working set against cache and
// knee, session arrival and completion rates, TTFT quantiles, engine queues and KV usage), basin's
// alerts, and the conventional utilisation alerts next to them so that the difference shows.
//
// The package has no Go API. Its tests run promtool over the file and over the unit tests in
// tests/, and check that every alert carries a severity, a summary, a description and a runbook
// link to a heading of docs/runbook.md, that every for: duration says why, and that every alert
// has a firing and a quiet test case.
package rules
