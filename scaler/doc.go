// Package scaler sizes a deployment in instances of each role and asks for them: what the
// deployment needs now (Size), the policy that decides when to ask (Policy), and the backends
// that carry the ask out.
//
// Adding instances widens the prefix cache itself, where the gateway's budget and KV lending work
// within the cache the deployment has: it is the remediation for a working set that has outgrown
// the cache, when arrivals stay above what the deployment completes. The autoscalers deployments
// run (the Horizontal Pod Autoscaler, KEDA, an inference platform's planner) scale on utilisation,
// queue length or time to first token, which the Basin paper shows stay calm until the trap has
// closed; the need computed here is from the working set against the knee instead, and is exported
// for them as basin_capacity_needed_instances whether or not basin scales by itself.
//
// # The need
//
// By Little's law the arrivals keep λ × T sessions live, T being how long a session lives under
// the knee (the detector's Assessment.SessionLifetime, read off the healthy side of the learnt
// completion curve, so that it does not move when instances are added), λ the detector's settled
// arrival rate taken ArrivalsConfidence standard errors low (a Poisson burst, or a cold start's
// first minute, is not demand). A spike of a configured size over the long-run rate, for a
// configured length, adds what of it λ does not carry already (a spike under way is in λ) on top,
// unless the detector's fluid model says the deployment absorbs it as it is. Prefill instances
// must hold that population's working set under the knee (the steady population's margin may sit
// in the KV decode lends), decode instances the KV of its calls in flight (the served share, with
// a binomial margin); neither may fall under what the live sessions hold now.
//
// # The policy
//
// Policy asks at once for all the arrivals need when that rises (after a short cool-down against
// noise), and asks for less as the mirror of it: each step finds the size that is enough — the
// arrivals taken high, the live sessions well under the knee and under it with the planned spike
// on top — and a scale-in goes to the largest of those over a sliding window (the HPA's
// stabilisation), never below a floor or above a ceiling. The daemon and the simulator's harness run it
// through remediate.Loop, whose executor audits each ask before applying it and applies nothing
// in a dry run. The policy reads no clock: Inputs.At is now.
//
// # Backends
//
// A Backend applies a Request: the desired replicas of one role, level-triggered — applying the
// same request twice equals applying it once, so the caller may apply its desired state every step
// and a failed or missed apply is repaired by the next one. Apply returns once the request is
// accepted, not once the instances serve: a GPU instance takes minutes to load its model, and
// the engines' metrics say when it has. The kinds, as NewBackend builds them from the YAML
// config (every mistake at once, each naming its key):
//
//   - sim: the simulator's switch, in-process (Wiring.Sim);
//   - http: a JSON POST of the request (Payload) to an operator's endpoint, with a bearer token
//     reread at each apply;
//   - exec: an operator's command, run without a shell, the request on stdin and in
//     BASIN_SCALE_* variables;
//   - kubernetes: the scale subresource of a Deployment or StatefulSet per role, through the API
//     server's REST interface with the pod's service account.
//
// Current reads the count back where the backend can know it: the kubernetes backend reads the
// scale subresource (spec.replicas asked for, status.replicas created); the others report
// ok=false, and the caller counts the instances from the engines' metrics.
//
// The http and exec mechanics (bounded calls, redirects not followed, redacted URLs, the start of
// an error body, the end of a script's stderr) are internal/hook's, shared with package lender,
// whose backends these mirror.
//
// # Why hand-written REST rather than client-go
//
// Scaling takes two calls on one stable resource: GET and PATCH of
// /apis/apps/v1/namespaces/{namespace}/{deployments|statefulsets}/{name}/scale, whose body is an
// autoscaling/v1 Scale (spec.replicas, status.replicas) and whose refusals are a meta/v1 Status
// (reason, message, code) — both unchanged since apps/v1 went GA in Kubernetes 1.9. An in-cluster
// client is three mounted files (token, CA, namespace) and two environment variables. k8s.io/client-go
// would bring k8s.io/api, k8s.io/apimachinery and their dependencies into a binary that otherwise
// needs none of them, and a release train to follow, for those two calls; net/http and two small
// structs do them, with the token reread at each call because projected service account tokens
// rotate. What client-go would add and this package does not do: read a kubeconfig, run exec
// credential plugins, or authenticate with client certificates — outside a cluster, set
// api_server, token_file (for example from `kubectl create token`) and ca_file.
package scaler
