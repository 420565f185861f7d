package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/testclock"
)

// holdHarness is a gateway alone on a settable clock in front of an upstream that counts the
// model calls it is sent, with session "s" live and idle.
type holdHarness struct {
	*harness
	clock *testclock.Clock
	sent  *atomic.Int64
}

func startHold(t *testing.T, tweak func(*Config)) *holdHarness {
	t.Helper()
	sent := &atomic.Int64{}
	ok := okJSON(100, 10)
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/chat/completions") {
			sent.Add(1)
		}
		ok(w, r)
	})
	clock := testclock.New(time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC))
	h := &holdHarness{harness: start(t, baseConfig(t, []string{up.URL}, tweak), clock.Now), clock: clock, sent: sent}
	require.Equal(t, http.StatusOK, h.chat("s", 5, nil).status)
	h.settle()
	require.Equal(t, int64(1), sent.Load())
	return h
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
	waitFor(h.t, "the call held", func() bool { return h.state().HeldCalls == 1 })
	return ch
}

// notAnswered fails if the call is answered within a moment.
func notAnswered(t *testing.T, ch <-chan response, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: the held call was answered: %s", what, r)
	case <-time.After(100 * time.Millisecond):
	}
}

// answered waits for a call's answer.
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
	h := startHold(t, nil)
	res := h.holds(`{"hold":["s","unknown"],"reason":"test"}`)
	assert.Equal(t, adminapi.HoldResult{Added: 1, Released: []string{}, HeldSessions: 1, HeldTokens: 110}, res,
		"s held (its context from the first call's usage); the unknown id skipped")
	ch := h.heldCall(context.Background())
	notAnswered(t, ch, "before the resume")
	assert.Equal(t, int64(1), h.sent.Load(), "the held call did not reach the upstream")
	st := h.state()
	assert.Equal(t, 1, st.InCall, "a held call counts in flight")
	require.Len(t, st.Sessions, 1)
	assert.True(t, st.Sessions[0].Held)

	h.clock.Advance(30 * time.Second)
	res = h.holds(`{"resume":["s"],"reason":"test"}`)
	assert.Equal(t, adminapi.HoldResult{Resumed: 1, Released: []string{"s"}}, res)
	r := answered(t, ch)
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
}

func TestHeldCallIsReleasedAtTheHoldBound(t *testing.T) {
	h := startHold(t, func(c *Config) { c.IdleTimeout = Duration(time.Minute) })
	h.holds(`{"hold":["s"],"reason":"test"}`)
	ch := h.heldCall(context.Background())

	h.clock.Advance(admission.DefaultHoldBound - time.Second)
	h.g.expire()
	notAnswered(t, ch, "a second before the bound")
	assert.True(t, h.g.core.Live("s"), "a session whose call waits is not idle, past the idle timeout")

	h.clock.Advance(time.Second)
	h.g.expire()
	r := answered(t, ch)
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
	notAnswered(t, ch, "the next call")
	cancel()
	<-ch
}

func TestCancelledHeldCallLeavesNothingInFlight(t *testing.T) {
	h := startHold(t, func(c *Config) { c.IdleTimeout = Duration(time.Minute) })
	h.holds(`{"hold":["s"],"reason":"test"}`)
	ctx, cancel := context.WithCancel(context.Background())
	ch := h.heldCall(ctx)
	require.Equal(t, 1, h.state().InCall)

	cancel()
	r := answered(t, ch)
	assert.Equal(t, -1, r.status, "the client gave up: %s", r)
	waitFor(t, "the held call finished", func() bool { return h.state().InCall == 0 })
	h.settle()
	assert.Equal(t, int64(1), h.sent.Load(), "a call given up while held never reaches the upstream")
	_, hist := gather(t, h.harness)
	assert.Equal(t, uint64(1), hist[`basin_gateway_held_call_wait_seconds{reason="client_gone"}`])

	// Nothing in flight: the session idles out as any idle one does.
	h.clock.Advance(2 * time.Minute)
	h.g.expire()
	assert.False(t, h.g.core.Live("s"), "idle for 2 min > 1 min")
}

func TestARetryOfAnAbandonedHeldCallIsHeldAfresh(t *testing.T) {
	h := startHold(t, nil)
	h.holds(`{"hold":["s"],"reason":"test"}`)
	ctx, cancel := context.WithCancel(context.Background())
	ch := h.heldCall(ctx)
	cancel()
	assert.Equal(t, -1, answered(t, ch).status)
	waitFor(t, "the held call finished", func() bool { return h.state().InCall == 0 })

	// The client retries a minute later: the retry waits, as the call it repeats did.
	h.clock.Advance(time.Minute)
	retry := h.chatAsync(context.Background(), "s", 5, nil)
	waitFor(t, "the retry begun", func() bool { return h.state().InCall == 1 })
	notAnswered(t, retry, "the retry of a held call")
	assert.Equal(t, int64(1), h.sent.Load())

	assert.Equal(t, 1, h.state().HeldCalls, "the given-up call no longer counts; the retry does")

	// Released at its own bound: each request waits at most one bound.
	h.clock.Advance(admission.DefaultHoldBound - time.Second)
	h.g.expire()
	notAnswered(t, retry, "the retry before its own bound")
	h.clock.Advance(time.Second)
	h.g.expire()
	r := answered(t, retry)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	h.settle()
	assert.Equal(t, int64(2), h.sent.Load())
	st := h.state()
	assert.Zero(t, st.InCall)
	assert.Zero(t, st.HeldCalls)
	assert.Equal(t, 1, st.Held, "still held")
}

func TestHeldCallOfASessionEndedWhileItWaits(t *testing.T) {
	h := startHold(t, nil)
	h.holds(`{"hold":["s"],"reason":"test"}`)
	ch := h.heldCall(context.Background())
	r, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/s/end", nil, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status, "%s", r)

	// The call is no longer a live session's: it is admitted as a new session's first call.
	r = answered(t, ch)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	h.settle()
	assert.Equal(t, int64(2), h.sent.Load())
	st := h.state()
	assert.Zero(t, st.Held, "the new session is not held")
	assert.Zero(t, st.InCall)
	assert.Equal(t, uint64(2), st.Counters.Arrivals, "the call arrived again")
}

func TestHeldCallAtShutdownIs503(t *testing.T) {
	h := startHold(t, nil)
	h.holds(`{"hold":["s"],"reason":"test"}`)
	ch := h.heldCall(context.Background())
	require.NoError(t, h.stop())
	r := answered(t, ch)
	checkRefusal(t, r, http.StatusServiceUnavailable, reasonShuttingDown)
	assert.Equal(t, int64(1), h.sent.Load())
	assert.Zero(t, h.g.core.Snapshot(h.g.now(), false).InCall, "the held call was finished in the core")
}

func TestAdminHoldsRejectsBadBodiesNamingTheField(t *testing.T) {
	h := startHold(t, nil)
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
	h := startHold(t, nil)
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
