package gateway

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/predictor"
)

func TestPeakModeUsesTheLoadedModel(t *testing.T) {
	var samples []predictor.Sample
	for i := range 40 {
		first := 100 + 37*i
		samples = append(samples, predictor.Sample{TaskChars: 50 + i, FirstPrompt: first, Peak: int64(20 * first)})
	}
	m, _, err := predictor.Train(samples, predictor.TrainOptions{Seed: 1, Created: time.Unix(0, 0)})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "model.json")
	require.NoError(t, m.Save(path))

	up := newFakeUpstream(t, okJSON(10, 1))
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) {
		c.Admission.Mode = "peak"
		c.Admission.BudgetTokens = 1
		c.Predictor.Model = path
	}), nil)
	require.Nil(t, h.g.fallback, "the model replaces the fallback")
	decodeCompletion(t, h.chat("a", 1, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := h.chatAsync(ctx, "b", 1, nil)
	q := h.waitQueued(1).Queue[0]
	req := parseCall(chatEndpoint, []byte(chatBody(1)))
	want := m.PredictPeak(req.Task, req.TaskChars, int(req.Prompt))
	assert.Greater(t, want, req.Prompt)
	assert.Equal(t, want, q.Demand, "a queued session's demand in peak mode is the model's prediction")
	cancel()
	<-b
}

func TestTheFallbackLearnsFromEndedSessions(t *testing.T) {
	up := newFakeUpstream(t, okJSON(1000, 500))
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) {
		c.Admission.Mode = "peak"
		c.Admission.BudgetTokens = 1
	}), nil)
	decodeCompletion(t, h.chat("a", 1, map[string]string{"x-session-end": "true"}))
	h.settle()
	require.Equal(t, 1, h.g.fallback.Observed(), "a's peak was fed to the fallback")
	decodeCompletion(t, h.chat("b", 1, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := h.chatAsync(ctx, "c", 1, nil)
	q := h.waitQueued(1).Queue[0]
	assert.Equal(t, int64(1500), q.Demand, "the prediction is the peak seen so far (prompt 1000 + completion 500)")
	cancel()
	<-c
}
