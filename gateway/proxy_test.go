package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sseChunks are the events the streaming upstream sends, each written and flushed on its own.
var sseChunks = []string{
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello \\\"wor\"}}]}\n\n",
	// An event split across two writes, and a comment line.
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"con",
	"tent\":\"ld\\u00e9\"}}]}\n\n: keep-alive\n\n",
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
	"data: [DONE]\n\n",
}

func TestStreamingPassesThroughByteIdentical(t *testing.T) {
	release := make(chan struct{})
	finished := make(chan struct{})
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		defer close(finished)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i, c := range sseChunks {
			_, _ = io.WriteString(w, c)
			_ = rc.Flush()
			if i == 0 {
				select { // hold the rest until the client has seen the first chunk
				case <-release:
				case <-time.After(3 * time.Second):
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	require.NoError(t, err)
	req.Header.Set("x-session-id", "streamer")
	resp, err := h.ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	first := make([]byte, len(sseChunks[0]))
	_, err = io.ReadFull(resp.Body, first)
	require.NoError(t, err)
	select {
	case <-finished:
		t.Fatal("the upstream finished before the client got the first chunk")
	default:
	}
	assert.Equal(t, sseChunks[0], string(first), "the first chunk arrives while the upstream is still streaming")
	close(release)
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, strings.Join(sseChunks, ""), string(first)+string(rest), "byte-identical")

	// No usage chunk: the context is the prompt estimate plus the streamed text's estimate
	// ("Hello \"world\u00e9" is 13 characters → 4 tokens; the prompt "hi" is 1 + 4 tokens).
	h.settle()
	assert.Equal(t, int64(5+4), h.state().WorkingSet)
	for _, hdr := range up.seen() {
		assert.Empty(t, hdr.Get("stream_options"))
	}
}

func TestObserverReadsUsageAndTextAcrossWrites(t *testing.T) {
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}],\"usage\":null}\r\n\r\n" +
		"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"xy\",\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"a\\\":1}\"}}]}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":7,\"total_tokens\":47}}\n\n" +
		"data: [DONE]\n\n"
	for _, size := range []int{1, 3, 7, 64, len(stream)} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			rec := newRecorderWriter()
			rec.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			o := newObserver(rec, time.Now)
			for p := []byte(stream); len(p) > 0; {
				n := min(size, len(p))
				_, err := o.Write(p[:n])
				require.NoError(t, err)
				p = p[n:]
			}
			o.finish()
			assert.Equal(t, stream, rec.buf.String())
			require.NotNil(t, o.usage)
			assert.Equal(t, usage{PromptTokens: 40, CompletionTokens: 7}, *o.usage)
			assert.Equal(t, int64(4+2+7), o.outChars, `"abcd", "xy" and {"a":1}`)
		})
	}
}

func TestObserverNonStreamedAndCompressed(t *testing.T) {
	body := `{"choices":[{"message":{"role":"assistant","content":"héllo"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`
	rec := newRecorderWriter()
	rec.Header().Set("Content-Type", "application/json")
	o := newObserver(rec, time.Now)
	_, _ = o.Write([]byte(body[:10]))
	_, _ = o.Write([]byte(body[10:]))
	o.finish()
	require.NotNil(t, o.usage)
	assert.Equal(t, int64(12), o.usage.PromptTokens)
	assert.Equal(t, int64(5), o.outChars)

	rec = newRecorderWriter()
	rec.Header().Set("Content-Type", "application/json")
	rec.Header().Set("Content-Encoding", "gzip")
	o = newObserver(rec, time.Now)
	_, _ = o.Write([]byte(body))
	o.finish()
	assert.Nil(t, o.usage, "a compressed body is passed on, not read")
	assert.Equal(t, body, rec.buf.String())
}

// recorderWriter is a minimal ResponseWriter for observer tests.
type recorderWriter struct {
	h      http.Header
	buf    bytes.Buffer
	status int
}

func newRecorderWriter() *recorderWriter { return &recorderWriter{h: http.Header{}} }

func (r *recorderWriter) Header() http.Header         { return r.h }
func (r *recorderWriter) WriteHeader(code int)        { r.status = code }
func (r *recorderWriter) Write(p []byte) (int, error) { return r.buf.Write(p) }

func TestUpstreamErrorsPassThroughWithoutLeakingBudget(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if fail.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":{"message":"engine exploded","type":"server_error","param":null,"code":null}}`)
			return
		}
		okJSON(100, 10)(w, r)
	})
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)

	r := h.chat("s", 5, nil)
	assert.Equal(t, http.StatusInternalServerError, r.status)
	assert.Equal(t, `{"error":{"message":"engine exploded","type":"server_error","param":null,"code":null}}`, string(r.body))
	assert.Empty(t, r.header.Get("x-basin-reason"), "the upstream's answer, not the gateway's")
	h.settle()
	s := h.state()
	assert.Equal(t, 0, s.Live, "a session whose first call failed did not start")
	assert.Zero(t, s.Reserved)
	assert.Zero(t, s.WorkingSet)

	// A failing later call keeps the session, and its call is not left in flight.
	fail.Store(false)
	decodeCompletion(t, h.chat("s", 5, nil))
	h.settle()
	require.Equal(t, int64(110), h.state().Reserved)
	fail.Store(true)
	r = h.chat("s", 5, nil)
	assert.Equal(t, http.StatusInternalServerError, r.status)
	h.settle()
	s = h.state()
	assert.Equal(t, 1, s.Live)
	assert.Equal(t, int64(110), s.Reserved, "the estimate of the failed call's prompt is below the context already tracked")
	h.g.core.Expire(h.g.now().Add(time.Hour)) // idle expiry works only if no call is left in flight
	assert.False(t, h.g.core.Live("s"))
}

func TestUnreachableUpstreamIs502(t *testing.T) {
	up := newFakeUpstream(t, okJSON(1, 1))
	url := up.URL
	up.Close()
	h := start(t, baseConfig(t, []string{url}, nil), nil)
	r := h.chat("s", 5, nil)
	assert.Equal(t, http.StatusBadGateway, r.status, "%s", r)
	assert.Equal(t, "upstream_error", r.header.Get("x-basin-reason"))
	h.settle()
	assert.Zero(t, h.state().Reserved)
}

func TestStickyUpstreamsAndAffinity(t *testing.T) {
	a := newFakeUpstream(t, okJSON(10, 1))
	b := newFakeUpstream(t, okJSON(10, 1))
	h := start(t, baseConfig(t, []string{a.URL, b.URL}, nil), nil)
	for range 3 {
		for _, id := range []string{"s1", "s2"} {
			decodeCompletion(t, h.chat(id, 1, nil))
		}
	}
	route := func(f *fakeUpstream) map[string]int {
		out := map[string]int{}
		for _, hdr := range f.seen() {
			out[hdr.Get("x-session-id")]++
		}
		return out
	}
	ra, rb := route(a), route(b)
	assert.Len(t, ra, 1, "one session per upstream: %v %v", ra, rb)
	assert.Len(t, rb, 1, "one session per upstream: %v %v", ra, rb)
	for _, hdr := range append(a.seen(), b.seen()...) {
		assert.Empty(t, hdr.Get("X-SMG-Routing-Key"), "affinity is off")
	}
	s := h.state()
	require.Len(t, s.Upstreams, 2)
	assert.Equal(t, 1, s.Upstreams[0].Sessions)
	assert.Equal(t, 1, s.Upstreams[1].Sessions)

	r := h.adminDo(http.MethodPut, "/admin/affinity", testToken, `{"enabled":true,"reason":"test: lend decode cache"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, h.log.String(), "false → true")
	decodeCompletion(t, h.chat("s1", 1, nil))
	all := append(a.seen(), b.seen()...)
	var last http.Header
	for _, hdr := range all {
		if hdr.Get("X-SMG-Routing-Key") != "" {
			last = hdr
		}
	}
	require.NotNil(t, last, "affinity on sets the routing key")
	assert.Equal(t, "s1", last.Get("X-SMG-Routing-Key"))
	assert.True(t, h.state().Affinity.Enabled)
}

// readSSE collects the data lines of a stream.
func readSSE(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func TestStreamingThroughSimServe(t *testing.T) {
	h := start(t, baseConfig(t, []string{startSim(t)}, nil), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"Write twenty words."}],"max_tokens":20,"stream":true,"stream_options":{"include_usage":true}}`))
	require.NoError(t, err)
	req.Header.Set("x-session-id", "sim-stream")
	resp, err := h.ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	events := readSSE(t, resp.Body)
	require.NotEmpty(t, events)
	assert.Equal(t, "[DONE]", events[len(events)-1])
	h.settle()
	// The usage chunk is what the gateway books: 20 output tokens on top of the prompt.
	assert.Equal(t, int64(tokensOf(int64(len("Write twenty words."))))+4+20, h.state().WorkingSet)
}

func TestClientDisconnectCancelsTheUpstreamCall(t *testing.T) {
	upstreamGone := make(chan struct{})
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sseChunks[0])
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			close(upstreamGone)
		case <-time.After(5 * time.Second):
		}
	})
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	require.NoError(t, err)
	req.Header.Set("x-session-id", "leaver")
	resp, err := h.ts.Client().Do(req)
	require.NoError(t, err)
	_, err = io.ReadFull(resp.Body, make([]byte, len(sseChunks[0])))
	require.NoError(t, err)
	cancel()
	resp.Body.Close()
	select {
	case <-upstreamGone:
	case <-time.After(3 * time.Second):
		t.Fatal("the upstream call was not cancelled when the client went away")
	}
	h.settle()
	assert.True(t, h.g.core.Live("leaver"), "the session stays live; only the call was aborted")
	h.g.core.Expire(h.g.now().Add(time.Hour))
	assert.False(t, h.g.core.Live("leaver"), "and its call is not left in flight")
}

func TestAStreamBrokenUpstreamIsCutForTheClientToo(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sseChunks[0])
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the engine dies mid-stream
	})
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
	r, err := h.do(context.Background(), http.MethodPost, "/v1/chat/completions", map[string]string{"x-session-id": "cut"},
		`{"messages":[{"role":"user","content":"hi"}],"stream":true}`)
	require.Error(t, err, "the client must see the stream break, not a clean end")
	assert.Equal(t, sseChunks[0], string(r.body), "what arrived before the break is passed on")
	h.settle()
	h.g.core.Expire(h.g.now().Add(time.Hour))
	assert.False(t, h.g.core.Live("cut"), "the broken call is not left in flight")
}
