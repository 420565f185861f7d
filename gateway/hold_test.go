package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
)

// holdHarness is a gateway alone in front of an upstream that counts the model calls it is
// sent, with session "s" live and idle.
type holdHarness struct {
	*harness
	sent *atomic.Int64
}

// startHold starts a holdHarness in the testing/synctest bubble it is called in: the hold bound
// and the keep-alive interval are kept by the gateway's Run loop on the bubble's fake clock, which
// advance moves.
func startHold(t *testing.T, tweak func(*Config)) *holdHarness {
	t.Helper()
	return startHoldOn(t, tweak, nil)
}

// startHoldOn is startHold with the streamed calls answered by streamed (nil: as the others,
// with okJSON).
func startHoldOn(t *testing.T, tweak func(*Config), streamed http.HandlerFunc) *holdHarness {
	t.Helper()
	n := newMemNet()
	handler, sent := holdUpstream(t, streamed)
	up := newMemUpstream(t, n, handler)
	return holdS(t, startInBubble(t, n, baseConfig(t, []string{up.URL}, tweak)), sent)
}

// startHoldLoopback is startHold outside a bubble, on loopback servers and the wall clock, for
// the tests that keep no time and run subtests on one gateway (a bubble's test runs none).
func startHoldLoopback(t *testing.T) *holdHarness {
	t.Helper()
	handler, sent := holdUpstream(t, nil)
	up := newFakeUpstream(t, handler)
	return holdS(t, start(t, baseConfig(t, []string{up.URL}, nil), nil), sent)
}

// holdUpstream is the upstream of a holdHarness and its count of model calls.
func holdUpstream(t *testing.T, streamed http.HandlerFunc) (http.HandlerFunc, *atomic.Int64) {
	sent := &atomic.Int64{}
	ok := okJSON(100, 10)
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !strings.Contains(r.URL.Path, "/sessions/") { // a session's end is not a model call
			sent.Add(1)
		}
		if streamed != nil && bytes.Contains(body, []byte(`"stream":true`)) {
			streamed(w, r)
			return
		}
		ok(w, r)
	}, sent
}

// holdS makes session s live on h with one call.
func holdS(t *testing.T, h *harness, sent *atomic.Int64) *holdHarness {
	t.Helper()
	require.Equal(t, http.StatusOK, h.chat("s", 5, nil).status)
	h.settle()
	require.Equal(t, int64(1), sent.Load())
	return &holdHarness{harness: h, sent: sent}
}

// holds posts a change of the hold list and decodes the answer.
func (h *holdHarness) holds(body string) adminapi.HoldResult {
	h.t.Helper()
	r := h.adminDo(http.MethodPost, "/admin/holds", testToken, body)
	require.Equal(h.t, http.StatusOK, r.status, "%s", r)
	var res adminapi.HoldResult
	require.NoError(h.t, json.Unmarshal(r.body, &res))
	return res
}

// heldCall sends a call of session s, which must be held, and waits until the gateway holds it.
func (h *holdHarness) heldCall(ctx context.Context) <-chan response {
	h.t.Helper()
	ch := h.chatAsync(ctx, "s", 5, nil)
	h.await("the call held", func() bool { return h.state().HeldCalls == 1 })
	return ch
}

// notAnswered fails if the call is answered within a moment of wall time: for the replicated
// tests, on loopback; in a bubble, pendingNow says it exactly.
func notAnswered(t *testing.T, ch <-chan response, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: the held call was answered: %s", what, r)
	case <-time.After(100 * time.Millisecond):
	}
}

// answered waits for a call's answer (on loopback; in a bubble, answeredNow).
func answered(t *testing.T, ch <-chan response) response {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("the held call was not answered")
		return response{}
	}
}

func TestHeldCallWaitsUntilResumed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHold(t, nil)
		res := h.holds(`{"hold":["s","unknown"],"reason":"test"}`)
		assert.Equal(t, adminapi.HoldResult{Added: 1, Released: []string{}, HeldSessions: 1, HeldTokens: 110}, res,
			"s held (its context from the first call's usage); the unknown id skipped")
		ch := h.heldCall(context.Background())
		advance(30 * time.Second)
		pendingNow(t, ch, "30 s on, before the resume")
		assert.Equal(t, int64(1), h.sent.Load(), "the held call did not reach the upstream")
		st := h.state()
		assert.Equal(t, 1, st.InCall, "a held call counts in flight")
		require.Len(t, st.Sessions, 1)
		assert.True(t, st.Sessions[0].Held)

		res = h.holds(`{"resume":["s"],"reason":"test"}`)
		assert.Equal(t, adminapi.HoldResult{Resumed: 1, Released: []string{"s"}}, res)
		r := answeredNow(t, ch)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		decodeCompletion(t, r)
		h.settle()
		assert.Equal(t, int64(2), h.sent.Load(), "proxied once released")
		st = h.state()
		assert.Zero(t, st.InCall, "counted once: begun by the hold, finished by the proxy")
		assert.Zero(t, st.Held)
		assert.Equal(t, uint64(1), st.Counters.CallsHeld)
		assert.Equal(t, uint64(1), st.Counters.Resumed)
		assert.True(t, h.g.core.Live("s"))

		_, hist := gather(t, h.harness)
		assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="resumed"}`])
	})
}

// TestHeldCallIsReleasedAtTheHoldBound: the Run loop releases a held call at the hold bound, not
// a second before or after, and the session, whose call waited past the idle timeout, is not idle.
func TestHeldCallIsReleasedAtTheHoldBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHold(t, func(c *Config) { c.IdleTimeout = Duration(time.Minute) })
		h.holds(`{"hold":["s"],"reason":"test"}`)
		// Held on an odd second of the Run loop's: its sweep comes every second, not every other.
		advance(time.Second)
		ch := h.heldCall(context.Background())

		advance(admission.DefaultHoldBound - time.Second)
		pendingNow(t, ch, "a second before the bound")
		assert.True(t, h.g.core.Live("s"), "a session whose call waits is not idle, past the idle timeout")

		advance(time.Second)
		r := answeredNow(t, ch)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		h.settle()
		assert.Equal(t, int64(2), h.sent.Load())
		st := h.state()
		assert.Equal(t, 1, st.Held, "the session stays held")
		assert.Zero(t, st.HeldCalls)
		assert.Equal(t, uint64(1), st.Counters.HoldBoundReleases)
		_, hist := gather(t, h.harness)
		assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="hold_bound"}`])

		// Still held: its next call waits again.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch = h.heldCall(ctx)
		advance(admission.DefaultHoldBound - time.Second)
		pendingNow(t, ch, "the next call, a second before its own bound")
		cancel()
		<-ch
	})
}

func TestCancelledHeldCallLeavesNothingInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHold(t, func(c *Config) { c.IdleTimeout = Duration(time.Minute) })
		h.holds(`{"hold":["s"],"reason":"test"}`)
		ctx, cancel := context.WithCancel(context.Background())
		ch := h.heldCall(ctx)
		require.Equal(t, 1, h.state().InCall)

		cancel()
		r := answeredNow(t, ch)
		assert.Equal(t, -1, r.status, "the client gave up: %s", r)
		h.settle()
		assert.Zero(t, h.state().InCall, "the held call finished")
		assert.Equal(t, int64(1), h.sent.Load(), "a call given up while held never reaches the upstream")
		_, hist := gather(t, h.harness)
		assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="client_gone"}`])

		// Nothing in flight: the session idles out as any idle one does, on the Run loop's sweep.
		advance(time.Minute - time.Second)
		assert.True(t, h.g.core.Live("s"), "idle for 59 s < 1 min")
		advance(2 * time.Second)
		assert.False(t, h.g.core.Live("s"), "idle for 61 s > 1 min")
	})
}

func TestARetryOfAnAbandonedHeldCallIsHeldAfresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHold(t, nil)
		h.holds(`{"hold":["s"],"reason":"test"}`)
		ctx, cancel := context.WithCancel(context.Background())
		ch := h.heldCall(ctx)
		cancel()
		assert.Equal(t, -1, answeredNow(t, ch).status)
		h.await("the held call finished", func() bool { return h.state().InCall == 0 })

		// The client retries a minute later: the retry waits, as the call it repeats did.
		advance(time.Minute)
		retry := h.chatAsync(context.Background(), "s", 5, nil)
		h.await("the retry begun", func() bool { return h.state().InCall == 1 })
		pendingNow(t, retry, "the retry of a held call")
		assert.Equal(t, int64(1), h.sent.Load())

		assert.Equal(t, 1, h.state().HeldCalls, "the given-up call no longer counts; the retry does")

		// Released at its own bound: each request waits at most one bound.
		advance(admission.DefaultHoldBound - time.Second)
		pendingNow(t, retry, "the retry before its own bound")
		advance(time.Second)
		r := answeredNow(t, retry)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		h.settle()
		assert.Equal(t, int64(2), h.sent.Load())
		st := h.state()
		assert.Zero(t, st.InCall)
		assert.Zero(t, st.HeldCalls)
		assert.Equal(t, 1, st.Held, "still held")
	})
}

func TestHeldCallOfASessionEndedWhileItWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHold(t, nil)
		h.holds(`{"hold":["s"],"reason":"test"}`)
		ch := h.heldCall(context.Background())
		r, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/s/end", nil, "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, r.status, "%s", r)

		// The call is no longer a live session's: it is admitted as a new session's first call.
		r = answeredNow(t, ch)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		h.settle()
		assert.Equal(t, int64(2), h.sent.Load())
		st := h.state()
		assert.Zero(t, st.Held, "the new session is not held")
		assert.Zero(t, st.InCall)
		assert.Equal(t, uint64(2), st.Counters.Arrivals, "the call arrived again")
	})
}

func TestHeldCallAtShutdownIs503(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHold(t, nil)
		h.holds(`{"hold":["s"],"reason":"test"}`)
		ch := h.heldCall(context.Background())
		require.NoError(t, h.stop())
		r := answeredNow(t, ch)
		checkRefusal(t, r, http.StatusServiceUnavailable, reasonShuttingDown)
		assert.Equal(t, int64(1), h.sent.Load())
		assert.Zero(t, h.g.core.Snapshot(h.g.now(), false).InCall, "the held call was finished in the core")
	})
}

func TestAdminHoldsRejectsBadBodiesNamingTheField(t *testing.T) {
	h := startHoldLoopback(t)
	for _, tc := range []struct{ name, body, param string }{
		{"neither list", `{"reason":"r"}`, "hold"},
		{"empty lists", `{"hold":[],"resume":[],"reason":"r"}`, "hold"},
		{"empty hold id", `{"hold":["s",""],"reason":"r"}`, "hold[1]"},
		{"blank resume id", `{"resume":[" "],"reason":"r"}`, "resume[0]"},
		{"held and resumed", `{"hold":["s"],"resume":["s"],"reason":"r"}`, "resume[0]"},
		{"no reason", `{"hold":["s"]}`, "reason"},
		{"blank reason", `{"hold":["s"],"reason":"  "}`, "reason"},
		{"unknown field", `{"hold":["s"],"reason":"r","session_ids":["s"]}`, "session_ids"},
		{"hold not a list", `{"hold":"s","reason":"r"}`, "hold"},
		{"not JSON", `hold=s`, ""},
		{"two objects", `{"hold":["s"],"reason":"r"}{}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.adminDo(http.MethodPost, "/admin/holds", testToken, tc.body)
			require.Equal(t, http.StatusBadRequest, r.status, "%s", r)
			e := errorOf(t, r)
			if tc.param != "" {
				require.NotNil(t, e.Param, "%s", r)
				assert.Equal(t, tc.param, *e.Param)
				assert.Contains(t, e.Message, tc.param)
			}
		})
	}
	t.Run("no token", func(t *testing.T) {
		r := h.adminDo(http.MethodPost, "/admin/holds", "", `{"hold":["s"],"reason":"r"}`)
		assert.Equal(t, http.StatusUnauthorized, r.status, "%s", r)
	})
	t.Run("stale daemon term", func(t *testing.T) {
		req := func(term string) response {
			r, err := http.NewRequest(http.MethodPost, h.admin.URL+"/admin/holds", strings.NewReader(`{"hold":["s"],"reason":"r"}`))
			require.NoError(t, err)
			r.Header.Set("Authorization", "Bearer "+testToken)
			r.Header.Set(DaemonTermHeader, term)
			resp, err := h.admin.Client().Do(r)
			require.NoError(t, err)
			resp.Body.Close()
			return response{status: resp.StatusCode, header: resp.Header}
		}
		claim, err := http.NewRequest(http.MethodPut, h.admin.URL+"/admin/daemon-term", nil)
		require.NoError(t, err)
		claim.Header.Set("Authorization", "Bearer "+testToken)
		claim.Header.Set(DaemonTermHeader, "5")
		resp, err := h.admin.Client().Do(claim)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, http.StatusConflict, req("4").status, "a deposed daemon's hold is refused")
	})
	st := h.state()
	assert.Zero(t, st.Held, "nothing was held")
	assert.Zero(t, st.Counters.Held)
}

func TestStateListsSessionsWithTheQueueTailWhenAsked(t *testing.T) {
	h := startHoldLoopback(t)
	h.holds(`{"hold":["s"],"reason":"test"}`)
	for _, tc := range []struct {
		query string
		want  []string // live session ids listed; nil: not listed
	}{
		{"", []string{"s"}},
		{"?queue_tail=2", nil},
		{"?queue_tail=2&sessions=true", []string{"s"}},
		{"?sessions=false", nil},
	} {
		t.Run(tc.query, func(t *testing.T) {
			r := h.adminDo(http.MethodGet, "/admin/state"+tc.query, testToken, "")
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			var v adminapi.StateView
			require.NoError(t, json.Unmarshal(r.body, &v))
			assert.Equal(t, 1, v.Held)
			if tc.want == nil {
				assert.Nil(t, v.Sessions)
				return
			}
			var ids []string
			for _, s := range v.Sessions {
				ids = append(ids, s.ID)
				assert.True(t, s.Held, "listed as held")
			}
			assert.Equal(t, tc.want, ids)
		})
	}
	r := h.adminDo(http.MethodGet, "/admin/state?queue_tail=2&sessions=maybe", testToken, "")
	assert.Equal(t, http.StatusBadRequest, r.status)
	assert.Contains(t, string(r.body), `"param":"sessions"`)
}

// The upstream's event streams of the three APIs a held streamed call is tested on, each with a
// usage of 120 prompt and 15 output tokens.
var upstreamStreams = map[string]string{
	"/v1/chat/completions": `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"held "}}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"and streamed"},"finish_reason":"stop"}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":15,"total_tokens":135}}

data: [DONE]

`,
	"/v1/responses": `event: response.created
data: {"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress"}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","delta":"held and streamed"}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed","usage":{"input_tokens":120,"output_tokens":15}}}

`,
	"/v1/messages": `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":120,"output_tokens":1}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"held and streamed"}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

`,
}

// streamOK answers a streamed call with its API's upstreamStreams entry.
func streamOK(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, upstreamStreams[r.URL.Path])
}

// heldStreamCase is a streamed call of session s, and the keep-alive its API gets while held.
type heldStreamCase struct {
	name, path, body string
	keepAlive        []string // its lines, the blank one that ends it included
}

var (
	chatStreamed = heldStreamCase{"chat completions", "/v1/chat/completions",
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"go on"}]}`, []string{": keep-alive", ""}}
	responsesStreamed = heldStreamCase{"responses", "/v1/responses",
		`{"model":"m","stream":true,"input":"go on"}`, []string{": keep-alive", ""}}
	messagesStreamed = heldStreamCase{"anthropic messages", "/v1/messages",
		`{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"go on"}]}`,
		[]string{"event: ping", `data: {"type": "ping"}`, ""}}
)

// liveCall is a call whose answer the test reads as it arrives: its status and headers once
// they are sent, then its body line by line. It is read in a testing/synctest bubble: what has
// arrived is what is there once every goroutine of the bubble is blocked.
type liveCall struct {
	t      *testing.T
	header chan *http.Response
	lines  chan string // closed at the end of the body (or when the call failed)
	err    chan error
}

// open sends a streamed call of session s in the background.
func (h *holdHarness) open(ctx context.Context, tc heldStreamCase) *liveCall {
	lc := &liveCall{t: h.t.(*testing.T), header: make(chan *http.Response, 1), lines: make(chan string, 64),
		err: make(chan error, 1)}
	go func() {
		defer close(lc.lines)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url+tc.path, strings.NewReader(tc.body))
		if err != nil {
			lc.err <- err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", "s")
		resp, err := h.client.Do(req)
		if err != nil {
			lc.err <- err
			return
		}
		defer resp.Body.Close()
		lc.header <- resp
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lc.lines <- sc.Text()
		}
		lc.err <- sc.Err()
	}()
	return lc
}

// headers is the call's status and headers, which must have arrived.
func (lc *liveCall) headers() *http.Response {
	lc.t.Helper()
	synctest.Wait()
	select {
	case r := <-lc.header:
		return r
	case err := <-lc.err:
		lc.t.Fatalf("the call failed before its headers: %v", err)
	default:
		lc.t.Fatal("no headers")
	}
	return nil
}

// noHeaders fails if the call's headers have arrived.
func (lc *liveCall) noHeaders(what string) {
	lc.t.Helper()
	synctest.Wait()
	select {
	case r := <-lc.header:
		lc.t.Fatalf("%s: headers sent (%d %v)", what, r.StatusCode, r.Header)
	default:
	}
}

// next reads n lines of the body, which must have arrived.
func (lc *liveCall) next(n int) []string {
	lc.t.Helper()
	var got []string
	for range n {
		synctest.Wait()
		select {
		case l, ok := <-lc.lines:
			if !ok {
				lc.t.Fatalf("the body ended after %q", got)
			}
			got = append(got, l)
		default:
			lc.t.Fatalf("no line after %q", got)
		}
	}
	return got
}

// quiet fails if a line of the body has arrived.
func (lc *liveCall) quiet(what string) {
	lc.t.Helper()
	synctest.Wait()
	select {
	case l, ok := <-lc.lines:
		lc.t.Fatalf("%s: got %q (open %v)", what, l, ok)
	default:
	}
}

// rest reads the body to its end, which must have arrived.
func (lc *liveCall) rest() string {
	lc.t.Helper()
	var b strings.Builder
	for {
		synctest.Wait()
		select {
		case l, ok := <-lc.lines:
			if !ok {
				return b.String()
			}
			b.WriteString(l + "\n")
		default:
			lc.t.Fatalf("the body did not end: %q", b.String())
		}
	}
}

// beginKeepAlives holds a streamed call of s until the gateway has begun its stream: no headers
// a second before the first keep-alive is due, then status 200, the stream's headers and one
// keep-alive, sent by the Run loop's sweep.
func (h *holdHarness) beginKeepAlives(ctx context.Context, tc heldStreamCase) *liveCall {
	h.t.Helper()
	t := h.t.(*testing.T)
	h.holds(`{"hold":["s"],"reason":"test"}`)
	lc := h.open(ctx, tc)
	h.await("the call held", func() bool { return h.state().HeldCalls == 1 })
	advance(heldKeepAliveEvery - time.Second)
	lc.noHeaders("a second before the first keep-alive")

	advance(time.Second)
	resp := lc.headers()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	assert.Empty(t, resp.Header.Get("Content-Length"))
	assert.Equal(t, tc.keepAlive, lc.next(len(tc.keepAlive)), "the first keep-alive")
	return lc
}

func TestHeldStreamedCallIsKeptAliveThenStreamed(t *testing.T) {
	for _, tc := range []heldStreamCase{chatStreamed, responsesStreamed, messagesStreamed} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startHoldOn(t, nil, streamOK)
				lc := h.beginKeepAlives(context.Background(), tc)

				advance(heldKeepAliveEvery / 2)
				lc.quiet("half an interval on")
				advance(heldKeepAliveEvery / 2)
				assert.Equal(t, tc.keepAlive, lc.next(len(tc.keepAlive)), "the second keep-alive")
				for i := range 6 { // a minute: one keep-alive every interval
					advance(heldKeepAliveEvery - time.Second)
					lc.quiet(fmt.Sprintf("a second before keep-alive %d", i+3))
					advance(time.Second)
					assert.Equal(t, tc.keepAlive, lc.next(len(tc.keepAlive)), "keep-alive %d", i+3)
				}
				// Sweeps a minute late (a clock that jumped: a suspended host) send one keep-alive,
				// not the six they missed.
				late := time.Now().Add(time.Minute)
				h.g.expireHolds(late)
				assert.Equal(t, tc.keepAlive, lc.next(len(tc.keepAlive)), "the late sweep's keep-alive")
				h.g.expireHolds(late)
				lc.quiet("one keep-alive, not a burst")
				assert.Equal(t, int64(1), h.sent.Load(), "held: not sent upstream")
				assert.Equal(t, 1, h.state().HeldCalls)

				h.holds(`{"resume":["s"],"reason":"test"}`)
				assert.Equal(t, upstreamStreams[tc.path], lc.rest(), "then the upstream's stream, byte for byte")
				h.settle()
				assert.Equal(t, int64(2), h.sent.Load())
				st := h.state()
				assert.Zero(t, st.InCall)
				assert.Zero(t, st.HeldCalls)
				assert.Equal(t, int64(135), st.WorkingSet, "booked with the usage read off the stream")
				_, hist := gather(t, h.harness)
				assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="resumed"}`])
			})
		})
	}
}

// TestHeldStreamIsReleasedAsItWouldBeWithoutKeepAlives: a stream begun with keep-alives goes on
// with the upstream's stream however the hold ends — at the hold bound (the keep-alives do not
// move it), or because its session ended, when the call is admitted again as a new session's
// first call.
func TestHeldStreamIsReleasedAsItWouldBeWithoutKeepAlives(t *testing.T) {
	// The keep-alives after beginKeepAlives's first and before the bound: one every interval
	// from the second to the last before the bound, where the release comes instead.
	const beforeTheBound = int((admission.DefaultHoldBound - 2*heldKeepAliveEvery) / heldKeepAliveEvery)
	for _, tc := range []struct {
		name    string
		release func(h *holdHarness)
		reason  string
		// keepAlives is how many more keep-alives come before the upstream's stream.
		keepAlives int
	}{
		{"at the hold bound", func(h *holdHarness) {
			advance(admission.DefaultHoldBound - heldKeepAliveEvery - time.Second)
			assert.Zero(h.t, h.state().Counters.HoldBoundReleases, "a second before the bound")
			advance(time.Second)
		}, "hold_bound", beforeTheBound},
		{"its session ended", func(h *holdHarness) {
			r, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/s/end", nil, "")
			require.NoError(h.t, err)
			require.Equal(h.t, http.StatusOK, r.status, "%s", r)
		}, admission.ResumeReasonEnded, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startHoldOn(t, nil, streamOK)
				lc := h.beginKeepAlives(context.Background(), chatStreamed)
				tc.release(h)
				assert.Equal(t, strings.Repeat(string(sseKeepAlive), tc.keepAlives)+upstreamStreams[chatStreamed.path], lc.rest())
				h.settle()
				assert.Zero(t, h.state().InCall)
				_, hist := gather(t, h.harness)
				assert.Equal(t, uint64(1), hist[fmt.Sprintf(`basin_gateway_held_call_wait_seconds{reason=%q}`, tc.reason)])
			})
		})
	}
}

func TestHeldCallThatDoesNotStreamWaitsSilently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHoldOn(t, nil, streamOK)
		h.holds(`{"hold":["s"],"reason":"test"}`)
		ch := h.heldCall(context.Background())
		advance(3 * heldKeepAliveEvery)
		pendingNow(t, ch, "three keep-alive intervals on")

		h.holds(`{"resume":["s"],"reason":"test"}`)
		r := answeredNow(t, ch)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		assert.Equal(t, "application/json", r.header.Get("Content-Type"), "the upstream's own headers")
		c := decodeCompletion(t, r)
		assert.Equal(t, "ok", c.Choices[0].Message.Content, "the whole answer")
		h.settle()
		assert.Zero(t, h.state().InCall)
	})
}

// streamEvent is the one event of an in-stream error: its name ("" for the OpenAI APIs) and
// its data.
func streamEvent(t *testing.T, body string) (name string, data map[string]any) {
	t.Helper()
	ev, rest, _ := strings.Cut(body, "\n\n")
	assert.Empty(t, rest, "nothing after the error event")
	for _, l := range strings.Split(ev, "\n") {
		switch {
		case strings.HasPrefix(l, "event: "):
			name = strings.TrimPrefix(l, "event: ")
		case strings.HasPrefix(l, "data: "):
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &data), "%q", l)
		default:
			t.Fatalf("unexpected line %q in %q", l, body)
		}
	}
	return name, data
}

// TestHeldStreamGetsTheUpstreamsErrorInStream: once a held call's stream has begun, an upstream
// that fails cannot send its status any more; the client gets one error event in its API's
// shape, which the SDKs raise, rather than an empty stream that looks complete.
func TestHeldStreamGetsTheUpstreamsErrorInStream(t *testing.T) {
	jsonAnswer := func(status int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}
	}
	for _, tc := range []struct {
		name     string
		call     heldStreamCase
		upstream http.HandlerFunc
		event    string
		want     map[string]any // the error object, message aside
		message  []string       // what the message says
		// working is the working set after: the session's context as the upstream left it.
		working int64
	}{
		{"openai 500", chatStreamed,
			jsonAnswer(500, `{"error":{"message":"engine crashed","type":"server_error","code":"engine_dead"}}`),
			"", map[string]any{"type": "server_error", "code": "engine_dead", "param": nil},
			[]string{"the upstream answered 500", "engine crashed"}, 110},
		{"openai 400 with a top-level message", responsesStreamed,
			jsonAnswer(400, `{"object":"error","message":"prompt too long","type":"BadRequestError","code":400}`),
			"", map[string]any{"type": "BadRequestError", "code": reasonUpstreamError, "param": nil},
			[]string{"the upstream answered 400", "prompt too long"}, 110},
		{"openai upstream gone", chatStreamed, func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}, "", map[string]any{"type": "server_error", "code": reasonUpstreamError, "param": nil},
			[]string{"could not reach the upstream"}, 110},
		{"openai answered without a stream", chatStreamed, okJSON(120, 15),
			"", map[string]any{"type": "server_error", "code": reasonUpstreamError, "param": nil},
			// The upstream answered: the session's context grew by its answer, which the client
			// did not get, and resends.
			[]string{"200", `"application/json"`, "not an event stream"}, 135},
		{"anthropic 529", messagesStreamed,
			jsonAnswer(529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`),
			"error", map[string]any{"type": "overloaded_error"},
			[]string{"the upstream answered 529", "Overloaded"}, 110},
		{"anthropic 500 as plain text", messagesStreamed, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "upstream connect error", http.StatusInternalServerError)
		}, "error", map[string]any{"type": "api_error"},
			[]string{"the upstream answered 500", "upstream connect error"}, 110},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startHoldOn(t, nil, tc.upstream)
				lc := h.beginKeepAlives(context.Background(), tc.call)
				h.holds(`{"resume":["s"],"reason":"test"}`)
				body := lc.rest()
				name, data := streamEvent(t, body)
				assert.Equal(t, tc.event, name)
				var e map[string]any
				if tc.event == "error" {
					assert.Equal(t, "error", data["type"], "%s", body)
				}
				e, _ = data["error"].(map[string]any)
				require.NotNil(t, e, "%s", body)
				msg, _ := e["message"].(string)
				for _, m := range tc.message {
					assert.Contains(t, msg, m)
				}
				delete(e, "message")
				assert.Equal(t, tc.want, e)
				h.settle()
				st := h.state()
				assert.Zero(t, st.InCall, "the failed call is finished")
				assert.Equal(t, int64(2), h.sent.Load())
				assert.Equal(t, tc.working, st.WorkingSet, "booked by what the upstream answered")
			})
		})
	}
}

func TestHeldStreamAtShutdownGetsAnErrorEvent(t *testing.T) {
	for _, tc := range []struct {
		call  heldStreamCase
		event string
		typ   string
	}{
		{chatStreamed, "", "server_error"},
		{messagesStreamed, "error", "overloaded_error"},
	} {
		t.Run(tc.call.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startHoldOn(t, nil, streamOK)
				lc := h.beginKeepAlives(context.Background(), tc.call)
				require.NoError(t, h.stop())
				body := lc.rest()
				name, data := streamEvent(t, body)
				assert.Equal(t, tc.event, name)
				e, _ := data["error"].(map[string]any)
				require.NotNil(t, e, "%s", body)
				assert.Equal(t, tc.typ, e["type"])
				assert.Contains(t, e["message"], "shutting down")
				if tc.event == "" {
					assert.Equal(t, reasonShuttingDown, e["code"])
				}
				assert.Equal(t, int64(1), h.sent.Load())
				assert.Zero(t, h.g.core.Snapshot(h.g.now(), false).InCall, "the held call was finished in the core")
				counts, hist := gather(t, h.harness)
				assert.Equal(t, float64(1), counts[`basin_gateway_refusals_total{code="503",reason="shutting_down"}`])
				assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="shutting_down"}`])
			})
		})
	}
}

func TestHeldStreamWhoseClientLeavesLeavesNothingInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHoldOn(t, func(c *Config) { c.IdleTimeout = Duration(time.Minute) }, streamOK)
		ctx, cancel := context.WithCancel(context.Background())
		lc := h.beginKeepAlives(ctx, chatStreamed)
		cancel()
		lc.rest()
		h.settle()
		assert.Zero(t, h.state().InCall, "the held call finished")
		assert.Equal(t, int64(1), h.sent.Load(), "never sent upstream")
		assert.Zero(t, h.state().HeldCalls)
		_, hist := gather(t, h.harness)
		assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="client_gone"}`])
		advance(time.Minute + time.Second)
		assert.False(t, h.g.core.Live("s"), "the session idles out")
	})
}
