package scaler

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/hook"
	"github.com/basin-dev/basin/internal/secret"
)

// Where Kubernetes mounts a pod's service account credentials (the Kubernetes documentation,
// "Accessing the Kubernetes API from a Pod"): the in-cluster defaults of KubernetesConfig.
const (
	DefaultTokenFile     = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile        = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	DefaultNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)

// FieldManager names basin as the writer of spec.replicas (the fieldManager query parameter of
// the PATCH), so `kubectl get -o yaml --show-managed-fields` says who scaled.
const FieldManager = "basin"

// The kinds of object a role scales, as ScaleTarget.Kind spells them.
const (
	TargetDeployment  = "Deployment"
	TargetStatefulSet = "StatefulSet"
)

// maxAnswerBytes bounds an API server answer read into memory. Chosen: a Scale or a Status is
// under 2 KiB; 1 MiB leaves room for a long message and stops a misconfigured api_server from
// filling memory.
const maxAnswerBytes = 1 << 20

// KubernetesConfig is the API server and the objects kind kubernetes scales. The defaults are a
// pod's own: run in the cluster with a service account, set only targets.
type KubernetesConfig struct {
	// APIServer is the API server's https URL (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT,
	// in-cluster).
	APIServer string `yaml:"api_server"`
	// TokenFile holds the bearer token (default DefaultTokenFile), reread at each call: projected
	// service account tokens rotate.
	TokenFile string `yaml:"token_file"`
	// CAFile holds the PEM certificates that sign the API server's (default DefaultCAFile); only
	// these are trusted.
	CAFile string `yaml:"ca_file"`
	// Namespace holds the targets (default: the service account's own, DefaultNamespaceFile).
	Namespace string `yaml:"namespace"`
	// Targets is the object each role scales, e.g. {decode: {kind: StatefulSet, name: sglang-decode}};
	// a role without one is not scaled.
	Targets map[Role]ScaleTarget `yaml:"targets"`
}

// ScaleTarget is a Deployment or StatefulSet whose scale subresource sets a role's count.
type ScaleTarget struct {
	// Kind is Deployment or StatefulSet.
	Kind string `yaml:"kind"`
	// Name is the object's name in the namespace.
	Name string `yaml:"name"`
}

func (c KubernetesConfig) isZero() bool {
	return c.APIServer == "" && c.TokenFile == "" && c.CAFile == "" && c.Namespace == "" && len(c.Targets) == 0
}

// resource is the target's REST resource name.
func (t ScaleTarget) resource() string {
	if t.Kind == TargetStatefulSet {
		return "statefulsets"
	}
	return "deployments"
}

// KubernetesBackend sets a role's count through the scale subresource of a Deployment or
// StatefulSet (apps/v1), over the API server's REST interface with a service account token —
// what `kubectl scale` does. It needs the RBAC verbs get and patch on deployments/scale or
// statefulsets/scale in the apps group. Build it with NewBackend, which checks the config and
// loads the CA.
//
// Nothing else should own the count: a HorizontalPodAutoscaler on the same object would undo
// basin's writes, and basin its. Kubernetes keeps only the count: the request's reason and seq
// are the audit log's.
type KubernetesBackend struct {
	// APIServer is the API server's base URL, without a trailing slash.
	APIServer string
	// TokenFile holds the bearer token, read at each call.
	TokenFile string
	Namespace string
	Targets   map[Role]ScaleTarget
	// Timeout bounds one apply (both PATCHes, when the first meets a conflict) or one read
	// (DefaultHTTPTimeout when 0).
	Timeout time.Duration
	// Client trusts the configured CA and follows no redirects.
	Client *http.Client
}

// newKubernetes checks cfg, fills the in-cluster defaults and builds the backend; every problem
// names its key.
func newKubernetes(cfg KubernetesConfig, getenv func(string) string) (*KubernetesBackend, []error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	// inCluster marks an error about a default: the file is a pod's, so outside one the key must
	// be set.
	inCluster := func(set bool, key string) string {
		if set {
			return ""
		}
		return " (the in-cluster default; outside a cluster, set kubernetes." + key + ")"
	}

	api := cfg.APIServer
	if api == "" {
		host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			add("kubernetes.api_server: required outside a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)")
		} else {
			api = "https://" + net.JoinHostPort(host, port)
		}
	}
	if api != "" {
		if err := checkAPIServer(api); err != nil {
			add("kubernetes.api_server: %v", err)
		}
	}

	tokenFile := orString(cfg.TokenFile, DefaultTokenFile)
	if _, err := secret.File(tokenFile); err != nil {
		add("kubernetes.token_file: %v%s", err, inCluster(cfg.TokenFile != "", "token_file"))
	}

	var pool *x509.CertPool
	caFile := orString(cfg.CAFile, DefaultCAFile)
	if pem, err := os.ReadFile(caFile); err != nil {
		add("kubernetes.ca_file: %v%s", err, inCluster(cfg.CAFile != "", "ca_file"))
	} else if pool = x509.NewCertPool(); !pool.AppendCertsFromPEM(pem) {
		add("kubernetes.ca_file: %s: no PEM certificate in it", caFile)
	}

	ns := cfg.Namespace
	if ns == "" {
		b, err := os.ReadFile(DefaultNamespaceFile)
		switch {
		case err != nil:
			add("kubernetes.namespace: %v%s", err, inCluster(false, "namespace"))
		default:
			ns = strings.TrimSpace(string(b))
		}
	}
	if ns != "" && !dnsLabel(ns) {
		add("kubernetes.namespace: %q is not a namespace name (lowercase letters, digits and '-', at most 63)", ns)
	}

	errs = append(errs, checkTargets(cfg.Targets)...)

	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	client := hook.NoRedirects()
	client.Transport = transport
	return &KubernetesBackend{
		APIServer: strings.TrimSuffix(api, "/"),
		TokenFile: tokenFile,
		Namespace: ns,
		Targets:   cfg.Targets,
		Client:    client,
	}, errs
}

// checkAPIServer accepts an https URL without credentials, query or fragment; a path is kept, for
// an API server behind a proxy's prefix.
func checkAPIServer(s string) error {
	if err := hook.CheckURL(s, "the API server's URL"); err != nil {
		return err
	}
	u, _ := url.Parse(s) // CheckURL parsed it
	switch {
	case u.Scheme != "https":
		return fmt.Errorf("%s: want https (the service account token must not travel in clear)", u.Redacted())
	case u.User != nil:
		return fmt.Errorf("%s: credentials in the URL; the token comes from kubernetes.token_file", u.Redacted())
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("%s: want no query or fragment", u.Redacted())
	}
	return nil
}

// checkTargets checks the per-role objects, in role order so the errors read the same each run.
func checkTargets(targets map[Role]ScaleTarget) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(targets) == 0 {
		add("kubernetes.targets: required, the Deployment or StatefulSet of prefill, decode or both, e.g. {decode: {kind: StatefulSet, name: sglang-decode}}")
		return errs
	}
	roles := make([]Role, 0, len(targets))
	for r := range targets {
		roles = append(roles, r)
	}
	slices.Sort(roles)
	seen := map[ScaleTarget]Role{}
	for _, r := range roles {
		t := targets[r]
		key := "kubernetes.targets." + string(r)
		if !r.Valid() {
			add("%s: unknown role, want %s or %s", key, RolePrefill, RoleDecode)
			continue
		}
		switch t.Kind {
		case TargetDeployment, TargetStatefulSet:
		case "":
			add("%s.kind: required, %s or %s", key, TargetDeployment, TargetStatefulSet)
		default:
			add("%s.kind: unknown %q, want %s or %s", key, t.Kind, TargetDeployment, TargetStatefulSet)
		}
		switch {
		case t.Name == "":
			add("%s.name: required, the object's name", key)
		case !dnsSubdomain(t.Name):
			add("%s.name: %q is not an object name (lowercase letters, digits, '-' and '.', at most 253)", key, t.Name)
		}
		if other, dup := seen[t]; dup && t.Name != "" {
			add("%s: the same %s %s as %s; one count cannot be two roles'", key, t.Kind, t.Name, other)
		}
		seen[t] = r
	}
	return errs
}

// dnsLabel is Kubernetes' RFC 1123 label, the form of a namespace's name.
func dnsLabel(s string) bool {
	return len(s) <= 63 && rfc1123Part(s)
}

// dnsSubdomain is Kubernetes' RFC 1123 subdomain, the form of a Deployment's or StatefulSet's
// name: dot-separated parts, at most 253 characters.
func dnsSubdomain(s string) bool {
	if len(s) > 253 {
		return false
	}
	for p := range strings.SplitSeq(s, ".") {
		if !rfc1123Part(p) {
			return false
		}
	}
	return true
}

// rfc1123Part is lowercase letters, digits and '-', starting and ending alphanumeric.
func rfc1123Part(s string) bool {
	if s == "" {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	for i := 0; i < len(s); i++ {
		if !alnum(s[i]) && s[i] != '-' {
			return false
		}
	}
	return alnum(s[0]) && alnum(s[len(s)-1])
}

func orString(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// Name implements Backend.
func (*KubernetesBackend) Name() string { return KindKubernetes }

// Apply implements Backend: a merge patch {"spec":{"replicas":N}} of the role's scale
// subresource. Setting the count the object already has is a no-op for the API server, so
// applying the same request twice equals once. A conflict (409: the object changed while the API
// server wrote it) is retried once at once, since a merge patch carries no resourceVersion and the
// second applies to the new object; a second conflict is left to the next apply.
func (b *KubernetesBackend) Apply(ctx context.Context, r Request) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	t, ok := b.Targets[r.Role]
	if !ok {
		return fmt.Errorf("kubernetes: no target for role %s (kubernetes.targets.%s)", r.Role, r.Role)
	}
	what := fmt.Sprintf("scale %s %s/%s to %d", t.Kind, b.Namespace, t.Name, r.Replicas)
	if r.Replicas > math.MaxInt32 {
		return fmt.Errorf("kubernetes: %s: more than a replica count holds (%d)", what, math.MaxInt32)
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(b.Timeout, DefaultHTTPTimeout))
	defer cancel()
	body := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, r.Replicas)
	var got scale
	var err error
	for range 2 {
		got, err = b.call(ctx, http.MethodPatch, t, body)
		var se *StatusError
		if !errors.As(err, &se) || se.Code != http.StatusConflict {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("kubernetes: %s: %w%s", what, err, b.hint(err, t))
	}
	if got.Spec.Replicas != r.Replicas {
		return fmt.Errorf("kubernetes: %s: the API server answered spec.replicas %d (an admission webhook or another writer?)",
			what, got.Spec.Replicas)
	}
	return nil
}

// Current implements Backend: the role's scale subresource, spec.replicas as Desired and
// status.replicas as Running; ok is false for a role without a target.
func (b *KubernetesBackend) Current(ctx context.Context, role Role) (Count, bool, error) {
	if err := checkRole(KindKubernetes, role); err != nil {
		return Count{}, false, err
	}
	t, ok := b.Targets[role]
	if !ok {
		return Count{}, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(b.Timeout, DefaultHTTPTimeout))
	defer cancel()
	got, err := b.call(ctx, http.MethodGet, t, nil)
	if err != nil {
		return Count{}, false, fmt.Errorf("kubernetes: read the scale of %s %s/%s: %w%s",
			t.Kind, b.Namespace, t.Name, err, b.hint(err, t))
	}
	return Count{Desired: got.Spec.Replicas, Running: got.Status.Replicas}, true, nil
}

// scale is the part of an autoscaling/v1 Scale that basin reads.
type scale struct {
	Kind string `json:"kind"`
	Spec struct {
		Replicas int `json:"replicas"`
	} `json:"spec"`
	Status struct {
		Replicas int `json:"replicas"`
	} `json:"status"`
}

// status is the part of a meta/v1 Status, the API server's answer to a failed call, that basin
// reads.
type status struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
}

// StatusError is the API server's refusal: its HTTP status, and the reason and message of the
// Status object it sent (empty when the answer was not one, e.g. a proxy's error page, whose
// start is then the message).
type StatusError struct {
	// Code is the HTTP status, e.g. 403.
	Code int
	// Reason is the Status's machine-readable reason, e.g. Forbidden, NotFound, Conflict.
	Reason string
	// Message is the Status's message, in the API server's words.
	Message string
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("%d %s", e.Code, http.StatusText(e.Code))
	if e.Reason != "" {
		s = fmt.Sprintf("%s (%d)", e.Reason, e.Code)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// call sends one request to t's scale subresource and reads the Scale it answers.
func (b *KubernetesBackend) call(ctx context.Context, method string, t ScaleTarget, body []byte) (scale, error) {
	u := b.APIServer + "/apis/apps/v1/namespaces/" + url.PathEscape(b.Namespace) + "/" + t.resource() + "/" +
		url.PathEscape(t.Name) + "/scale"
	if method == http.MethodPatch {
		u += "?fieldManager=" + url.QueryEscape(FieldManager)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return scale{}, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "basin-scaler")
	if body != nil {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	}
	if err := hook.SetBearer(req.Header, b.TokenFile); err != nil {
		return scale{}, err
	}
	client := b.Client
	if client == nil {
		client = hook.NoRedirects()
	}
	resp, err := client.Do(req)
	if err != nil {
		return scale{}, err
	}
	defer hook.Drain(resp.Body)
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return scale{}, fmt.Errorf("%s: read the answer: %w", resp.Status, err)
	}
	if len(raw) > maxAnswerBytes {
		return scale{}, fmt.Errorf("%s: answer larger than %d bytes", resp.Status, maxAnswerBytes)
	}
	if resp.StatusCode/100 != 2 {
		var st status
		if json.Unmarshal(raw, &st) == nil && st.Kind == "Status" {
			return scale{}, &StatusError{Code: resp.StatusCode, Reason: st.Reason, Message: st.Message}
		}
		return scale{}, &StatusError{Code: resp.StatusCode, Message: strings.TrimPrefix(hook.SnippetOf(raw), ": ")}
	}
	var sc scale
	if err := json.Unmarshal(raw, &sc); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// The deadline cut the answer short: say so, rather than blame the answer. net/http can
			// hand back the headers of a response the server only finished because the client gave up.
			return scale{}, fmt.Errorf("%s: answer cut short: %w", resp.Status, cerr)
		}
		return scale{}, fmt.Errorf("%s: answer is not a Scale: %w%s", resp.Status, err, hook.SnippetOf(raw))
	}
	if sc.Kind != "Scale" {
		return scale{}, fmt.Errorf("%s: answer is a %q, not a Scale (is kubernetes.api_server the API server?)", resp.Status, sc.Kind)
	}
	return sc, nil
}

// hint says, after the API server's words, what to do about the refusals an operator can fix.
func (b *KubernetesBackend) hint(err error, t ScaleTarget) string {
	var se *StatusError
	if !errors.As(err, &se) {
		return ""
	}
	switch se.Code {
	case http.StatusUnauthorized:
		return " (the API server did not accept the token in kubernetes.token_file: expired, revoked or for another cluster)"
	case http.StatusForbidden:
		return fmt.Sprintf(" (the service account needs the RBAC verbs get and patch on %s/scale in the apps group, namespace %s)",
			t.resource(), b.Namespace)
	case http.StatusNotFound:
		return fmt.Sprintf(" (no %s %s in namespace %s: check kubernetes.targets and kubernetes.namespace)", t.Kind, t.Name, b.Namespace)
	case http.StatusConflict:
		return " (the object changed under both PATCHes; the next apply tries again)"
	case http.StatusTooManyRequests:
		return " (the API server is throttling; the next apply tries again)"
	}
	return ""
}
