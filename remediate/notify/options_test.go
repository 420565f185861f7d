package notify_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/remediate/notify"
)

const hookURL = "https://hooks.slack.com/services/T000/B000/hooksecret"

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    notify.Options
		want []string // substrings of the error; none: valid
	}{
		{"bot token and channel", notify.Options{BotToken: botToken, Channel: channel}, nil},
		{"webhook", notify.Options{WebhookURL: hookURL}, nil},
		{"everything set", notify.Options{BotToken: botToken, Channel: channel, APIURL: "http://127.0.0.1:1/api",
			DashboardURL: "https://g.example.com/d/x?var-deployment={deployment}", StatusURL: "https://status.example.com",
			MinInterval: time.Second, Burst: 1, DedupWindow: time.Minute, QueueSize: 1, Timeout: time.Second,
			MaxAttempts: 1, RetryBackoff: time.Second}, nil},
		{"no destination", notify.Options{}, []string{"BotToken, WebhookURL: set one"}},
		{"both destinations", notify.Options{BotToken: botToken, Channel: channel, WebhookURL: hookURL}, []string{"BotToken, WebhookURL: set only one"}},
		{"token without channel", notify.Options{BotToken: botToken}, []string{"Channel: required with BotToken"}},
		{"token read with its newline", notify.Options{BotToken: botToken + "\n", Channel: channel}, []string{"BotToken: contains white space"}},
		{"channel with a webhook", notify.Options{WebhookURL: hookURL, Channel: channel}, []string{"Channel: an incoming webhook posts to the channel it was created for"}},
		{"webhook not a URL", notify.Options{WebhookURL: "hooks.slack.com/services/T000/B000/hooksecret"}, []string{"WebhookURL: must be an absolute http(s) URL"}},
		{"API URL with a webhook", notify.Options{WebhookURL: hookURL, APIURL: "http://127.0.0.1/"}, []string{"APIURL: only used with BotToken"}},
		{"bad links", notify.Options{WebhookURL: hookURL, DashboardURL: "grafana/d/x", StatusURL: "ftp://status"},
			[]string{`DashboardURL: must be an absolute http(s) URL without white space, got "grafana/d/x"`, "StatusURL:"}},
		{"negative numbers", notify.Options{WebhookURL: hookURL, MinInterval: -1, DedupWindow: -1, Timeout: -1,
			RetryBackoff: -1, Burst: -1, QueueSize: -1, MaxAttempts: -1},
			[]string{"MinInterval:", "DedupWindow:", "Timeout:", "RetryBackoff:", "Burst:", "QueueSize:", "MaxAttempts:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			_, newErr := notify.New(tc.o)
			if len(tc.want) == 0 {
				assert.NoError(t, err)
				assert.NoError(t, newErr)
				return
			}
			require.Error(t, err)
			require.Error(t, newErr, "New validates too")
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "hooksecret")
			assert.NotContains(t, err.Error(), botToken)
		})
	}
}

func TestOptionsHideSecrets(t *testing.T) {
	for _, o := range []notify.Options{
		{BotToken: botToken, Channel: channel},
		{WebhookURL: hookURL},
	} {
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "slack", o)
		for _, printed := range []string{buf.String(), fmt.Sprint(o), fmt.Sprintf("%+v", o)} {
			assert.NotContains(t, printed, "secret")
			assert.Contains(t, printed, "[redacted]")
		}
	}
}

func TestNewRegistersOnTheGivenRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, err := notify.New(notify.Options{WebhookURL: hookURL, Registerer: reg})
	require.NoError(t, err)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	assert.ElementsMatch(t, []string{"basin_slack_messages_total", "basin_slack_queue_length"}, names)

	_, err = notify.New(notify.Options{WebhookURL: hookURL, Registerer: reg})
	assert.ErrorContains(t, err, "register metrics", "a second notifier on the same registry is a configuration error")
}
