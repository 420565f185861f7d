// Package deploy holds basin's deployment files and the tests that keep them honest: hardened
// systemd units for `basin gateway` and `basin daemon` with the drop-ins and configurations that
// make them a store-backed pair on two hosts (systemd/), and Kubernetes manifests for the single
// mode (one gateway, one daemon) and the replicated mode (a Redis/Valkey store, three gateways,
// two daemons) with their Prometheus Operator ServiceMonitors and PrometheusRule (kubernetes/),
// the Alertmanager route that notifies both replicated daemons (alertmanager/), and examples that
// size the engines' prefill and decode pools to the instances basin says the deployment needs:
// KEDA ScaledObjects, or HorizontalPodAutoscalers on an External metric with the
// prometheus-adapter rule that serves it (kubernetes/autoscaling/, prometheus-adapter/).
//
// The package has no code. Its tests parse every manifest strictly, per mode, run the embedded
// gateway and daemon configurations through the binaries' own config parsers, check that the
// workloads, Services, Secret keys, volumes, disruption budgets and ServiceMonitors refer to one
// another correctly, that the probes name the gateway's real handlers, that the store keeps an
// append-only file and evicts nothing, that the PrometheusRule carries exactly the groups of
// rules/basin.rules.yml, that the replicated daemons read the gateway's admission series from
// one address any replica answers and that Alertmanager notifies each daemon pod by name (amtool
// where it is installed), and that the units start the right subcommand (and pass
// systemd-analyze verify where it is installed). The autoscaling examples are checked against
// KEDA's own ScaledObject schema (testdata/keda/) and k8s.io/api's autoscaling/v2 types, and their
// PromQL parsed and run with promtool against basin's rules. When to run which mode is
// docs/scaling.md.
package deploy
