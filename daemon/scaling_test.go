package daemon

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/scaler"
)

// The synthetic deployment sized: 40 sessions of 25K live, 1.5 calls/s and K = 30 make a session
// live 40 × 30 ÷ 1.5 = 800 s; 0.05 arrivals/s keep 40 sessions, 55 with a +50% spike for ten
// minutes. Prefill: max(40 × 25K ÷ 0.8, 55 × 25K) = 1.375M under the knee's 1.9 × 1M → 1.
// Decode, with no served fraction exported (every session counted): 1.375M over 0.9 × 800K → 2.
// With every session counted in decode, 800K ÷ 25K = 32 sessions fill it before the knee's 76:
// decode-first. The arrivals are sized two standard errors low (scaler.ArrivalsConfidence): after
// sizedAfter, λ's error is √(0.05 ÷ 1200 × (2 − w) ÷ w) = 0.008/s (w = 1 − e^(−1.5)), so 0.034/s
// is sized: 27 sessions, 37 with the spike — 1 prefill, and decode 930K over 720K → still 2.
const wantPrefill, wantDecode = 1, 2

// sizedAfter is how many steps (15 minutes of the deployment's time) the tests give the settled
// λ's error to fall; before it, the arrivals are sized low (0 just after the start).
const sizedAfter = 180

// metricLine finds one series' value in an exposition.
func metricLine(body, series string) (string, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// TestCapacitySignals: without scaling the daemon still sizes the deployment every step and
// exports it for autoscalers, in its metrics and its status.
func TestCapacitySignals(t *testing.T) {
	e := newEnv(t, "")
	d := e.daemon()
	api := serveAPI(t, d)
	e.stepUntil(d, 30, "sized for the arrivals", func(s Status) bool { return s.Capacity.Need != nil && s.Capacity.Need.ForArrivals })
	for range sizedAfter {
		e.step(d)
	}
	st := d.StatusNow()
	n := st.Capacity.Need
	assert.Equal(t, wantPrefill, n.Prefill, "%q", n.Reasons)
	assert.Equal(t, wantDecode, n.Decode, "%q", n.Reasons)
	assert.Equal(t, 1, n.ServingPrefill)
	assert.Equal(t, 1, n.ServingDecode)
	assert.Equal(t, "decode-first", n.Binding)
	assert.False(t, st.Capacity.Scaling)
	_, body := call(t, http.MethodGet, api.URL+"/metrics", "", "")
	for series, want := range map[string]string{
		`basin_capacity_needed_instances{deployment="unit",role="prefill"}`: fmt.Sprint(wantPrefill),
		`basin_capacity_needed_instances{deployment="unit",role="decode"}`:  fmt.Sprint(wantDecode),
		`basin_capacity_instances{deployment="unit",role="decode"}`:         "1",
		`basin_capacity_binding{deployment="unit",limit="cache"}`:           "0",
		`basin_capacity_binding{deployment="unit",limit="decode"}`:          "1",
	} {
		got, ok := metricLine(string(body), series)
		if assert.True(t, ok, "%s exported", series) {
			assert.Equal(t, want, got, series)
		}
	}
	_, ok := metricLine(string(body), `basin_scale_desired_instances{deployment="unit",role="decode"}`)
	assert.False(t, ok, "no scaling, no asks")
}

// scaleReceiver is an operator's scaling endpoint: it records what basin asks.
type scaleReceiver struct {
	mu  sync.Mutex
	got []scaler.Payload
	srv *httptest.Server
}

func newScaleReceiver(t *testing.T) *scaleReceiver {
	r := &scaleReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		var p scaler.Payload
		if err := json.NewDecoder(q.Body).Decode(&p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, p)
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *scaleReceiver) asks() []scaler.Payload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]scaler.Payload(nil), r.got...)
}

// TestScalingAsksOnce: with an http scaling backend the acting daemon asks for the decode
// instance the arrivals need — audited before it asks — once; a restarted daemon remembers what it
// asked and does not ask again.
func TestScalingAsksOnce(t *testing.T) {
	rcv := newScaleReceiver(t)
	e := newEnv(t, fmt.Sprintf("scaling:\n  backend: {kind: http, url: %q}\n  ceiling: {prefill: 4, decode: 4}\n", rcv.srv.URL))
	d := e.daemon()
	api := serveAPI(t, d)
	e.stepUntil(d, sizedAfter+30, "asked for decode", func(Status) bool { return len(rcv.asks()) > 0 })
	for range 5 {
		e.step(d)
	}
	asks := rcv.asks()
	require.Len(t, asks, 1, "one ask: %+v", asks)
	assert.Equal(t, "unit", asks[0].Deployment)
	assert.Equal(t, scaler.RoleDecode, asks[0].Role)
	assert.Equal(t, wantDecode, asks[0].Replicas)
	assert.Contains(t, asks[0].Reason, "scaling out 1 → 2")

	var phases []remediate.Phase
	for _, r := range auditLines(t, e.cfg.DataDir) {
		if r.Kind == "scale" {
			phases = append(phases, r.Phase)
			assert.Equal(t, "scale decode 1 → 2", r.Change())
		}
	}
	assert.Equal(t, []remediate.Phase{remediate.PhaseIntent, remediate.PhaseDone}, phases, "the intent is on disk before the ask")
	_, body := call(t, http.MethodGet, api.URL+"/metrics", "", "")
	got, ok := metricLine(string(body), `basin_scale_desired_instances{deployment="unit",role="decode"}`)
	assert.True(t, ok)
	assert.Equal(t, "2", got)
	assert.Equal(t, map[scaler.Role]int{scaler.RolePrefill: 1, scaler.RoleDecode: 2}, d.StatusNow().Capacity.Asked)

	d2 := e.daemon()
	for range 5 {
		e.step(d2)
	}
	assert.Len(t, rcv.asks(), 1, "the restarted daemon knows it asked")
	assert.Equal(t, 2, d2.StatusNow().Capacity.Asked[scaler.RoleDecode])
}

// TestScalingDryRun: a dry run audits the ask and makes none.
func TestScalingDryRun(t *testing.T) {
	rcv := newScaleReceiver(t)
	e := newEnv(t, fmt.Sprintf("dry_run: true\nscaling:\n  backend: {kind: http, url: %q}\n  ceiling: {decode: 4}\n", rcv.srv.URL))
	d := e.daemon()
	decided := func() bool {
		for _, r := range auditLines(t, e.cfg.DataDir) {
			if r.Kind == "scale" && r.Phase == remediate.PhaseDryRun {
				return true
			}
		}
		return false
	}
	e.stepUntil(d, sizedAfter+30, "a scale decided", func(Status) bool { return decided() })
	assert.Empty(t, rcv.asks())
	assert.True(t, d.StatusNow().Capacity.DecidedOnly)
}

// TestScalingConfig: mistakes are named by key.
func TestScalingConfig(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"ceiling without a backend", "scaling:\n  ceiling: {decode: 2}\n", "scaling.backend.kind"},
		{"backend without a ceiling", "scaling:\n  backend: {kind: http, url: http://x}\n", "roles: none scaled"},
		{"floor above ceiling", "scaling:\n  backend: {kind: http, url: http://x}\n  floor: {decode: 3}\n  ceiling: {decode: 2}\n", "floor.decode: 3 above ceiling.decode 2"},
		{"unknown role", "scaling:\n  backend: {kind: http, url: http://x}\n  ceiling: {unified: 2}\n", `unknown role "unified"`},
		{"spike size", "capacity: {spike_size: -1}\n", "spike_size"},
		{"decode floor", "capacity: {decode_floor: -1}\n", "capacity.decode_floor: -1, must be ≥ 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(baseYAML + tc.yaml))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestDecodeKept: the exported sizing counts lent cache from the decode instances that stay —
// capacity.decode_floor where an autoscaler scales decode on basin's need, basin's own decode floor
// where basin scales decode (its policy sizes so), every instance serving otherwise.
func TestDecodeKept(t *testing.T) {
	const scaling = "scaling:\n  backend: {kind: http, url: http://x}\n"
	for _, tc := range []struct {
		name, yaml string
		want       int
	}{
		{"decode not scaled", "", 0},
		{"an autoscaler keeps two", "capacity: {decode_floor: 2}\n", 2},
		{"basin scales decode, default floor", "capacity: {decode_floor: 2}\n" + scaling + "  ceiling: {decode: 4}\n", 1},
		{"basin scales decode from 3", scaling + "  floor: {decode: 3}\n  ceiling: {decode: 4}\n", 3},
		{"basin scales prefill only", "capacity: {decode_floor: 2}\n" + scaling + "  ceiling: {prefill: 4}\n", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, newEnv(t, tc.yaml).daemon().decodeKept())
		})
	}
}
