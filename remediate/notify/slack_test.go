package notify_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/slack-go/slack/slacktest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/remediate/notify"
)

const (
	botToken = "xoxb-1234-5678-secretsecret"
	channel  = "C0BASIN"
)

// noLeaks fails the test if goroutines outlive it. Register it first: cleanups run last-in
// first-out, so it checks after the servers and Run have been stopped.
func noLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines leaked:\n%s", n-before, buf[:runtime.Stack(buf, true)])
		}
	})
}

// fakeAPI stands in for chat.postMessage. slacktest's own handler is replaced: it leaks a
// goroutine per post without an RTM client and does not record the posts.
type fakeAPI struct {
	mu      sync.Mutex
	posts   []url.Values
	respond func(i int, w http.ResponseWriter, r *http.Request) // nil: ok
}

func (f *fakeAPI) handle(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	i := len(f.posts)
	f.posts = append(f.posts, r.PostForm)
	f.mu.Unlock()
	if f.respond != nil {
		f.respond(i, w, r)
		return
	}
	okJSON(w)
}

func okJSON(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"ok":true,"channel":%q,"ts":"1795167000.000100"}`, channel)
}

func (f *fakeAPI) got() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]url.Values(nil), f.posts...)
}

// startSlack starts a slacktest server whose chat.postMessage is api's, stopped with the test.
func startSlack(t *testing.T, api *fakeAPI) string {
	s := slacktest.NewTestServer(func(c slacktest.Customize) { c.Handle("/chat.postMessage", api.handle) })
	s.Start()
	t.Cleanup(s.Stop)
	return s.GetAPIURL()
}

// syncBuffer collects log output written from Run's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type harness struct {
	n    *notify.Notifier
	reg  *prometheus.Registry
	logs *syncBuffer
}

// start builds a Notifier from o (adding a registry and a logger) and runs it until the test ends.
func start(t *testing.T, o notify.Options) harness {
	h := harness{reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	o.Registerer = h.reg
	o.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n, err := notify.New(o)
	require.NoError(t, err)
	h.n = n
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return h
}

// count reads basin_slack_messages_total{kind,result}.
func (h harness) count(t *testing.T, kind, result string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "basin_slack_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["kind"] == kind && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// waitCount waits until basin_slack_messages_total{kind,result} reaches want.
func (h harness) waitCount(t *testing.T, kind, result string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool { return h.count(t, kind, result) >= want }, 5*time.Second, 5*time.Millisecond,
		"basin_slack_messages_total{kind=%q,result=%q} never reached %v (logs: %s)", kind, result, want, h.logs)
}

func TestSlackPostsTransitionAndAction(t *testing.T) {
	noLeaks(t)
	api := &fakeAPI{}
	o := links
	o.BotToken, o.Channel, o.APIURL = botToken, channel, startSlack(t, api)
	h := start(t, o)

	h.n.Notify(trapped)
	h.n.Notify(tighten)
	h.waitCount(t, "transition", "sent", 1)
	h.waitCount(t, "action", "sent", 1)

	posts := api.got()
	require.Len(t, posts, 2)
	for i, want := range []struct {
		ev     notify.Event
		header string
		field  string
	}{
		{trapped, ":rotating_light: prod-a: drifting → trapped", "*Hit rate vs plateau*\n31.0% vs 95.0%"},
		{tighten, ":rotating_light: prod-a: session budget 1.2M tokens → 1.0M tokens", "*Session budget*\n1.2M tokens → *1.0M tokens*"},
	} {
		p := posts[i]
		assert.Equal(t, channel, p.Get("channel"))
		assert.Equal(t, botToken, p.Get("token"))
		assert.Equal(t, notify.Fallback(want.ev), p.Get("text"), "the notification text")
		assert.Equal(t, "false", p.Get("unfurl_links"), "dashboard links must not unfurl")
		bs := decodeBlocks(t, []byte(p.Get("blocks")))
		assert.Equal(t, want.header, bs[0].Text.Text)
		assert.Contains(t, fieldTexts(bs), want.field)
		assert.Contains(t, contextText(t, bs), "|Dashboard>")
	}
	assert.Zero(t, h.count(t, "transition", "failed"))
}

func TestSlackDeduplicates(t *testing.T) {
	noLeaks(t)
	api := &fakeAPI{}
	h := start(t, notify.Options{BotToken: botToken, Channel: channel, APIURL: startSlack(t, api)})

	for range 3 {
		h.n.Notify(trapped)
		h.n.Notify(tighten)
	}
	h.waitCount(t, "transition", "deduplicated", 2)
	h.waitCount(t, "action", "deduplicated", 2)
	assert.Len(t, api.got(), 2, "each message once")
}

func TestSlackFailuresAreCountedAndDoNotBlock(t *testing.T) {
	for _, tc := range []struct {
		name     string
		respond  func(i int, w http.ResponseWriter, r *http.Request)
		result   string
		attempts int
	}{
		{"5xx is retried, then failed", func(_ int, w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "<html>oops</html>", http.StatusInternalServerError)
		}, "failed", 3},
		{"429 without Retry-After is retried, then rate limited", func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusTooManyRequests)
		}, "rate_limited", 3},
		{"a Slack error is not retried", func(_ int, w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, `{"ok":false,"error":"channel_not_found"}`)
		}, "failed", 1},
		{"a timeout is not retried: Slack may have posted", func(_ int, w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, "failed", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			// Slack answers only once every event has been offered, so the one post Run may have
			// started holds it and the queue's overflow is exact, however fast the machine drains.
			offered := make(chan struct{})
			api := &fakeAPI{respond: func(i int, w http.ResponseWriter, r *http.Request) {
				<-offered
				tc.respond(i, w, r)
			}}
			h := start(t, notify.Options{BotToken: botToken, Channel: channel, APIURL: startSlack(t, api),
				Timeout: 100 * time.Millisecond, RetryBackoff: time.Millisecond, QueueSize: 2})

			began := time.Now()
			for i := range 20 { // far more than the queue holds
				ev := trapped
				ev.To = fmt.Sprint("state-", i)
				h.n.Notify(ev)
			}
			assert.Less(t, time.Since(began), 50*time.Millisecond, "Notify waited for Slack")
			close(offered)

			dropped := h.count(t, "transition", "dropped")
			assert.GreaterOrEqual(t, dropped, 17.0, "the queue overflowed") // 2 queued, maybe 1 taken by Run
			handled := 20 - dropped
			h.waitCount(t, "transition", tc.result, handled)
			assert.Len(t, api.got(), int(handled)*tc.attempts, "attempts per message")
			assert.Zero(t, h.count(t, "transition", "sent"))
			assert.Contains(t, h.logs.String(), "slack post failed")
			assert.NotContains(t, h.logs.String(), botToken)
		})
	}
}

func TestSlackHonoursRetryAfter(t *testing.T) {
	noLeaks(t)
	api := &fakeAPI{respond: func(i int, w http.ResponseWriter, _ *http.Request) {
		if i == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		okJSON(w)
	}}
	h := start(t, notify.Options{BotToken: botToken, Channel: channel, APIURL: startSlack(t, api), RetryBackoff: time.Millisecond})

	began := time.Now()
	h.n.Notify(trapped)
	h.waitCount(t, "transition", "sent", 1)
	assert.GreaterOrEqual(t, time.Since(began), time.Second, "the retry waited for Retry-After")
	assert.Len(t, api.got(), 2)
	assert.Zero(t, h.count(t, "transition", "rate_limited"))
}

func TestPostSummary(t *testing.T) {
	goodput := 180.0
	s := notify.Summary{Deployment: "prod-a", From: at.Add(-24 * time.Hour), To: at, Incidents: 2,
		TimeInState: map[string]time.Duration{"healthy": 23 * time.Hour, "trapped": time.Hour}, GoodputPerHour: &goodput}

	t.Run("posted", func(t *testing.T) {
		noLeaks(t)
		api := &fakeAPI{}
		h := start(t, notify.Options{BotToken: botToken, Channel: channel, APIURL: startSlack(t, api)})
		require.NoError(t, h.n.PostSummary(t.Context(), s))
		posts := api.got()
		require.Len(t, posts, 1, "synchronous: posted when PostSummary returns")
		bs := decodeBlocks(t, []byte(posts[0].Get("blocks")))
		assert.Equal(t, ":bar_chart: basin daily summary: prod-a", bs[0].Text.Text)
		assert.Contains(t, fieldTexts(bs), "*Goodput*\n180.0 sessions/h")
		assert.Equal(t, 1.0, h.count(t, "summary", "sent"))
	})
	t.Run("failure is returned and counted, within the timeout", func(t *testing.T) {
		noLeaks(t)
		api := &fakeAPI{respond: func(_ int, _ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }}
		h := start(t, notify.Options{BotToken: botToken, Channel: channel, APIURL: startSlack(t, api),
			Timeout: 100 * time.Millisecond})
		began := time.Now()
		err := h.n.PostSummary(t.Context(), s)
		require.Error(t, err)
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
		assert.Less(t, time.Since(began), 2*time.Second)
		assert.Equal(t, 1.0, h.count(t, "summary", "failed"))
	})
}
