package collector

import (
	"errors"
	"fmt"
	"net/url"
	"unicode/utf8"
)

// Role is what a target is in the deployment; it decides which signals the target feeds.
type Role string

// Target roles.
const (
	// RolePrefill is a PD prefill instance: hit rate, cache capacity, working-set estimate.
	RolePrefill Role = "prefill"
	// RoleDecode is a PD decode instance: decode KV, call rate, TTFT, lent KV.
	RoleDecode Role = "decode"
	// RoleUnified is an engine doing both (no PD): the prefill and the decode-side signals except
	// decode KV.
	RoleUnified Role = "unified"
	// RoleGateway is basin's session gateway.
	RoleGateway Role = "gateway"
)

// Roles lists the roles in a stable order.
func Roles() []Role { return []Role{RolePrefill, RoleDecode, RoleUnified, RoleGateway} }

func (r Role) valid() bool {
	switch r {
	case RolePrefill, RoleDecode, RoleUnified, RoleGateway:
		return true
	}
	return false
}

// engine reports whether the role is an inference engine (not the gateway).
func (r Role) engine() bool { return r == RolePrefill || r == RoleDecode || r == RoleUnified }

// prefillSide reports whether the role holds prefixes for prompts (hit rate, cache capacity).
func (r Role) prefillSide() bool { return r == RolePrefill || r == RoleUnified }

// decodeSide reports whether the role finishes model calls (call rate, TTFT).
func (r Role) decodeSide() bool { return r == RoleDecode || r == RoleUnified }

// Dialect is the family of metric names a target exposes.
type Dialect string

// Target dialects.
const (
	// DialectAuto detects the dialect from the metric names of each scrape: "sglang:" prefix for
	// SGLang, "vllm:" for vLLM, "basin_gateway_" for the gateway.
	DialectAuto Dialect = "auto"
	// DialectSGLang is SGLang (any version) and basin's simulator.
	DialectSGLang Dialect = "sglang"
	// DialectVLLM is vLLM (v1 engine; the v0.9-deprecated names are read as fallbacks).
	DialectVLLM Dialect = "vllm"
	// DialectGateway is basin's session gateway.
	DialectGateway Dialect = "basin-gateway"
)

// Dialects lists the dialects in a stable order.
func Dialects() []Dialect { return []Dialect{DialectAuto, DialectSGLang, DialectVLLM, DialectGateway} }

func (d Dialect) valid() bool {
	switch d {
	case DialectAuto, DialectSGLang, DialectVLLM, DialectGateway:
		return true
	}
	return false
}

// fits reports whether a target of role r may speak dialect d: engines speak SGLang or vLLM, the
// gateway speaks basin-gateway; auto fits everything until a scrape says otherwise.
func (d Dialect) fits(r Role) bool {
	switch d {
	case DialectAuto:
		return true
	case DialectGateway:
		return r == RoleGateway
	case DialectSGLang, DialectVLLM:
		return r.engine()
	}
	return false
}

// Target is one /metrics endpoint.
type Target struct {
	// Name identifies the target in metrics, logs and Value.Source; unique among targets.
	Name string `json:"name" yaml:"name"`
	// URL is the full http(s) URL of the metrics endpoint, path included.
	URL string `json:"url" yaml:"url"`
	// Role is prefill, decode, unified or gateway.
	Role Role `json:"role" yaml:"role"`
	// Dialect is sglang, vllm, basin-gateway or auto (the default when empty).
	Dialect Dialect `json:"dialect" yaml:"dialect"`
}

// withDefaults fills the dialect.
func (t Target) withDefaults() Target {
	if t.Dialect == "" {
		t.Dialect = DialectAuto
	}
	return t
}

// validate checks a target after withDefaults; errors name the field. needURL is false for
// targets fed through Ingest, which have no endpoint.
func (t Target) validate(needURL bool) error {
	var errs []error
	if t.Name == "" {
		errs = append(errs, errors.New("name: must not be empty"))
	} else if !utf8.ValidString(t.Name) {
		errs = append(errs, fmt.Errorf("name: not valid UTF-8: %q", t.Name))
	}
	if t.URL != "" || needURL {
		if err := checkURL(t.URL); err != nil {
			errs = append(errs, fmt.Errorf("url: %w", err))
		}
	}
	if !t.Role.valid() {
		errs = append(errs, fmt.Errorf("role: must be one of prefill, decode, unified, gateway, got %q", t.Role))
	}
	switch {
	case !t.Dialect.valid():
		errs = append(errs, fmt.Errorf("dialect: must be one of auto, sglang, vllm, basin-gateway, got %q", t.Dialect))
	case t.Role.valid() && !t.Dialect.fits(t.Role):
		errs = append(errs, fmt.Errorf("dialect: %s does not fit role %s (engines are sglang or vllm, the gateway basin-gateway)",
			t.Dialect, t.Role))
	}
	return errors.Join(errs...)
}

func checkURL(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme must be http or https, got %q in %q", u.Scheme, s)
	}
	if u.Host == "" {
		return fmt.Errorf("no host in %q", s)
	}
	return nil
}
