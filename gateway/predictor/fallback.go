package predictor

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

// Defaults of FallbackOptions.
const (
	// DefaultWindow is how many recent peaks Fallback keeps: enough for a stable 0.9 quantile
	// (about a hundred sessions above it), recent enough to follow a change of workload within
	// hours at a few sessions a minute.
	DefaultWindow = 1000
	// DefaultQuantile is the quantile of recent peaks Fallback predicts. High, because
	// underpredicting lets the working set outgrow the cache, the failure admission exists to
	// prevent, while overpredicting only makes a session wait.
	DefaultQuantile = 0.9
	// DefaultMultiplier is how many times its first prompt Fallback expects a session to grow
	// before it has seen any peak. Agent sessions re-send a growing conversation and end several
	// times larger than they start: in the Basin paper's numbers (unverified), Terminal-Bench's
	// median prompt is 25.6K tokens while SWE-bench Pro's median peak is 107K, about 4×.
	DefaultMultiplier = 4.0
	// DefaultMinObserved is how many peaks Fallback needs before a quantile of them may call a
	// session smaller than Multiplier × its first prompt. The first sessions to end are the
	// short ones (a fresh gateway sees survivors' peaks last), so a handful of peaks calls every
	// later session small while the sessions that arrived first keep their know-nothing
	// predictions: measured through a gateway, the two earliest sessions were refused at
	// max_queue_wait in every run while 34 later ones, most with larger first calls, went first.
	// Twenty peaks put the 0.9 quantile at the second largest.
	DefaultMinObserved = 20
	// maxWindow bounds FallbackOptions.Window: Observe moves up to Window values.
	maxWindow = 1 << 20
)

// FallbackOptions configure a Fallback. A zero field takes its default.
type FallbackOptions struct {
	// Window is how many of the most recent peaks to keep, in [1, 1048576]; DefaultWindow if 0.
	Window int
	// Quantile of the kept peaks to predict, in (0, 1]; DefaultQuantile if 0. 1 predicts the
	// largest.
	Quantile float64
	// Multiplier of the first prompt to predict before any peak is observed, finite and >= 1;
	// DefaultMultiplier if 0.
	Multiplier float64
	// MinObserved is how many peaks the window must hold before a prediction may fall below
	// Multiplier × the first prompt, in [1, Window]; DefaultMinObserved (capped at Window) if 0.
	MinObserved int
}

// withDefaults fills zero fields.
func (o FallbackOptions) withDefaults() FallbackOptions {
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.Quantile == 0 {
		o.Quantile = DefaultQuantile
	}
	if o.Multiplier == 0 {
		o.Multiplier = DefaultMultiplier
	}
	if o.MinObserved == 0 {
		o.MinObserved = min(DefaultMinObserved, o.Window)
	}
	return o
}

// Validate reports the first option NewFallback refuses, naming it; zero fields stand for their
// defaults.
func (o FallbackOptions) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Window < 1 || o.Window > maxWindow:
		return fieldErr("FallbackOptions.Window", "must be in [1, %d], got %d", maxWindow, o.Window)
	case !(o.Quantile > 0 && o.Quantile <= 1):
		return fieldErr("FallbackOptions.Quantile", "must be in (0, 1], got %v", o.Quantile)
	case !(o.Multiplier >= 1) || math.IsInf(o.Multiplier, 0):
		return fieldErr("FallbackOptions.Multiplier", "must be a finite number >= 1, got %v", o.Multiplier)
	case o.MinObserved < 1 || o.MinObserved > o.Window:
		return fieldErr("FallbackOptions.MinObserved", "must be in [1, Window = %d], got %d", o.Window, o.MinObserved)
	}
	return nil
}

// Fallback predicts peaks when no model is loaded, from the peaks of recent sessions: the
// Quantile of the last Window observed peaks, never below the session's first prompt; before any
// peak is observed, Multiplier times the first prompt, and until MinObserved are, never below it. It ignores the task text. The zero value
// uses the defaults; a Fallback is safe for concurrent use.
type Fallback struct {
	opts FallbackOptions // zero in a zero Fallback; see options
	mu   struct {
		sync.Mutex
		ring   []int64 // the last Window peaks in arrival order, a ring once full
		next   int     // where the next peak goes once ring is full
		sorted []int64 // the same peaks, ascending
	}
}

// NewFallback returns a Fallback with the given options, or an error naming a bad one.
func NewFallback(o FallbackOptions) (*Fallback, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("fallback predictor: %w", err)
	}
	return &Fallback{opts: o.withDefaults()}, nil
}

// options gives the options, the defaults for a zero Fallback (which cannot be invalid).
func (f *Fallback) options() FallbackOptions {
	if f.opts.Window == 0 {
		return FallbackOptions{}.withDefaults()
	}
	return f.opts
}

// Observe records the peak context of a finished session. Non-positive peaks are ignored: no
// session that ran has one.
func (f *Fallback) Observe(peak int64) {
	if peak <= 0 {
		return
	}
	window := f.options().Window
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.mu.ring) < window {
		f.mu.ring = append(f.mu.ring, peak)
	} else {
		old := f.mu.ring[f.mu.next]
		f.mu.ring[f.mu.next] = peak
		f.mu.next = (f.mu.next + 1) % window
		i, _ := slices.BinarySearch(f.mu.sorted, old)
		f.mu.sorted = slices.Delete(f.mu.sorted, i, i+1)
	}
	// Kept sorted on the way in, so that a prediction on the admission path is a lookup.
	i, _ := slices.BinarySearch(f.mu.sorted, peak)
	f.mu.sorted = slices.Insert(f.mu.sorted, i, peak)
}

// Observed is how many peaks the window holds.
func (f *Fallback) Observed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mu.sorted)
}

// PredictPeak predicts the peak context in tokens: the Quantile of recent peaks by nearest rank
// (the ⌈q·n⌉-th smallest, always a peak that was observed), or Multiplier × firstPrompt before any
// observation, and the larger of the two until MinObserved peaks are kept; always within
// [firstPrompt, MaxPeak].
func (f *Fallback) PredictPeak(taskText string, taskChars, firstPrompt int) int64 {
	o := f.options()
	q, n := f.quantile(o.Quantile)
	guess := o.Multiplier * float64(max(firstPrompt, 0))
	if n == 0 {
		return clampPeak(guess, firstPrompt)
	}
	if n < o.MinObserved {
		return clampPeak(max(float64(q), guess), firstPrompt)
	}
	return clampPeak(float64(q), firstPrompt)
}

// quantile is the q quantile of the kept peaks and how many there are (0: none, no quantile).
func (f *Fallback) quantile(q float64) (int64, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.mu.sorted)
	if n == 0 {
		return 0, 0
	}
	// The tolerance keeps float error from pushing an exact rank one up (0.7×10 is 7.000000000000001).
	k := int(math.Ceil(q*float64(n)-1e-9)) - 1
	return f.mu.sorted[max(0, min(k, n-1))], n
}
