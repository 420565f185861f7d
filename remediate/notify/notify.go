// Package notify tells people in Slack what basin's detector saw and what the remediator did:
// one message for each state transition and each remediation action, and a daily summary.
//
// The one rule it is built around is that Slack must never slow remediation down. Notify only
// puts a copy of the event on a bounded queue and returns; when the queue is full the event is
// dropped and counted (basin_slack_messages_total{result="dropped"}). A single sender
// goroutine, Run, takes events off the queue, suppresses repeats, spaces the posts and sends
// them with slack-go — through the Web API (a bot token and a channel) or an incoming webhook.
// A post that fails is logged and counted; only a 429 (Slack's rate limit, honouring its
// Retry-After) or a 5xx is retried, a bounded number of times. PostSummary, for the daily cron
// job, is synchronous; each of its attempts is bounded by the same per-post timeout and the
// whole call by its context.
//
// De-duplication works per stream — one deployment's state, or one of its actions — and drops
// a message only while it repeats the latest message posted on that stream within DedupWindow.
// So a remediator that re-asserts the same budget every control step posts it once, but a state
// that flaps back is always reported: the channel's newest word on a deployment is never stale.
// Only posts that reached Slack are remembered, so the next repeat of a failed one is tried.
//
// Rate limiting lets a burst through (a transition and the actions it triggered arrive
// together) and then spaces posts MinInterval apart, far below Slack's own limit. The decisions
// are pure functions of an injected clock; the messages' blocks come from the pure Blocks and
// SummaryBlocks, so both can be tested without Slack.
//
// The package imports nothing else from basin: the remediator converts its own types to Event,
// which keeps the dependency one-way.
package notify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slack-go/slack"
)

// EventKind says what an Event reports.
type EventKind string

// The kinds of Event.
const (
	// KindTransition: the detector moved the deployment from one state to another.
	KindTransition EventKind = "transition"
	// KindAction: the remediator acted (or, in a dry run, would have).
	KindAction EventKind = "action"
)

// Event is one thing worth telling the channel. Zero measurements are treated as unknown and
// left out of the message (see Blocks).
type Event struct {
	Kind EventKind
	// At is when it happened (the Notifier's clock when zero). The message shows it because
	// rate limiting may post it later.
	At time.Time
	// Deployment names the deployment in the header and selects the dashboard link.
	Deployment string
	// From and To are detector states (healthy, pressure, drifting, trapped, recovering). An
	// action's To is the state it acted in and picks the header's emoji.
	From, To string
	// WorkingSetOverCache is W/C; KneeRatio is the knee in the same units.
	WorkingSetOverCache, KneeRatio float64
	// HitRate and Plateau are fractions (0.31, not 31).
	HitRate, Plateau float64
	// Action is the remediation: budget, shed, lending or pause (other names are shown as is).
	Action string
	// Before and After describe the change in words, e.g. "1.2M tokens" → "1.0M tokens".
	Before, After string
	// Reasons are the detector's or remediator's explanations, one line each; the message
	// shows as many as fit Slack's 3000 characters and counts the rest.
	Reasons []string
	// DryRun marks an action that was only logged; the message says nothing was changed.
	DryRun bool
	// Key, when set, replaces the de-duplication derived from the content: events with the same
	// Key within DedupWindow are posted once.
	Key string
}

// Summary is a period's account of one deployment, for PostSummary.
type Summary struct {
	// Deployment is named in the header and selects the dashboard link.
	Deployment string
	// From and To bound the period the summary covers.
	From, To time.Time
	// TimeInState is the time spent in each detector state.
	TimeInState map[string]time.Duration
	// Incidents is the number of incidents in the period, as the caller counts them.
	Incidents int
	// Actions counts the remediation actions by name (budget, shed, lending, pause).
	Actions map[string]int
	// GoodputPerHour is completed sessions per hour; nil when not known, which the message says.
	GoodputPerHour *float64
	// Notes are free-form remarks, one line each, shown as a list.
	Notes []string
}

// message is one rendered post.
type message struct {
	kind   string
	text   string
	blocks []slack.Block
}

// Notifier posts events to Slack. Notify may be called from any goroutine; Run must be running
// for queued events to be sent. A nil *Notifier ignores events, so the remediator can hold one
// unconditionally whether Slack is configured or not.
type Notifier struct {
	opts    Options
	queue   chan Event
	metrics *metrics
	running atomic.Bool
	// post sends one message; a field so tests can replace Slack.
	post func(ctx context.Context, m message) error

	// Only Run's goroutine touches these.
	limit limiter
	dedup dedup

	mu struct {
		sync.Mutex
		dropped    int       // drops since the last warning
		droppedLog time.Time // when the last warning was logged
	}
}

// New checks o and returns a Notifier; call Run to start sending.
func New(o Options) (*Notifier, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("notify options: %w", err)
	}
	o = o.withDefaults()
	n := &Notifier{
		opts:  o,
		queue: make(chan Event, o.QueueSize),
		limit: limiter{interval: o.MinInterval, burst: o.Burst},
		dedup: dedup{window: o.DedupWindow},
	}
	m, err := newMetrics(o.Registerer, func() float64 { return float64(len(n.queue)) })
	if err != nil {
		return nil, err
	}
	n.metrics = m
	if o.BotToken != "" {
		opts := []slack.Option{slack.OptionHTTPClient(o.HTTPClient)}
		if o.APIURL != "" {
			opts = append(opts, slack.OptionAPIURL(o.APIURL))
		}
		// No slack.OptionRetry: retries are ours, so they are bounded, counted and the same
		// for both destinations, and a 429's wait also holds back the messages queued behind it.
		api := slack.New(o.BotToken, opts...)
		n.post = func(ctx context.Context, m message) error {
			_, _, err := api.PostMessageContext(ctx, o.Channel,
				slack.MsgOptionText(m.text, false),
				slack.MsgOptionBlocks(m.blocks...),
				// Links to the dashboard would otherwise unfurl into a preview on every message.
				slack.MsgOptionDisableLinkUnfurl(),
				slack.MsgOptionDisableMediaUnfurl())
			return err
		}
	} else {
		no := false
		n.post = func(ctx context.Context, m message) error {
			// The CustomHTTP variant: PostWebhookContext uses http.DefaultClient.
			return slack.PostWebhookCustomHTTPContext(ctx, o.WebhookURL, o.HTTPClient, &slack.WebhookMessage{
				Text:        m.text,
				Blocks:      &slack.Blocks{BlockSet: m.blocks},
				UnfurlLinks: &no,
				UnfurlMedia: &no,
			})
		}
	}
	return n, nil
}

// Notify queues ev for Run and returns at once; it never waits for Slack. When the queue is
// full the event is dropped, counted and logged (at most once a minute, with the count).
func (n *Notifier) Notify(ev Event) {
	if n == nil {
		return
	}
	if ev.At.IsZero() {
		ev.At = n.opts.Now()
	}
	ev.Reasons = slices.Clone(ev.Reasons) // the caller may reuse its slice
	select {
	case n.queue <- ev:
	default:
		n.metrics.count(kindLabel(ev.Kind), resultDropped)
		n.noteDrop(ev)
	}
}

// noteDrop logs a dropped event when the last warning is a minute old, with the drops since.
func (n *Notifier) noteDrop(ev Event) {
	now := n.opts.Now()
	n.mu.Lock()
	n.mu.dropped++
	dropped := n.mu.dropped
	logIt := n.mu.droppedLog.IsZero() || now.Sub(n.mu.droppedLog) >= dropLogInterval
	if logIt {
		n.mu.dropped = 0
		n.mu.droppedLog = now
	}
	n.mu.Unlock()
	if logIt {
		n.opts.Logger.Warn("slack queue full, messages dropped",
			"dropped", dropped, "queue_size", n.opts.QueueSize, "kind", ev.Kind, "deployment", ev.Deployment)
	}
}

// Run sends queued events until ctx is done, then returns nil; events still queued are dropped
// and counted. It is the only sender, so de-duplication and rate limiting need no locks. Run
// may not be called twice at once.
func (n *Notifier) Run(ctx context.Context) error {
	if !n.running.CompareAndSwap(false, true) {
		return errors.New("notify: Run is already running")
	}
	defer n.running.Store(false)
	for {
		select {
		case <-ctx.Done():
			n.discard()
			return nil
		case ev := <-n.queue:
			n.handle(ctx, ev)
		}
	}
}

// discard empties the queue at shutdown, counting what it throws away.
func (n *Notifier) discard() {
	left := 0
	for {
		select {
		case ev := <-n.queue:
			n.metrics.count(kindLabel(ev.Kind), resultDropped)
			left++
		default:
			if left > 0 {
				n.opts.Logger.Warn("slack notifier stopped with messages unsent", "dropped", left)
			}
			return
		}
	}
}

// handle de-duplicates, waits for the rate limit and posts one event.
func (n *Notifier) handle(ctx context.Context, ev Event) {
	kind := kindLabel(ev.Kind)
	if n.dedup.duplicate(ev, n.opts.Now()) {
		n.metrics.count(kind, resultDeduplicated)
		n.opts.Logger.Debug("slack message suppressed as a repeat", "kind", ev.Kind, "deployment", ev.Deployment)
		return
	}
	if !sleep(ctx, n.limit.wait(n.opts.Now())) {
		n.metrics.count(kind, resultDropped)
		return
	}
	n.limit.take(n.opts.Now())
	m := message{kind: kind, text: Fallback(ev), blocks: Blocks(ev, n.opts)}
	err := n.send(ctx, m, ev.Deployment)
	if err == nil {
		n.dedup.record(ev, n.opts.Now())
		return
	}
	var rl *slack.RateLimitedError
	if errors.As(err, &rl) {
		// Slack's limit is the channel's, not this message's: hold back the queued ones too.
		n.limit.holdUntil(n.opts.Now().Add(rl.RetryAfter))
	}
}

// PostSummary posts s now, bypassing the queue and the rate limit (it is one message a day),
// with the same bounded retries as Run. Each attempt is bounded by Options.Timeout, the whole
// call by ctx. Its error is for the cron job's log; it never affects remediation.
func (n *Notifier) PostSummary(ctx context.Context, s Summary) error {
	if n == nil {
		return nil
	}
	return n.send(ctx, message{kind: kindSummary, text: SummaryFallback(s), blocks: SummaryBlocks(s, n.opts)}, s.Deployment)
}

// send posts m with bounded retries and counts the outcome. Errors are logged with the secrets
// removed: a transport error quotes the webhook URL, which is itself the credential.
func (n *Notifier) send(ctx context.Context, m message, deployment string) error {
	var err error
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, n.opts.Timeout)
		err = n.post(actx, m)
		cancel()
		if err == nil {
			n.metrics.count(m.kind, resultSent)
			return nil
		}
		err = n.redact(err)
		wait, retry := n.retryAfter(err, attempt)
		if !retry || attempt >= n.opts.MaxAttempts || ctx.Err() != nil {
			break
		}
		n.opts.Logger.Info("slack post failed, retrying",
			"kind", m.kind, "deployment", deployment, "attempt", attempt, "retry_in", wait, "err", err)
		if !sleep(ctx, wait) {
			break
		}
	}
	result := resultFailed
	if isRateLimited(err) {
		result = resultRateLimited
	}
	// Logged before it is counted: whoever sees the failure in the counter finds it in the log
	// (TestWebhookFailureKeepsTheURLSecret read the log as the counter moved and found it empty).
	n.opts.Logger.Warn("slack post failed", "kind", m.kind, "deployment", deployment, "result", result, "err", err)
	n.metrics.count(m.kind, result)
	return fmt.Errorf("post %s message to slack: %w", m.kind, err)
}

// retryAfter says whether err is worth another attempt and after how long: a 429 after its
// Retry-After (given up when that is over a minute away), a 5xx after an exponential backoff.
// Anything else — a bad token, an unknown channel, a timeout after which Slack may have posted
// after all — is not retried.
func (n *Notifier) retryAfter(err error, attempt int) (time.Duration, bool) {
	backoff := n.opts.RetryBackoff << (attempt - 1)
	var rl *slack.RateLimitedError
	if errors.As(err, &rl) {
		if rl.RetryAfter > maxRetryAfter {
			return 0, false
		}
		return max(rl.RetryAfter, backoff), true
	}
	var sc slack.StatusCodeError
	if errors.As(err, &sc) && (sc.Code == 429 || sc.Code >= 500) {
		return backoff, true
	}
	return 0, false
}

func isRateLimited(err error) bool {
	var rl *slack.RateLimitedError
	var sc slack.StatusCodeError
	return errors.As(err, &rl) || (errors.As(err, &sc) && sc.Code == 429)
}

// redact removes the secrets from err's text while keeping it unwrappable.
func (n *Notifier) redact(err error) error {
	for _, s := range []string{n.opts.WebhookURL, n.opts.BotToken} {
		if s != "" && strings.Contains(err.Error(), s) {
			return redactedError{err: err, secret: s}
		}
	}
	return err
}

type redactedError struct {
	err    error
	secret string
}

func (e redactedError) Error() string {
	return strings.ReplaceAll(e.err.Error(), e.secret, "[redacted]")
}
func (e redactedError) Unwrap() error { return e.err }

// kindLabel bounds the kind label to known values: the kind comes from the caller.
func kindLabel(k EventKind) string {
	switch k {
	case KindTransition, KindAction:
		return string(k)
	default:
		return "other"
	}
}

// sleep waits d, or until ctx is done; it reports whether the wait completed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
