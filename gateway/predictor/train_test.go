package predictor_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/predictor"
	"github.com/basin-dev/basin/internal/trace"
)

var fixedTime = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

func TestTrainLearnsLengthsAndWords(t *testing.T) {
	samples := synth(synthOptions{n: 600, seed: 1})
	m, rep, err := predictor.Train(samples, predictor.TrainOptions{Created: fixedTime})
	require.NoError(t, err)
	t.Logf("report: %+v", rep)

	assert.False(t, rep.HoldoutSkipped)
	assert.Equal(t, len(samples), rep.Train+rep.Holdout)
	assert.InDelta(t, 0.2*float64(len(samples)), float64(rep.Holdout), 0.05*float64(len(samples)), "about 20%% held out")
	assert.Equal(t, rep.Train, m.TrainedOn())
	assert.Greater(t, rep.SpearmanHoldout, 0.8)
	assert.Greater(t, rep.SpearmanTrain, 0.8)
	assert.Less(t, rep.MedianAbsLogErr, 0.4, "noise is lognormal with sigma 0.25")
	assert.Equal(t, rep.SpearmanHoldout, m.SpearmanHoldout())

	// Same lengths, one word apart: "refactor" tasks grew 3× more, "typo" tasks half as much.
	base := task(20, 9)
	chars := len(base) + 9
	plain := m.PredictPeak(base+" and more", chars, 20000)
	refactor := m.PredictPeak(base+" refactor", chars, 20000)
	typo := m.PredictPeak(base+" and typo", chars, 20000)
	t.Logf("plain %d, refactor %d, typo %d", plain, refactor, typo)
	assert.Greater(t, float64(refactor)/float64(plain), 1.8, "refactor %d vs plain %d", refactor, plain)
	assert.Less(t, float64(typo)/float64(plain), 0.8, "typo %d vs plain %d", typo, plain)
	assert.Greater(t, typo, int64(20000), "a real prediction, not the first-prompt floor")

	// Lengths matter on their own.
	assert.Greater(t, m.PredictPeak(base, chars, 40000), m.PredictPeak(base, chars, 20000))

	t.Run("text adds over lengths alone", func(t *testing.T) {
		blind := make([]predictor.Sample, len(samples))
		for i, s := range samples {
			s.TaskText = ""
			blind[i] = s
		}
		_, blindRep, err := predictor.Train(blind, predictor.TrainOptions{Created: fixedTime})
		require.NoError(t, err)
		t.Logf("lengths only: %+v", blindRep)
		assert.Greater(t, rep.SpearmanHoldout, blindRep.SpearmanHoldout+0.05,
			"with text %.3f, lengths only %.3f", rep.SpearmanHoldout, blindRep.SpearmanHoldout)
	})
}

func TestTrainOnNoiseFindsNothing(t *testing.T) {
	samples := synth(synthOptions{n: 1000, seed: 2, noise: true})
	_, rep, err := predictor.Train(samples, predictor.TrainOptions{Created: fixedTime})
	require.NoError(t, err)
	t.Logf("report: %+v", rep)
	require.False(t, rep.HoldoutSkipped)
	require.Greater(t, rep.Holdout, 150)
	assert.Less(t, math.Abs(rep.SpearmanHoldout), 0.2, "holdout Spearman %.3f on noise", rep.SpearmanHoldout)
}

func TestTrainIsDeterministic(t *testing.T) {
	samples := synth(synthOptions{n: 300, seed: 3})
	write := func(o predictor.TrainOptions) []byte {
		t.Helper()
		m, _, err := predictor.Train(samples, o)
		require.NoError(t, err)
		var b bytes.Buffer
		require.NoError(t, m.Write(&b))
		return b.Bytes()
	}
	o := predictor.TrainOptions{Seed: 7, Created: fixedTime}
	first := write(o)
	assert.Equal(t, first, write(o), "same samples and options")

	// The seed picks the split, so another seed fits other samples.
	o.Seed = 8
	assert.NotEqual(t, first, write(o), "another seed")
}

func TestTrainStampsCreated(t *testing.T) {
	samples := synth(synthOptions{n: 50, seed: 4})
	m, _, err := predictor.Train(samples, predictor.TrainOptions{Created: time.Date(2026, 7, 1, 14, 0, 0, 999, time.FixedZone("x", 2*3600))})
	require.NoError(t, err)
	assert.Equal(t, fixedTime, m.Created(), "UTC, whole seconds")

	before := time.Now().Truncate(time.Second)
	m, _, err = predictor.Train(samples, predictor.TrainOptions{})
	require.NoError(t, err)
	assert.False(t, m.Created().Before(before), "zero Created means now")
}

func TestTrainOnTraceLabSession(t *testing.T) {
	f, err := os.Open("../../internal/trace/testdata/tracelab-claude-session.jsonl")
	require.NoError(t, err)
	defer f.Close()
	sessions, err := trace.ReadTraceLab(f)
	require.NoError(t, err)

	samples := predictor.SamplesFromTrace(sessions)
	// Round 9 is the largest: 48305 prompt + 852 output. Round 0: 32272 prompt, 146 task chars.
	require.Equal(t, []predictor.Sample{{TaskChars: 146, FirstPrompt: 32272, Peak: 49157}}, samples)

	m, rep, err := predictor.Train(samples, predictor.TrainOptions{Created: fixedTime})
	require.NoError(t, err, "one session trains")
	assert.True(t, rep.HoldoutSkipped, "one session is too few to hold out")
	assert.Equal(t, 1, rep.Train)
	assert.Equal(t, 0, rep.Holdout)
	assert.True(t, math.IsNaN(rep.SpearmanHoldout))
	assert.True(t, math.IsNaN(rep.MedianAbsLogErr))
	assert.True(t, math.IsNaN(m.SpearmanHoldout()))

	// Fit on one session, the model predicts that session's peak.
	assert.Equal(t, int64(49157), m.PredictPeak("", 146, 32272))

	var b bytes.Buffer
	require.NoError(t, m.Write(&b))
	assert.Contains(t, b.String(), `"spearman_holdout":null`)
}

func TestSamplesFromTrace(t *testing.T) {
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	sessions := []trace.Session{
		{ID: "grows", TaskChars: 80, Calls: []trace.Call{
			{Start: start, Prompt: 1000, Output: 50},
			{Start: start, Prompt: 3000, Output: 900},
			{Start: start, Prompt: 3500, Output: 10},
		}},
		{ID: "no calls"},
		{ID: "single", Calls: []trace.Call{{Start: start, Prompt: 200, Output: 0}}},
	}
	assert.Equal(t, []predictor.Sample{
		{TaskChars: 80, FirstPrompt: 1000, Peak: 3900},
		{TaskChars: 0, FirstPrompt: 200, Peak: 200},
	}, predictor.SamplesFromTrace(sessions))
}

func TestTrainHoldoutSkipped(t *testing.T) {
	tests := []struct {
		name    string
		n       int
		o       predictor.TrainOptions
		skipped bool
	}{
		{name: "20 samples hold out about 4, under the default minimum of 10", n: 20, skipped: true},
		{name: "minimum lowered", n: 20, o: predictor.TrainOptions{MinHoldout: 2}, skipped: false},
		{name: "enough samples", n: 200, skipped: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			samples := synth(synthOptions{n: tt.n, seed: 5})
			tt.o.Created = fixedTime
			_, rep, err := predictor.Train(samples, tt.o)
			require.NoError(t, err)
			assert.Equal(t, tt.skipped, rep.HoldoutSkipped)
			if tt.skipped {
				assert.Equal(t, tt.n, rep.Train)
				assert.Zero(t, rep.Holdout)
				assert.True(t, math.IsNaN(rep.SpearmanHoldout))
			} else {
				assert.Equal(t, tt.n, rep.Train+rep.Holdout)
				assert.Positive(t, rep.Holdout)
				assert.False(t, math.IsNaN(rep.SpearmanHoldout))
			}
		})
	}
}

func TestTrainRejects(t *testing.T) {
	good := synth(synthOptions{n: 30, seed: 6})
	with := func(i int, edit func(*predictor.Sample)) []predictor.Sample {
		s := append([]predictor.Sample(nil), good...)
		edit(&s[i])
		return s
	}
	tests := []struct {
		name    string
		samples []predictor.Sample
		o       predictor.TrainOptions
		field   string
	}{
		{"no samples", nil, predictor.TrainOptions{}, "samples"},
		{"zero peak", with(3, func(s *predictor.Sample) { s.Peak = 0 }), predictor.TrainOptions{}, "samples[3].Peak"},
		{"negative task chars", with(4, func(s *predictor.Sample) { s.TaskChars = -1 }), predictor.TrainOptions{}, "samples[4].TaskChars"},
		{"negative first prompt", with(0, func(s *predictor.Sample) { s.FirstPrompt = -2 }), predictor.TrainOptions{}, "samples[0].FirstPrompt"},
		{"negative dim", good, predictor.TrainOptions{Dim: -1}, "TrainOptions.Dim"},
		{"dim too large", good, predictor.TrainOptions{Dim: predictor.MaxDim + 1}, "TrainOptions.Dim"},
		{"negative lambda", good, predictor.TrainOptions{Lambda: -1}, "TrainOptions.Lambda"},
		{"NaN lambda", good, predictor.TrainOptions{Lambda: math.NaN()}, "TrainOptions.Lambda"},
		{"infinite lambda", good, predictor.TrainOptions{Lambda: math.Inf(1)}, "TrainOptions.Lambda"},
		{"hold out everything", good, predictor.TrainOptions{HoldoutFraction: 1}, "TrainOptions.HoldoutFraction"},
		{"negative holdout", good, predictor.TrainOptions{HoldoutFraction: -0.1}, "TrainOptions.HoldoutFraction"},
		{"min holdout of one", good, predictor.TrainOptions{MinHoldout: 1}, "TrainOptions.MinHoldout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _, err := predictor.Train(tt.samples, tt.o)
			require.Error(t, err)
			assert.Nil(t, m)
			var fe *predictor.FieldError
			require.True(t, errors.As(err, &fe), "error %q is not a *FieldError", err)
			assert.Equal(t, tt.field, fe.Field)
			assert.Contains(t, err.Error(), tt.field)
		})
	}
}
