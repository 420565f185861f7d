package alerts

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/alertmanager/template"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/testclock"
)

const testToken = "s3cr3t-t0ken-for-tests"

// t0 is shortly after the alerts of testdata/firing.json started.
var t0 = time.Date(2025, 6, 3, 14, 5, 0, 0, time.UTC)

// changes records OnChange calls.
type changes struct {
	mu   sync.Mutex
	seen []Incident
}

func (c *changes) record(inc Incident) {
	c.mu.Lock()
	c.seen = append(c.seen, inc)
	c.mu.Unlock()
}

// actives returns the Active flag of each call so far.
func (c *changes) actives() []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]bool, len(c.seen))
	for i, inc := range c.seen {
		out[i] = inc.Active
	}
	return out
}

// harness is a Receiver with a fake clock, its own registry and an OnChange recorder.
type harness struct {
	r       *Receiver
	clock   *testclock.Clock
	reg     *prometheus.Registry
	changes *changes
}

// newHarness builds a Receiver from opts with Token, Now, Registerer and OnChange filled in
// unless set.
func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	h := &harness{clock: testclock.New(t0), reg: prometheus.NewRegistry(), changes: &changes{}}
	if opts.Token == "" && opts.BasicUser == "" {
		opts.Token = testToken
	}
	if opts.Now == nil {
		opts.Now = h.clock.Now
	}
	opts.Registerer = h.reg
	if opts.OnChange == nil {
		opts.OnChange = h.changes.record
	}
	r, err := New(opts)
	require.NoError(t, err)
	h.r = r
	return h
}

// post sends body with the test token.
func (h *harness) post(t *testing.T, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	return h.do(t, http.MethodPost, body, func(req *http.Request) { req.Header.Set("Authorization", "Bearer "+testToken) })
}

func (h *harness) do(t *testing.T, method string, body []byte, auth func(*http.Request)) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != nil {
		auth(req)
	}
	rec := httptest.NewRecorder()
	h.r.ServeHTTP(rec, req)
	return rec
}

// metric returns the value of the counter or gauge name with the given label pairs.
func (h *harness) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

// alert is a matching firing alert with a blank endsAt, as Alertmanager sends it.
func alert(name string, startsAt time.Time, labels ...string) template.Alert {
	kv := template.KV{"alertname": name, "namespace": "inference"}
	for i := 0; i+1 < len(labels); i += 2 {
		kv[labels[i]] = labels[i+1]
	}
	return template.Alert{Status: statusFiring, Labels: kv, Annotations: template.KV{"summary": name + " fires"},
		StartsAt: startsAt, Fingerprint: fingerprint(kv)}
}

// resolved is a resolved at endsAt.
func resolved(a template.Alert, endsAt time.Time) template.Alert {
	a.Status, a.EndsAt = statusResolved, endsAt
	return a
}

// payload is a version 4 webhook body with these alerts.
func payload(t testing.TB, alerts ...template.Alert) []byte {
	t.Helper()
	status := statusResolved
	for _, a := range alerts {
		if a.Status == statusFiring {
			status = statusFiring
		}
	}
	b, err := json.Marshal(message{Data: &template.Data{Receiver: "basin", Status: status, Alerts: alerts,
		GroupLabels: template.KV{}, CommonLabels: template.KV{}, CommonAnnotations: template.KV{},
		ExternalURL: "http://alertmanager:9093"}, Version: "4", GroupKey: "{}:{}"})
	require.NoError(t, err)
	return b
}

// okReply decodes a 200 answer.
func okReply(t *testing.T, rec *httptest.ResponseRecorder) okBody {
	t.Helper()
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var b okBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &b))
	return b
}

// errorReply is an error answer as a client decodes it.
type errorReply struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// decodeError decodes an error answer.
func decodeError(t *testing.T, rec *httptest.ResponseRecorder) errorReply {
	t.Helper()
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var b struct {
		Error errorReply `json:"error"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &b), rec.Body.String())
	return b.Error
}

func fingerprints(inc Incident) []string {
	out := []string{}
	for _, a := range inc.Alerts {
		out = append(out, a.Fingerprint)
	}
	return out
}
