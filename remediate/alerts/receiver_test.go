package alerts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/alertmanager/template"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFiringThenResolved(t *testing.T) {
	h := newHarness(t, Options{})

	rep := okReply(t, h.post(t, readTestdata(t, "firing.json")))
	assert.Equal(t, okBody{Status: "ok", Active: 2, Incident: true}, rep)
	inc := h.r.Incident()
	require.True(t, inc.Active)
	assert.Equal(t, t0, inc.Since)
	require.Len(t, inc.Alerts, 2)
	// Oldest first: BasinHitRateCollapsed started 30 s before BasinTrapped.
	assert.Equal(t, "BasinHitRateCollapsed", inc.Alerts[0].Name)
	assert.Equal(t, "551f566302c6ed8d", inc.Alerts[0].Fingerprint)
	assert.Equal(t, "llama-70b prefix-cache hit rate collapsed.", inc.Alerts[0].Summary)
	assert.Equal(t, "BasinTrapped", inc.Alerts[1].Name)
	assert.Equal(t, "critical", inc.Alerts[1].Labels["severity"])
	assert.Equal(t, time.Date(2025, 6, 3, 14, 2, 11, 482e6, time.UTC), inc.Alerts[1].StartsAt.UTC())
	assert.Equal(t, t0.Add(DefaultMaxAge), inc.Alerts[1].ExpiresAt, "Alertmanager blanks endsAt of firing alerts")
	assert.Equal(t, []bool{true}, h.changes.actives(), "incident mode turns on once")
	assert.Equal(t, 1.0, h.metric(t, "basin_webhook_incident_active"))
	assert.Equal(t, 2.0, h.metric(t, "basin_webhook_active_alerts"))
	assert.Equal(t, 2.0, h.metric(t, "basin_webhook_alerts_total", "status", "firing"))

	h.clock.Advance(14 * time.Minute / 2)
	rep = okReply(t, h.post(t, readTestdata(t, "resolved.json")))
	assert.Equal(t, okBody{Status: "ok", Active: 0, Incident: false}, rep)
	inc = h.r.Incident()
	assert.False(t, inc.Active)
	assert.True(t, inc.Since.IsZero())
	assert.Empty(t, inc.Alerts)
	assert.Equal(t, []bool{true, false}, h.changes.actives())
	h.changes.mu.Lock()
	assert.Len(t, h.changes.seen[0].Alerts, 2, "OnChange sees the alerts that switched incident mode on")
	h.changes.mu.Unlock()
	assert.Equal(t, 0.0, h.metric(t, "basin_webhook_incident_active"))
	assert.Equal(t, 2.0, h.metric(t, "basin_webhook_alerts_total", "status", "resolved"))
	assert.Equal(t, 2.0, h.metric(t, "basin_webhook_requests_total", "result", "ok"))
}

func TestPartialResolveKeepsIncident(t *testing.T) {
	h := newHarness(t, Options{})
	a := alert("BasinTrapped", t0.Add(-time.Minute))
	b := alert("BasinHitRateCollapsed", t0.Add(-2*time.Minute))
	okReply(t, h.post(t, payload(t, a, b)))
	// One notification carries the whole group: one still firing, one resolved.
	rep := okReply(t, h.post(t, payload(t, a, resolved(b, t0))))
	assert.Equal(t, okBody{Status: "ok", Active: 1, Incident: true}, rep)
	assert.Equal(t, []string{a.Fingerprint}, fingerprints(h.r.Incident()))
	assert.Equal(t, []bool{true}, h.changes.actives())
}

func TestDuplicates(t *testing.T) {
	h := newHarness(t, Options{})
	firing, res := readTestdata(t, "firing.json"), readTestdata(t, "resolved.json")
	for range 3 {
		assert.Equal(t, okBody{Status: "ok", Active: 2, Incident: true}, okReply(t, h.post(t, firing)))
	}
	assert.Len(t, h.r.Incident().Alerts, 2)
	assert.Equal(t, []bool{true}, h.changes.actives(), "repeats do not switch again")
	for range 3 {
		assert.Equal(t, okBody{Status: "ok", Active: 0, Incident: false}, okReply(t, h.post(t, res)))
	}
	assert.Equal(t, []bool{true, false}, h.changes.actives())
	assert.Equal(t, 4.0, h.metric(t, "basin_webhook_alerts_ignored_total", "reason", "duplicate"))
	// A repeat of the firing notice after the resolve belongs to the resolved episode.
	assert.Equal(t, okBody{Status: "ok", Active: 0, Incident: false}, okReply(t, h.post(t, firing)))
	assert.Equal(t, 2.0, h.metric(t, "basin_webhook_alerts_ignored_total", "reason", "stale"))
	assert.Equal(t, []bool{true, false}, h.changes.actives())
}

func TestOutOfOrder(t *testing.T) {
	s1 := t0.Add(-20 * time.Minute) // first episode
	e1 := t0.Add(-15 * time.Minute)
	s2 := t0.Add(-10 * time.Minute) // second episode
	e2 := t0.Add(-time.Minute)
	ep1 := alert("BasinTrapped", s1)
	ep2 := alert("BasinTrapped", s2)
	older := ep1
	older.StartsAt = s2.Add(-time.Minute)

	tests := []struct {
		name    string
		posts   [][]template.Alert
		active  bool
		starts  time.Time // of the one active alert
		changes []bool
	}{
		{
			name:    "late resolve of an earlier episode leaves the newer one firing",
			posts:   [][]template.Alert{{ep1}, {ep2}, {resolved(ep1, e1)}},
			active:  true,
			starts:  s2,
			changes: []bool{true},
		},
		{
			name:    "late resolve of an earlier episode when only the newer one was seen",
			posts:   [][]template.Alert{{ep2}, {resolved(ep1, e1)}},
			active:  true,
			starts:  s2,
			changes: []bool{true},
		},
		{
			name:    "resolve before its firing notice: the late firing notice is ignored",
			posts:   [][]template.Alert{{resolved(ep1, e1)}, {ep1}},
			changes: []bool{},
		},
		{
			name:    "a new episode after a resolve fires again",
			posts:   [][]template.Alert{{ep1}, {resolved(ep1, e1)}, {ep2}},
			active:  true,
			starts:  s2,
			changes: []bool{true, false, true},
		},
		{
			name:    "a new episode whose firing notice overtook the old resolve",
			posts:   [][]template.Alert{{ep1}, {ep2}, {resolved(ep1, e1)}, {resolved(ep2, e2)}},
			changes: []bool{true, false},
		},
		{
			name:    "an older startsAt refreshes without reopening the tracked episode",
			posts:   [][]template.Alert{{ep2}, {older}},
			active:  true,
			starts:  s2,
			changes: []bool{true},
		},
		{
			name: "a firing alert whose endsAt passed is resolved",
			posts: [][]template.Alert{{ep2}, {func() template.Alert {
				a := ep2
				a.EndsAt = t0.Add(-time.Second)
				return a
			}()}},
			changes: []bool{true, false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			for _, p := range tt.posts {
				okReply(t, h.post(t, payload(t, p...)))
			}
			inc := h.r.Incident()
			assert.Equal(t, tt.active, inc.Active)
			if tt.active {
				require.Len(t, inc.Alerts, 1)
				assert.True(t, tt.starts.Equal(inc.Alerts[0].StartsAt), "tracked episode started %v, want %v", inc.Alerts[0].StartsAt, tt.starts)
			}
			assert.Equal(t, tt.changes, h.changes.actives())
			assert.Equal(t, 0.0, h.metric(t, "basin_webhook_alerts_expired_total"), "resolved, not expired")
		})
	}
}

func TestMatchers(t *testing.T) {
	tests := []struct {
		name     string
		matchers []Matcher
		alert    template.Alert
		want     bool
	}{
		{"default names match", nil, alert("BasinMetastableDrift", t0), true},
		{"other names are ignored", nil, alert("KubePodCrashLooping", t0), false},
		{"labels narrow a name", []Matcher{{AlertName: "BasinTrapped", Labels: map[string]string{"severity": "critical"}}},
			alert("BasinTrapped", t0, "severity", "warning"), false},
		{"labels narrow a name, matching", []Matcher{{AlertName: "BasinTrapped", Labels: map[string]string{"severity": "critical"}}},
			alert("BasinTrapped", t0, "severity", "critical"), true},
		{"labels alone", []Matcher{{Labels: map[string]string{"basin": "incident"}}}, alert("GPUMemoryHigh", t0, "basin", "incident"), true},
		{"empty value means absent", []Matcher{{AlertName: "BasinTrapped", Labels: map[string]string{"canary": ""}}},
			alert("BasinTrapped", t0, "canary", "true"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{Matchers: tt.matchers})
			rep := okReply(t, h.post(t, payload(t, tt.alert)))
			assert.Equal(t, tt.want, rep.Incident)
			assert.Equal(t, tt.want, h.r.Incident().Active)
			ignored := 1.0
			if tt.want {
				ignored = 0
			}
			assert.Equal(t, ignored, h.metric(t, "basin_webhook_alerts_ignored_total", "reason", "not_matching"))
		})
	}
}

func TestAuth(t *testing.T) {
	const user, pass = "alertmanager", "b4sic-p4ss"
	bearerAuth := func(tok string) func(*http.Request) {
		return func(req *http.Request) { req.Header.Set("Authorization", "Bearer "+tok) }
	}
	basicAuth := func(u, p string) func(*http.Request) {
		return func(req *http.Request) { req.SetBasicAuth(u, p) }
	}
	tokenOnly := Options{Token: testToken}
	basicOnly := Options{BasicUser: user, BasicPassword: pass}
	both := Options{Token: testToken, BasicUser: user, BasicPassword: pass}
	tests := []struct {
		name string
		opts Options
		auth func(*http.Request)
		ok   bool
	}{
		{"no credentials", tokenOnly, nil, false},
		{"wrong token", tokenOnly, bearerAuth("not-the-token"), false},
		{"token prefix", tokenOnly, bearerAuth(testToken[:5]), false},
		{"token with more after it", tokenOnly, bearerAuth(testToken + "x"), false},
		{"empty bearer", tokenOnly, bearerAuth(""), false},
		{"other scheme", tokenOnly, func(req *http.Request) { req.Header.Set("Authorization", "Token "+testToken) }, false},
		{"basic when only a token is configured", tokenOnly, basicAuth(user, testToken), false},
		{"right token", tokenOnly, bearerAuth(testToken), true},
		{"scheme in lower case", tokenOnly, func(req *http.Request) { req.Header.Set("Authorization", "bearer "+testToken) }, true},
		{"no basic credentials", basicOnly, nil, false},
		{"wrong basic password", basicOnly, basicAuth(user, "wrong"), false},
		{"wrong basic user", basicOnly, basicAuth("admin", pass), false},
		{"bearer when only basic is configured", basicOnly, bearerAuth(pass), false},
		{"right basic", basicOnly, basicAuth(user, pass), true},
		{"both configured, token", both, bearerAuth(testToken), true},
		{"both configured, basic", both, basicAuth(user, pass), true},
		{"both configured, wrong basic", both, basicAuth(user, testToken), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.opts)
			rec := h.do(t, http.MethodPost, readTestdata(t, "firing.json"), tt.auth)
			if tt.ok {
				assert.True(t, okReply(t, rec).Incident)
				return
			}
			require.Equal(t, http.StatusUnauthorized, rec.Code)
			e := decodeError(t, rec)
			assert.Equal(t, "authentication_error", e.Type)
			assert.Equal(t, "unauthorized", e.Code)
			challenges := strings.Join(rec.Header().Values("WWW-Authenticate"), "; ")
			assert.Equal(t, tt.opts.Token != "", strings.Contains(challenges, "Bearer realm="), challenges)
			assert.Equal(t, tt.opts.BasicUser != "", strings.Contains(challenges, "Basic realm="), challenges)
			// An unauthenticated call changes nothing.
			assert.False(t, h.r.Incident().Active)
			assert.Empty(t, h.r.State().Active)
			assert.Empty(t, h.changes.actives())
			assert.Equal(t, 1.0, h.metric(t, "basin_webhook_requests_total", "result", "unauthorized"))
			assert.Equal(t, 0.0, h.metric(t, "basin_webhook_alerts_total", "status", "firing"))
		})
	}
}

func TestUnauthenticatedBodyIsNotRead(t *testing.T) {
	h := newHarness(t, Options{})
	rec := h.do(t, http.MethodPost, []byte("not json at all"), nil)
	assert.Equal(t, http.StatusUnauthorized, rec.Code, "credentials are checked before the body")
	assert.Equal(t, 0.0, h.metric(t, "basin_webhook_requests_total", "result", "bad_request"))
}

func TestBadPayloads(t *testing.T) {
	firing := string(readTestdata(t, "firing.json"))
	replace := func(old, new string) string {
		require.Contains(t, firing, old)
		return strings.Replace(firing, old, new, 1)
	}
	valid := func(mod func(*template.Alert)) string {
		a := alert("BasinTrapped", t0)
		b := alert("BasinHitRateCollapsed", t0)
		mod(&b)
		return string(payload(t, a, b))
	}
	tests := []struct {
		name    string
		body    string
		maxBody int64
		param   string // "" for the body as a whole
		msg     string // the message contains this
		result  string
	}{
		{name: "not JSON", body: "alert!", msg: "body: invalid JSON at byte 1"},
		{name: "empty", body: "", msg: "body: empty"},
		{name: "only white space", body: " \n", msg: "body: empty"},
		{name: "cut off", body: firing[:200], msg: "body: JSON ends early"},
		{name: "an array", body: "[]", msg: "body: must be a JSON object"},
		{name: "null", body: "null", param: "version", msg: `version: required, "4"`},
		{name: "trailing data", body: firing + `{"version":"4"}`, msg: "body: want one JSON object, found more after it"},
		{name: "trailing garbage", body: firing + "]", msg: "body: want one JSON object, found more after it"},
		{name: "wrong version", body: replace(`"version": "4"`, `"version": "3"`), param: "version", msg: `version: must be "4" (Alertmanager webhook payload version), got "3"`},
		{name: "version a number", body: replace(`"version": "4"`, `"version": 4`), param: "version", msg: `version: must be the string "4", got JSON number`},
		{name: "no version", body: replace(`"version": "4",`, ``), param: "version", msg: "version: required"},
		{name: "version checked before the shape", body: replace(`"version": "4"`, `"version": "5", "alerts": {}`), param: "version", msg: `got "5"`},
		{name: "no status", body: replace(`"status": "firing",`, ``), param: "status", msg: "status: required"},
		{name: "unknown status", body: replace(`"status": "firing"`, `"status": "pending"`), param: "status", msg: `status: must be "firing" or "resolved", got "pending"`},
		{name: "no alerts", body: `{"version":"4","status":"firing","alerts":[]}`, param: "alerts", msg: "alerts: required"},
		{name: "alerts not an array", body: `{"version":"4","status":"firing","alerts":{"status":"firing"}}`, param: "alerts", msg: "alerts: must be an array"},
		{name: "alert not an object", body: `{"version":"4","status":"firing","alerts":[7]}`, param: "alerts[0]", msg: "alerts[0]: must be an object, got JSON number"},
		{name: "missing alertname", body: valid(func(a *template.Alert) { delete(a.Labels, "alertname") }), param: "alerts[1].labels.alertname", msg: "alerts[1].labels.alertname: required"},
		{name: "alert status missing", body: valid(func(a *template.Alert) { a.Status = "" }), param: "alerts[1].status", msg: "alerts[1].status: required"},
		{name: "alert status unknown", body: valid(func(a *template.Alert) { a.Status = "suppressed" }), param: "alerts[1].status", msg: `got "suppressed"`},
		{name: "missing startsAt", body: valid(func(a *template.Alert) { a.StartsAt = time.Time{} }), param: "alerts[1].startsAt", msg: "alerts[1].startsAt: required"},
		{name: "startsAt not a time", body: replace(`"startsAt": "2025-06-03T14:01:41.482Z"`, `"startsAt": "yesterday"`), param: "alerts[1].startsAt", msg: "alerts[1].startsAt: must be an RFC 3339 time"},
		{name: "endsAt a number", body: replace(`"endsAt": "0001-01-01T00:00:00Z"`, `"endsAt": 0`), param: "alerts[0].endsAt", msg: "alerts[0].endsAt: must be an RFC 3339 time"},
		{name: "label value a number", body: replace(`"severity": "warning"`, `"severity": 2`), param: "alerts[1].labels.severity", msg: "alerts[1].labels.severity: must be a string, got JSON number"},
		{name: "labels an array", body: replace(`"labels": {`, `"labels": ["x"], "x": {`), param: "alerts[0].labels", msg: "alerts[0].labels: must be an object of strings"},
		{name: "group label value a bool", body: replace(`"namespace": "inference"
  },
  "commonLabels"`, `"namespace": true
  },
  "commonLabels"`), param: "groupLabels.namespace", msg: "groupLabels.namespace: must be a string"},
		{name: "negative truncatedAlerts", body: replace(`"truncatedAlerts": 0`, `"truncatedAlerts": -1`), param: "truncatedAlerts", msg: "truncatedAlerts: must be a non-negative integer"},
		{name: "oversize", body: firing, maxBody: 512, msg: "body: larger than 512 bytes", result: resultTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{MaxBody: tt.maxBody})
			rec := h.do(t, http.MethodPost, []byte(tt.body), func(req *http.Request) { req.Header.Set("Authorization", "Bearer "+testToken) })
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			e := decodeError(t, rec)
			assert.Equal(t, "invalid_request_error", e.Type)
			if tt.param == "" {
				assert.Nil(t, e.Param)
				assert.True(t, strings.HasPrefix(e.Message, "body: "), e.Message)
			} else if assert.NotNil(t, e.Param) {
				assert.Equal(t, tt.param, *e.Param)
				assert.True(t, strings.HasPrefix(e.Message, tt.param+": "), e.Message)
			}
			assert.Contains(t, e.Message, tt.msg)
			assert.False(t, h.r.Incident().Active, "a rejected payload changes nothing")
			assert.Empty(t, h.changes.actives())
			result := tt.result
			if result == "" {
				result = resultBadRequest
			}
			assert.Equal(t, 1.0, h.metric(t, "basin_webhook_requests_total", "result", result))
		})
	}
}

func TestFingerprintDerivedWhenMissing(t *testing.T) {
	h := newHarness(t, Options{})
	body := strings.Replace(string(readTestdata(t, "firing.json")), `"fingerprint": "a04e51d1b80f119d"`, `"fingerprint": ""`, 1)
	okReply(t, h.post(t, []byte(body)))
	// Alertmanager's own fingerprint, so the resolve (which carries it) still matches.
	assert.ElementsMatch(t, []string{"a04e51d1b80f119d", "551f566302c6ed8d"}, fingerprints(h.r.Incident()))
	okReply(t, h.post(t, readTestdata(t, "resolved.json")))
	assert.False(t, h.r.Incident().Active)
}

func TestMethodNotAllowed(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, Options{})
			rec := h.do(t, method, readTestdata(t, "firing.json"), func(req *http.Request) { req.Header.Set("Authorization", "Bearer "+testToken) })
			require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
			assert.Equal(t, http.MethodPost, rec.Header().Get("Allow"))
			assert.Equal(t, "method_not_allowed", decodeError(t, rec).Code)
			assert.False(t, h.r.Incident().Active)
			assert.Equal(t, 1.0, h.metric(t, "basin_webhook_requests_total", "result", "method_not_allowed"))
		})
	}
}

func TestExpiry(t *testing.T) {
	t.Run("without endsAt, MaxAge after the last notification", func(t *testing.T) {
		h := newHarness(t, Options{})
		firing := readTestdata(t, "firing.json")
		okReply(t, h.post(t, firing))
		h.clock.Advance(DefaultMaxAge - time.Second)
		assert.True(t, h.r.Incident().Active)
		okReply(t, h.post(t, firing)) // Alertmanager's repeat
		h.clock.Advance(DefaultMaxAge - time.Second)
		assert.True(t, h.r.Incident().Active, "the repeat pushed expiry back")
		assert.Equal(t, []bool{true}, h.changes.actives())
		h.clock.Advance(time.Second)
		inc := h.r.Incident()
		assert.False(t, inc.Active)
		assert.Equal(t, []bool{true, false}, h.changes.actives(), "expiry switches incident mode off once")
		assert.Equal(t, 2.0, h.metric(t, "basin_webhook_alerts_expired_total"))
		assert.Equal(t, 0.0, h.metric(t, "basin_webhook_incident_active"))
		h.r.Incident()
		assert.Equal(t, []bool{true, false}, h.changes.actives())
	})
	t.Run("a sender's endsAt is the timeout", func(t *testing.T) {
		h := newHarness(t, Options{MaxAge: time.Minute})
		a := alert("BasinTrapped", t0)
		a.EndsAt = t0.Add(30 * time.Minute)
		okReply(t, h.post(t, payload(t, a)))
		h.clock.Advance(30*time.Minute - time.Second)
		assert.True(t, h.r.Incident().Active)
		h.clock.Advance(time.Second)
		assert.False(t, h.r.Incident().Active)
	})
	t.Run("resolves are forgotten after MaxAge", func(t *testing.T) {
		h := newHarness(t, Options{})
		okReply(t, h.post(t, readTestdata(t, "resolved.json")))
		assert.Len(t, h.r.State().Resolved, 2)
		h.clock.Advance(DefaultMaxAge)
		assert.Empty(t, h.r.State().Resolved)
	})
	t.Run("expired and re-fired in one notification does not flap", func(t *testing.T) {
		h := newHarness(t, Options{})
		firing := readTestdata(t, "firing.json")
		okReply(t, h.post(t, firing))
		h.clock.Advance(DefaultMaxAge + time.Minute)
		okReply(t, h.post(t, firing))
		assert.Equal(t, []bool{true}, h.changes.actives())
	})
}

func TestRunSweeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &changes{}
		r, err := New(Options{Token: testToken, OnChange: ch.record}) // time.Now: the bubble's clock
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		synctest.Wait()
		require.Error(t, r.Run(ctx), "a second Run is refused")

		req, _ := http.NewRequest(http.MethodPost, Path, bytes.NewReader(readTestdata(t, "firing.json")))
		req.Header.Set("Authorization", "Bearer "+testToken)
		rec := newRecorder()
		r.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.code)

		time.Sleep(DefaultMaxAge - time.Second)
		synctest.Wait()
		assert.Equal(t, []bool{true}, ch.actives())
		time.Sleep(2 * sweepEvery)
		synctest.Wait()
		assert.Equal(t, []bool{true, false}, ch.actives(), "Run switched incident mode off with nobody asking")
		cancel()
		assert.NoError(t, <-done)
	})
}

// recorder is a minimal http.ResponseWriter for the synctest bubble.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func newRecorder() *recorder                    { return &recorder{header: http.Header{}} }
func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(code int)        { r.code = code }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

var _ http.ResponseWriter = (*recorder)(nil)

func TestStateRestore(t *testing.T) {
	roundTrip := func(t *testing.T, s State) State {
		b, err := json.Marshal(s)
		require.NoError(t, err)
		var out State
		require.NoError(t, json.Unmarshal(b, &out))
		return out
	}
	t.Run("an incident survives a restart", func(t *testing.T) {
		h := newHarness(t, Options{})
		okReply(t, h.post(t, readTestdata(t, "firing.json")))
		want := h.r.Incident()
		s := roundTrip(t, h.r.State())

		h2 := newHarness(t, Options{})
		h2.clock.Advance(time.Minute)
		require.NoError(t, h2.r.Restore(s))
		got := h2.r.Incident()
		assert.True(t, got.Active)
		assert.True(t, want.Since.Equal(got.Since), "Since is kept")
		assert.Equal(t, fingerprints(want), fingerprints(got))
		assert.Equal(t, []bool{true}, h2.changes.actives(), "the restart tightens again")
		assert.Equal(t, 1.0, h2.metric(t, "basin_webhook_incident_active"))

		okReply(t, h2.post(t, readTestdata(t, "resolved.json")))
		assert.False(t, h2.r.Incident().Active)
		assert.Equal(t, []bool{true, false}, h2.changes.actives())
	})
	t.Run("remembered resolves survive a restart", func(t *testing.T) {
		h := newHarness(t, Options{})
		okReply(t, h.post(t, readTestdata(t, "resolved.json")))
		h2 := newHarness(t, Options{})
		require.NoError(t, h2.r.Restore(roundTrip(t, h.r.State())))
		okReply(t, h2.post(t, readTestdata(t, "firing.json")))
		assert.False(t, h2.r.Incident().Active, "the late firing notice is still recognised")
	})
	t.Run("alerts that expired while down are dropped", func(t *testing.T) {
		h := newHarness(t, Options{})
		okReply(t, h.post(t, readTestdata(t, "firing.json")))
		h2 := newHarness(t, Options{})
		h2.clock.Advance(DefaultMaxAge)
		require.NoError(t, h2.r.Restore(roundTrip(t, h.r.State())))
		assert.False(t, h2.r.Incident().Active)
		assert.Empty(t, h2.changes.actives())
	})
	t.Run("alerts no matcher selects any more are dropped", func(t *testing.T) {
		h := newHarness(t, Options{})
		okReply(t, h.post(t, readTestdata(t, "firing.json")))
		h2 := newHarness(t, Options{Matchers: []Matcher{{AlertName: "BasinTrapped"}}})
		require.NoError(t, h2.r.Restore(roundTrip(t, h.r.State())))
		assert.Equal(t, []string{"a04e51d1b80f119d"}, fingerprints(h2.r.Incident()))
	})
	t.Run("restoring an empty state ends the incident", func(t *testing.T) {
		h := newHarness(t, Options{})
		okReply(t, h.post(t, readTestdata(t, "firing.json")))
		require.NoError(t, h.r.Restore(State{}))
		assert.False(t, h.r.Incident().Active)
		assert.Equal(t, []bool{true, false}, h.changes.actives())
	})
	t.Run("an inconsistent state is refused whole", func(t *testing.T) {
		h := newHarness(t, Options{})
		okReply(t, h.post(t, readTestdata(t, "firing.json")))
		good := h.r.State()
		tests := []struct {
			name  string
			mod   func(*State)
			field string
		}{
			{"no fingerprint", func(s *State) { s.Active[1].Fingerprint = "" }, "Active[1].Fingerprint: empty"},
			{"twice", func(s *State) { s.Active[1].Fingerprint = s.Active[0].Fingerprint }, "Active[1].Fingerprint: "},
			{"no expiry", func(s *State) { s.Active[0].ExpiresAt = time.Time{} }, "Active[0].ExpiresAt: zero"},
			{"active and resolved", func(s *State) {
				s.Resolved = []ResolvedAlert{{Fingerprint: s.Active[0].Fingerprint, StartsAt: t0, EndsAt: t0, ReceivedAt: t0}}
			}, "Resolved[0].Fingerprint: "},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				s := roundTrip(t, good)
				tt.mod(&s)
				err := h.r.Restore(s)
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.field)
				assert.Len(t, h.r.Incident().Alerts, 2, "the state in use is kept")
			})
		}
	})
}

func TestConcurrentFlood(t *testing.T) {
	h := newHarness(t, Options{})
	const (
		workers = 16
		posts   = 60
		alerts  = 6
	)
	names := []string{AlertMetastableDrift, AlertTrapped, AlertHitRateCollapsed}
	// Each alert has three episodes a minute apart, each ending 30 s after it starts; the
	// notifications about them arrive in any order, repeated.
	notice := func(rng *rand.Rand) template.Alert {
		name := names[rng.IntN(len(names))]
		a := alert(name, t0.Add(-10*time.Minute+time.Duration(rng.IntN(3))*time.Minute), "shard", fmt.Sprint(rng.IntN(alerts)))
		if rng.IntN(2) == 0 {
			a = resolved(a, a.StartsAt.Add(30*time.Second))
		}
		return a
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range posts {
				n := 1 + rng.IntN(4)
				as := make([]template.Alert, n)
				for i := range as {
					as[i] = notice(rng)
				}
				rec := h.post(t, payload(t, as...))
				if rec.Code != http.StatusOK {
					t.Errorf("post: %d %s", rec.Code, rec.Body)
				}
				if rng.IntN(10) == 0 {
					h.clock.Advance(time.Second)
					h.r.Incident()
				}
			}
		})
	}
	wg.Wait()

	// OnChange alternates on, off, on, … and agrees with the final state.
	seen := h.changes.actives()
	for i, on := range seen {
		require.Equal(t, i%2 == 0, on, "switch %d of %v", i, seen)
	}
	inc := h.r.Incident()
	assert.Equal(t, len(seen)%2 == 1, inc.Active)
	assert.Equal(t, len(inc.Alerts) > 0, inc.Active)
	assert.Equal(t, float64(len(inc.Alerts)), h.metric(t, "basin_webhook_active_alerts"))
	assert.Equal(t, float64(workers*posts), h.metric(t, "basin_webhook_requests_total", "result", "ok"))
	s := h.r.State()
	for _, r := range s.Resolved {
		for _, a := range s.Active {
			assert.NotEqual(t, a.Fingerprint, r.Fingerprint, "an alert is active or resolved, not both")
		}
	}

	// The last episodes resolve: the incident is over whatever the order before.
	var last []template.Alert
	for _, name := range names {
		for shard := range alerts {
			a := alert(name, t0.Add(-8*time.Minute), "shard", fmt.Sprint(shard))
			last = append(last, resolved(a, t0.Add(-7*time.Minute-30*time.Second)))
		}
	}
	assert.False(t, okReply(t, h.post(t, payload(t, last...))).Incident)
	assert.False(t, h.r.Incident().Active)
	if seen := h.changes.actives(); len(seen) > 0 {
		assert.False(t, seen[len(seen)-1])
	}
}

func TestOnChangeMayCallBack(t *testing.T) {
	var h *harness
	var seen []Incident
	h = newHarness(t, Options{OnChange: func(inc Incident) {
		seen = append(seen, inc)
		assert.Equal(t, inc.Active, h.r.Incident().Active, "Incident is callable from OnChange")
	}})
	okReply(t, h.post(t, readTestdata(t, "firing.json")))
	okReply(t, h.post(t, readTestdata(t, "resolved.json")))
	require.Len(t, seen, 2)
	assert.True(t, seen[0].Active)
	assert.False(t, seen[1].Active)
}

func TestSecretsNeverLogged(t *testing.T) {
	const user, pass = "alertmanager", "b4sic-p4ss-do-not-log"
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newHarness(t, Options{Token: testToken, BasicUser: user, BasicPassword: pass, Logger: logger})
	h.post(t, readTestdata(t, "firing.json"))
	h.do(t, http.MethodPost, nil, func(req *http.Request) { req.Header.Set("Authorization", "Bearer "+testToken+"x") })
	h.do(t, http.MethodPost, nil, func(req *http.Request) { req.SetBasicAuth(user, pass+"x") })
	h.do(t, http.MethodPost, []byte("{"), func(req *http.Request) { req.SetBasicAuth(user, pass) })
	h.clock.Advance(time.Hour)
	h.r.Incident()
	require.NotEmpty(t, logs.String())
	assert.NotContains(t, logs.String(), testToken)
	assert.NotContains(t, logs.String(), pass)

	_, err := New(Options{Token: " " + testToken})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), testToken)
}
