package alerts

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for the zero fields of Options.
const (
	// DefaultMaxBody bounds a webhook body. Alertmanager sends every alert of a group in one
	// body; 1 MiB holds a few thousand alerts, far more than basin's own alerts make.
	DefaultMaxBody = 1 << 20
	// DefaultMaxAge is how long a firing alert without endsAt stays active after its last
	// notification. Alertmanager blanks endsAt of firing alerts, so this is the usual case; basin's
	// route must repeat well within it (see the package documentation).
	DefaultMaxAge = 10 * time.Minute
)

// Names of basin's own alerting rules for the cache-pressure trap: the alerts that put the
// daemon into incident mode when Options.Matchers is empty.
const (
	AlertMetastableDrift  = "BasinMetastableDrift"
	AlertTrapped          = "BasinTrapped"
	AlertHitRateCollapsed = "BasinHitRateCollapsed"
)

// DefaultMatchers returns the matchers used when Options.Matchers is empty: one per alert name
// above, with no label condition.
func DefaultMatchers() []Matcher {
	return []Matcher{{AlertName: AlertMetastableDrift}, {AlertName: AlertTrapped}, {AlertName: AlertHitRateCollapsed}}
}

// Matcher selects the alerts that put the daemon into incident mode. An alert matches when its
// alertname equals AlertName (if set) and each of Labels equals the alert's label of that name;
// an empty value asks for the label to be absent, as in Prometheus, where an empty label is no
// label.
type Matcher struct {
	// AlertName is the alertname the alert must have; empty: any.
	AlertName string `yaml:"alertname"`
	// Labels must each equal the alert's label of that name; an empty value asks for the label to
	// be absent.
	Labels map[string]string `yaml:"labels"`
}

// Matches reports whether an alert with these labels is selected.
func (m Matcher) Matches(labels map[string]string) bool {
	if m.AlertName != "" && labels["alertname"] != m.AlertName {
		return false
	}
	for k, v := range m.Labels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func matchesAny(ms []Matcher, labels map[string]string) bool {
	for _, m := range ms {
		if m.Matches(labels) {
			return true
		}
	}
	return false
}

// Options configure a Receiver. Zero fields take the defaults above; New rejects bad values with
// the field's name.
type Options struct {
	// Matchers select the alerts that count; an alert counts when any one matches
	// (DefaultMatchers when empty).
	Matchers []Matcher
	// Token is the bearer token Alertmanager sends (http_config.authorization). Token or
	// BasicUser/BasicPassword is required: the webhook changes the daemon's budget, so it is never
	// open. When both are set either is accepted.
	Token string
	// BasicUser and BasicPassword are the HTTP basic credentials Alertmanager sends
	// (http_config.basic_auth); set both or neither.
	BasicUser, BasicPassword string
	// MaxBody bounds a request body in bytes (DefaultMaxBody); larger is answered 400.
	MaxBody int64
	// MaxAge is how long a firing alert without endsAt stays active after its last notification
	// (DefaultMaxAge). Resolves are remembered as long, to recognise late firing notices.
	MaxAge time.Duration
	// Logger receives incident switches, rejected payloads and expiries, never credentials
	// (discarded when nil).
	Logger *slog.Logger
	// Registerer receives the basin_webhook_* metrics; a private registry when nil, never the
	// default one unless passed.
	Registerer prometheus.Registerer
	// Now is the clock (time.Now when nil): receipt times, expiry and Incident.Since.
	Now func() time.Time
	// OnChange is called when incident mode turns on or off, with the incident as it was right
	// after the switch. Calls are made in order, one per switch, outside the Receiver's locks, so
	// OnChange may call Incident; it runs on the goroutine of the request (or Run, or Restore) that
	// caused the switch, or of a concurrent one that is already delivering, and it should return
	// quickly.
	OnChange func(Incident)
}

func (o Options) withDefaults() Options {
	if len(o.Matchers) == 0 {
		o.Matchers = DefaultMatchers()
	}
	if o.MaxBody == 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.MaxAge == 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	// The matchers are read without a lock for the Receiver's life: copy them away from the caller.
	ms := make([]Matcher, len(o.Matchers))
	for i, m := range o.Matchers {
		ms[i] = Matcher{AlertName: m.AlertName, Labels: cloneLabels(m.Labels)}
	}
	o.Matchers = ms
	return o
}

// Validate checks o as New would use it (zero fields meaning their defaults) and names each bad
// field with the reason. It never quotes a credential.
func (o Options) Validate() error {
	var errs []error
	if o.Token == "" && o.BasicUser == "" && o.BasicPassword == "" {
		errs = append(errs, errors.New("Token: required unless BasicUser and BasicPassword are set; the webhook changes the budget, so it is never open"))
	}
	if o.Token != "" && strings.TrimSpace(o.Token) != o.Token {
		errs = append(errs, errors.New("Token: has leading or trailing white space, which an Authorization header cannot carry"))
	}
	switch {
	case o.BasicUser != "" && o.BasicPassword == "":
		errs = append(errs, errors.New("BasicPassword: required with BasicUser"))
	case o.BasicUser == "" && o.BasicPassword != "":
		errs = append(errs, errors.New("BasicUser: required with BasicPassword"))
	}
	if strings.Contains(o.BasicUser, ":") {
		errs = append(errs, errors.New("BasicUser: must not contain ':' (RFC 7617)"))
	}
	if o.MaxBody < 0 {
		errs = append(errs, fmt.Errorf("MaxBody: must be > 0 bytes, got %d", o.MaxBody))
	}
	if o.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("MaxAge: must be > 0, got %v", o.MaxAge))
	}
	for i, m := range o.Matchers {
		if m.AlertName == "" && len(m.Labels) == 0 {
			errs = append(errs, fmt.Errorf("Matchers[%d]: empty, it would match every alert; set AlertName or Labels", i))
		}
		for k := range m.Labels {
			if k == "" {
				errs = append(errs, fmt.Errorf("Matchers[%d].Labels: empty label name", i))
			}
		}
	}
	return errors.Join(errs...)
}
