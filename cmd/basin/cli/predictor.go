package cli

import (
	"fmt"
	"math"
	"os"

	"github.com/basin-dev/basin/gateway/predictor"
	"github.com/basin-dev/basin/internal/trace"
)

// predictorTrain fits the gateway's peak-context predictor on recorded sessions and reports how
// well it ranks held-out sessions.
func predictorTrain(env Env, args []string) error {
	fs := newFlags(env)
	traces := fs.String("traces", "", "recorded sessions (basin trace JSONL, e.g. from the gateway's record.path)")
	format := fs.String("format", "basin", "trace format: basin or tracelab")
	out := fs.String("o", "", "write the model JSON here")
	lambda := fs.Float64("lambda", predictor.DefaultLambda, "ridge penalty")
	dim := fs.Int("dim", predictor.DefaultDim, "hash buckets for the task text")
	seed := fs.Uint64("seed", 1, "seed of the train/holdout split")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *traces == "" || *out == "" {
		return fmt.Errorf("%w: --traces and -o are required", errUsage)
	}
	f, err := os.Open(*traces)
	if err != nil {
		return fmt.Errorf("open traces: %w", err)
	}
	defer f.Close()
	var sessions []trace.Session
	switch *format {
	case "basin":
		sessions, err = trace.ReadBasin(f)
	case "tracelab":
		sessions, err = trace.ReadTraceLab(f)
	default:
		return fmt.Errorf("%w: --format: %q, want basin or tracelab", errUsage, *format)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", *traces, err)
	}
	m, rep, err := predictor.Train(predictor.SamplesFromTrace(sessions), predictor.TrainOptions{Lambda: *lambda, Dim: *dim, Seed: *seed})
	if err != nil {
		return err
	}
	if err := m.Save(*out); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "trained on %d sessions, held out %d\n", rep.Train, rep.Holdout)
	if rep.HoldoutSkipped || math.IsNaN(rep.SpearmanHoldout) {
		fmt.Fprintf(env.Stdout, "holdout: too few sessions to measure the model (Spearman undefined); it is fit on all of them, unvalidated\n")
	} else {
		fmt.Fprintf(env.Stdout, "Spearman rank correlation: holdout %.3f, train %.3f; median |log error| %.3f\n",
			rep.SpearmanHoldout, rep.SpearmanTrain, rep.MedianAbsLogErr)
	}
	fmt.Fprintf(env.Stdout, "model written to %s\n", *out)
	return nil
}
