package predictor

import (
	"fmt"
	"math"
)

// Predictor predicts a session's peak context in tokens from what is known at its first call: the
// task text (empty when unknown), the text's length in characters (0 when unknown) and the first
// prompt's length in tokens. Predictions are never below firstPrompt nor above MaxPeak (unless
// firstPrompt itself is larger), never fail and are safe to make from several goroutines, because
// they run on the gateway's admission path. *Model and *Fallback satisfy it; the gateway may as
// well declare the same method set itself.
type Predictor interface {
	PredictPeak(taskText string, taskChars, firstPrompt int) int64
}

// MaxPeak caps every prediction, in tokens. Ten million is far beyond any model's context window,
// so the cap only stops a runaway extrapolation (exp of a large score) from reserving the whole
// budget for one session.
const MaxPeak = 10_000_000

var (
	_ Predictor = (*Model)(nil)
	_ Predictor = (*Fallback)(nil)
)

// clampPeak rounds a predicted peak and holds it to [firstPrompt, MaxPeak]; when firstPrompt is
// above MaxPeak the first prompt wins, since a session's context is never smaller than its first
// prompt. A NaN prediction yields the lower bound.
func clampPeak(x float64, firstPrompt int) int64 {
	lo := int64(max(firstPrompt, 0))
	if math.IsNaN(x) {
		return lo
	}
	x = min(x, MaxPeak)
	return max(int64(math.Round(x)), lo)
}

// FieldError reports a bad value in a model file, in training samples or in options. It keeps the
// field apart from the reason so that a tool can point at it; errors.As finds it under any wrapping.
type FieldError struct {
	// Field names the value at fault: a JSON field of a model file ("weights", "idf[3]"), an option
	// ("TrainOptions.Lambda") or a sample field ("samples[7].Peak").
	Field string
	// Err is the reason.
	Err error
}

// Error gives "field: reason".
func (e *FieldError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }

// Unwrap gives the reason.
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}
