package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/basin-dev/basin/loadgen"
	"github.com/basin-dev/basin/sim"
)

// runLoadgen drives a scenario's agent sessions over the OpenAI chat, OpenAI Responses or
// Anthropic Messages API against any endpoint (the
// gateway, basin sim serve, a real engine) and prints the outcome as JSON; progress goes to
// stderr, and an interrupted run still prints its report, marked partial.
func runLoadgen(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	target := fs.String("target", "", "base URL of the OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080)")
	scName := fs.String("scenario", "", "scenario file or preset: its arrivals and workload are what is sent")
	speed := fs.Float64("speed", 60, "virtual seconds per wall second (arrivals and tool pauses are divided by it)")
	header := fs.String("session-header", "x-session-id", "header carrying the session id")
	keyEnv := fs.String("api-key-env", "", "environment variable holding the API key sent as a bearer token")
	noStream := fs.Bool("no-stream", false, "ask for whole responses instead of streams")
	stopAtEOS := fs.Bool("stop-at-eos", false, "leave out \"ignore_eos\": true (sent by default so that outputs have the scenario's lengths) for an endpoint that refuses unknown fields")
	apiName := fs.String("api", "chat", "the API the calls speak: chat (/v1/chat/completions), responses (/v1/responses) or messages (/v1/messages)")
	reject429 := fs.Bool("reject-429", false, "treat 429 as a final refusal instead of retrying after Retry-After")
	retries := fs.Int("retry-budget", 5, "retries per session after 503/429 (negative: none)")
	maxWait := fs.Duration("max-retry-wait", 2*time.Minute, "longest total Retry-After wait per session (wall time)")
	perSession := fs.Bool("per-session", false, "include every session's record")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *target == "" {
		return fmt.Errorf("%w: --target is required", errUsage)
	}
	api, err := loadgen.ParseAPI(*apiName)
	if err != nil {
		return fmt.Errorf("%w: --api: %v", errUsage, err)
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	key := ""
	if *keyEnv != "" {
		if key = strings.TrimSpace(env.Getenv(*keyEnv)); key == "" {
			return fmt.Errorf("%w: --api-key-env: %s is empty or unset", errUsage, *keyEnv)
		}
	}
	dep := sc.Deployment.Deployment
	b := bar(env, false, "load on "+*target)
	rep, err := loadgen.Run(ctx, loadgen.Options{
		Progress: func(p loadgen.Progress) {
			if p.Duration > 0 {
				b.SetNote(float64(p.Elapsed)/float64(p.Duration), loadgenNote(p))
			}
		},
		Target: *target, Scenario: sc, Speed: *speed, SessionHeader: *header, APIKey: key, NoStream: *noStream, StopAtEOS: *stopAtEOS, API: api,
		Reject429Terminal: *reject429, RetryBudget: *retries, MaxRetryWait: *maxWait, PerSession: *perSession,
		// The scenario's deployment is what goodput's slowdown is measured against; against a real
		// engine it is only as right as the scenario's description of that engine.
		Unloaded: func(s sim.SessionSpec) time.Duration { return dep.UnloadedTime(s) },
		Logger:   slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	b.Done()
	if err != nil {
		return err
	}
	if err := writeJSON(env.Stdout, rep); err != nil {
		return err
	}
	if rep.Interrupted {
		fmt.Fprintln(env.Stderr, "basin loadgen: interrupted; the report is partial")
	}
	return nil
}

// loadgenNote says where a load run is, in the scenario's minutes and its sessions so far.
func loadgenNote(p loadgen.Progress) string {
	s := fmt.Sprintf("minute %.1f of %g: %d of %d sessions arrived, %d live, %d completed, %d refused",
		p.Elapsed.Minutes(), p.Duration.Minutes(), p.Arrived, p.Offered, p.Live, p.Completed, p.Refused)
	if p.Failed > 0 {
		s += fmt.Sprintf(", %d failed", p.Failed)
	}
	if p.Unfinished > 0 {
		s += fmt.Sprintf(", %d unfinished", p.Unfinished)
	}
	return s
}
