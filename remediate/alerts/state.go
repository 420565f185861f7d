package alerts

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/alertmanager/template"
)

// Incident is incident mode as the daemon sees it: Active while any matching alert is active.
type Incident struct {
	// Active is incident mode: the session budget stays tight while it holds.
	Active bool `json:"active"`
	// Since is when incident mode turned on (receipt time, basin's clock); zero when not Active.
	Since time.Time `json:"since,omitzero"`
	// Alerts are the active matching alerts, oldest startsAt first.
	Alerts []ActiveAlert `json:"alerts"`
}

// ActiveAlert is one matching alert that keeps incident mode on.
type ActiveAlert struct {
	// Name is the alertname label.
	Name string `json:"name"`
	// Fingerprint identifies the alert: Alertmanager's, or the same hash of the labels.
	Fingerprint string `json:"fingerprint"`
	// StartsAt is when the alert started firing, by the sender's clock.
	StartsAt time.Time `json:"starts_at"`
	// Labels are the alert's labels.
	Labels map[string]string `json:"labels"`
	// Summary is the summary annotation, if any.
	Summary string `json:"summary,omitempty"`
	// ExpiresAt is when the alert stops counting unless notified again or resolved before: its
	// endsAt if the sender set one, otherwise the last notification plus Options.MaxAge.
	ExpiresAt time.Time `json:"expires_at"`
}

// ResolvedAlert is a resolve remembered after its alert left: a firing notice of the same episode
// that arrives later is ignored.
type ResolvedAlert struct {
	// Fingerprint identifies the alert, as in ActiveAlert.
	Fingerprint string `json:"fingerprint"`
	// StartsAt is when the resolved episode started, by the sender's clock.
	StartsAt time.Time `json:"starts_at"`
	// EndsAt is when the episode ended, by the sender's clock (StartsAt when the sender gave none).
	EndsAt time.Time `json:"ends_at"`
	// ReceivedAt is when basin received the resolve; it is forgotten Options.MaxAge later.
	ReceivedAt time.Time `json:"received_at"`
}

// State is the Receiver's memory, for keeping it across restarts of the daemon (it marshals to
// JSON as is).
type State struct {
	// Since is Incident.Since: kept, so that a restart does not make an incident look new.
	Since time.Time `json:"since,omitzero"`
	// Active are the tracked alerts with their expiry.
	Active []ActiveAlert `json:"active"`
	// Resolved are the remembered resolves.
	Resolved []ResolvedAlert `json:"resolved"`
}

// maxResolved bounds the remembered resolves: a sender inventing label sets would otherwise grow
// them without bound within MaxAge. The oldest are forgotten first; forgetting one only means a
// very late duplicate firing notice is believed.
const maxResolved = 4096

// outcome is what one alert of a payload did.
type outcome int

const (
	added outcome = iota
	refreshed
	removed
	noted      // a resolve of an alert that was not active, remembered
	notMatched // no Matcher selects it
	stale      // older than what is known about the alert
	duplicate  // a resolve already known
)

// tracker is the alert bookkeeping, without locks or clocks (the Receiver holds the lock and
// passes now), so that tests and the fuzzer drive it directly.
type tracker struct {
	matchers []Matcher
	maxAge   time.Duration
	active   map[string]*ActiveAlert
	resolved map[string]ResolvedAlert
}

func newTracker(ms []Matcher, maxAge time.Duration) *tracker {
	return &tracker{matchers: ms, maxAge: maxAge, active: map[string]*ActiveAlert{}, resolved: map[string]ResolvedAlert{}}
}

// apply records one checked alert received at now.
func (t *tracker) apply(now time.Time, a *template.Alert) outcome {
	if !matchesAny(t.matchers, a.Labels) {
		return notMatched
	}
	// Alertmanager reads an alert whose endsAt has passed as resolved whatever it was sent as
	// (alert.Resolved); its own notifications never carry such a firing alert.
	if a.Status == statusResolved || (!a.EndsAt.IsZero() && !a.EndsAt.After(now)) {
		return t.resolve(now, a)
	}
	return t.fire(now, a)
}

func (t *tracker) fire(now time.Time, a *template.Alert) outcome {
	fp := a.Fingerprint
	if r, ok := t.resolved[fp]; ok {
		// The same episode resolved already: this notice was overtaken. A new episode starts
		// after the last one ended.
		if !a.StartsAt.After(r.EndsAt) {
			return stale
		}
		delete(t.resolved, fp)
	}
	expires := a.EndsAt
	if expires.IsZero() {
		expires = now.Add(t.maxAge)
	}
	e, ok := t.active[fp]
	if !ok {
		t.active[fp] = &ActiveAlert{Name: a.Labels["alertname"], Fingerprint: fp, StartsAt: a.StartsAt,
			Labels: cloneLabels(a.Labels), Summary: a.Annotations["summary"], ExpiresAt: expires}
		return added
	}
	// An older startsAt is a late notice of an earlier episode or a replica's view of this one:
	// either way the alert is firing, so it refreshes, but the episode tracked stays the newest.
	if a.StartsAt.After(e.StartsAt) {
		e.StartsAt = a.StartsAt
	}
	if a.EndsAt.IsZero() {
		e.ExpiresAt = later(e.ExpiresAt, expires)
	} else if !a.StartsAt.Before(e.StartsAt) {
		e.ExpiresAt = expires // the sender's timeout for the episode tracked, shorter or longer
	}
	e.Labels = cloneLabels(a.Labels)
	e.Summary = a.Annotations["summary"]
	return refreshed
}

func (t *tracker) resolve(now time.Time, a *template.Alert) outcome {
	fp := a.Fingerprint
	end := a.EndsAt
	if end.IsZero() || end.Before(a.StartsAt) {
		end = a.StartsAt
	}
	out := noted
	if e, ok := t.active[fp]; ok {
		// The resolve of an episode that ended before the tracked one started leaves it alone.
		if end.Before(e.StartsAt) {
			return stale
		}
		delete(t.active, fp)
		out = removed
	}
	if r, ok := t.resolved[fp]; ok && !r.EndsAt.Before(end) {
		return duplicate // an active alert has no remembered resolve, so nothing was removed
	}
	if _, ok := t.resolved[fp]; !ok && len(t.resolved) >= maxResolved {
		t.forgetOldestResolved()
	}
	t.resolved[fp] = ResolvedAlert{Fingerprint: fp, StartsAt: a.StartsAt, EndsAt: end, ReceivedAt: now}
	return out
}

func (t *tracker) forgetOldestResolved() {
	var oldest string
	first := true
	for fp, r := range t.resolved {
		if first || r.ReceivedAt.Before(t.resolved[oldest].ReceivedAt) {
			oldest, first = fp, false
		}
	}
	delete(t.resolved, oldest)
}

// sweep drops the alerts that expired by now and the resolves older than maxAge, and returns the
// alerts dropped.
func (t *tracker) sweep(now time.Time) []ActiveAlert {
	var expired []ActiveAlert
	for fp, e := range t.active {
		if !e.ExpiresAt.After(now) {
			expired = append(expired, *e)
			delete(t.active, fp)
		}
	}
	for fp, r := range t.resolved {
		if !r.ReceivedAt.Add(t.maxAge).After(now) {
			delete(t.resolved, fp)
		}
	}
	return expired
}

// alerts returns copies of the active alerts, oldest startsAt first.
func (t *tracker) alerts() []ActiveAlert {
	out := make([]ActiveAlert, 0, len(t.active))
	for _, e := range t.active {
		c := *e
		c.Labels = cloneLabels(e.Labels)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b ActiveAlert) int {
		return cmp.Or(a.StartsAt.Compare(b.StartsAt), cmp.Compare(a.Fingerprint, b.Fingerprint))
	})
	return out
}

func (t *tracker) resolvedList() []ResolvedAlert {
	out := slices.Collect(maps.Values(t.resolved))
	slices.SortFunc(out, func(a, b ResolvedAlert) int {
		return cmp.Or(a.ReceivedAt.Compare(b.ReceivedAt), cmp.Compare(a.Fingerprint, b.Fingerprint))
	})
	return out
}

// restore replaces the tracker's memory with s after checking it; alerts no matcher selects any
// more (the configuration changed across the restart) are dropped.
func (t *tracker) restore(s State) error {
	var errs []error
	active := make(map[string]*ActiveAlert, len(s.Active))
	for i, a := range s.Active {
		p := fmt.Sprintf("Active[%d]", i)
		switch {
		case a.Fingerprint == "":
			errs = append(errs, fmt.Errorf("%s.Fingerprint: empty", p))
			continue
		case active[a.Fingerprint] != nil:
			errs = append(errs, fmt.Errorf("%s.Fingerprint: %q appears twice", p, a.Fingerprint))
			continue
		case a.StartsAt.IsZero():
			errs = append(errs, fmt.Errorf("%s.StartsAt: zero", p))
		case a.ExpiresAt.IsZero():
			errs = append(errs, fmt.Errorf("%s.ExpiresAt: zero", p))
		case a.Labels["alertname"] == "":
			errs = append(errs, fmt.Errorf("%s.Labels: no alertname", p))
		}
		if !matchesAny(t.matchers, a.Labels) {
			continue
		}
		c := a
		c.Labels = cloneLabels(a.Labels)
		c.Name = a.Labels["alertname"]
		active[a.Fingerprint] = &c
	}
	resolved := make(map[string]ResolvedAlert, len(s.Resolved))
	for i, r := range s.Resolved {
		p := fmt.Sprintf("Resolved[%d]", i)
		switch {
		case r.Fingerprint == "":
			errs = append(errs, fmt.Errorf("%s.Fingerprint: empty", p))
			continue
		case active[r.Fingerprint] != nil:
			errs = append(errs, fmt.Errorf("%s.Fingerprint: %q is also active", p, r.Fingerprint))
		case r.EndsAt.IsZero() || r.ReceivedAt.IsZero():
			errs = append(errs, fmt.Errorf("%s: EndsAt and ReceivedAt are required", p))
		}
		if old, ok := resolved[r.Fingerprint]; !ok || old.EndsAt.Before(r.EndsAt) {
			resolved[r.Fingerprint] = r
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	t.active, t.resolved = active, resolved
	for len(t.resolved) > maxResolved {
		t.forgetOldestResolved()
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func cloneLabels(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	return maps.Clone(m)
}
