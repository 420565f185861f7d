package gateway

import (
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/replication"
	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/store"
	"github.com/basin-dev/basin/internal/yamlconf"
)

// Defaults of Config.
const (
	DefaultListen      = "127.0.0.1:8080"
	DefaultAdminListen = "127.0.0.1:8081"
	DefaultIdleTimeout = admission.DefaultIdleTimeout
	// MaxHoldBound is the 10-minute request timeout of the OpenAI and Anthropic SDKs: a hold
	// bound must stay under it.
	MaxHoldBound        = 10 * time.Minute
	DefaultMaxQueueWait = 30 * time.Second
	DefaultMaxBodyBytes = 16 << 20
	// DefaultAffinityHeader is the header SGLang's model gateway routes on with its manual and
	// consistent_hashing policies: keyed on the session, a session's calls reach the decode
	// instance whose radix cache holds its prefix.
	DefaultAffinityHeader = "X-SMG-Routing-Key"
	// AdminTokenEnv is the environment variable the admin token is read from when no
	// admin_token_file is configured.
	AdminTokenEnv = "BASIN_GATEWAY_ADMIN_TOKEN"
)

// defaultSessionHeaders are the headers that carry a session id, first non-empty wins: the list
// the simulator's server reads too (agentcall.SessionHeaders).
var defaultSessionHeaders = agentcall.SessionHeaders()

// Duration is a time.Duration written the Go way in YAML ("30s", "10m").
type Duration = yamlconf.Duration

// Config is the gateway's configuration file. ParseConfig fills the defaults noted on each field.
type Config struct {
	// Listen is the address of the OpenAI-compatible listener (DefaultListen).
	Listen string `yaml:"listen"`
	// AdminListen is the address of the admin API and /metrics (DefaultAdminListen).
	AdminListen string `yaml:"admin_listen"`
	// AdminTokenFile holds the admin API's bearer token; when empty the token comes from the
	// environment variable AdminTokenEnv. Start fails if neither gives one.
	AdminTokenFile string `yaml:"admin_token_file"`
	// Upstreams are the http(s) base URLs calls are proxied to (required). New sessions are spread
	// round-robin; a session's calls all go to the upstream of its first call.
	Upstreams []string `yaml:"upstreams"`
	// SessionHeaders are the request headers that carry the session id, first non-empty wins
	// (default x-session-id, x-claude-code-session-id, session-id, session_id,
	// x-session-affinity, x-dynamo-session-id). After them the body's metadata.session_id, then
	// prompt_cache_key (Responses), then user (Anthropic Messages: metadata.user_id), then a
	// Responses previous_response_id chain.
	SessionHeaders []string `yaml:"session_headers"`
	// RejectAnonymous answers 400 to a call with no session id instead of treating it as a
	// one-call session.
	RejectAnonymous bool `yaml:"reject_anonymous"`
	// TenantHeader names the header that carries the tenant; when it is empty or absent on a
	// request, the tenant is a hash of the API key (bearer, or x-api-key), or "" without one.
	TenantHeader string `yaml:"tenant_header"`
	// IdleTimeout ends a live session with no call in flight for this long (DefaultIdleTimeout).
	IdleTimeout Duration `yaml:"idle_timeout"`
	// MaxQueueWait is how long a queued first call is held before 503 (DefaultMaxQueueWait).
	MaxQueueWait Duration `yaml:"max_queue_wait"`
	// UpstreamTimeout bounds each proxied call from sending it upstream to the end of its answer;
	// 0 (the default): no bound but the client's own. A call that runs out is answered 504
	// upstream_timeout if its response had not begun, else its stream is cut as on an upstream
	// failure. Without streaming an answer arrives only once generated, so set it above the
	// longest generation served.
	UpstreamTimeout Duration `yaml:"upstream_timeout"`
	// MaxBodyBytes bounds request bodies; larger ones get 413 (DefaultMaxBodyBytes).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// Admission is the admission policy.
	Admission AdmissionConfig `yaml:"admission"`
	// Predictor selects the peak predictor.
	Predictor PredictorConfig `yaml:"predictor"`
	// Affinity is the sticky decode routing switch.
	Affinity AffinityConfig `yaml:"affinity"`
	// Record is the trace recorder.
	Record RecordConfig `yaml:"record"`
	// StateFile keeps the live sessions (and the runtime budget and affinity) across restarts;
	// empty: nothing is kept.
	StateFile string `yaml:"state_file"`
	// WebConfigFile is a Prometheus exporter-toolkit web configuration file (TLS, basic auth) for
	// the OpenAI-compatible listener; empty: plain HTTP. Basic auth there would ask agents for it on
	// every call: use this file for TLS.
	WebConfigFile string `yaml:"web_config_file"`
	// AdminWebConfigFile is a Prometheus exporter-toolkit web configuration file (TLS, basic auth)
	// for the admin listener; empty: plain HTTP.
	AdminWebConfigFile string `yaml:"admin_web_config_file"`
	// Store is the Redis or Valkey server replicated mode shares one budget through
	// (docs/scaling.md). Without store.url the gateway runs alone, exactly as without the block.
	// The lease's TTL defaults to DefaultLeaseTTL; the prefix to "basin".
	Store store.Config `yaml:"store"`
	// Replication is this replica's part in replicated mode; it needs store.url.
	Replication ReplicationConfig `yaml:"replication"`
}

// Defaults of ReplicationConfig.
const (
	// DefaultLeaseTTL is the admission leader's lease: a crashed leader is replaced within it,
	// and meanwhile new sessions are admitted against each replica's local slice.
	DefaultLeaseTTL = 5 * time.Second
	// DefaultReportInterval is how often a replica sends its calls' begin and finish to the
	// leader: the working set the leader admits against lags the calls by at most this much.
	DefaultReportInterval = 100 * time.Millisecond
)

// Degraded admission: what a replica does with new sessions while it cannot reach the leader or
// the store.
const (
	// DegradedLocalSlice admits them against this replica's share of the budget the leader had
	// free at the last contact, divided by the number of replicas seen.
	DegradedLocalSlice = replication.DegradedLocalSlice
	// DegradedRefuse answers them 503 (with Retry-After) until the leader is back.
	DegradedRefuse = replication.DegradedRefuse
)

// Headers of replicated mode's admin traffic.
const (
	// ForwardedByHeader marks an admin request a follower forwarded to the leader, so that a
	// replica that is not (or no longer) the leader answers instead of forwarding it again.
	ForwardedByHeader = replication.ForwardedByHeader
	// ReplicaHeader names the replica that answered an admin request.
	ReplicaHeader = replication.ReplicaHeader
)

// ReplicationConfig is one replica's settings in replicated mode.
type ReplicationConfig struct {
	// ReplicaID names this replica to the others and in the store (default: the host name; on
	// Kubernetes the pod name). Unique among the replicas.
	ReplicaID string `yaml:"replica_id"`
	// AdvertiseURL is this replica's admin listener as the other replicas reach it,
	// http(s)://host:port (required with a store): followers send first calls and reports to
	// the leader there, and forward /admin/* to it.
	AdvertiseURL string `yaml:"advertise_url"`
	// ReportInterval is how often calls' begin and finish go to the leader in one batch
	// (DefaultReportInterval).
	ReportInterval Duration `yaml:"report_interval"`
	// DegradedAdmission is local_slice (default) or refuse: new sessions while the leader or
	// the store is unreachable. Live sessions' calls pass either way.
	DegradedAdmission string `yaml:"degraded_admission"`
}

// AdmissionConfig is the admission policy; see package admission.
type AdmissionConfig struct {
	// Mode is "current" (default: a live session counts its current context) or "peak" (its
	// predicted peak).
	Mode string `yaml:"mode"`
	// CountOnly admits every session at once and only counts (working set, live sessions) until
	// the first PUT /admin/budget sets a budget: how a gateway starts ahead of the basin daemon
	// that sizes its budget. BudgetTokens and ReferenceBudgetTokens are left out with it.
	CountOnly bool `yaml:"count_only"`
	// BudgetTokens is the budget B (required unless CountOnly).
	BudgetTokens int64 `yaml:"budget_tokens"`
	// ReferenceBudgetTokens: admission engages when the working set exceeds it (default
	// BudgetTokens).
	ReferenceBudgetTokens int64 `yaml:"reference_budget_tokens"`
	// PriorityTokensPerSec is r in priority = arrival + peak/r (default 30).
	PriorityTokensPerSec float64 `yaml:"priority_tokens_per_sec"`
	// ArrivalOrder orders the queue by arrival alone.
	ArrivalOrder bool `yaml:"arrival_order"`
	// StaleAfter is how long a queued session may wait before it goes stale: behind every fresh
	// session, the stale ones newest first (admission.DefaultStaleAfter).
	StaleAfter Duration `yaml:"stale_after"`
	// HoldBound is the longest a held session's call waits at the gateway before it passes
	// anyway (admission.DefaultHoldBound). It must stay under the clients' request timeout (the
	// OpenAI and Anthropic SDKs' is 10 minutes): a held call that outlives it costs the agent its
	// request, which is what holding must never do.
	HoldBound Duration `yaml:"hold_bound"`
	// StartDeadline refuses early what cannot make it (0, the default: off): a session whose
	// first call would wait longer than this, by the queue's recent admission rate, gets a
	// retryable 503 with Retry-After at once, and one still queued after it gets it then,
	// instead of a wait it cannot get through in time. A retry keeps its place.
	StartDeadline Duration `yaml:"start_deadline"`
	// MaxLead caps the size term of the queue's priority (admission.Options.MaxLead): a session
	// that has waited this long is ahead of every later arrival, whatever the predictions
	// (0, the default: no cap, the paper's order, which the simulator measures). For clients
	// whose patience is shorter than the leads their predictions give.
	MaxLead Duration `yaml:"max_lead"`
	// DormantFloor is the shortest idleness that makes a live session dormant: out of the
	// working set and the admission test until it calls again (admission.DefaultDormantFloor).
	DormantFloor Duration `yaml:"dormant_floor"`
	// DisableDormancy keeps every live session in the working set until it ends or idles out.
	DisableDormancy bool `yaml:"disable_dormancy"`
	// TenantQuota caps each tenant's live plus queued sessions (0: no cap).
	TenantQuota int `yaml:"tenant_quota"`
	// Quotas overrides TenantQuota per tenant.
	Quotas map[string]int `yaml:"quotas"`
}

// PredictorConfig selects the peak predictor.
type PredictorConfig struct {
	// Model is a model file written by `basin predictor train`; empty: the fallback predictor,
	// which learns from the peaks of sessions as they end.
	Model string `yaml:"model"`
}

// AffinityConfig is sticky decode routing.
type AffinityConfig struct {
	// Enabled sets Header to the session id on upstream requests (switchable at runtime through
	// the admin API).
	Enabled bool `yaml:"enabled"`
	// Header is the routing-key header (DefaultAffinityHeader).
	Header string `yaml:"header"`
}

// RecordConfig is the trace recorder.
type RecordConfig struct {
	// Path is the JSON Lines file finished calls are appended to in basin's trace format; empty:
	// no recording.
	Path string `yaml:"path"`
}

// LoadConfig reads and validates a configuration file. Relative paths in it (admin_token_file,
// predictor.model, record.path, state_file) are resolved against the file's directory.
func LoadConfig(path string) (*Config, error) {
	return yamlconf.Load(path, "gateway config", ParseConfig, func(c *Config) []*string {
		return []*string{&c.AdminTokenFile, &c.Predictor.Model, &c.Record.Path, &c.StateFile, &c.WebConfigFile, &c.AdminWebConfigFile}
	})
}

// ParseConfig reads a configuration from YAML, fills the defaults and validates it. Unknown keys
// and type errors name the key and the line; bad values name the field (and its line).
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	root, err := yamlconf.Decode(data, &c)
	if err != nil {
		return nil, err
	}
	if err := c.validate(root); err != nil {
		return nil, err
	}
	return &c, nil
}

// validate fills the defaults and checks every field, naming each bad one (with its line when the
// file states it).
func (c *Config) validate(root *yaml.Node) error {
	probs := yamlconf.NewProblems(root)
	bad := probs.Add
	defStr := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defStr(&c.Listen, DefaultListen)
	defStr(&c.AdminListen, DefaultAdminListen)
	for _, f := range []struct {
		name string
		v    string
	}{{"listen", c.Listen}, {"admin_listen", c.AdminListen}} {
		if _, _, err := net.SplitHostPort(f.v); err != nil {
			bad([]string{f.name}, "want host:port, got %q", f.v)
		}
	}
	if len(c.Upstreams) == 0 {
		bad([]string{"upstreams"}, "required: at least one http(s) URL")
	}
	for i, u := range c.Upstreams {
		p := []string{"upstreams", strconv.Itoa(i)}
		pu, err := url.Parse(u)
		switch {
		case err != nil:
			bad(p, "not a URL: %v", err)
		case pu.Scheme != "http" && pu.Scheme != "https":
			bad(p, "want an http or https URL, got %q", u)
		case pu.Host == "":
			bad(p, "no host in %q", u)
		case pu.RawQuery != "" || pu.Fragment != "":
			bad(p, "must not have a query or fragment, got %q", u)
		}
	}
	if c.SessionHeaders == nil {
		c.SessionHeaders = append([]string(nil), defaultSessionHeaders...)
	}
	if len(c.SessionHeaders) == 0 {
		bad([]string{"session_headers"}, "must not be empty (leave it out for the defaults)")
	}
	for i, h := range c.SessionHeaders {
		if !validHeaderName(h) {
			bad([]string{"session_headers", strconv.Itoa(i)}, "not a header name: %q", h)
		}
	}
	if c.TenantHeader != "" && !validHeaderName(c.TenantHeader) {
		bad([]string{"tenant_header"}, "not a header name: %q", c.TenantHeader)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = Duration(DefaultIdleTimeout)
	}
	if c.MaxQueueWait == 0 {
		c.MaxQueueWait = Duration(DefaultMaxQueueWait)
	}
	switch {
	case c.MaxBodyBytes == 0:
		c.MaxBodyBytes = DefaultMaxBodyBytes
	case c.MaxBodyBytes < 0:
		bad([]string{"max_body_bytes"}, "must be > 0, got %d", c.MaxBodyBytes)
	}

	a := &c.Admission
	adm := func(k string) []string { return []string{"admission", k} }
	before := probs.Len() // the admission block's own problems are those found from here
	if a.Mode == "" {
		a.Mode = string(admission.ModeCurrent)
	}
	if a.Mode != string(admission.ModeCurrent) && a.Mode != string(admission.ModePeak) {
		bad(adm("mode"), "want current or peak, got %q", a.Mode)
	}
	givenBudget := yamlconf.LineOf(root, adm("budget_tokens")...) != 0
	switch {
	case a.CountOnly:
		for _, k := range []string{"budget_tokens", "reference_budget_tokens"} {
			if yamlconf.LineOf(root, adm(k)...) != 0 {
				bad(adm(k), "leave it out with count_only: true (the first PUT /admin/budget sets the budget), "+
					"or set count_only: false to enforce a budget from the start")
			}
		}
	case a.BudgetTokens <= 0 && !givenBudget:
		bad(adm("budget_tokens"), "required: the token budget B, > 0 (or count_only: true to count until the daemon sets it)")
	case a.BudgetTokens <= 0:
		bad(adm("budget_tokens"), "must be > 0, got %d", a.BudgetTokens)
	}
	if a.ReferenceBudgetTokens < 0 {
		bad(adm("reference_budget_tokens"), "must be ≥ 0, got %d", a.ReferenceBudgetTokens)
	}
	if p := a.PriorityTokensPerSec; p < 0 || math.IsNaN(p) || math.IsInf(p, 0) {
		bad(adm("priority_tokens_per_sec"), "must be a finite number > 0, got %v", p)
	}
	if a.TenantQuota < 0 {
		bad(adm("tenant_quota"), "must be ≥ 0, got %d", a.TenantQuota)
	}
	if a.StartDeadline < 0 {
		bad(adm("start_deadline"), "must be ≥ 0 (0: off), got %v", time.Duration(a.StartDeadline))
	}
	if a.MaxLead < 0 {
		bad(adm("max_lead"), "must be ≥ 0 (0: no cap), got %v", time.Duration(a.MaxLead))
	}
	if hb := time.Duration(a.HoldBound); hb < 0 || hb >= MaxHoldBound {
		bad(adm("hold_bound"), "must be > 0 and under %v (the SDKs' request timeout), got %v", MaxHoldBound, hb)
	}
	for t, q := range a.Quotas {
		if q < 0 {
			bad([]string{"admission", "quotas", t}, "must be ≥ 0, got %d", q)
		}
	}
	// Anything the admission core rejects beyond the checks above, whatever else is wrong: a
	// file with several bad values hears of every one at once.
	if probs.Len() == before {
		if err := c.admissionOptions().Validate(); err != nil {
			bad([]string{"admission"}, "%v", err)
		}
	}

	defStr(&c.Affinity.Header, DefaultAffinityHeader)
	if !validHeaderName(c.Affinity.Header) {
		bad([]string{"affinity", "header"}, "not a header name: %q", c.Affinity.Header)
	}
	c.validateReplication(root, bad)
	return probs.Err()
}

// validateReplication checks the store and replication blocks.
func (c *Config) validateReplication(root *yaml.Node, bad func([]string, string, ...any)) {
	r := &c.Replication
	rep := func(k string) []string { return []string{"replication", k} }
	if !c.Store.Enabled() {
		for _, p := range c.Store.Check() {
			bad([]string{"store", p.Field}, "%s", p.Message)
		}
		if *r != (ReplicationConfig{}) {
			for _, k := range yamlconf.Keys(ReplicationConfig{}) {
				if yamlconf.LineOf(root, rep(k)...) != 0 {
					bad(rep(k), "needs store.url (replicated mode)")
				}
			}
		}
		return
	}
	c.Store = c.Store.WithDefaults("", DefaultLeaseTTL)
	c.Store.Prefix = strings.TrimSuffix(c.Store.Prefix, ":")
	for _, p := range c.Store.Check() {
		bad([]string{"store", p.Field}, "%s", p.Message)
	}
	if c.StateFile != "" {
		bad([]string{"state_file"}, "leave it out with a store: the session table lives in the store")
	}
	if r.ReplicaID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			bad(rep("replica_id"), "required: the host name is unknown (%v)", err)
		}
		r.ReplicaID = host
	}
	if strings.ContainsFunc(r.ReplicaID, func(x rune) bool { return unicode.IsSpace(x) || unicode.IsControl(x) }) || len(r.ReplicaID) > 200 {
		bad(rep("replica_id"), "at most 200 bytes, no whitespace or control characters, got %q", r.ReplicaID)
	}
	switch u, err := url.Parse(r.AdvertiseURL); {
	case r.AdvertiseURL == "":
		bad(rep("advertise_url"), "required with a store: this replica's admin listener as the others reach it, http(s)://host:port")
	case err != nil:
		bad(rep("advertise_url"), "not a URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		bad(rep("advertise_url"), "want http(s)://host:port, got %q", r.AdvertiseURL)
	}
	switch {
	case r.ReportInterval == 0:
		r.ReportInterval = Duration(DefaultReportInterval)
	case r.ReportInterval < 0 || time.Duration(r.ReportInterval) > time.Duration(c.Store.LeaseTTL)/2:
		bad(rep("report_interval"), "want > 0 and at most half of store.lease_ttl (%v), got %v",
			time.Duration(c.Store.LeaseTTL)/2, time.Duration(r.ReportInterval))
	}
	switch r.DegradedAdmission {
	case "":
		r.DegradedAdmission = DegradedLocalSlice
	case DegradedLocalSlice, DegradedRefuse:
	default:
		bad(rep("degraded_admission"), "want %s or %s, got %q", DegradedLocalSlice, DegradedRefuse, r.DegradedAdmission)
	}
}

// dormantFloor is the core's DormantFloor: negative turns dormancy off.
func (a AdmissionConfig) dormantFloor() time.Duration {
	if a.DisableDormancy {
		return -1
	}
	return time.Duration(a.DormantFloor)
}

// admissionOptions maps the configuration onto the admission core's options.
func (c *Config) admissionOptions() admission.Options {
	a := c.Admission
	return admission.Options{
		Mode:            admission.Mode(a.Mode),
		CountOnly:       a.CountOnly,
		Budget:          a.BudgetTokens,
		ReferenceBudget: a.ReferenceBudgetTokens,
		TokensPerSecond: a.PriorityTokensPerSec,
		ArrivalOrder:    a.ArrivalOrder,
		StaleAfter:      time.Duration(a.StaleAfter),
		HoldBound:       time.Duration(a.HoldBound),
		StartDeadline:   time.Duration(a.StartDeadline),
		MaxLead:         time.Duration(a.MaxLead),
		DormantFloor:    a.dormantFloor(),
		TenantQuota:     a.TenantQuota,
		Quotas:          a.Quotas,
		IdleTimeout:     time.Duration(c.IdleTimeout),
		LiveLog:         c.liveLog(),
	}
}

// liveLog is how many changes of the live set a replicated gateway keeps for its followers:
// a follower further behind (one just started, or cut off for longer) takes the set whole.
func (c *Config) liveLog() int {
	if !c.Store.Enabled() {
		return 0
	}
	return 100_000
}

// validHeaderName reports whether s is an HTTP header field name (an RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(b)) {
			return false
		}
	}
	return http.CanonicalHeaderKey(s) != ""
}
