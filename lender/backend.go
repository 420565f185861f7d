package lender

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

// Backend applies a lending decision to a deployment. Apply is level-triggered: it receives the
// whole desired state, and applying the same decision twice must equal applying it once, so the
// caller may apply every decision and the next one repairs a failed apply.
type Backend interface {
	// Name is the backend's kind, for logs and metrics.
	Name() string
	Apply(ctx context.Context, d Decision) error
}

// Backend kinds, as BackendConfig.Kind spells them.
const (
	KindSim      = "sim"
	KindAffinity = "affinity"
	KindHTTP     = "http"
	KindExec     = "exec"
)

// Backend timeouts when the config sets none.
const (
	// DefaultHTTPTimeout bounds one POST, and one affinity switch through the gateway's admin API.
	// Chosen: an admin endpoint answers in milliseconds; 5 s is one step of the daemon's loop, so
	// a hung endpoint costs at most one step.
	DefaultHTTPTimeout = 5 * time.Second
	// DefaultExecTimeout bounds one run of the command. Chosen: long enough for a script that
	// drains a router or flips a blue/green switch and waits for it to take; a switch that takes
	// longer should start in the background and return, so the daemon's loop is not held.
	DefaultExecTimeout = 60 * time.Second
)

// BackendConfig selects and configures a backend; it is the lender's backend section of the
// daemon's YAML config, values only (what the code hands in is Wiring).
type BackendConfig struct {
	// Kind is sim, affinity, http or exec.
	Kind string `yaml:"kind"`
	// URL receives the decision as a JSON POST (http).
	URL string `yaml:"url"`
	// TokenFile holds a bearer token for URL (http, optional); read at each apply, so the token
	// can be rotated without a restart.
	TokenFile string `yaml:"token_file"`
	// Command is the program and its arguments, run without a shell (exec).
	Command []string `yaml:"command"`
	// Timeout bounds one apply, written "5s" (default DefaultHTTPTimeout for http and affinity,
	// DefaultExecTimeout for exec; sim takes none).
	Timeout time.Duration `yaml:"timeout"`
}

// Wiring is what the code that builds a backend hands in, beside the configuration: the
// in-process simulator's switch and the gateway admin client are objects, not settings.
type Wiring struct {
	// Sim is the simulator's lending switch, sim.Control.SetLending (kind sim).
	Sim func(enabled bool, maxFraction float64)
	// Affinity is the gateway admin client (kind affinity).
	Affinity AffinitySetter
}

// NewBackend builds the backend cfg names. Every problem is reported at once, each naming its
// YAML key, including keys set for a kind that ignores them: a url on an exec backend is a config
// mistake that would otherwise switch nothing, silently.
func NewBackend(cfg BackendConfig, w Wiring) (Backend, error) {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	unused := func(kind string) {
		if cfg.URL != "" {
			add("url: not used by kind %s", kind)
		}
		if cfg.TokenFile != "" {
			add("token_file: not used by kind %s", kind)
		}
		if cfg.Command != nil {
			add("command: not used by kind %s", kind)
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
		unused(cfg.Kind)
		if cfg.Timeout != 0 {
			add("timeout: not used by kind sim (the simulator switches in-process)")
		}
		if w.Sim == nil {
			add("kind: sim needs the simulator's lending switch, and none was wired (Wiring.Sim)")
		}
		b = SimBackend{Set: w.Sim}
	case KindAffinity:
		unused(cfg.Kind)
		if w.Affinity == nil {
			add("kind: affinity needs a gateway admin client, and none was wired (Wiring.Affinity)")
		}
		b = AffinityBackend{Client: w.Affinity, Timeout: timeout(DefaultHTTPTimeout)}
	case KindHTTP:
		if cfg.Command != nil {
			add("command: not used by kind http")
		}
		if err := hook.CheckURL(cfg.URL, "where to POST the decision"); err != nil {
			add("url: %v", err)
		}
		if cfg.TokenFile != "" {
			if _, err := secret.File(cfg.TokenFile); err != nil {
				add("token_file: %v", err)
			}
		}
		b = &HTTPBackend{URL: cfg.URL, TokenFile: cfg.TokenFile, Timeout: timeout(DefaultHTTPTimeout)}
	case KindExec:
		if cfg.URL != "" {
			add("url: not used by kind exec")
		}
		if cfg.TokenFile != "" {
			add("token_file: not used by kind exec")
		}
		switch {
		case len(cfg.Command) == 0:
			add("command: required, the program and its arguments, e.g. [/usr/local/bin/lending-switch, --apply]")
		case cfg.Command[0] == "":
			add("command[0]: empty, want the program")
		default:
			if _, err := exec.LookPath(cfg.Command[0]); err != nil {
				add("command[0]: %v", err)
			}
		}
		b = &ExecBackend{Command: cfg.Command, Timeout: timeout(DefaultExecTimeout)}
	case "":
		add("kind: required, one of %s, %s, %s, %s", KindSim, KindAffinity, KindHTTP, KindExec)
	default:
		add("kind: unknown %q, want one of %s, %s, %s, %s", cfg.Kind, KindSim, KindAffinity, KindHTTP, KindExec)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("lender backend: %w", err)
	}
	return b, nil
}

// PayloadVersion is the version of the JSON that the http and exec backends send. It changes
// only when a field changes meaning or goes away; new fields may appear within a version.
const PayloadVersion = 1

// Payload is the JSON the http backend POSTs and the exec backend writes to stdin: the decision
// with a version, e.g.
//
//	{"version":1,"at":"2026-05-01T12:00:00Z","enabled":true,"changed":true,
//	 "since":"2026-05-01T12:00:00Z","max_fraction":0.5,
//	 "grants":[{"instance":"decode-0","tokens":37000,"reason":"decode-0: free 52000 − …"}],
//	 "reasons":["lending on: cache-first …", "decode-0: reserved 98000 / 150000 = 0.65, …"]}
//
// Grants are ceilings of lent KV per decode instance in tokens, 0 for every instance while
// lending is off; times are RFC 3339.
type Payload struct {
	Version int `json:"version"`
	Decision
}

// MarshalPayload encodes d as the versioned payload; empty lists are [], never null, so a
// receiver can range over them without a check. The reasons' "<" and ">" stay as they are rather
// than \u003c: the payload is read by scripts and people, never embedded in HTML.
func MarshalPayload(d Decision) ([]byte, error) {
	if d.Grants == nil {
		d.Grants = []Grant{}
	}
	if d.Reasons == nil {
		d.Reasons = []string{}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(Payload{Version: PayloadVersion, Decision: d}); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// SimBackend switches the simulator's KV lending (sim.Control.SetLending, or PUT /admin/lending
// of `basin sim serve`). The simulator's switch is global — on or off with one max fraction for
// every decode instance — so per-instance grants collapse to Decision.MaxFraction there: headroom
// is not needed because the simulated decode reclaims lent KV the moment a reservation needs it,
// as the paper's design does. In the simulator, switching off returns every lent token at once.
type SimBackend struct {
	Set func(enabled bool, maxFraction float64)
}

// Name implements Backend.
func (SimBackend) Name() string { return KindSim }

// Apply implements Backend.
func (b SimBackend) Apply(ctx context.Context, d Decision) error {
	if b.Set == nil {
		return errors.New("sim: no lending switch wired")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	b.Set(d.Enabled, d.MaxFraction)
	return nil
}

// AffinitySetter switches the gateway's sticky decode routing, as PUT /admin/affinity does; a
// gateway admin client implements it. Declared here, by its consumer, so the lender depends on
// one method rather than on the gateway.
type AffinitySetter interface {
	SetAffinity(ctx context.Context, enabled bool, reason string) error
}

// AffinityBackend turns lending into sticky decode routing through the basin gateway. On a real
// SGLang PD deployment this sets the router's routing key (X-SMG-Routing-Key by default) to the
// session id on every upstream request, so with the router's manual or consistent-hashing policy
// a session's calls return to the decode instance whose radix cache
// (--disaggregation-decode-enable-radix-cache) still holds its KV. That is the part of lending
// SGLang has today: decode keeps finished KV in its own radix cache and reuses it for the same
// session. It does not move memory between the decode and prefill pools, does not enforce grants
// or MaxFraction (decode's cache is bounded by SGLang's own eviction), and switching off does not
// evict anything — it only stops steering sessions back to their decode instance.
type AffinityBackend struct {
	Client AffinitySetter
	// Timeout bounds one switch (DefaultHTTPTimeout when 0).
	Timeout time.Duration
}

// Name implements Backend.
func (AffinityBackend) Name() string { return KindAffinity }

// Apply implements Backend. The gateway logs the reason with the switch, so it carries the
// decision's verdict.
func (b AffinityBackend) Apply(ctx context.Context, d Decision) error {
	if b.Client == nil {
		return errors.New("affinity: no gateway admin client wired")
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(b.Timeout, DefaultHTTPTimeout))
	defer cancel()
	if err := b.Client.SetAffinity(ctx, d.Enabled, "basin lender: "+d.Summary()); err != nil {
		return fmt.Errorf("affinity: switch to %t: %w", d.Enabled, err)
	}
	return nil
}

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}
