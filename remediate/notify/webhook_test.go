package notify_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/remediate/notify"
)

// webhookBody is what an incoming webhook receives.
type webhookBody struct {
	Text        string          `json:"text"`
	Blocks      json.RawMessage `json:"blocks"`
	Channel     string          `json:"channel"`
	UnfurlLinks *bool           `json:"unfurl_links"`
}

// fakeWebhook is an incoming webhook; slacktest has none.
type fakeWebhook struct {
	mu     sync.Mutex
	bodies []webhookBody
	status int // 0: 200
}

func (f *fakeWebhook) start(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(r.Body)
		if err != nil || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var b webhookBody
		if err := json.Unmarshal(raw, &b); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, b)
		status := f.status
		f.mu.Unlock()
		if status != 0 {
			http.Error(w, "no_service", status)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/services/T000/B000/webhooksecret"
}

func (f *fakeWebhook) got() []webhookBody {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]webhookBody(nil), f.bodies...)
}

func TestWebhookPosts(t *testing.T) {
	noLeaks(t)
	hook := &fakeWebhook{}
	o := links
	o.WebhookURL = hook.start(t)
	h := start(t, o)

	h.n.Notify(trapped)
	h.waitCount(t, "transition", "sent", 1)
	require.NoError(t, h.n.PostSummary(t.Context(), notify.Summary{Deployment: "prod-a", From: at, To: at}))

	bodies := hook.got()
	require.Len(t, bodies, 2)
	b := bodies[0]
	assert.Equal(t, notify.Fallback(trapped), b.Text)
	assert.Empty(t, b.Channel, "a webhook posts to its own channel")
	if assert.NotNil(t, b.UnfurlLinks) {
		assert.False(t, *b.UnfurlLinks, "dashboard links must not unfurl")
	}
	bs := decodeBlocks(t, b.Blocks)
	assert.Equal(t, ":rotating_light: prod-a: drifting → trapped", bs[0].Text.Text)
	assert.Contains(t, fieldTexts(bs), "*W/C vs knee*\n1.42 vs 1.30")
	assert.Contains(t, contextText(t, bs), "|Status page>")

	assert.Equal(t, ":bar_chart: basin daily summary: prod-a", decodeBlocks(t, bodies[1].Blocks)[0].Text.Text)
	assert.Equal(t, 1.0, h.count(t, "summary", "sent"))
}

// The webhook URL is the credential: a failure must be logged and counted without it.
func TestWebhookFailureKeepsTheURLSecret(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		noLeaks(t)
		hook := &fakeWebhook{status: http.StatusForbidden}
		h := start(t, notify.Options{WebhookURL: hook.start(t)})
		h.n.Notify(trapped)
		h.waitCount(t, "transition", "failed", 1)
		assert.Len(t, hook.got(), 1, "a 403 is not retried")
		assert.Contains(t, h.logs.String(), "403")
		assert.NotContains(t, h.logs.String(), "webhooksecret")
	})
	t.Run("unreachable", func(t *testing.T) {
		noLeaks(t)
		srv := httptest.NewServer(http.NotFoundHandler())
		dead := srv.URL + "/services/T000/B000/webhooksecret"
		srv.Close()
		h := start(t, notify.Options{WebhookURL: dead})
		h.n.Notify(trapped)
		h.waitCount(t, "transition", "failed", 1)
		logs := h.logs.String()
		assert.Contains(t, logs, "connection refused")
		assert.NotContains(t, logs, "webhooksecret")
		err := h.n.PostSummary(t.Context(), notify.Summary{})
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "webhooksecret", "the returned error is logged by the cron job")
	})
}
