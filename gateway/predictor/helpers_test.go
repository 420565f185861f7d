package predictor_test

import (
	"math"
	"math/rand/v2"
	"strings"

	"github.com/basin-dev/basin/gateway/predictor"
)

// filler are words that say nothing about a session's size.
var filler = strings.Fields(`the a of to in and fix add update test check file function module error
	build run config value make sure when with from for on is it that this should return handle
	case user data service request response log output input path name type list`)

// synthOptions shape a synthetic workload.
type synthOptions struct {
	n    int
	seed uint64
	// noise makes peaks independent of everything the predictor sees.
	noise bool
}

// synth makes samples whose peak grows with the first prompt and the task length and depends on
// two words: tasks mentioning "refactor" grow 3× more, tasks mentioning "typo" half as much, with
// lognormal noise (sigma 0.25) on top.
func synth(o synthOptions) []predictor.Sample {
	rng := rand.New(rand.NewPCG(o.seed, 42))
	out := make([]predictor.Sample, o.n)
	for i := range out {
		words := make([]string, 8+rng.IntN(40))
		for j := range words {
			words[j] = filler[rng.IntN(len(filler))]
		}
		factor := 1.0
		if rng.Float64() < 0.3 {
			words[rng.IntN(len(words))] = "refactor"
			factor *= 3
		}
		if rng.Float64() < 0.2 {
			words[rng.IntN(len(words))] = "typo"
			factor *= 0.5
		}
		text := strings.Join(words, " ")
		first := math.Exp(math.Log(20000) + 0.5*rng.NormFloat64())
		// Sessions grow about 4× from their first prompt, never shrink below it.
		peak := max(first, 4*first*math.Sqrt(float64(len(text))/100)*factor*math.Exp(0.25*rng.NormFloat64()))
		if o.noise {
			peak = math.Exp(math.Log(60000) + rng.NormFloat64())
		}
		out[i] = predictor.Sample{
			TaskText:    text,
			TaskChars:   len(text),
			FirstPrompt: int(first),
			Peak:        int64(peak),
		}
	}
	return out
}

// task makes a task text of n filler words, with extra appended.
func task(n int, seed uint64, extra ...string) string {
	rng := rand.New(rand.NewPCG(seed, 7))
	words := make([]string, n, n+len(extra))
	for i := range words {
		words[i] = filler[rng.IntN(len(filler))]
	}
	return strings.Join(append(words, extra...), " ")
}
