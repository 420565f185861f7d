package predictor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/atomicfile"
)

// Model file identity. Version 1 fixes the feature scheme described in the package comment
// (tokenisation, FNV-1a of words, signed hashing, 1+ln tf, smoothed IDF, the two
// log lengths); a change to any of these needs a new version, because old weights would silently
// mean something else.
const (
	ModelVersion = 1
	ModelKind    = "ridge-log-peak"
)

// Limits on model files, so that a corrupt or hostile file cannot make the gateway allocate
// without bound.
const (
	// MaxDim is the largest number of hash buckets a model may have.
	MaxDim = 1 << 18
	// maxModelBytes bounds a model file; a MaxDim model written by Write takes about 11 MB.
	maxModelBytes = 64 << 20
)

// numDense is the number of dense features: ln(1+task chars) and ln(1+first prompt).
const numDense = 2

// Model is a trained peak-context predictor (see the package comment for the features). Get one
// from Train, Read or Load; it is immutable and safe for concurrent use.
//
// Its JSON form, written by Write and read by Read, is one object:
//
//	{
//	  "version": 1,                  // ModelVersion; other versions are refused
//	  "kind": "ridge-log-peak",      // ModelKind
//	  "dim": 1024,                   // hash buckets D, 1..MaxDim
//	  "lambda": 1,                   // L2 penalty the weights were fit with (> 0; informational)
//	  "bias": 10.2,                  // intercept of ln(peak), not penalised
//	  "trained_on": 800,             // samples the weights were fit on (>= 1)
//	  "spearman_holdout": 0.71,      // rank correlation on held-out samples; null if not measured
//	  "created": "2026-07-01T12:00:00Z", // RFC 3339
//	  "mean": [m_chars, m_prompt],   // training mean of ln(1+task chars), ln(1+first prompt)
//	  "std": [s_chars, s_prompt],    // their standard deviations (> 0; 1 where constant)
//	  "idf": [...],                  // D values >= 0, IDF of each bucket
//	  "weights": [...]               // D+2 values: D bucket weights, then chars, then prompt
//	}
//
// Every field is required except spearman_holdout, which may be null; unknown fields are errors.
type Model struct {
	dim             int
	lambda          float64
	bias            float64
	trainedOn       int
	spearmanHoldout float64 // NaN when not measured
	created         time.Time
	mean, std       [numDense]float64
	idf             []float64 // dim
	weights         []float64 // dim + numDense
}

// Dim is the number of hash buckets of the text features.
func (m *Model) Dim() int { return m.dim }

// Lambda is the L2 penalty the model was fit with.
func (m *Model) Lambda() float64 { return m.lambda }

// TrainedOn is the number of samples the weights were fit on.
func (m *Model) TrainedOn() int { return m.trainedOn }

// SpearmanHoldout is the Spearman rank correlation between predicted and actual peaks on the
// held-out samples at training time, NaN when there were too few to measure it.
func (m *Model) SpearmanHoldout() float64 { return m.spearmanHoldout }

// Created is when the model was trained.
func (m *Model) Created() time.Time { return m.created }

// PredictPeak predicts the session's peak context in tokens; see Predictor and Extract.
func (m *Model) PredictPeak(taskText string, taskChars, firstPrompt int) int64 {
	return m.Predict(Extract(taskText, taskChars, firstPrompt))
}

// Predict predicts the peak context in tokens of a session with features f: exp of the
// regression, rounded, within [f.FirstPrompt, MaxPeak].
func (m *Model) Predict(f Features) int64 {
	// A 200-word task has about 400 terms; this keeps them off the heap.
	var buf [512]slot
	text, d := m.vectorize(buf[:0], f)
	return clampPeak(math.Exp(m.score(text, d)), f.FirstPrompt)
}

// vectorize turns features into the regression's inputs: the L2-normalised TF-IDF buckets
// (appended to dst) and the standardised lengths. Training and prediction share it, so that the
// model sees at prediction time exactly what it was fit on.
func (m *Model) vectorize(dst []slot, f Features) ([]slot, [numDense]float64) {
	return vectorize(dst, f, m.dim, m.idf, m.mean, m.std)
}

func vectorize(dst []slot, f Features, dim int, idf []float64, mean, std [numDense]float64) ([]slot, [numDense]float64) {
	start := len(dst)
	dst = buckets(dst, f.Terms, dim)
	s := dst[start:]
	var norm float64
	for i := range s {
		s[i].value *= idf[s[i].bucket]
		norm += s[i].value * s[i].value
	}
	if norm > 0 {
		inv := 1 / math.Sqrt(norm)
		for i := range s {
			s[i].value *= inv
		}
	}
	d := dense(f)
	for j := range d {
		d[j] = (d[j] - mean[j]) / std[j]
	}
	return s, d
}

// score is the regression: the predicted ln(peak).
func (m *Model) score(text []slot, d [numDense]float64) float64 {
	y := m.bias
	for _, s := range text {
		y += m.weights[s.bucket] * s.value
	}
	for j, v := range d {
		y += m.weights[m.dim+j] * v
	}
	return y
}

// modelJSON is the file form of a Model. Pointers tell a missing field from a zero one.
type modelJSON struct {
	Version         *int      `json:"version"`
	Kind            *string   `json:"kind"`
	Dim             *int      `json:"dim"`
	Lambda          *float64  `json:"lambda"`
	Bias            *float64  `json:"bias"`
	TrainedOn       *int      `json:"trained_on"`
	SpearmanHoldout *float64  `json:"spearman_holdout"`
	Created         *string   `json:"created"`
	Mean            []float64 `json:"mean"`
	Std             []float64 `json:"std"`
	IDF             []float64 `json:"idf"`
	Weights         []float64 `json:"weights"`
}

// MarshalJSON writes the model in the form Read accepts.
func (m *Model) MarshalJSON() ([]byte, error) {
	v, k := ModelVersion, ModelKind
	created := m.created.UTC().Format(time.RFC3339)
	j := modelJSON{
		Version:   &v,
		Kind:      &k,
		Dim:       &m.dim,
		Lambda:    &m.lambda,
		Bias:      &m.bias,
		TrainedOn: &m.trainedOn,
		Created:   &created,
		Mean:      m.mean[:],
		Std:       m.std[:],
		IDF:       m.idf,
		Weights:   m.weights,
	}
	if !math.IsNaN(m.spearmanHoldout) {
		j.SpearmanHoldout = &m.spearmanHoldout
	}
	return json.Marshal(j)
}

// Write writes the model as one line of JSON.
func (m *Model) Write(w io.Writer) error {
	b, err := m.MarshalJSON()
	if err != nil {
		return fmt.Errorf("write model: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write model: %w", err)
	}
	return nil
}

// Save writes the model to path atomically: to a temporary file in the same directory, then
// renamed over path, so that a gateway loading the model meanwhile sees the old file or the new
// one, never half of one.
func (m *Model) Save(path string) error {
	var buf bytes.Buffer
	if err := m.Write(&buf); err != nil {
		return fmt.Errorf("save model %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("save model %s: %w", path, err)
	}
	return nil
}

// Load reads and validates a model file; see Read.
func Load(path string) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load model: %w", err)
	}
	defer f.Close()
	m, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("load model %s: %w", path, err)
	}
	return m, nil
}

// UnmarshalJSON reads a model in the form MarshalJSON writes and validates it, with the errors
// described at Read.
func (m *Model) UnmarshalJSON(data []byte) error {
	// The version decides how to read the rest, so it is checked first and alone: a version 2 file
	// with new fields gets "unsupported version", not "unknown field".
	var head struct {
		Version json.RawMessage `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return jsonErr(err)
	}
	if len(head.Version) == 0 || string(head.Version) == "null" {
		return fieldErr("version", "missing")
	}
	if v := string(head.Version); v != strconv.Itoa(ModelVersion) {
		return fieldErr("version", "unsupported version %s, this build reads version %d", v, ModelVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j modelJSON
	if err := dec.Decode(&j); err != nil {
		return jsonErr(err)
	}
	nm, err := fromJSON(j)
	if err != nil {
		return err
	}
	*m = *nm
	return nil
}

// Read reads one model, as written by Write, from r and validates it. Every error names the field
// at fault with a *FieldError ("idf: want 1024 values (dim), got 3", "colour: unknown field",
// "version: unsupported version 2, this build reads version 1"), except for input that is not JSON
// at all. Anything after the model other than white space is an error.
func Read(r io.Reader) (*Model, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxModelBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read model: %w", err)
	}
	if len(data) > maxModelBytes {
		return nil, fmt.Errorf("read model: larger than %d bytes", maxModelBytes)
	}
	// One JSON value and nothing after it: a file with two models concatenated is corrupt.
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("read model: %w", jsonErr(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("read model: invalid JSON: data after the model object")
	}
	m := new(Model)
	if err := m.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("read model: %w", err)
	}
	return m, nil
}

// jsonErr names the field of an encoding/json error where encoding/json knows it.
func jsonErr(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return fmt.Errorf("model must be a JSON object, got %s", typeErr.Value)
		}
		return fieldErr(typeErr.Field, "want %s, got %s", typeErr.Type, typeErr.Value)
	}
	// DisallowUnknownFields reports `json: unknown field "name"` and has no error type of its own.
	if _, quoted, ok := strings.Cut(err.Error(), "unknown field "); ok {
		if name, uerr := strconv.Unquote(quoted); uerr == nil {
			return fieldErr(name, "unknown field")
		}
	}
	if errors.Is(err, io.EOF) {
		return errors.New("invalid JSON: empty input")
	}
	return fmt.Errorf("invalid JSON: %w", err)
}

// fromJSON checks a decoded model file and builds the Model.
func fromJSON(j modelJSON) (*Model, error) {
	switch {
	case j.Kind == nil:
		return nil, fieldErr("kind", "missing")
	case *j.Kind != ModelKind:
		return nil, fieldErr("kind", "want %q, got %q", ModelKind, *j.Kind)
	case j.Dim == nil:
		return nil, fieldErr("dim", "missing")
	case j.Lambda == nil:
		return nil, fieldErr("lambda", "missing")
	case j.Bias == nil:
		return nil, fieldErr("bias", "missing")
	case j.TrainedOn == nil:
		return nil, fieldErr("trained_on", "missing")
	case j.Created == nil:
		return nil, fieldErr("created", "missing")
	}
	created, err := time.Parse(time.RFC3339, *j.Created)
	if err != nil {
		return nil, fieldErr("created", "invalid RFC 3339 timestamp %q", *j.Created)
	}
	m := &Model{
		dim:             *j.Dim,
		lambda:          *j.Lambda,
		bias:            *j.Bias,
		trainedOn:       *j.TrainedOn,
		spearmanHoldout: math.NaN(),
		created:         created.UTC(),
		idf:             j.IDF,
		weights:         j.Weights,
	}
	if j.SpearmanHoldout != nil {
		m.spearmanHoldout = *j.SpearmanHoldout
	}
	if len(j.Mean) != numDense {
		return nil, fieldErr("mean", "want %d values, got %d", numDense, len(j.Mean))
	}
	if len(j.Std) != numDense {
		return nil, fieldErr("std", "want %d values, got %d", numDense, len(j.Std))
	}
	copy(m.mean[:], j.Mean)
	copy(m.std[:], j.Std)
	if err := m.validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// validate checks what Predict relies on. Train runs it too, as a guard against its own bugs.
func (m *Model) validate() error {
	if m.dim < 1 || m.dim > MaxDim {
		return fieldErr("dim", "must be in [1, %d], got %d", MaxDim, m.dim)
	}
	if !(m.lambda > 0) || math.IsInf(m.lambda, 0) {
		return fieldErr("lambda", "must be a finite number > 0, got %v", m.lambda)
	}
	if !finite(m.bias) {
		return fieldErr("bias", "must be finite, got %v", m.bias)
	}
	if m.trainedOn < 1 {
		return fieldErr("trained_on", "must be >= 1, got %d", m.trainedOn)
	}
	if s := m.spearmanHoldout; !math.IsNaN(s) && (s < -1 || s > 1) {
		return fieldErr("spearman_holdout", "must be in [-1, 1] or null, got %v", s)
	}
	for i, v := range m.mean {
		if !finite(v) {
			return fieldErr(fmt.Sprintf("mean[%d]", i), "must be finite, got %v", v)
		}
	}
	for i, v := range m.std {
		if !finite(v) || v <= 0 {
			return fieldErr(fmt.Sprintf("std[%d]", i), "must be finite and > 0, got %v", v)
		}
	}
	if len(m.idf) != m.dim {
		return fieldErr("idf", "want %d values (dim), got %d", m.dim, len(m.idf))
	}
	for i, v := range m.idf {
		if !finite(v) || v < 0 {
			return fieldErr(fmt.Sprintf("idf[%d]", i), "must be finite and >= 0, got %v", v)
		}
	}
	if len(m.weights) != m.dim+numDense {
		return fieldErr("weights", "want %d values (dim+%d), got %d", m.dim+numDense, numDense, len(m.weights))
	}
	for i, v := range m.weights {
		if !finite(v) {
			return fieldErr(fmt.Sprintf("weights[%d]", i), "must be finite, got %v", v)
		}
	}
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
