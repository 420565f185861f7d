package scaler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/basin-dev/basin/internal/hook"
	"github.com/basin-dev/basin/internal/secret"
)

// Role is a pool of a prefill/decode-disaggregated deployment that scales on its own.
type Role string

// The roles, as the config's targets and the payloads spell them.
const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Roles lists the roles in a stable order (metrics, reasons, plans).
func Roles() []Role { return []Role{RolePrefill, RoleDecode} }

// Valid says whether r is one of the roles.
func (r Role) Valid() bool { return r == RolePrefill || r == RoleDecode }

// Request is the desired state of one role, level-triggered: applying the same request twice
// equals applying it once, so a caller may apply its desired state every step and a failed or
// missed apply is repaired by the next one.
type Request struct {
	// Deployment names the deployment (the daemon's `deployment`), for a receiver that scales
	// several.
	Deployment string `json:"deployment"`
	Role       Role   `json:"role"`
	// Replicas is the number of instances the role should run.
	Replicas int `json:"replicas"`
	// Reason is the policy's verdict in words, for the receiver's logs.
	Reason string `json:"reason"`
	// Seq increases with every request the caller makes, so a receiver that can see requests out
	// of order (a queue, retries) keeps the newest.
	Seq uint64 `json:"seq"`
}

// Validate checks the request as every backend needs it; errors name the field.
func (r Request) Validate() error {
	var errs []error
	if !r.Role.Valid() {
		errs = append(errs, fmt.Errorf("role: %q, want %s or %s", r.Role, RolePrefill, RoleDecode))
	}
	if r.Replicas < 0 {
		errs = append(errs, fmt.Errorf("replicas: %d, must not be negative", r.Replicas))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("scale request: %w", err)
	}
	return nil
}

// Count is what a backend knows of a role's instances.
type Count struct {
	// Desired is the instances asked for (Kubernetes: the scale subresource's spec.replicas).
	Desired int
	// Running is the instances that exist (Kubernetes: status.replicas, the pods the controller
	// has created — not necessarily ready, let alone serving with a loaded model).
	Running int
}

// Backend asks a deployment for instances.
type Backend interface {
	// Name is the backend's kind, for logs and metrics.
	Name() string
	// Apply asks for r.Replicas instances of r.Role. It returns once the request is accepted, not
	// once the instances serve: a GPU instance takes minutes to load its model.
	Apply(ctx context.Context, r Request) error
	// Current reports the replicas the backend knows for the role: for kubernetes the scale
	// subresource's spec.replicas and status.replicas; ok=false where the backend cannot know
	// (sim, http, exec, which then rely on the engines' metrics) or scales no such role.
	Current(ctx context.Context, role Role) (c Count, ok bool, err error)
}

// Backend kinds, as BackendConfig.Kind spells them.
const (
	KindSim        = "sim"
	KindHTTP       = "http"
	KindExec       = "exec"
	KindKubernetes = "kubernetes"
)

// Backend timeouts when the config sets none.
const (
	// DefaultHTTPTimeout bounds one POST (http), and one apply — up to two PATCHes — or one read
	// against the Kubernetes API server. Chosen: an admin endpoint or the API server answers a
	// scale request in milliseconds; 5 s is one step of the daemon's loop (as the lender's), so a
	// hung endpoint costs at most one step.
	DefaultHTTPTimeout = 5 * time.Second
	// DefaultExecTimeout bounds one run of the command. Chosen, as the lender's: long enough for a
	// script that calls a cloud or cluster API and waits for it to accept; a script should ask for
	// the instances and return rather than wait for them to serve (minutes, for a model to load),
	// so the daemon's loop is not held.
	DefaultExecTimeout = 60 * time.Second
)

// BackendConfig selects and configures a backend; it is the scaler's backend section of the
// daemon's YAML config, values only (what the code hands in is Wiring).
type BackendConfig struct {
	// Kind is sim, http, exec or kubernetes.
	Kind string `yaml:"kind"`
	// URL receives each request as a JSON POST (http).
	URL string `yaml:"url"`
	// TokenFile holds a bearer token for URL (http, optional); read at each apply, so the token
	// can be rotated without a restart.
	TokenFile string `yaml:"token_file"`
	// Command is the program and its arguments, run without a shell (exec).
	Command []string `yaml:"command"`
	// Timeout bounds one apply, written "5s" (default DefaultHTTPTimeout for http and kubernetes,
	// DefaultExecTimeout for exec; sim takes none).
	Timeout time.Duration `yaml:"timeout"`
	// Kubernetes is the API server and the objects to scale (kubernetes).
	Kubernetes KubernetesConfig `yaml:"kubernetes"`
}

// Wiring is what the code that builds a backend hands in, beside the configuration.
type Wiring struct {
	// Sim is the simulator's switch that sets a role's instance count (kind sim).
	Sim func(role Role, replicas int)
	// Getenv reads the environment for the in-cluster defaults of kind kubernetes
	// (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT); nil is os.Getenv.
	Getenv func(string) string
}

// NewBackend builds the backend cfg names. Every problem is reported at once, each naming its
// YAML key, including keys set for a kind that ignores them: a url on an exec backend is a config
// mistake that would otherwise scale nothing, silently.
func NewBackend(cfg BackendConfig, w Wiring) (Backend, error) {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	unused := func(kind string, url, tokenFile, command, kube bool) {
		if url && cfg.URL != "" {
			add("url: not used by kind %s", kind)
		}
		if tokenFile && cfg.TokenFile != "" {
			if kind == KindKubernetes {
				add("token_file: not used by kind kubernetes (its token is kubernetes.token_file)")
			} else {
				add("token_file: not used by kind %s", kind)
			}
		}
		if command && cfg.Command != nil {
			add("command: not used by kind %s", kind)
		}
		if kube && !cfg.Kubernetes.isZero() {
			add("kubernetes: not used by kind %s", kind)
		}
	}
	if cfg.Timeout < 0 {
		add("timeout: %v, must not be negative", cfg.Timeout)
	}
	timeout := func(def time.Duration) time.Duration {
		if cfg.Timeout > 0 {
			return cfg.Timeout
		}
		return def
	}

	var b Backend
	switch cfg.Kind {
	case KindSim:
		unused(cfg.Kind, true, true, true, true)
		if cfg.Timeout != 0 {
			add("timeout: not used by kind sim (the simulator scales in-process)")
		}
		if w.Sim == nil {
			add("kind: sim needs the simulator's scaling switch, and none was wired (Wiring.Sim)")
		}
		b = SimBackend{Set: w.Sim}
	case KindHTTP:
		unused(cfg.Kind, false, false, true, true)
		if err := hook.CheckURL(cfg.URL, "where to POST the scale requests"); err != nil {
			add("url: %v", err)
		}
		if cfg.TokenFile != "" {
			if _, err := secret.File(cfg.TokenFile); err != nil {
				add("token_file: %v", err)
			}
		}
		b = &HTTPBackend{URL: cfg.URL, TokenFile: cfg.TokenFile, Timeout: timeout(DefaultHTTPTimeout)}
	case KindExec:
		unused(cfg.Kind, true, true, false, true)
		switch {
		case len(cfg.Command) == 0:
			add("command: required, the program and its arguments, e.g. [/usr/local/bin/scale-pool, --apply]")
		case cfg.Command[0] == "":
			add("command[0]: empty, want the program")
		default:
			if _, err := exec.LookPath(cfg.Command[0]); err != nil {
				add("command[0]: %v", err)
			}
		}
		b = &ExecBackend{Command: cfg.Command, Timeout: timeout(DefaultExecTimeout)}
	case KindKubernetes:
		unused(cfg.Kind, true, true, true, false)
		k, kerrs := newKubernetes(cfg.Kubernetes, w.Getenv)
		errs = append(errs, kerrs...)
		if k != nil {
			k.Timeout = timeout(DefaultHTTPTimeout)
			b = k
		}
	case "":
		add("kind: required, one of %s, %s, %s, %s", KindSim, KindHTTP, KindExec, KindKubernetes)
	default:
		add("kind: unknown %q, want one of %s, %s, %s, %s", cfg.Kind, KindSim, KindHTTP, KindExec, KindKubernetes)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("scaler backend: %w", err)
	}
	return b, nil
}

// PayloadVersion is the version of the JSON that the http and exec backends send. It changes
// only when a field changes meaning or goes away; new fields may appear within a version.
const PayloadVersion = 1

// Payload is the JSON the http backend POSTs and the exec backend writes to stdin: the request
// with a version, e.g.
//
//	{"version":1,"deployment":"prod","role":"decode","replicas":3,
//	 "reason":"trapped: …","seq":42}
type Payload struct {
	Version int `json:"version"`
	Request
}

// MarshalPayload encodes r as the versioned payload. The reason's "<" and ">" stay as they are
// rather than \u003c: the payload is read by scripts and people, never embedded in HTML.
func MarshalPayload(r Request) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(Payload{Version: PayloadVersion, Request: r}); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// SimBackend sets the simulator's instance count of a role, in-process.
type SimBackend struct {
	Set func(role Role, replicas int)
}

// Name implements Backend.
func (SimBackend) Name() string { return KindSim }

// Apply implements Backend.
func (b SimBackend) Apply(ctx context.Context, r Request) error {
	if b.Set == nil {
		return errors.New("sim: no scaling switch wired")
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	b.Set(r.Role, r.Replicas)
	return nil
}

// Current implements Backend: the switch only sets, so the simulator's engine metrics say what
// runs.
func (SimBackend) Current(_ context.Context, role Role) (Count, bool, error) {
	return Count{}, false, checkRole("sim", role)
}

// checkRole is the error of a backend asked about a role that does not exist.
func checkRole(kind string, role Role) error {
	if role.Valid() {
		return nil
	}
	return fmt.Errorf("%s: role %q, want %s or %s", kind, role, RolePrefill, RoleDecode)
}

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}
