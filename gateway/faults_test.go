package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
)

// Fault tests: what the gateway does when the upstream or the client misbehaves, across a restart
// and under admin changes racing admissions. After each, the admission core's books must balance:
// the reserved tokens are the sum of the live sessions' demands, the working set the sum of their
// contexts, the live and queued counts are what the clients saw, and no admitted session is
// refused for budget.

// checkBooks asserts the admission core's accounting is consistent and that live sessions are
// live and queued ones queued, with no call left in flight. It returns the snapshot.
func checkBooks(t *testing.T, h *harness, live, queued int) admission.Snapshot {
	t.Helper()
	s := h.g.core.Snapshot(h.g.now(), true)
	var ctx, demand int64
	for _, ls := range s.Sessions {
		assert.GreaterOrEqual(t, ls.Context, int64(0), "session %s context", ls.ID)
		assert.GreaterOrEqual(t, ls.Peak, ls.Context, "session %s peak", ls.ID)
		ctx += ls.Context
		d := ls.Context
		if s.Mode == admission.ModePeak {
			d = max(ls.PredictedPeak, ls.Context)
		}
		demand += d
	}
	for _, q := range s.Queue {
		assert.GreaterOrEqual(t, q.Demand, int64(0), "queued %s demand", q.ID)
	}
	assert.Equal(t, ctx, s.WorkingSet, "working set = sum of live contexts")
	assert.Equal(t, demand, s.Reserved, "reserved = sum of live demands")
	assert.GreaterOrEqual(t, s.Reserved, int64(0))
	assert.GreaterOrEqual(t, s.WorkingSet, int64(0))
	assert.Len(t, s.Sessions, s.Live)
	assert.Equal(t, live, s.Live, "live sessions")
	assert.Len(t, s.Queue, queued, "queued sessions")
	assert.Zero(t, s.InCall, "no call left in flight")
	assert.Equal(t, queued, h.g.core.QueueLen())
	h.g.mu.Lock()
	walked := make([]int, len(h.g.upstreams))
	for _, si := range h.g.mu.sessions {
		walked[si.upstream]++
	}
	assert.Equal(t, walked, h.g.mu.perUpstream, "the per-upstream counts /admin/state serves match the sessions")
	h.g.mu.Unlock()
	return s
}

// checkRefusal asserts r is an answer of the gateway's own: status, x-basin-reason, an
// OpenAI-style JSON body whose code is the reason, and a sane Retry-After when there is one.
func checkRefusal(t *testing.T, r response, status int, reason string) {
	t.Helper()
	assert.Equal(t, status, r.status, "%s", r)
	assert.Equal(t, reason, r.header.Get(ReasonHeader), "%s", r)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	var e errorBody
	if assert.NoError(t, json.Unmarshal(r.body, &e), "%s", r) {
		assert.Equal(t, reason, e.Error.Code)
		assert.NotEmpty(t, e.Error.Message)
		assert.NotEmpty(t, e.Error.Type)
	}
	if ra := r.header.Get("Retry-After"); ra != "" {
		n, err := strconv.Atoi(ra)
		assert.NoError(t, err, "Retry-After %q", ra)
		assert.GreaterOrEqual(t, n, 1, "Retry-After %q", ra)
	}
}

// settleHeld waits until the only calls the gateway still handles are the held ones (queued).
func settleHeld(t *testing.T, h *harness, held int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("all but %d calls accounted for", held), func() bool { return h.g.calls.count() == held })
}

// callSession sends a chat call for session id with the given extra headers and a client
// deadline; a transport error comes back as status -1.
func callSession(h *harness, ctx context.Context, id, body string, extra map[string]string) response {
	hdr := map[string]string{"Content-Type": "application/json", "x-session-id": id}
	for k, v := range extra {
		hdr[k] = v
	}
	r, err := h.do(ctx, http.MethodPost, "/v1/chat/completions", hdr, body)
	if err != nil {
		return response{status: -1, body: []byte(err.Error())}
	}
	return r
}

// rawUpstream is a loopback TCP server that speaks just enough HTTP/1.1 for the test to break it
// precisely: handle gets each request (body read) and the connection, which is closed after.
func rawUpstream(t *testing.T, handle func(conn net.Conn, req *http.Request)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				handle(c, req)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// writeRawJSON answers a raw request with a complete JSON completion and closes.
func writeRawJSON(conn net.Conn, prompt, completion int) {
	body := fmt.Sprintf(`{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`,
		prompt, completion)
	fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		len(body), body)
}

// chunk is one HTTP/1.1 chunk of a chunked body.
func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// waitClosed blocks until the peer closes conn (or 5 s pass) and reports whether it did.
func waitClosed(conn net.Conn) bool {
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

const streamBody = `{"messages":[{"role":"user","content":"Fix the failing test, please."}],"stream":true,"stream_options":{"include_usage":true}}`

func TestFaultUpstream5xxPassesThroughAndFreesTheBudget(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable,
		http.StatusGatewayTimeout} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			errBody := fmt.Sprintf(`{"error":{"message":"engine says %d","type":"server_error","param":null,"code":null}}`, status)
			var mu sync.Mutex
			calls := map[string]int{}
			up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				id := r.Header.Get("x-session-id")
				mu.Lock()
				calls[id]++
				n := calls[id]
				mu.Unlock()
				// a's second call and b's first fail; everything else succeeds.
				if (id == "a" && n == 2) || id == "b" {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Retry-After", "7")
					w.WriteHeader(status)
					_, _ = io.WriteString(w, errBody)
					return
				}
				okJSON(100, 10)(w, r)
			})
			h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
			passedThrough := func(r response) {
				t.Helper()
				assert.Equal(t, status, r.status, "%s", r)
				assert.Equal(t, errBody, string(r.body), "the upstream's body, unchanged")
				assert.Empty(t, r.header.Get(ReasonHeader), "the upstream's answer, not the gateway's")
				assert.Equal(t, "7", r.header.Get("Retry-After"), "the upstream's Retry-After, unchanged")
			}

			decodeCompletion(t, h.chat("a", 5, nil))
			h.settle()
			checkBooks(t, h, 1, 0)
			b := h.chatAsync(context.Background(), "b", 5, nil)
			h.waitQueued(1)
			c := h.chatAsync(context.Background(), "c", 5, map[string]string{"x-session-end": "true"})
			h.waitQueued(2)

			// A live session's failing call keeps it, with its context, and the queue waits.
			passedThrough(h.chat("a", 5, nil))
			settleHeld(t, h, 2) // b and c wait
			s := checkBooks(t, h, 1, 2)
			assert.Equal(t, int64(110), s.Reserved)

			// a ends: b is admitted, its first call fails, so b holds nothing and c goes next.
			end, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/a/end", nil, "")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, end.status, "%s", end)
			passedThrough(<-b)
			decodeCompletion(t, <-c)
			h.settle()
			s = checkBooks(t, h, 0, 0)
			assert.Zero(t, s.Reserved)
			assert.Equal(t, uint64(3), s.Counters.Arrivals)
			assert.Equal(t, uint64(2), s.Counters.AdmittedFromQueue)
			assert.Equal(t, uint64(3), s.Counters.Ended, "a explicitly, b for its failed first call, c by x-session-end")
		})
	}
}

func TestFaultUpstreamTimeoutIsBoundedByTheClient(t *testing.T) {
	// By default (upstream_timeout 0) the gateway sets no deadline of its own on the upstream: a
	// call to an upstream that never answers lasts until the client gives up. These cases check
	// that giving up releases everything.
	type variant struct {
		name string
		url  func(t *testing.T, cancelled chan<- string) string
	}
	variants := []variant{
		{"http handler hangs", func(t *testing.T, cancelled chan<- string) string {
			return newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				id := r.Header.Get("x-session-id")
				if strings.HasPrefix(id, "hung") && r.Header.Get("x-hang") == "1" {
					select {
					case <-r.Context().Done():
						cancelled <- id
					case <-time.After(5 * time.Second):
					}
					return
				}
				okJSON(100, 10)(w, r)
			}).URL
		}},
		{"tcp accepts and stays silent", func(t *testing.T, cancelled chan<- string) string {
			return rawUpstream(t, func(conn net.Conn, req *http.Request) {
				id := req.Header.Get("x-session-id")
				if strings.HasPrefix(id, "hung") && req.Header.Get("x-hang") == "1" {
					if waitClosed(conn) {
						cancelled <- id
					}
					return
				}
				writeRawJSON(conn, 100, 10)
			})
		}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			cancelled := make(chan string, 4)
			h := start(t, baseConfig(t, []string{v.url(t, cancelled)}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
			hang := map[string]string{"x-hang": "1"}
			timeout := func(id string) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				t0 := time.Now()
				r := callSession(h, ctx, id, chatBody(5), hang)
				assert.Equal(t, -1, r.status, "the client timed out: %s", r)
				assert.Less(t, time.Since(t0), 3*time.Second)
				select {
				case got := <-cancelled:
					assert.Equal(t, id, got)
				case <-time.After(3 * time.Second):
					t.Fatalf("the upstream call of %s was not cancelled when its client timed out", id)
				}
			}

			// First call times out: the session never started, its budget goes to the queue.
			first := make(chan struct{})
			go func() { defer close(first); timeout("hung-first") }()
			waitFor(t, "hung-first live", func() bool { return h.g.core.Live("hung-first") })
			next := h.chatAsync(context.Background(), "next", 5, nil)
			h.waitQueued(1)
			<-first
			decodeCompletion(t, <-next)
			h.settle()
			assert.False(t, h.g.core.Live("hung-first"))
			checkBooks(t, h, 1, 0)

			// A later call times out: the session stays live with its context, nothing in flight.
			end, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/next/end", nil, "")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, end.status)
			decodeCompletion(t, h.chat("hung-later", 5, nil))
			h.settle()
			timeout("hung-later")
			h.settle()
			s := checkBooks(t, h, 1, 0)
			assert.Equal(t, int64(110), s.Reserved, "the timed-out call leaves the context as it was")
			// And its next call is not refused for budget (the budget is 1 token).
			decodeCompletion(t, h.chat("hung-later", 5, nil))
			h.settle()
			checkBooks(t, h, 1, 0)
			h.g.core.Expire(h.g.now().Add(time.Hour))
			assert.False(t, h.g.core.Live("hung-later"), "idle expiry works: no call left in flight")
		})
	}
}

func TestFaultConnectionResetMidStream(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	cases := []struct {
		name    string
		partial []string // what the upstream sends before the reset
		rst     bool     // abortive close (RST) rather than FIN
		text    int64    // characters of generated text in the complete events of partial
	}{
		{"rst after two events", sseChunks[:2], true, 10},
		{"rst inside an event", sseChunks[:3], true, 10},
		{"fin inside an event", sseChunks[:3], false, 10},
		{"rst after headers only", nil, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			url := rawUpstream(t, func(conn net.Conn, req *http.Request) {
				if req.Header.Get("x-break") != "1" {
					writeRawJSON(conn, 100, 10)
					return
				}
				calls.Add(1)
				var b strings.Builder
				b.WriteString(head)
				for _, c := range tc.partial {
					b.WriteString(chunk(c))
				}
				_, _ = io.WriteString(conn, b.String())
				time.Sleep(20 * time.Millisecond) // let the client see the part
				if tc.rst {
					_ = conn.(*net.TCPConn).SetLinger(0)
				}
				conn.Close()
			})
			h := start(t, baseConfig(t, []string{url}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
			brk := map[string]string{"x-break": "1"}
			want := strings.Join(tc.partial, "")

			// First call broken mid-stream, then a later call of another session broken too.
			r := callSession(h, context.Background(), "first", streamBody, brk)
			assert.Equal(t, -1, r.status, "the client must see the stream break, not a clean end: %s", r)
			h.settle()
			s := checkBooks(t, h, 1, 0)
			assert.True(t, h.g.core.Live("first"), "a 200 broken off stays a started session")
			assert.Positive(t, s.WorkingSet)

			decodeCompletion(t, h.chat("first", 5, nil)) // its next call passes (budget is 1)
			h.settle()
			checkBooks(t, h, 1, 0)

			// The partial bytes reach the client byte for byte before the break.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions", strings.NewReader(streamBody))
			require.NoError(t, err)
			req.Header.Set("x-session-id", "first")
			req.Header.Set("x-break", "1")
			resp, err := h.ts.Client().Do(req)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Error(t, err, "a broken stream is an error for the client")
			assert.Equal(t, want, string(got))
			h.settle()
			s = checkBooks(t, h, 1, 0)
			// A 200 broken off is booked like a stream without usage: prompt and text estimates.
			assert.Equal(t, tokensOf(int64(len("Fix the failing test, please.")))+4+tokensOf(tc.text), s.Reserved)
			assert.Equal(t, int32(2), calls.Load())
			h.g.core.Expire(h.g.now().Add(time.Hour))
			checkBooks(t, h, 0, 0)
		})
	}
}

func TestFaultSlowClientGetsEveryByteAndDoesNotHoldOthers(t *testing.T) {
	const events, size = 4096, 4096 // 16 MiB, past the loopback socket buffers
	payload := strings.Repeat("x", size-64)
	var want strings.Builder
	for i := range events {
		fmt.Fprintf(&want, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%04d%s\"}}]}\n\n", i, payload)
	}
	want.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":70000}}\n\ndata: [DONE]\n\n")
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-session-id") != "slow" {
			okJSON(100, 10)(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		s := want.String()
		for len(s) > 0 {
			n := min(size, len(s))
			if _, err := io.WriteString(w, s[:n]); err != nil {
				return
			}
			_ = rc.Flush()
			s = s[n:]
		}
	})
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	require.NoError(t, err)
	req.Header.Set("x-session-id", "slow")
	// A small receive buffer, so the slow reader pushes back on the gateway at once.
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			_ = c.(*net.TCPConn).SetReadBuffer(64 << 10)
		}
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// Read the first 64 KiB slowly, then let other sessions come and go while the slow stream is
	// held by back-pressure.
	var got strings.Builder
	buf := make([]byte, 32<<10)
	for got.Len() < 64<<10 {
		n, err := resp.Body.Read(buf[:2048])
		got.Write(buf[:n])
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
	}
	const others = 8
	t0 := time.Now()
	var wg sync.WaitGroup
	results := make([]response, others)
	for i := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = callSession(h, context.Background(), fmt.Sprintf("other-%d", i), chatBody(5),
				map[string]string{"x-session-end": "true"})
		}()
	}
	wg.Wait()
	assert.Less(t, time.Since(t0), 3*time.Second, "a slow reader does not hold other sessions")
	for _, r := range results {
		decodeCompletion(t, r)
	}
	// A client has its whole answer a moment before the gateway's handler books the session's
	// end: wait for the others' books, not just their answers.
	waitFor(t, "the other sessions ended", func() bool {
		s := h.g.core.Snapshot(h.g.now(), false)
		return s.Live == 1 && s.Counters.Ended == others
	})
	s := h.g.core.Snapshot(h.g.now(), false)
	assert.Equal(t, 1, s.Live, "only the slow session is live while it reads")
	assert.Equal(t, 1, s.InCall, "the slow stream is still being proxied: back-pressure reaches the gateway")

	for {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	assert.Equal(t, want.Len(), got.Len())
	assert.True(t, want.String() == got.String(), "byte-identical after a slow read")
	h.settle()
	s = checkBooks(t, h, 1, 0)
	assert.Equal(t, int64(50+70000), s.WorkingSet, "the usage at the end of the slow stream is booked")
	assert.Equal(t, uint64(others), s.Counters.Ended)
}

func TestFaultClientDisconnectWhileQueued(t *testing.T) {
	cases := []struct {
		name   string
		ids    []string // queued calls, in order; a repeated id is a second call of that session
		cancel []int    // indexes of the calls whose clients give up
	}{
		{"all of six leave", []string{"q0", "q1", "q2", "q3", "q4", "q5"}, []int{0, 1, 2, 3, 4, 5}},
		{"every other of six leaves", []string{"q0", "q1", "q2", "q3", "q4", "q5"}, []int{0, 2, 4}},
		{"the head leaves", []string{"q0", "q1", "q2"}, []int{0}},
		{"one of two calls of a session leaves", []string{"dup", "dup", "q1"}, []int{0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newFakeUpstream(t, okJSON(100, 10))
			h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
			decodeCompletion(t, h.chat("live", 5, nil))

			sessions := map[string]bool{}
			cancels := make([]context.CancelFunc, len(tc.ids))
			results := make([]<-chan response, len(tc.ids))
			for i, id := range tc.ids {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				cancels[i] = cancel
				// Each admitted session ends with its call, so the next can be admitted.
				results[i] = h.chatAsync(ctx, id, 5, map[string]string{"x-session-end": "true"})
				if !sessions[id] {
					sessions[id] = true
					h.waitQueued(len(sessions))
				} else {
					waitFor(t, "the second call waits", func() bool {
						h.g.mu.Lock()
						defer h.g.mu.Unlock()
						return len(h.g.mu.waiters[id]) == 2
					})
				}
			}
			cancelled := map[int]bool{}
			left := map[string]bool{} // sessions all of whose calls left
			for _, i := range tc.cancel {
				cancels[i]()
				cancelled[i] = true
				r := <-results[i]
				assert.Equal(t, -1, r.status, "the client gave up: %s", r)
			}
			for id := range sessions {
				all := true
				for i, o := range tc.ids {
					if o == id && !cancelled[i] {
						all = false
					}
				}
				left[id] = all
			}
			h.waitQueued(len(sessions) - countTrue(left))
			settleHeld(t, h, len(tc.ids)-len(tc.cancel))
			s := checkBooks(t, h, 1, len(sessions)-countTrue(left))
			assert.Equal(t, uint64(countTrue(left)), s.Counters.Cancelled)

			// The live session ends: the remaining queue is admitted in order, one at a time.
			end, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/live/end", nil, "")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, end.status)
			for i := range tc.ids {
				if cancelled[i] {
					continue
				}
				select {
				case r := <-results[i]:
					decodeCompletion(t, r)
				case <-time.After(5 * time.Second):
					t.Fatalf("queued call %d (%s) was not admitted", i, tc.ids[i])
				}
			}
			h.settle()
			s = checkBooks(t, h, 0, 0)
			for id, gone := range left {
				if gone {
					assert.False(t, h.g.core.Live(id), "%s left the queue and never started", id)
				}
			}
			assert.Equal(t, uint64(1+len(sessions)-countTrue(left)), s.Counters.Ended)
			h.g.mu.Lock()
			assert.Empty(t, h.g.mu.waiters, "no waiter left behind")
			h.g.mu.Unlock()
		})
	}
}

func countTrue(m map[string]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}

func TestFaultClientDisconnectWhileStreaming(t *testing.T) {
	const n = 8 // streaming sessions; the odd ones' clients leave after the first event
	cancelled := make(chan string, n)
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get("x-session-id")
		if r.Header.Get("x-stream") != "1" {
			okJSON(100, 10)(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, sseChunks[0])
		_ = rc.Flush()
		if r.Header.Get("x-leave") == "1" {
			select {
			case <-r.Context().Done():
				cancelled <- id
			case <-time.After(5 * time.Second):
			}
			return
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":200,\"completion_tokens\":20}}\n\ndata: [DONE]\n\n")
	})

	t.Run("mid-stream", func(t *testing.T) {
		h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = streamAndMaybeLeave(h, fmt.Sprintf("s%d", i), i%2 == 1)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			assert.NoError(t, err, "s%d", i)
		}
		seen := map[string]bool{}
		for range n / 2 {
			select {
			case id := <-cancelled:
				seen[id] = true
			case <-time.After(3 * time.Second):
				t.Fatal("an upstream call was not cancelled when its client left")
			}
		}
		assert.Len(t, seen, n/2)
		h.settle()
		s := checkBooks(t, h, n, 0)
		for _, ls := range s.Sessions {
			var i int
			_, _ = fmt.Sscanf(ls.ID, "s%d", &i)
			if i%2 == 0 {
				assert.Equal(t, int64(220), ls.Context, "%s: usage booked", ls.ID)
			} else {
				assert.Positive(t, ls.Context, "%s: the estimate stays", ls.ID)
			}
		}
		// Every session's next call passes, the ones whose clients left included.
		for i := range n {
			decodeCompletion(t, h.chat(fmt.Sprintf("s%d", i), 5, nil))
		}
		h.settle()
		s = checkBooks(t, h, n, 0)
		assert.Equal(t, int64(n*110), s.Reserved)
	})

	t.Run("before the response, first call", func(t *testing.T) {
		gotReq := make(chan struct{}, 1)
		hold := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if r.Header.Get("x-session-id") == "gone" {
				gotReq <- struct{}{}
				select {
				case <-r.Context().Done():
					cancelled <- "gone"
				case <-time.After(5 * time.Second):
				}
				return
			}
			okJSON(100, 10)(w, r)
		})
		h := start(t, baseConfig(t, []string{hold.URL}, func(c *Config) { c.Admission.BudgetTokens = 1 }), nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		gone := h.chatAsync(ctx, "gone", 5, nil)
		<-gotReq
		next := h.chatAsync(context.Background(), "next", 5, nil)
		h.waitQueued(1)
		cancel()
		assert.Equal(t, -1, (<-gone).status)
		select {
		case id := <-cancelled:
			assert.Equal(t, "gone", id)
		case <-time.After(3 * time.Second):
			t.Fatal("the upstream call was not cancelled")
		}
		decodeCompletion(t, <-next)
		h.settle()
		checkBooks(t, h, 1, 0)
		assert.False(t, h.g.core.Live("gone"), "a session whose client left before any answer never started")
		assert.True(t, h.g.core.Live("next"))
	})
}

// streamAndMaybeLeave streams a call of session id; with leave it hangs up after the first event.
func streamAndMaybeLeave(h *harness, id string, leave bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	if err != nil {
		return err
	}
	req.Header.Set("x-session-id", id)
	req.Header.Set("x-stream", "1")
	if leave {
		req.Header.Set("x-leave", "1")
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	first := make([]byte, len(sseChunks[0]))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		return fmt.Errorf("first event: %w", err)
	}
	if leave {
		cancel()
		return nil
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		return fmt.Errorf("stream did not end: %q", rest)
	}
	return nil
}

func TestFaultRestartWithLiveSessions(t *testing.T) {
	up := newFakeUpstream(t, okJSON(100, 10))
	state := filepath.Join(t.TempDir(), "state.json")
	cfg := baseConfig(t, []string{up.URL}, func(c *Config) { c.StateFile = state })
	const veterans = 5

	h1 := start(t, cfg, nil)
	for i := range veterans {
		decodeCompletion(t, h1.chat(fmt.Sprintf("v%d", i), 5, nil))
	}
	r := h1.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":1,"reference_tokens":1,"reason":"test: capacity lost"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	newcomer := h1.chatAsync(context.Background(), "newcomer", 5, nil)
	queuedAt := h1.waitQueued(1).Queue[0].Arrival
	settleHeld(t, h1, 1) // the newcomer waits
	before := h1.g.core.Snapshot(h1.g.now(), true)
	require.Equal(t, veterans, before.Live)

	require.NoError(t, h1.stop())
	checkRefusal(t, <-newcomer, http.StatusServiceUnavailable, reasonShuttingDown)
	checkBooks(t, h1, veterans, 0)

	h2 := start(t, cfg, nil)
	s := checkBooks(t, h2, veterans, 0)
	require.Len(t, s.Sessions, len(before.Sessions))
	for i, ls := range s.Sessions {
		b := before.Sessions[i]
		assert.Equal(t, b.ID, ls.ID)
		assert.Equal(t, b.Context, ls.Context, "%s context", ls.ID)
		assert.Equal(t, b.Peak, ls.Peak, "%s peak", ls.ID)
		assert.True(t, b.Arrival.Equal(ls.Arrival), "%s arrival", ls.ID)
		assert.True(t, b.LastDone.Equal(ls.LastDone), "%s last done", ls.ID)
	}
	assert.Equal(t, before.Reserved, s.Reserved)
	assert.Equal(t, int64(1), s.Budget, "the budget as last set")

	// Every veteran's next call passes at once, concurrently, though the budget is 1 token.
	var wg sync.WaitGroup
	results := make([]response, veterans)
	for i := range veterans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			results[i] = callSession(h2, ctx, fmt.Sprintf("v%d", i), chatBody(5), nil)
		}()
	}
	wg.Wait()
	for _, r := range results {
		decodeCompletion(t, r)
	}
	h2.settle()
	s = checkBooks(t, h2, veterans, 0)
	assert.Zero(t, s.Counters.Arrivals, "no veteran was a new arrival")
	assert.Zero(t, s.Counters.Queued)

	// The newcomer's retry queues behind them, keeping its place in time.
	ctx, cancel := context.WithCancel(context.Background())
	retry := h2.chatAsync(ctx, "newcomer", 5, nil)
	v := h2.waitQueued(1)
	assert.True(t, queuedAt.Equal(v.Queue[0].Arrival), "arrival %v, was %v", v.Queue[0].Arrival, queuedAt)
	cancel()
	assert.Equal(t, -1, (<-retry).status)
	h2.waitQueued(0)
	h2.settle()
	checkBooks(t, h2, veterans, 0)
}

func TestFaultAdminRacingAdmissions(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		okJSON(100, 10)(w, r)
	})
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) {
		c.Admission.BudgetTokens = 400
		c.MaxQueueWait = Duration(60 * time.Millisecond)
	}), nil)
	const sessions, callsPer = 48, 3

	adminCall := func(method, path, body string) (int, error) {
		req, err := http.NewRequest(method, h.admin.URL+path, strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := h.admin.Client().Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	stop := make(chan struct{})
	var adminWG sync.WaitGroup
	var adminCalls, adminErrs atomic.Int64
	for k := range 3 {
		adminWG.Add(1)
		go func() {
			defer adminWG.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				var code int
				var err error
				switch k {
				case 0:
					tok := 100 + rand.IntN(400)
					code, err = adminCall(http.MethodPut, "/admin/budget",
						fmt.Sprintf(`{"tokens":%d,"reference_tokens":%d,"reason":"test: race"}`, tok, tok))
				case 1:
					code, err = adminCall(http.MethodPost, "/admin/shed", `{"count":1,"reason":"test: race"}`)
				default:
					code, err = adminCall(http.MethodGet, "/admin/state", "")
				}
				adminCalls.Add(1)
				if err != nil || code != http.StatusOK {
					adminErrs.Add(1)
				}
				pause := time.Duration(1+rand.IntN(3)) * time.Millisecond
				if k == 1 {
					pause *= 8 // shed less often than the budget moves, so some queued calls time out
				}
				time.Sleep(pause)
			}
		}()
	}

	type outcome struct {
		first   response
		laterOK int
		later   []response // later calls that failed
	}
	outcomes := make([]outcome, sessions)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i*4) * time.Millisecond) // arrivals spread over ~200 ms
			id := fmt.Sprintf("r%02d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			o := &outcomes[i]
			o.first = callSession(h, ctx, id, chatBody(5), nil)
			if o.first.status != http.StatusOK {
				return
			}
			for c := 1; c < callsPer; c++ {
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond) // a tool runs
				extra := map[string]string{}
				if c == callsPer-1 {
					extra["x-session-end"] = "true"
				}
				r := callSession(h, ctx, id, chatBody(5), extra)
				if r.status == http.StatusOK {
					o.laterOK++
				} else {
					o.later = append(o.later, r)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	adminWG.Wait()
	h.settle()

	var admitted, timedOut, shed int
	for i, o := range outcomes {
		switch o.first.status {
		case http.StatusOK:
			admitted++
			assert.Empty(t, o.later, "r%02d: an admitted session's later call was refused: %v", i, o.later)
			assert.Equal(t, callsPer-1, o.laterOK, "r%02d", i)
		case http.StatusServiceUnavailable:
			timedOut++
			checkRefusal(t, o.first, http.StatusServiceUnavailable, reasonQueueTimeout)
		case 529:
			shed++
			checkRefusal(t, o.first, 529, reasonShed)
		default:
			t.Errorf("r%02d: unexpected first answer %s", i, o.first)
		}
	}
	s := checkBooks(t, h, 0, 0)
	c := s.Counters
	assert.Equal(t, uint64(sessions), c.Arrivals)
	assert.Equal(t, uint64(admitted), c.AdmittedAtOnce+c.AdmittedFromQueue, "admissions = first calls answered 200")
	assert.Equal(t, uint64(admitted), c.Ended, "every admitted session ended with its last call")
	assert.Equal(t, c.Queued, c.AdmittedFromQueue+c.Cancelled+c.Shed, "every queued session left the queue one way")
	assert.Equal(t, uint64(timedOut), c.Cancelled, "queue timeouts = 503s the clients saw")
	assert.Equal(t, uint64(shed), c.Shed, "sheds = 529s the clients saw")
	assert.Zero(t, c.Refused+c.OverQuota)
	assert.Zero(t, adminErrs.Load(), "admin calls all answered 200")
	h.g.mu.Lock()
	assert.Empty(t, h.g.mu.waiters, "no waiter left behind")
	assert.Empty(t, h.g.mu.sessions, "no routing state left for ended sessions")
	h.g.mu.Unlock()
	t.Logf("%d sessions × %d calls, %d admin calls: %d admitted (%d at once, %d from the queue), %d queue timeouts, %d shed",
		sessions, callsPer, adminCalls.Load(), admitted, c.AdmittedAtOnce, c.AdmittedFromQueue, timedOut, shed)
}

// TestFaultUpstreamTimeoutConfigured: with upstream_timeout set, a call to an upstream that
// never answers is answered 504 upstream_timeout once it runs out, with the same accounting as a
// failed call (a first call frees its session, a later one keeps its context); a stream that
// stops mid-way is cut, as on an upstream failure.
func TestFaultUpstreamTimeoutConfigured(t *testing.T) {
	cancelled := make(chan string, 4)
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get("x-session-id")
		switch r.Header.Get("x-hang") {
		case "before":
			<-r.Context().Done()
			cancelled <- id
			return
		case "mid-stream":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial\"}}]}\n\n")
			http.NewResponseController(w).Flush()
			<-r.Context().Done()
			cancelled <- id
			return
		}
		okJSON(100, 10)(w, r)
	})
	const limit = 200 * time.Millisecond
	h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) {
		c.Admission.BudgetTokens = 1
		c.UpstreamTimeout = Duration(limit)
	}), nil)

	// A first call that times out: 504 with its reason; the session never started, so it is gone.
	t0 := time.Now()
	r := callSession(h, context.Background(), "hung-first", chatBody(5), map[string]string{"x-hang": "before"})
	assert.Equal(t, http.StatusGatewayTimeout, r.status, "%s", r)
	assert.Equal(t, "upstream_timeout", r.header.Get(ReasonHeader))
	assert.Contains(t, string(r.body), `"code":"upstream_timeout"`)
	assert.Contains(t, string(r.body), "upstream_timeout")
	assert.GreaterOrEqual(t, time.Since(t0), limit)
	assert.Less(t, time.Since(t0), 3*time.Second)
	assert.Equal(t, "hung-first", <-cancelled, "the upstream call was cancelled")
	h.settle()
	assert.False(t, h.g.core.Live("hung-first"))
	checkBooks(t, h, 0, 0)

	// A later call that times out: 504, the session stays live with the context it had.
	decodeCompletion(t, h.chat("later", 5, nil))
	r = callSession(h, context.Background(), "later", chatBody(5), map[string]string{"x-hang": "before"})
	assert.Equal(t, http.StatusGatewayTimeout, r.status, "%s", r)
	assert.Equal(t, "later", <-cancelled)
	h.settle()
	s := checkBooks(t, h, 1, 0)
	assert.Equal(t, int64(110), s.Reserved, "the timed-out call leaves the context as it was")

	// A stream that stops after its first event is cut when the limit runs out.
	hdr := map[string]string{"Content-Type": "application/json", "x-session-id": "later", "x-hang": "mid-stream"}
	_, err := h.do(context.Background(), http.MethodPost, "/v1/chat/completions", hdr, chatBody(5))
	assert.Error(t, err, "the client sees the stream broken off, not a complete answer")
	assert.Equal(t, "later", <-cancelled)
	h.settle()
	checkBooks(t, h, 1, 0)

	// Calls that answer in time are untouched.
	decodeCompletion(t, h.chat("later", 5, nil))
}

func TestUpstreamTimeoutConfig(t *testing.T) {
	_, err := ParseConfig([]byte("upstreams: [http://127.0.0.1:1]\nadmission: {budget_tokens: 10}\nupstream_timeout: -1s\n"))
	assert.ErrorContains(t, err, `line 3: upstream_timeout: duration "-1s": must not be negative`)
	c, err := ParseConfig([]byte("upstreams: [http://127.0.0.1:1]\nadmission: {budget_tokens: 10}\n"))
	require.NoError(t, err)
	assert.Zero(t, c.UpstreamTimeout, "no bound unless configured")
}
