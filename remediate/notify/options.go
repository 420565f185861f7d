package notify

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for the zero fields of Options.
const (
	// DefaultMinInterval: sustained posts are at least 10 s apart (six a minute). Slack allows
	// about one message a second per channel; staying an order of magnitude under it means basin
	// never draws a 429 and never crowds out people or other bots in an on-call channel, while a
	// state change still reaches it within seconds.
	DefaultMinInterval = 10 * time.Second
	// DefaultBurst: five posts may go out back to back before spacing applies — one control step
	// can produce a transition and up to four actions (budget, shed, lending, pause), and those
	// belong together in the channel rather than trickling in over 40 s.
	DefaultBurst = 5
	// DefaultDedupWindow: a repeat of the latest message of its stream is suppressed for 10 min.
	// That is longer than the detector's longest hold (RecoverHold, 5 min), so a remediator that
	// re-asserts the same action at every 5 s step posts it once, and the channel is reminded
	// every 10 min while it stays in force.
	DefaultDedupWindow = 10 * time.Minute
	// DefaultQueueSize: 100 queued messages. Past the burst they drain at one per MinInterval,
	// so 100 is about a quarter of an hour of backlog; older news is worth less than the counted
	// drop that replaces it.
	DefaultQueueSize = 100
	// DefaultTimeout bounds one post (10 s). Slack answers in well under a second; the bound
	// keeps one hung connection from stalling the queue for long.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxAttempts: a post is tried at most three times, and only after a 429 or a 5xx.
	// Other failures (bad token, unknown channel, a timeout after which Slack may have posted
	// the message) are not retried: retrying would fail again or post twice.
	DefaultMaxAttempts = 3
	// DefaultRetryBackoff is the first wait before a retry (1 s, doubling) when Slack gives no
	// Retry-After.
	DefaultRetryBackoff = time.Second
	// maxRetryAfter is the longest Retry-After the sender honours by waiting; asked to wait longer,
	// it gives the message up rather than hold every queued message behind it.
	maxRetryAfter = time.Minute
	// dropLogInterval spaces the warnings about a full queue: a flood of drops is one log line a
	// minute with a count, not one line per drop.
	dropLogInterval = time.Minute
)

// Options configure a Notifier. Exactly one destination is set: BotToken with Channel (the Web
// API, chat.postMessage) or WebhookURL (an incoming webhook, which posts to the channel it was
// created for). Zero fields take the defaults above; New rejects bad values with the field's
// name. BotToken and WebhookURL are secrets: the Notifier never logs them, and Options print
// them redacted.
type Options struct {
	// BotToken is a Slack bot token (xoxb-…) with chat:write; requires Channel.
	BotToken string
	// Channel is the channel ID (C…) or name the bot posts to; the bot must be a member.
	Channel string
	// WebhookURL is an incoming-webhook URL (https://hooks.slack.com/services/…).
	WebhookURL string
	// APIURL overrides Slack's Web API base URL (https://slack.com/api/), for tests and proxies.
	APIURL string
	// DashboardURL and StatusURL, when set, are linked from every message. "{deployment}" in
	// either is replaced by the event's deployment, query-escaped, so one Grafana URL with
	// var-deployment={deployment} serves every deployment.
	DashboardURL, StatusURL string
	// MinInterval is the sustained spacing of posts (DefaultMinInterval).
	MinInterval time.Duration
	// Burst is how many posts may go out back to back before MinInterval applies (DefaultBurst).
	Burst int
	// DedupWindow is how long a repeat of its stream's latest message is suppressed
	// (DefaultDedupWindow).
	DedupWindow time.Duration
	// QueueSize bounds the messages waiting to be sent (DefaultQueueSize); Notify drops past it.
	QueueSize int
	// Timeout bounds one post attempt (DefaultTimeout).
	Timeout time.Duration
	// MaxAttempts bounds the tries of one post (DefaultMaxAttempts); 1 disables retries.
	MaxAttempts int
	// RetryBackoff is the first wait before retrying a 5xx or a 429 without Retry-After
	// (DefaultRetryBackoff); it doubles per attempt.
	RetryBackoff time.Duration
	// HTTPClient sends the posts (a client with its own transport when nil). Its Timeout, if
	// any, applies on top of Timeout.
	HTTPClient *http.Client
	// Logger receives failed and dropped posts (discarded when nil).
	Logger *slog.Logger
	// Registerer receives basin_slack_messages_total and basin_slack_queue_length; a private
	// registry when nil, never the default one unless passed.
	Registerer prometheus.Registerer
	// Now is the clock (time.Now when nil) of de-duplication, the rate limit and events without
	// a time.
	Now func() time.Time
}

// Validate reports every bad field of o, each error naming its field. Zero values are valid
// (they take the defaults); the destination is not: exactly one of BotToken (with Channel) and
// WebhookURL must be set. Errors never quote a secret.
func (o Options) Validate() error {
	var errs []error
	switch {
	case o.BotToken == "" && o.WebhookURL == "":
		errs = append(errs, errors.New("BotToken, WebhookURL: set one (a bot token with Channel, or an incoming-webhook URL)"))
	case o.BotToken != "" && o.WebhookURL != "":
		errs = append(errs, errors.New("BotToken, WebhookURL: set only one"))
	case o.BotToken != "":
		if strings.ContainsFunc(o.BotToken, isSpace) {
			errs = append(errs, errors.New("BotToken: contains white space (a trailing newline from a file?)"))
		}
		if o.Channel == "" {
			errs = append(errs, errors.New("Channel: required with BotToken"))
		}
	case o.WebhookURL != "":
		if err := checkURL(o.WebhookURL, false); err != nil {
			// The URL is the secret: say what is wrong with it, never what it is.
			errs = append(errs, errors.New("WebhookURL: must be an absolute http(s) URL without white space"))
		}
		if o.Channel != "" {
			errs = append(errs, errors.New("Channel: an incoming webhook posts to the channel it was created for; leave Channel empty"))
		}
	}
	if o.APIURL != "" {
		if o.WebhookURL != "" {
			errs = append(errs, errors.New("APIURL: only used with BotToken"))
		} else if err := checkURL(o.APIURL, true); err != nil {
			errs = append(errs, fmt.Errorf("APIURL: %w", err))
		}
	}
	if o.DashboardURL != "" {
		if err := checkURL(o.DashboardURL, true); err != nil {
			errs = append(errs, fmt.Errorf("DashboardURL: %w", err))
		}
	}
	if o.StatusURL != "" {
		if err := checkURL(o.StatusURL, true); err != nil {
			errs = append(errs, fmt.Errorf("StatusURL: %w", err))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"MinInterval", o.MinInterval}, {"DedupWindow", o.DedupWindow}, {"Timeout", o.Timeout}, {"RetryBackoff", o.RetryBackoff}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must be > 0 (or zero for the default), got %v", d.name, d.v))
		}
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"Burst", o.Burst}, {"QueueSize", o.QueueSize}, {"MaxAttempts", o.MaxAttempts}} {
		if c.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must be > 0 (or zero for the default), got %d", c.name, c.v))
		}
	}
	return errors.Join(errs...)
}

// checkURL accepts absolute http(s) URLs; echo says whether the error may quote the URL.
func checkURL(s string, echo bool) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsFunc(s, isSpace) {
		if echo {
			return fmt.Errorf("must be an absolute http(s) URL without white space, got %q", s)
		}
		return errors.New("must be an absolute http(s) URL")
	}
	return nil
}

func isSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' }

func (o Options) withDefaults() Options {
	if o.MinInterval == 0 {
		o.MinInterval = DefaultMinInterval
	}
	if o.Burst == 0 {
		o.Burst = DefaultBurst
	}
	if o.DedupWindow == 0 {
		o.DedupWindow = DefaultDedupWindow
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.RetryBackoff == 0 {
		o.RetryBackoff = DefaultRetryBackoff
	}
	if o.APIURL != "" && !strings.HasSuffix(o.APIURL, "/") {
		// slack-go appends the method name ("chat.postMessage") to the base URL as is.
		o.APIURL += "/"
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// LogValue keeps the secrets out of logs when Options themselves are logged.
func (o Options) LogValue() slog.Value {
	mode := "webhook"
	if o.BotToken != "" {
		mode = "bot"
	}
	return slog.GroupValue(
		slog.String("mode", mode),
		slog.String("channel", o.Channel),
		slog.String("bot_token", redact(o.BotToken)),
		slog.String("webhook_url", redact(o.WebhookURL)),
		slog.String("dashboard_url", o.DashboardURL),
		slog.String("status_url", o.StatusURL),
		slog.Duration("min_interval", o.MinInterval),
		slog.Duration("dedup_window", o.DedupWindow),
	)
}

// String keeps the secrets out of fmt's %v and %s.
func (o Options) String() string {
	return fmt.Sprintf("notify.Options{Channel:%q BotToken:%s WebhookURL:%s DashboardURL:%q StatusURL:%q}",
		o.Channel, redact(o.BotToken), redact(o.WebhookURL), o.DashboardURL, o.StatusURL)
}

func redact(secret string) string {
	if secret == "" {
		return ""
	}
	return "[redacted]"
}
