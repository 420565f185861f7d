package loadgen

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/serve"
	"github.com/basin-dev/basin/test/servetest"
)

// noLeaks fails the test if goroutines started after it was called are still running at the end
// (polling for a while: closed connections take a moment to wind down).
func noLeaks(t *testing.T) func() {
	t.Helper()
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
	}
}

const shortYAML = `name: loadgen-short
seed: 3
duration: 3m
deployment: {preset: paper-1p1d-h100}
workload: {kind: short}
arrivals: {rate_per_min: 2}
`

func TestAgainstSimServe(t *testing.T) {
	for _, tc := range []struct {
		api    string
		stream bool
	}{{"chat", true}, {"chat", false}, {"responses", true}, {"responses", false}, {"messages", true}, {"messages", false}} {
		stream := tc.stream
		name := tc.api + ", " + map[bool]string{true: "stream", false: "no stream"}[stream]
		t.Run(name, func(t *testing.T) {
			api, err := ParseAPI(tc.api)
			require.NoError(t, err)
			const speed = 1200
			// Sessions stay live through a stall of the busy test machine (10 virtual minutes
			// are half a second here): the test checks that each call finds the previous one's
			// prompt in the cache.
			ts := servetest.StartWith(t, speed, func(o *serve.Options) { o.IdleTimeout = 2 * time.Hour })
			client := ts.Client()
			check := noLeaks(t)
			sc := parseScenario(t, shortYAML)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			rep, err := Run(ctx, Options{Target: ts.URL + "/v1/", Scenario: sc, Speed: speed, NoStream: !stream, API: api,
				PerSession: true, HTTPClient: client, RunID: "t"})
			require.NoError(t, err)
			client.CloseIdleConnections()
			check()

			summary := *rep
			summary.PerSession = nil
			js, err := json.Marshal(summary)
			require.NoError(t, err)
			t.Logf("report: %s", js)
			require.GreaterOrEqual(t, rep.Sessions.Arrived, 3, "the scenario offers a few sessions")
			assert.False(t, rep.Interrupted)
			assert.Equal(t, rep.Sessions.Arrived, rep.Sessions.Completed, "an unloaded deployment completes every session")
			assert.Equal(t, 1.0, *rep.CompletionRate)
			assert.Nil(t, rep.GoodputPerHour, "no Unloaded: goodput unknown, not zero")
			require.NotNil(t, rep.FirstCallWaitP50)
			assert.Greater(t, *rep.FirstCallWaitP50, 0.0)
			if stream {
				require.NotNil(t, rep.TTFTP50)
				assert.Greater(t, *rep.TTFTP50, 0.0)
			} else {
				assert.Nil(t, rep.TTFTP50, "without a stream the first token is not seen")
			}

			w, err := sim.SyntheticWorkload("short")
			require.NoError(t, err)
			calls := 0
			var cached, prompted int
			for _, s := range rep.PerSession {
				for _, c := range s.calls {
					if s.Measured {
						cached, prompted = cached+min(c.cached, c.prompt), prompted+c.prompt
					}
				}
			}
			require.NotNil(t, rep.PrefixHitRate)
			assert.InDelta(t, float64(cached)/float64(prompted), *rep.PrefixHitRate, 1e-12)
			assert.Greater(t, *rep.PrefixHitRate, 0.5, "an unloaded deployment finds each conversation's earlier prompt")
			for _, s := range rep.PerSession {
				// The spec drawn with the simulator's seeding, independently of the run.
				spec := w.Session(sim.SessionRNG(sc.Seed, 0, s.Index))
				require.Equal(t, Completed, s.Outcome, s.Error)
				require.Len(t, s.calls, len(spec.Calls), "session %s", s.ID)
				assert.Equal(t, len(spec.Calls), s.CallsDone)
				for i, c := range s.calls {
					assert.Equal(t, spec.Calls[i].Prompt, c.specPrompt)
					assert.InEpsilon(t, spec.Calls[i].Prompt, c.prompt, 0.03, "session %s call %d: server counted %d, spec %d",
						s.ID, i, c.prompt, spec.Calls[i].Prompt)
					if i > 0 {
						// The conversation really extends: the server finds the previous prompt,
						// not just the shared system prompt, in its cache.
						assert.Greater(t, c.cached, spec.Shared, "session %s call %d", s.ID, i)
						assert.GreaterOrEqual(t, c.cached, s.calls[i-1].prompt*9/10, "session %s call %d", s.ID, i)
					}
				}
				require.NotNil(t, s.MaxPromptError)
				assert.Less(t, *s.MaxPromptError, 0.03)
				calls += len(spec.Calls)
			}

			// The server saw every call and no session is left open (each ended with its last call).
			resp, err := client.Get(ts.URL + "/admin/state")
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			var st struct {
				CallsCompleted   int `json:"calls_completed"`
				ExternalSessions int `json:"external_sessions"`
			}
			require.NoError(t, json.Unmarshal(b, &st), string(b))
			assert.Equal(t, calls, st.CallsCompleted)
			assert.Zero(t, st.ExternalSessions, "x-session-end closed every session")
			assert.Equal(t, http.StatusOK, resp.StatusCode)
		})
	}
}
