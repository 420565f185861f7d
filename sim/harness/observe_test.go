package harness

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

func observed(t *testing.T, name string, seed uint64, cal *detector.Calibration) *sim.Result {
	t.Helper()
	sc, err := scenario.Load(name)
	require.NoError(t, err)
	sc.Seed = seed
	o, err := sc.Options("")
	require.NoError(t, err)
	require.NoError(t, Observe(&o, detector.Options{Calibration: cal}))
	s, err := sim.New(o)
	require.NoError(t, err)
	return s.Run()
}

func TestDetectorSeesTheTrapBeforeUtilisationAlerts(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	calm, err := scenario.Load("paper-1p1d-h100")
	require.NoError(t, err)
	cal, err := Calibrate(calm, time.Unix(0, 0))
	require.NoError(t, err)
	assert.InDelta(t, 1.35, cal.KneeRatio, 0.2, "the simulated deployment's knee")

	r := observed(t, "paper-1p1d-h100-spike", 1, cal)
	obs, ok := r.Detector.(*Observation)
	require.True(t, ok)
	require.NotNil(t, obs.FirstWarningMin)
	require.NotNil(t, obs.FirstTrappedMin)
	require.NotNil(t, r.UtilisationAlertFirstMin)
	assert.GreaterOrEqual(t, *r.UtilisationAlertFirstMin-*obs.FirstWarningMin, 5.0,
		"the first warning leads the first utilisation alert by five minutes or more")
	assert.Equal(t, detector.Trapped, obs.FinalState)
	assert.Greater(t, *obs.FirstWarningMin, 15.0, "nothing before the spike starts")
	b, err := json.Marshal(r)
	require.NoError(t, err)
	for _, k := range []string{`"detector":`, `"first_warning_min":`, `"first_trapped_min":`, `"transitions":`,
		`"utilisation_alert_first_min":`} {
		assert.Contains(t, string(b), k)
	}
}

func TestDetectorQuietOnAHealthyRun(t *testing.T) {
	if raceEnabled {
		t.Skip("simulation only, single-threaded: the race detector slows it tenfold; the plain pass runs it")
	}
	calm, err := scenario.Load("paper-1p3d-h200")
	require.NoError(t, err)
	cal, err := Calibrate(calm, time.Unix(0, 0))
	require.NoError(t, err)
	r := observed(t, "paper-1p3d-h200", 1, cal)
	obs := r.Detector.(*Observation)
	assert.Nil(t, obs.FirstDriftingMin)
	assert.Nil(t, obs.FirstTrappedMin)
	assert.Nil(t, r.UtilisationAlertFirstMin)
	assert.Equal(t, detector.Healthy, obs.FinalState)
}
