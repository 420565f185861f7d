// Package deploy holds basin's deployment files and the tests that keep them honest: hardened
// systemd units for `basin gateway` and `basin daemon` (systemd/), and Kubernetes manifests for
// both with their Prometheus Operator ServiceMonitors and PrometheusRule (kubernetes/).
//
// The package has no code. Its tests parse every manifest strictly, run the embedded gateway and
// daemon configurations through the binaries' own config parsers, check that the Deployments,
// Services, Secret keys, volumes and ServiceMonitors refer to one another correctly, that the
// PrometheusRule carries exactly the groups of rules/basin.rules.yml, and that the units start the
// right subcommand (and pass systemd-analyze verify where it is installed). How far one gateway and
// one daemon scale, and why both run as a single replica, is docs/scaling.md.
package deploy
