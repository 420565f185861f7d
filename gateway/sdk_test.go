package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// anthropicClientDir holds the Node script and its pinned @anthropic-ai/sdk dependency.
const anthropicClientDir = "testdata/anthropic-client"

// nodeScript is one of the SDK scripts: where it lives, its package, and the base URL it takes
// (the openai client wants /v1, Anthropic's the root).
type nodeScript struct {
	name, dir, pkg, file, suffix string
}

var (
	openAIResponses = nodeScript{name: "openai responses", dir: openAIClientDir, pkg: "openai", file: "responses.mjs", suffix: "/v1"}
	anthropicSDK    = nodeScript{name: "anthropic messages", dir: anthropicClientDir, pkg: "@anthropic-ai/sdk", file: "client.mjs"}
)

// run runs the script against the gateway and returns what it printed.
func (s nodeScript) run(t *testing.T, h *harness, args ...string) []byte {
	t.Helper()
	node := needNode(t, s.dir, s.pkg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{s.file, h.ts.URL + s.suffix}, args...)...)
	cmd.Dir = s.dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s: %s", s.name, stderr.String())
	return out
}

// sdkOutcome is what a script's "once" mode prints.
type sdkOutcome struct {
	OK          bool    `json:"ok"`
	Status      int     `json:"status"`
	Error       string  `json:"error"`
	Type        *string `json:"type"`
	RetryAfter  *string `json:"retry_after"`
	ShouldRetry *string `json:"should_retry"`
	ElapsedMS   int64   `json:"elapsed_ms"`
	Attempts    []struct {
		SentMS       int64 `json:"sent_ms"`
		AnsweredMS   int64 `json:"answered_ms"`
		Status       int   `json:"status"`
		RetryAfterMS int64 `json:"retry_after_ms"`
	} `json:"attempts"`
}

// retried checks that the SDK made want attempts, each retry sent no sooner than the previous
// answer's Retry-After (retry-after-ms), bounded by MaxRetryAfter; it returns the waits.
func (o sdkOutcome) retried(t *testing.T, want int) (waits []string) {
	t.Helper()
	require.Len(t, o.Attempts, want, "%+v", o)
	for i := 1; i < len(o.Attempts); i++ {
		prev, next := o.Attempts[i-1], o.Attempts[i]
		require.Positive(t, prev.RetryAfterMS)
		assert.LessOrEqual(t, prev.RetryAfterMS, MaxRetryAfter.Milliseconds(), "bounded where a retry helps")
		wait := next.SentMS - prev.AnsweredMS
		assert.GreaterOrEqual(t, wait, prev.RetryAfterMS-50, "retry %d waited Retry-After (timer slack 50 ms)", i)
		waits = append(waits, fmt.Sprintf("waited %d ms for retry-after-ms %d", wait, prev.RetryAfterMS))
	}
	return waits
}

func (s nodeScript) once(t *testing.T, h *harness, session string, maxRetries int, tenant string) sdkOutcome {
	t.Helper()
	out := s.run(t, h, "once", session, strconv.Itoa(maxRetries), tenant)
	var o sdkOutcome
	require.NoError(t, json.Unmarshal(out, &o), "%s", out)
	return o
}

func TestOpenAIResponsesChainThroughTheGateway(t *testing.T) {
	needNode(t, openAIResponses.dir, openAIResponses.pkg)
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	out := openAIResponses.run(t, h, "chain", "8")
	var got struct {
		Turns []struct {
			ID           string `json:"id"`
			Text         string `json:"text"`
			InputTokens  int64  `json:"input_tokens"`
			CachedTokens int64  `json:"cached_tokens"`
			OutputTokens int64  `json:"output_tokens"`
			Events       int    `json:"events"`
		} `json:"turns"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Len(t, got.Turns, 3)
	for i, turn := range got.Turns {
		assert.Len(t, strings.Fields(turn.Text), 8, "turn %d: %q", i, turn.Text)
		assert.Equal(t, int64(8), turn.OutputTokens)
		if i > 0 {
			assert.Greater(t, turn.InputTokens, got.Turns[i-1].InputTokens+got.Turns[i-1].OutputTokens,
				"turn %d's prompt is the whole chain", i)
			assert.Positive(t, turn.CachedTokens, "turn %d reads the chain from the cache", i)
		}
	}
	assert.Greater(t, got.Turns[1].Events, 4, "the second turn streamed")

	h.settle()
	s := h.state()
	assert.Equal(t, 1, s.Live, "the chain is one session")
	assert.Equal(t, uint64(1), s.Counters.AdmittedAtOnce)
	last := got.Turns[2]
	assert.Equal(t, last.InputTokens+last.OutputTokens, s.WorkingSet, "counted with the chain's context")
}

func TestAnthropicSDKThroughTheGateway(t *testing.T) {
	needNode(t, anthropicSDK.dir, anthropicSDK.pkg)
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	out := anthropicSDK.run(t, h, "session", "cc-session-1", "8")
	var got struct {
		Calls []struct {
			Text          string `json:"text"`
			Input         int64  `json:"input_tokens"`
			CacheRead     int64  `json:"cache_read_input_tokens"`
			CacheCreation int64  `json:"cache_creation_input_tokens"`
			Output        int64  `json:"output_tokens"`
			Events        int    `json:"events"`
		} `json:"calls"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Len(t, got.Calls, 2)
	for i, c := range got.Calls {
		assert.Len(t, strings.Fields(c.Text), 8, "call %d: %q", i, c.Text)
		assert.Equal(t, int64(8), c.Output)
	}
	assert.Greater(t, got.Calls[1].Events, 4, "the second call streamed")
	assert.Positive(t, got.Calls[1].CacheRead, "the session's second call reads its prefix from the cache")

	h.settle()
	s := h.state()
	assert.Equal(t, 1, s.Live)
	assert.True(t, h.g.core.Live("cc-session-1"), "the session is Claude Code's header")
	last := got.Calls[1]
	assert.Equal(t, last.Input+last.CacheRead+last.CacheCreation+last.Output, s.WorkingSet,
		"counted with the whole prompt, cached or not, and the output")
}

// TestSDKsAreQueuedAndRefusedAsTheyUnderstand drives the gateway's queue and its three refusals
// with each real SDK, its own retries on, and checks what the SDK does with them: it waits in the
// queue, retries a 503 and a 429 after the Retry-After (bounded), and gives up on a 529 at once,
// surfacing it as overload.
func TestSDKsAreQueuedAndRefusedAsTheyUnderstand(t *testing.T) {
	for _, sdk := range []nodeScript{openAIResponses, anthropicSDK} {
		t.Run(sdk.name, func(t *testing.T) {
			needNode(t, sdk.dir, sdk.pkg)
			refusals := func(h *harness, status, reason string) int {
				return int(testutil.ToFloat64(h.g.metrics.refusals.WithLabelValues(status, reason)))
			}
			t.Run("queued, then admitted", func(t *testing.T) {
				h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
				decodeCompletion(t, h.chat("live", 5, nil))
				done := make(chan sdkOutcome, 1)
				go func() { done <- sdk.once(t, h, "waiting", 0, "") }()
				h.waitQueued(1)
				decodeCompletion(t, h.chat("live", 5, map[string]string{"x-session-end": "true"}))
				o := <-done
				assert.True(t, o.OK, "%+v", o)
				assert.True(t, h.g.core.Live("waiting"))
			})
			t.Run("503: retried after Retry-After", func(t *testing.T) {
				h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) {
					c.Admission.BudgetTokens = 1
					c.MaxQueueWait = Duration(300 * time.Millisecond)
				}), nil)
				decodeCompletion(t, h.chat("live", 5, nil))
				o := sdk.once(t, h, "waiting", 1, "")
				require.False(t, o.OK, "%+v", o)
				assert.Equal(t, http.StatusServiceUnavailable, o.Status)
				require.NotNil(t, o.ShouldRetry)
				assert.Equal(t, "true", *o.ShouldRetry)
				waits := o.retried(t, 2)
				assert.Equal(t, 2, refusals(h, "503", reasonQueueTimeout), "one retry")
				t.Logf("%s, 503 queue_timeout, maxRetries 1: 2 attempts in %d ms (max_queue_wait 300 ms), %v",
					sdk.name, o.ElapsedMS, waits)
				if sdk.pkg == anthropicSDK.pkg {
					assert.Equal(t, "overloaded_error", deref(o.Type))
				}
			})
			t.Run("429: retried after Retry-After", func(t *testing.T) {
				h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) {
					c.TenantHeader = "x-tenant-id"
					c.Admission.TenantQuota = 1
				}), nil)
				decodeCompletion(t, h.chat("first", 5, map[string]string{"x-tenant-id": "acme"}))
				o := sdk.once(t, h, "second", 1, "acme")
				require.False(t, o.OK, "%+v", o)
				assert.Equal(t, http.StatusTooManyRequests, o.Status)
				waits := o.retried(t, 2)
				assert.Equal(t, 2, refusals(h, "429", reasonTenantQuota), "one retry")
				t.Logf("%s, 429 tenant_quota, maxRetries 1: 2 attempts in %d ms, %v", sdk.name, o.ElapsedMS, waits)
				if sdk.pkg == anthropicSDK.pkg {
					assert.Equal(t, "rate_limit_error", deref(o.Type))
				}
			})
			t.Run("529: not retried, surfaced as overload", func(t *testing.T) {
				h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
				decodeCompletion(t, h.chat("live", 5, nil))
				queued := h.chatAsync(context.Background(), "victim", 5, nil)
				h.waitQueued(1)
				a := h.adminDo(http.MethodPost, "/admin/shed", testToken, `{"session_ids":["victim"],"reason":"test"}`)
				require.Equal(t, http.StatusOK, a.status, "%s", a)
				require.Equal(t, 529, (<-queued).status)

				o := sdk.once(t, h, "victim", 2, "")
				require.False(t, o.OK, "%+v", o)
				assert.Equal(t, 529, o.Status)
				require.NotNil(t, o.ShouldRetry)
				assert.Equal(t, "false", *o.ShouldRetry)
				require.NotNil(t, o.RetryAfter)
				ra, err := strconv.Atoi(*o.RetryAfter)
				require.NoError(t, err)
				assert.Greater(t, ra, 25*60, "Retry-After says how long the shed lasts")
				o.retried(t, 1)
				assert.Equal(t, 2, refusals(h, "529", reasonShed), "the SDK did not retry (the first 529 was the queued call's)")
				assert.Less(t, o.ElapsedMS, int64(5000), "no sleep on a Retry-After of half an hour")
				t.Logf("%s, 529 shed, maxRetries 2: 1 attempt in %d ms (%s)", sdk.name, o.ElapsedMS, o.Error)
				if sdk.pkg == anthropicSDK.pkg {
					assert.Equal(t, "OverloadedError", o.Error)
					assert.Equal(t, "overloaded_error", deref(o.Type))
				}
			})
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
