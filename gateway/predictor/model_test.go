package predictor_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/predictor"
)

// trained gives a model trained on the synthetic workload, and its JSON.
func trained(t testing.TB) (*predictor.Model, []byte) {
	t.Helper()
	m, _, err := predictor.Train(synth(synthOptions{n: 400, seed: 10}), predictor.TrainOptions{Created: fixedTime})
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, m.Write(&b))
	return m, b.Bytes()
}

func TestModelSaveLoadRoundTrip(t *testing.T) {
	m, written := trained(t)
	path := filepath.Join(t.TempDir(), "peak.json")
	require.NoError(t, m.Save(path))
	got, err := predictor.Load(path)
	require.NoError(t, err)

	for i, s := range synth(synthOptions{n: 200, seed: 11}) {
		assert.Equal(t, m.PredictPeak(s.TaskText, s.TaskChars, s.FirstPrompt),
			got.PredictPeak(s.TaskText, s.TaskChars, s.FirstPrompt), "sample %d", i)
	}
	assert.Equal(t, m.Dim(), got.Dim())
	assert.Equal(t, m.Lambda(), got.Lambda())
	assert.Equal(t, m.TrainedOn(), got.TrainedOn())
	assert.Equal(t, m.SpearmanHoldout(), got.SpearmanHoldout())
	assert.Equal(t, fixedTime, got.Created())

	var again bytes.Buffer
	require.NoError(t, got.Write(&again))
	assert.Equal(t, string(written), again.String(), "written again byte for byte")

	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "Save leaves no temporary file behind")
}

func TestModelSchema(t *testing.T) {
	_, written := trained(t)
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(written, &fields))
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	assert.ElementsMatch(t, []string{"version", "kind", "dim", "lambda", "bias", "trained_on",
		"spearman_holdout", "created", "mean", "std", "idf", "weights"}, keys)
	assert.JSONEq(t, `1`, string(fields["version"]))
	assert.JSONEq(t, `"ridge-log-peak"`, string(fields["kind"]))
	assert.JSONEq(t, `1024`, string(fields["dim"]))
	assert.JSONEq(t, `"2026-07-01T12:00:00Z"`, string(fields["created"]))
}

// TestPredictByHand checks the prediction arithmetic and the version 1 bucket and sign scheme
// against a model written by hand.
func TestPredictByHand(t *testing.T) {
	const dim = 4
	h := fnv.New64a()
	_, _ = h.Write([]byte("refactor"))
	hash := h.Sum64()
	bucket, sign := hash%dim, 1.0
	if hash>>63 == 1 {
		sign = -1
	}
	weights := make([]float64, dim+2)
	weights[bucket] = sign * math.Ln2 // "refactor" alone doubles the peak
	weights[dim+1] = 1                // peak = 1 + first prompt
	model := map[string]any{
		"version": 1, "kind": "ridge-log-peak", "dim": dim, "lambda": 1, "bias": 0,
		"trained_on": 1, "spearman_holdout": nil, "created": "2026-07-01T12:00:00Z",
		"mean": []float64{0, 0}, "std": []float64{1, 1}, "idf": []float64{1, 1, 1, 1},
		"weights": weights,
	}
	b, err := json.Marshal(model)
	require.NoError(t, err)
	m, err := predictor.Read(bytes.NewReader(b))
	require.NoError(t, err)

	tests := []struct {
		name        string
		text        string
		firstPrompt int
		want        int64
	}{
		{"lengths only", "", 999, 1000},
		{"the word doubles it", "Refactor", 999, 2000},
		{"normalised: repeating the word changes nothing", "refactor refactor refactor", 999, 2000},
		{"no lower than the first prompt", "", 0, 1},
		{"capped at MaxPeak", "refactor", 6_000_000, predictor.MaxPeak},
		{"a first prompt above the cap wins", "", 20_000_000, 20_000_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, m.PredictPeak(tt.text, 0, tt.firstPrompt))
		})
	}
}

func TestReadRejects(t *testing.T) {
	_, valid := trained(t)
	// edit changes one field of the valid model file.
	edit := func(f func(m map[string]any)) string {
		var m map[string]any
		require.NoError(t, json.Unmarshal(valid, &m))
		f(m)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name  string
		input string
		field string // "" for errors that cannot name one
		want  string // part of the message
	}{
		{"empty", "", "", "empty input"},
		{"not JSON", "peak model", "", "invalid JSON"},
		{"truncated", string(valid[:len(valid)/2]), "", "invalid JSON"},
		{"two models", string(valid) + string(valid), "", "data after the model"},
		{"an array", "[1, 2]", "", "must be a JSON object"},
		{"unknown field", edit(func(m map[string]any) { m["colour"] = "blue" }), "colour", "unknown field"},
		{"version 2", edit(func(m map[string]any) { m["version"] = 2 }), "version", "unsupported version 2"},
		{"version 2 with new fields", edit(func(m map[string]any) { m["version"] = 2; m["ngrams"] = 2 }), "version", "unsupported version 2"},
		{"version missing", edit(func(m map[string]any) { delete(m, "version") }), "version", "missing"},
		{"kind", edit(func(m map[string]any) { m["kind"] = "gbdt" }), "kind", `want "ridge-log-peak"`},
		{"dim zero", edit(func(m map[string]any) { m["dim"] = 0 }), "dim", "must be in [1,"},
		{"dim as string", edit(func(m map[string]any) { m["dim"] = "1024" }), "dim", "want int"},
		{"dim disagrees with idf", edit(func(m map[string]any) { m["dim"] = 512 }), "idf", "want 512 values (dim), got 1024"},
		{"idf short", edit(func(m map[string]any) { m["idf"] = []float64{1, 2, 3} }), "idf", "want 1024 values (dim), got 3"},
		{"idf negative", edit(func(m map[string]any) { m["idf"].([]any)[3] = -1.0 }), "idf[3]", "must be finite and >= 0"},
		{"weights short", edit(func(m map[string]any) { m["weights"] = m["idf"] }), "weights", "want 1026 values (dim+2), got 1024"},
		{"weights missing", edit(func(m map[string]any) { delete(m, "weights") }), "weights", "got 0"},
		{"weights of strings", edit(func(m map[string]any) { m["weights"] = []string{"x"} }), "weights", "want float64"},
		{"mean too long", edit(func(m map[string]any) { m["mean"] = []float64{1, 2, 3} }), "mean", "want 2 values, got 3"},
		{"std zero", edit(func(m map[string]any) { m["std"] = []float64{1, 0} }), "std[1]", "must be finite and > 0"},
		{"lambda negative", edit(func(m map[string]any) { m["lambda"] = -1 }), "lambda", "> 0"},
		{"bias missing", edit(func(m map[string]any) { delete(m, "bias") }), "bias", "missing"},
		{"trained_on zero", edit(func(m map[string]any) { m["trained_on"] = 0 }), "trained_on", ">= 1"},
		{"spearman out of range", edit(func(m map[string]any) { m["spearman_holdout"] = 1.5 }), "spearman_holdout", "[-1, 1]"},
		{"created not RFC 3339", edit(func(m map[string]any) { m["created"] = "yesterday" }), "created", "invalid RFC 3339"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := predictor.Read(strings.NewReader(tt.input))
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Contains(t, err.Error(), tt.want)
			var fe *predictor.FieldError
			if tt.field == "" {
				assert.False(t, errors.As(err, &fe), "no field to name, got %q", err)
				return
			}
			require.True(t, errors.As(err, &fe), "error %q is not a *FieldError", err)
			assert.Equal(t, tt.field, fe.Field)
			assert.True(t, strings.HasPrefix(err.Error(), "read model: "+tt.field+": "), "got %q", err)
		})
	}
}

func TestLoadNamesThePath(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"version":2}`), 0o644))
	_, err := predictor.Load(bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.json")
	assert.Contains(t, err.Error(), "version")

	_, err = predictor.Load(filepath.Join(dir, "missing.json"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// BenchmarkPredict measures a prediction as the gateway makes it on its admission path: a
// 200-word task text to features to peak.
func BenchmarkPredict(b *testing.B) {
	m, _ := trained(b)
	// 200 words, 160 of them distinct, as in a real task description (the filler vocabulary alone
	// would repeat its 47 words).
	words := strings.Fields(task(39, 12, "refactor"))
	for i := range 160 {
		words = append(words, fmt.Sprintf("ident%d", i))
	}
	text := strings.Join(words, " ")
	chars := len(text)
	b.ReportAllocs()
	require.Len(b, strings.Fields(text), 200)
	for b.Loop() {
		benchSink = m.PredictPeak(text, chars, 25600)
	}
}

var benchSink int64
