package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/testclock"
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
	openAIHeld      = nodeScript{name: "openai chat", dir: openAIClientDir, pkg: "openai", file: "held.mjs", suffix: "/v1"}
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
				h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) {
					c.Admission.BudgetTokens = 1
					c.IdleTimeout = simIdleTimeout
				}), nil)
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
					c.IdleTimeout = simIdleTimeout
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
					c.IdleTimeout = simIdleTimeout
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
				h := start(t, baseConfig(t, []string{startSim(t)}, func(c *Config) {
					c.Admission.BudgetTokens = 1
					c.IdleTimeout = simIdleTimeout
				}), nil)
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
				assert.Nil(t, o.RetryAfter, "no Retry-After a client could sleep through; the message says how long the shed lasts")
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

// process is a client (a node script, curl) running against the gateway in the background:
// the lines it writes on one stream arrive on lines as it writes them; the other stream's
// output and its exit on done.
type process struct {
	lines <-chan string
	done  <-chan processResult
}

type processResult struct {
	out, lines string // the other stream's output; every line sent on lines
	err        error
}

// startProcess runs cmd with the stream it is watched on (stderr for the node scripts, which
// print their JSON on stdout; stdout for curl).
func startProcess(t *testing.T, cmd *exec.Cmd, watchStderr bool) *process {
	t.Helper()
	var other bytes.Buffer
	var pipe io.ReadCloser
	var err error
	if watchStderr {
		cmd.Stdout = &other
		pipe, err = cmd.StderrPipe()
	} else {
		cmd.Stderr = &other
		pipe, err = cmd.StdoutPipe()
	}
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string, 256)
	done := make(chan processResult, 1)
	go func() {
		var all strings.Builder
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			l := strings.TrimSuffix(sc.Text(), "\r")
			all.WriteString(l + "\n")
			lines <- l
		}
		close(lines)
		err := cmd.Wait()
		done <- processResult{out: other.String(), lines: all.String(), err: err}
	}()
	return &process{lines: lines, done: done}
}

// expect reads lines until one is want; it fails if the process ends or goes quiet first.
func (p *process) expect(t *testing.T, want string) {
	t.Helper()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("the client ended before %q", want)
			}
			if l == want {
				return
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the client did not see %q", want)
		}
	}
}

// quiet fails if the process writes a line within a moment.
func (p *process) quiet(t *testing.T, what string) {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if ok {
			t.Fatalf("%s: the client saw %q", what, l)
		}
		t.Fatalf("%s: the client ended", what)
	case <-time.After(200 * time.Millisecond):
	}
}

// wait waits for the process to end and returns what it wrote.
func (p *process) wait(t *testing.T) processResult {
	t.Helper()
	for {
		select {
		case _, ok := <-p.lines:
			if ok {
				continue // drained: the result holds every line
			}
			select {
			case r := <-p.done:
				return r
			case <-time.After(30 * time.Second):
				t.Fatal("the client did not exit")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the client did not finish")
		}
	}
}

// heldSession starts a gateway on a settable clock in front of the simulator, admits session id
// with one call and holds it, so that its next call waits.
func heldSession(t *testing.T, id string) (*harness, *testclock.Clock) {
	t.Helper()
	clock := testclock.New(time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC))
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), clock.Now)
	decodeCompletion(t, h.chat(id, 5, nil))
	r := h.adminDo(http.MethodPost, "/admin/holds", testToken, fmt.Sprintf(`{"hold":[%q],"reason":"test"}`, id))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	return h, clock
}

// waitHeldCall waits until the gateway holds one call, as GET /admin/state says, failing early
// if the client ends meanwhile.
func waitHeldCall(t *testing.T, h *harness, p *process) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // node takes a moment to load an SDK
	for h.state().HeldCalls != 1 {
		select {
		case r := <-p.done:
			t.Fatalf("the client ended before its call was held: %v\n%s%s", r.err, r.lines, r.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the call was not held")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// keepAliveOrSilence advances the clock over two keep-alive intervals, the sweep running after
// each: a streamed call's client sees the status and two keep-alives (seen are the lines that
// say so), one that does not stream sees nothing.
func keepAliveOrSilence(t *testing.T, h *harness, clock *testclock.Clock, p *process, stream bool, seen [][]string) {
	t.Helper()
	for i := range 2 {
		clock.Advance(heldKeepAliveEvery)
		h.g.expire()
		if !stream {
			continue
		}
		for _, l := range seen[i] {
			p.expect(t, l)
		}
	}
	if !stream {
		p.quiet(t, "a held call that does not stream, two keep-alive intervals on")
	}
}

// resume takes session id off the hold list, releasing its call.
func resume(t *testing.T, h *harness, id string) {
	t.Helper()
	r := h.adminDo(http.MethodPost, "/admin/holds", testToken, fmt.Sprintf(`{"resume":[%q],"reason":"test"}`, id))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var res struct {
		Released []string `json:"released"`
	}
	require.NoError(t, json.Unmarshal(r.body, &res))
	require.Equal(t, []string{id}, res.Released, "the waiting call released")
}

// TestSDKsHeldCallsAreKeptAliveAndResumed holds a call of each real SDK, streamed and not, and
// resumes it: a streamed call's client gets its status and keep-alives while it waits (the
// OpenAI SDK skips the SSE comments, Anthropic's its ping events) and then the whole answer; a
// call that does not stream gets nothing until the resume, then its answer.
func TestSDKsHeldCallsAreKeptAliveAndResumed(t *testing.T) {
	for _, sdk := range []struct {
		script nodeScript
		args   []string // before the session
	}{
		{openAIHeld, nil},
		{anthropicSDK, []string{"held"}},
	} {
		for _, tc := range []struct {
			name   string
			stream bool
			// stop: the gateway stops instead of resuming, and the streamed call, its status
			// sent, must end in an error the SDK raises, not in an empty answer.
			stop bool
		}{
			{"not streamed", false, false},
			{"streamed", true, false},
			{"streamed, the gateway stops", true, true},
		} {
			stream := tc.stream
			t.Run(sdk.script.name+", "+tc.name, func(t *testing.T) {
				node := needNode(t, sdk.script.dir, sdk.script.pkg)
				const id = "sdk-held"
				h, clock := heldSession(t, id)
				flag := "0"
				if stream {
					flag = "1"
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				args := append([]string{sdk.script.file, h.ts.URL + sdk.script.suffix}, sdk.args...)
				cmd := exec.CommandContext(ctx, node, append(args, id, flag, "8")...)
				cmd.Dir = sdk.script.dir
				p := startProcess(t, cmd, true)
				waitHeldCall(t, h, p)
				keepAliveOrSilence(t, h, clock, p, stream, [][]string{{"headers 200", "keepalive"}, {"keepalive"}})

				if tc.stop {
					require.NoError(t, h.stop())
				} else {
					resume(t, h, id)
				}
				res := p.wait(t)
				require.NoError(t, res.err, "%s%s", res.lines, res.out)
				var got struct {
					OK         bool   `json:"ok"`
					Text       string `json:"text"`
					Error      string `json:"error"`
					Chunks     int    `json:"chunks"`
					Events     int    `json:"events"`
					Keepalives int    `json:"keepalives"`
				}
				require.NoError(t, json.Unmarshal([]byte(res.out), &got), "%s", res.out)
				if tc.stop {
					assert.False(t, got.OK, "%+v", got)
					assert.Contains(t, got.Error, "APIError", "raised as the API's error")
					assert.Contains(t, got.Error, "shutting down")
					assert.Equal(t, 2, got.Keepalives)
					assert.Empty(t, got.Text)
					t.Logf("%s raised: %s", sdk.script.name, got.Error)
					return
				}
				require.True(t, got.OK, "%+v\n%s", got, res.lines)
				assert.Len(t, strings.Fields(got.Text), 8, "the whole answer: %q", got.Text)
				if stream {
					assert.Equal(t, 2, got.Keepalives, "the client saw both keep-alives")
					assert.Greater(t, got.Chunks+got.Events, 2, "then the answer's stream")
				} else {
					assert.Zero(t, got.Keepalives)
				}
				h.settle()
				st := h.state()
				assert.Zero(t, st.HeldCalls)
				assert.Zero(t, st.InCall)
				assert.Equal(t, uint64(1), st.Counters.CallsHeld)
				assert.True(t, h.g.core.Live(id))
			})
		}
	}
}

// TestCurlHeldCallsAreKeptAliveAndResumed is TestSDKsHeldCallsAreKeptAliveAndResumed with curl,
// which shows the bytes as they come: `curl -N` for a streamed call, plain curl for one that
// does not stream.
func TestCurlHeldCallsAreKeptAliveAndResumed(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not on PATH")
	}
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			const id = "curl-held"
			h, clock := heldSession(t, id)
			body := fmt.Sprintf(`{"model":"basin-sim","stream":%v,"messages":[{"role":"user","content":"Fix the test."}],"max_tokens":8}`, stream)
			args := []string{"-sS", "-i", "--max-time", "60", "-H", "Content-Type: application/json", "-H", "x-session-id: " + id,
				"-d", body, h.ts.URL + "/v1/chat/completions"}
			if stream {
				args = append([]string{"-N"}, args...)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p := startProcess(t, exec.CommandContext(ctx, curl, args...), false)
			waitHeldCall(t, h, p)
			keepAliveOrSilence(t, h, clock, p, stream, [][]string{
				{"HTTP/1.1 200 OK", "Content-Type: text/event-stream", "", ": keep-alive"}, {": keep-alive"}})

			resume(t, h, id)
			res := p.wait(t)
			require.NoError(t, res.err, "%s%s", res.lines, res.out)
			head, payload, ok := strings.Cut(res.lines, "\n\n")
			require.True(t, ok, "%s", res.lines)
			require.True(t, strings.HasPrefix(head, "HTTP/1.1 200 OK\n"), "%s", head)
			if !stream {
				assert.Contains(t, head, "Content-Type: application/json")
				c := decodeCompletion(t, response{status: http.StatusOK, body: []byte(payload)})
				assert.Len(t, strings.Fields(c.Choices[0].Message.Content), 8, "%s", payload)
			} else {
				assert.Equal(t, 2, strings.Count(payload, ": keep-alive\n"), "%s", payload)
				var text strings.Builder
				for _, l := range strings.Split(payload, "\n") {
					data, ok := strings.CutPrefix(l, "data: ")
					if !ok || data == "[DONE]" {
						continue
					}
					var chunk struct {
						Choices []struct {
							Delta struct {
								Content string `json:"content"`
							} `json:"delta"`
						} `json:"choices"`
					}
					require.NoError(t, json.Unmarshal([]byte(data), &chunk), "%q", l)
					for _, c := range chunk.Choices {
						text.WriteString(c.Delta.Content)
					}
				}
				assert.Len(t, strings.Fields(text.String()), 8, "%q", text.String())
				assert.True(t, strings.HasSuffix(payload, "data: [DONE]\n\n"), "%s", payload)
			}
			h.settle()
			assert.Zero(t, h.state().InCall)
		})
	}
}
