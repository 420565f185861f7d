package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/test/agentbody"
)

// Streamed body of the throughput benchmark: 4 MiB of SSE in 4 KiB events, each written and
// flushed on its own.
const (
	benchBody  = 4 << 20
	benchChunk = 4 << 10
)

// benchEvent is one 4 KiB SSE event of generated text.
func benchEvent() []byte {
	head := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"`
	tail := "\"}}]}\n\n"
	return []byte(head + strings.Repeat("abc ", (benchChunk-len(head)-len(tail))/4) +
		strings.Repeat("x", (benchChunk-len(head)-len(tail))%4) + tail)
}

// BenchmarkStreamThroughput streams a large SSE body through a bare httputil.ReverseProxy and
// through the gateway (session admitted, usage and text read off the stream), to the same
// upstream, side by side.
func BenchmarkStreamThroughput(b *testing.B) {
	ev := benchEvent()
	if len(ev) != benchChunk {
		b.Fatalf("event is %d bytes, want %d", len(ev), benchChunk)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range benchBody / benchChunk {
			if _, err := w.Write(ev); err != nil {
				return
			}
			_ = rc.Flush()
		}
	}))
	b.Cleanup(up.Close)
	target, err := url.Parse(up.URL)
	require.NoError(b, err)

	// The same transport settings as the gateway's, so that only the gateway's work differs. The
	// bare proxy buffers the (small) request body as the gateway does: proxying the server's own
	// body, the stock ReverseProxy intermittently cuts streams (the transport reads the inbound
	// body once more after the upstream has answered, finds it closed by the response and drops
	// the upstream connection).
	bareTransport := newTransport()
	bareProxy := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:     bareTransport,
		FlushInterval: -1,
	}
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		bareProxy.ServeHTTP(w, r)
	}))
	b.Cleanup(func() {
		bare.Close()
		bareTransport.CloseIdleConnections()
	})

	h := start(b, baseConfig(b, []string{up.URL}, nil), nil)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"stream a lot"}],"stream":true}`)

	run := func(b *testing.B, base string) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
		b.Cleanup(client.CloseIdleConnections)
		call := func() int64 {
			req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("x-session-id", "bench")
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || n != benchBody {
				b.Fatalf("status %d, %d bytes, err %v", resp.StatusCode, n, err)
			}
			return n
		}
		call() // warm the connections; through the gateway this also admits the session
		b.SetBytes(benchBody)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			call()
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, bare.URL) })
	b.Run("gateway", func(b *testing.B) { run(b, h.ts.URL) })
}

// benchChatBody is the benchmarks' long agent conversation, 300 KB.
func benchChatBody() []byte { return agentbody.Chat(300 << 10) }

// BenchmarkParseCall reads a 300 KB chat body as the gateway does on every call (agentcall.Read;
// internal/agentcall's BenchmarkParseRead sets it beside its encoding/json fallback).
func BenchmarkParseCall(b *testing.B) {
	body := benchChatBody()
	b.Run("single-pass", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if c := parseCall(chatEndpoint, body); c.Prompt < 1000 {
				b.Fatalf("prompt %d", c.Prompt)
			}
		}
	})
}

// BenchmarkCallShapes sends the same 300 KB agent conversation through the gateway in each API it
// serves, side by side: read, admitted (a live session), proxied to an upstream that answers in
// the API's own shape with its usage, and accounted for.
func BenchmarkCallShapes(b *testing.B) {
	answers := map[agentcall.Shape]string{
		agentcall.Chat:      `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":90000,"completion_tokens":2}}`,
		agentcall.Responses: responsesJSON,
		agentcall.Messages:  messagesJSON,
	}
	for _, bc := range []struct {
		shape agentcall.Shape
		body  []byte
	}{
		{agentcall.Chat, agentbody.Chat(300 << 10)},
		{agentcall.Responses, agentbody.Responses(300 << 10)},
		{agentcall.Messages, agentbody.Messages(300 << 10)},
	} {
		b.Run(bc.shape.String(), func(b *testing.B) {
			up := httptest.NewServer(answerWith("application/json", answers[bc.shape]))
			b.Cleanup(up.Close)
			h := start(b, baseConfig(b, []string{up.URL}, nil), nil)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
			b.Cleanup(client.CloseIdleConnections)
			call := func() {
				req, err := http.NewRequest(http.MethodPost, h.ts.URL+bc.shape.Path(), bytes.NewReader(bc.body))
				if err != nil {
					b.Fatal(err)
				}
				req.Header.Set("x-session-id", "bench")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d, err %v", resp.StatusCode, err)
				}
			}
			call() // admits the session
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				call()
			}
		})
	}
}
