package predictor

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/basin-dev/basin/internal/trace"
)

// Defaults of TrainOptions.
const (
	// DefaultDim is the default number of hash buckets: enough for the vocabulary of task
	// descriptions (a few thousand distinct words collide little in 1024 signed
	// buckets) while a model stays a few tens of kilobytes and training solves a 1026×1026 system.
	DefaultDim = 1024
	// DefaultLambda is the default L2 penalty, the usual starting point for features of unit
	// scale (standardised lengths, L2-normalised text).
	DefaultLambda = 1.0
	// DefaultHoldoutFraction is the share of samples held out to measure the model.
	DefaultHoldoutFraction = 0.2
	// DefaultMinHoldout is the fewest held-out samples worth a rank correlation; with fewer, one
	// swapped pair moves it by more than the differences it is meant to show.
	DefaultMinHoldout = 10
)

// Sample is one finished session to learn from.
type Sample struct {
	// TaskText is the task the session was started with; empty when unknown, as in traces.
	TaskText string
	// TaskChars is the length of the task text in characters (see Extract).
	TaskChars int
	// FirstPrompt is the first call's prompt in tokens.
	FirstPrompt int
	// Peak is the largest context the session reached, in tokens: over its calls, the most of
	// prompt plus output.
	Peak int64
}

// SamplesFromTrace turns recorded sessions into samples. A session's peak is the largest prompt
// plus output over its calls, its first prompt that of call 0 and its task length the trace's
// task_chars. Traces carry no text, so TaskText is empty. Sessions without calls are skipped.
func SamplesFromTrace(sessions []trace.Session) []Sample {
	out := make([]Sample, 0, len(sessions))
	for _, s := range sessions {
		if len(s.Calls) == 0 {
			continue
		}
		var peak int64
		for _, c := range s.Calls {
			peak = max(peak, int64(c.Prompt)+int64(c.Output))
		}
		out = append(out, Sample{TaskChars: s.TaskChars, FirstPrompt: s.Calls[0].Prompt, Peak: peak})
	}
	return out
}

// TrainOptions configure Train. A zero field takes its default.
type TrainOptions struct {
	// Dim is the number of hash buckets for the text, in [1, MaxDim]; DefaultDim if 0.
	Dim int
	// Lambda is the L2 penalty on the weights (the bias is not penalised), finite and > 0;
	// DefaultLambda if 0.
	Lambda float64
	// HoldoutFraction is the share of samples held out to measure the model, in (0, 1);
	// DefaultHoldoutFraction if 0.
	HoldoutFraction float64
	// MinHoldout is the fewest held-out samples for which Train measures the model, >= 2;
	// DefaultMinHoldout if 0. With fewer, Train fits on every sample and sets
	// Report.HoldoutSkipped.
	MinHoldout int
	// Seed picks the split: sample i is held out when a hash of (Seed, i) falls below
	// HoldoutFraction. The same samples and Seed give the same split, so a model can be rebuilt
	// exactly.
	Seed uint64
	// Created stamps the model (to the second); the current time if zero. Fix it to make Train
	// byte-for-byte reproducible.
	Created time.Time
}

// withDefaults fills zero fields.
func (o TrainOptions) withDefaults() TrainOptions {
	if o.Dim == 0 {
		o.Dim = DefaultDim
	}
	if o.Lambda == 0 {
		o.Lambda = DefaultLambda
	}
	if o.HoldoutFraction == 0 {
		o.HoldoutFraction = DefaultHoldoutFraction
	}
	if o.MinHoldout == 0 {
		o.MinHoldout = DefaultMinHoldout
	}
	return o
}

// Validate reports the first option Train refuses, naming it; zero fields stand for their
// defaults.
func (o TrainOptions) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Dim < 1 || o.Dim > MaxDim:
		return fieldErr("TrainOptions.Dim", "must be in [1, %d], got %d", MaxDim, o.Dim)
	case !(o.Lambda > 0) || math.IsInf(o.Lambda, 0):
		return fieldErr("TrainOptions.Lambda", "must be a finite number > 0, got %v", o.Lambda)
	case !(o.HoldoutFraction > 0 && o.HoldoutFraction < 1):
		return fieldErr("TrainOptions.HoldoutFraction", "must be in (0, 1), got %v", o.HoldoutFraction)
	case o.MinHoldout < 2:
		return fieldErr("TrainOptions.MinHoldout", "must be >= 2, got %d", o.MinHoldout)
	}
	return nil
}

// Report tells how well a trained model does.
type Report struct {
	// Train and Holdout count the samples fit and held out.
	Train, Holdout int
	// HoldoutSkipped is set when the split left fewer than MinHoldout samples to hold out (or none
	// to train on), as with a handful of sessions: the model is then fit on every sample and
	// SpearmanHoldout and MedianAbsLogErr are NaN. The model is usable but unmeasured; a caller
	// should say so rather than ship it as validated.
	HoldoutSkipped bool
	// SpearmanHoldout and SpearmanTrain are the rank correlations of predicted and actual peaks on
	// the held-out and the training samples (see Spearman, NaN where undefined). The gap between
	// them shows overfitting.
	SpearmanHoldout, SpearmanTrain float64
	// MedianAbsLogErr is the median of |ln(predicted/actual peak)| on the held-out samples: 0.1
	// means the typical prediction is off by about 10%.
	MedianAbsLogErr float64
}

// Train fits a Model to samples: ridge regression of ln(peak) on the features described in the
// package comment, on a deterministic split of the samples, measured on the rest. The same
// samples and options give a byte-identical model. Errors name the bad option or sample field.
func Train(samples []Sample, o TrainOptions) (*Model, Report, error) {
	if err := o.Validate(); err != nil {
		return nil, Report{}, fmt.Errorf("train: %w", err)
	}
	o = o.withDefaults()
	if len(samples) == 0 {
		return nil, Report{}, fmt.Errorf("train: %w", fieldErr("samples", "need at least one sample"))
	}
	for i, s := range samples {
		var err error
		switch {
		case s.Peak <= 0:
			err = fieldErr(fmt.Sprintf("samples[%d].Peak", i), "must be > 0, got %d", s.Peak)
		case s.TaskChars < 0:
			err = fieldErr(fmt.Sprintf("samples[%d].TaskChars", i), "must be >= 0, got %d", s.TaskChars)
		case s.FirstPrompt < 0:
			err = fieldErr(fmt.Sprintf("samples[%d].FirstPrompt", i), "must be >= 0, got %d", s.FirstPrompt)
		}
		if err != nil {
			return nil, Report{}, fmt.Errorf("train: %w", err)
		}
	}

	var fit, held []Sample
	for i, s := range samples {
		if unitHash(o.Seed, uint64(i)) < o.HoldoutFraction {
			held = append(held, s)
		} else {
			fit = append(fit, s)
		}
	}
	rep := Report{SpearmanHoldout: math.NaN(), MedianAbsLogErr: math.NaN()}
	if len(held) < o.MinHoldout || len(fit) == 0 {
		fit, held = samples, nil
		rep.HoldoutSkipped = true
	}
	rep.Train, rep.Holdout = len(fit), len(held)

	created := o.Created
	if created.IsZero() {
		created = time.Now()
	}
	m, err := fitRidge(fit, o.Dim, o.Lambda)
	if err != nil {
		return nil, Report{}, fmt.Errorf("train: %w", err)
	}
	m.created = created.UTC().Truncate(time.Second)

	rep.SpearmanTrain, _ = evaluate(m, fit)
	if len(held) > 0 {
		rep.SpearmanHoldout, rep.MedianAbsLogErr = evaluate(m, held)
	}
	m.spearmanHoldout = rep.SpearmanHoldout
	if err := m.validate(); err != nil {
		return nil, Report{}, fmt.Errorf("train: built an invalid model: %w", err)
	}
	return m, rep, nil
}

// unitHash maps (seed, i) to [0, 1) with splitmix64, whose output is uniform even for consecutive
// inputs.
func unitHash(seed, i uint64) float64 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// evaluate predicts every sample and gives the rank correlation with the actual peaks and the
// median absolute log error.
func evaluate(m *Model, samples []Sample) (rho, medianAbsLogErr float64) {
	pred := make([]float64, len(samples))
	actual := make([]float64, len(samples))
	errs := make([]float64, len(samples))
	for i, s := range samples {
		p := m.Predict(Extract(s.TaskText, s.TaskChars, s.FirstPrompt))
		pred[i], actual[i] = float64(p), float64(s.Peak)
		errs[i] = math.Abs(math.Log(float64(max(p, 1))) - math.Log(float64(s.Peak)))
	}
	slices.Sort(errs)
	n := len(errs)
	med := errs[n/2]
	if n%2 == 0 {
		med = (errs[n/2-1] + errs[n/2]) / 2
	}
	return Spearman(pred, actual), med
}

// fitRidge fits the weights, IDF and standardisation of a model on samples.
//
// The bias is left unpenalised by centring: with X the feature rows and x̄, ȳ the means, the
// weights solve (XcᵀXc + λI) w = Xcᵀyc for centred Xc, yc, and bias = ȳ − x̄·w. XcᵀXc is
// accumulated sparsely as XᵀX − n x̄x̄ᵀ, and only over buckets some sample uses: a bucket no sample
// touches has a zero column, so its weight is exactly 0 and it is left out of the solve.
func fitRidge(samples []Sample, dim int, lambda float64) (*Model, error) {
	n := len(samples)
	feats := make([]Features, n)
	raw := make([][]slot, n)
	df := make([]int, dim)
	for i, s := range samples {
		feats[i] = Extract(s.TaskText, s.TaskChars, s.FirstPrompt)
		raw[i] = buckets(nil, feats[i].Terms, dim)
		for _, x := range raw[i] {
			df[x.bucket]++
		}
	}
	m := &Model{
		dim:             dim,
		lambda:          lambda,
		trainedOn:       n,
		spearmanHoldout: math.NaN(),
		idf:             make([]float64, dim),
		weights:         make([]float64, dim+numDense),
	}
	for b := range m.idf {
		m.idf[b] = math.Log(float64(1+n)/float64(1+df[b])) + 1
	}
	for j := range numDense {
		var sum float64
		for _, f := range feats {
			sum += dense(f)[j]
		}
		mean := sum / float64(n)
		var ss float64
		for _, f := range feats {
			d := dense(f)[j] - mean
			ss += d * d
		}
		std := math.Sqrt(ss / float64(n))
		// A length that never varies carries no information; 1 keeps the feature at 0 rather
		// than dividing by (nearly) zero.
		if std < 1e-9 {
			std = 1
		}
		m.mean[j], m.std[j] = mean, std
	}

	// Columns: the buckets some sample uses, in bucket order, then the dense features.
	col := make([]int, dim)
	var active []int
	for b := range dim {
		col[b] = -1
		if df[b] > 0 {
			col[b] = len(active)
			active = append(active, b)
		}
	}
	p := len(active) + numDense
	gram := make([]float64, p*p)
	rhs := make([]float64, p)
	xbar := make([]float64, p)
	var ybar float64
	// One sample's row as (column, value) pairs.
	row := make([]slot, 0, 64)
	for i := range samples {
		text, d := m.vectorize(nil, feats[i])
		row = row[:0]
		for _, x := range text {
			row = append(row, slot{bucket: col[x.bucket], value: x.value})
		}
		for j, v := range d {
			row = append(row, slot{bucket: len(active) + j, value: v})
		}
		y := math.Log(float64(samples[i].Peak))
		ybar += y
		for _, a := range row {
			xbar[a.bucket] += a.value
			rhs[a.bucket] += a.value * y
			g := gram[a.bucket*p : (a.bucket+1)*p]
			for _, b := range row {
				g[b.bucket] += a.value * b.value
			}
		}
	}
	fn := float64(n)
	ybar /= fn
	for j := range xbar {
		xbar[j] /= fn
	}
	for a := range p {
		rhs[a] -= fn * xbar[a] * ybar
		g := gram[a*p : (a+1)*p]
		for b := range p {
			g[b] -= fn * xbar[a] * xbar[b]
		}
		g[a] += lambda
	}
	w, err := solveSPD(gram, rhs, p)
	if err != nil {
		return nil, err
	}
	m.bias = ybar
	for k, v := range w {
		m.bias -= xbar[k] * v
		if k < len(active) {
			m.weights[active[k]] = v
		} else {
			m.weights[dim+k-len(active)] = v
		}
	}
	return m, nil
}

// solveSPD solves a·x = b for a symmetric positive definite p×p matrix a (row-major; overwritten
// by its Cholesky factor) by Cholesky decomposition.
//
// Hand-written rather than taken from gonum: the system is small (at most Dim+2 unknowns, solved
// once, offline), positive definite by construction (λ > 0 is added to a Gram matrix), and
// twenty lines here spare every binary that embeds the gateway a large dependency.
func solveSPD(a, b []float64, p int) ([]float64, error) {
	// a = L·Lᵀ, L stored in the lower triangle; each entry is a dot product of two rows of L,
	// which keeps the inner loop on contiguous memory.
	for j := range p {
		rj := a[j*p : j*p+j+1]
		d := rj[j]
		for _, v := range rj[:j] {
			d -= v * v
		}
		if !(d > 0) {
			return nil, errors.New("ridge system is not positive definite (non-finite features?)")
		}
		d = math.Sqrt(d)
		rj[j] = d
		for i := j + 1; i < p; i++ {
			ri := a[i*p : i*p+j+1]
			s := ri[j]
			for k, v := range rj[:j] {
				s -= ri[k] * v
			}
			ri[j] = s / d
		}
	}
	// L·z = b, then Lᵀ·x = z.
	x := slices.Clone(b)
	for i := range p {
		ri := a[i*p : i*p+i]
		s := x[i]
		for k, v := range ri {
			s -= v * x[k]
		}
		x[i] = s / a[i*p+i]
	}
	for i := p - 1; i >= 0; i-- {
		s := x[i]
		for k := i + 1; k < p; k++ {
			s -= a[k*p+i] * x[k]
		}
		x[i] = s / a[i*p+i]
	}
	return x, nil
}
