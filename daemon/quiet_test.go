package daemon

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

// TestQuietDeploymentHasNoHitRate: once the traffic stops, the windows hold no prompt tokens and
// the hit rate is no reading. The daemon stays healthy and sighted (quiet is not blind), exports
// no basin_hit_rate rather than a stale or made-up one, leaves a gap in the history's hit-rate
// line, and neither loosens nor tightens the budget on it.
func TestQuietDeploymentHasNoHitRate(t *testing.T) {
	e := newEnv(t, "")
	d := e.daemon()
	api := serveAPI(t, d)
	for range 6 {
		e.step(d)
	}
	_, body := call(t, http.MethodGet, api.URL+"/metrics", "", "")
	require.True(t, strings.Contains(string(body), "\nbasin_hit_rate{"), "a busy deployment has a hit rate")
	budgets := len(e.gw.Budgets())

	e.dep.quiet = true
	st := e.stepUntil(d, 40, "no hit-rate reading", func(s Status) bool { return !s.Assessment.HitEvidence.Enough })
	for range 20 {
		e.step(d)
	}
	var s Status
	getJSON(t, api.URL+"/api/v1/status", &s)
	assert.Equal(t, detector.Healthy, s.Assessment.State)
	assert.False(t, s.Blind, "quiet is not blind: %q", s.Unseen)
	assert.Empty(t, s.Assessment.Blind)
	assert.Contains(t, s.Assessment.Reasons, "hit rate not a reading over the 15s window: no prompt tokens in the window", "%q", st.Assessment.Reasons)
	_, body = call(t, http.MethodGet, api.URL+"/metrics", "", "")
	assert.False(t, strings.Contains(string(body), "\nbasin_hit_rate{"), "no basin_hit_rate while quiet")
	assert.True(t, strings.Contains(string(body), "\nbasin_working_set_over_cache{"), "the other numbers stay")
	var h struct{ Points []HistoryPoint }
	getJSON(t, api.URL+"/api/v1/history", &h)
	require.NotEmpty(t, h.Points)
	last := h.Points[len(h.Points)-1]
	assert.Nil(t, last.Hit, "a gap in the hit-rate line")
	assert.NotNil(t, last.WC)
	assert.Len(t, e.gw.Budgets(), budgets, "no budget change on a quiet deployment")
}
