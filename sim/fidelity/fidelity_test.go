package fidelity

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
)

// TestPaperObservations holds the model to the fractions docs/fidelity.md reports for seeds 1–10.
// The thresholds are the measured counts, one seed of slack: a change to the model that loses the
// trap (or makes it universal) fails here, and docs/fidelity.md must be regenerated with it.
func TestPaperObservations(t *testing.T) {
	if testing.Short() {
		t.Skip("runs about sixty simulations")
	}
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	r, err := Run(seeds, nil)
	require.NoError(t, err)
	want := map[string]int{"a": 10, "b": 7, "c": 9, "d": 5, "e": 7}
	for id, min := range want {
		c := r.Check(id)
		assert.GreaterOrEqual(t, c.Passed, min, "(%s) %s: %s", id, c.Criterion, c.Detail)
		assert.Equal(t, len(seeds), c.Runs)
	}
	var md bytes.Buffer
	require.NoError(t, r.Markdown(&md, "test"))
	assert.Contains(t, md.String(), "| (e) |")
	assert.Contains(t, md.String(), "## Healthy goodput")
	require.Len(t, r.Healthy, len(seeds))
	assert.Positive(t, r.MaxStepMs["paper-1p1d-h100"])
}

func TestRecoveryMinutes(t *testing.T) {
	tl := minutes([]float64{0.3, 0.3, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9})
	assert.Equal(t, 2, recoveryMinutes(tl, 0))
	assert.Equal(t, -1, recoveryMinutes(minutes([]float64{0.3, 0.9, 0.9, 0.9, 0.9}), 0),
		"four good minutes are not a recovery")
	assert.Equal(t, 0, recoveryMinutes(tl, 2))
}

func minutes(hits []float64) []sim.Minute {
	out := make([]sim.Minute, len(hits))
	for i, h := range hits {
		out[i] = sim.Minute{Minute: i, PromptTokens: 1000, HitTokens: 1000 * h, HitRate: h}
	}
	return out
}
