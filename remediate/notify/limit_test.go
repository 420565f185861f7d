package notify

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)

// admitted replays arrivals through a limiter the way Run does (wait, then take) and returns
// when each was posted.
func admitted(l *limiter, arrivals []time.Duration) []time.Duration {
	var out []time.Duration
	clock := t0
	for _, a := range arrivals {
		if at := t0.Add(a); at.After(clock) {
			clock = at
		}
		if w := l.wait(clock); w > 0 {
			clock = clock.Add(w)
		}
		l.take(clock)
		out = append(out, clock.Sub(t0))
	}
	return out
}

func TestLimiterSpacesPosts(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name     string
		burst    int
		arrivals []time.Duration
		want     []time.Duration
	}{
		{"burst 1 spaces every post", 1, []time.Duration{0, 0, 0, 0}, []time.Duration{0, 10 * s, 20 * s, 30 * s}},
		{"a burst goes out together, then spacing", 3, []time.Duration{0, 0, 0, 0, 0}, []time.Duration{0, 0, 0, 10 * s, 20 * s}},
		{"sparse posts are not delayed", 3, []time.Duration{0, 15 * s, 40 * s, 90 * s}, []time.Duration{0, 15 * s, 40 * s, 90 * s}},
		{"the burst refills with quiet time", 2, []time.Duration{0, 0, 0, 60 * s, 60 * s, 60 * s}, []time.Duration{0, 0, 10 * s, 60 * s, 60 * s, 70 * s}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &limiter{interval: 10 * s, burst: tc.burst}
			assert.Equal(t, tc.want, admitted(l, tc.arrivals))
		})
	}
}

func TestLimiterHoldUntil(t *testing.T) {
	l := &limiter{interval: 10 * time.Second, burst: 5}
	l.take(t0)
	l.holdUntil(t0.Add(30 * time.Second)) // a 429 with Retry-After: 30
	assert.Equal(t, 30*time.Second, l.wait(t0), "nothing before Retry-After")
	l.take(t0.Add(30 * time.Second))
	assert.Equal(t, 10*time.Second, l.wait(t0.Add(30*time.Second)), "no burst right after a 429")

	l.holdUntil(t0) // an earlier hold never loosens the limit
	assert.Equal(t, 10*time.Second, l.wait(t0.Add(30*time.Second)))
}

func TestDedup(t *testing.T) {
	pressure := Event{Kind: KindTransition, Deployment: "prod", From: "healthy", To: "pressure", WorkingSetOverCache: 1.1}
	back := Event{Kind: KindTransition, Deployment: "prod", From: "pressure", To: "healthy"}
	other := Event{Kind: KindTransition, Deployment: "staging", From: "healthy", To: "pressure"}
	budget := Event{Kind: KindAction, Deployment: "prod", Action: "budget", Before: "1.2M tokens", After: "1.0M tokens", HitRate: 0.8}
	shed := Event{Kind: KindAction, Deployment: "prod", Action: "shed", Before: "40", After: "20"}
	type step struct {
		at   time.Duration
		ev   Event
		want bool // duplicate
	}
	m := time.Minute
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a repeat within the window is suppressed, even with other measurements", []step{
			{0, pressure, false},
			{m, withNumbers(pressure, 1.3, 0.7), true},
			{9 * m, pressure, true},
		}},
		{"the window is counted from the post", []step{{0, pressure, false}, {10 * m, pressure, false}}},
		{"a state that flaps back is reported", []step{{0, pressure, false}, {m, back, false}, {2 * m, pressure, false}}},
		{"deployments are separate streams", []step{{0, pressure, false}, {0, other, false}}},
		{"actions are separate streams", []step{{0, budget, false}, {0, shed, false}, {m, budget, true}, {m, shed, true}}},
		{"a changed action is posted", []step{{0, budget, false}, {m, withAfter(budget, "0.8M tokens"), false}}},
		{"a dry run and a real run differ", []step{{0, budget, false}, {m, withDryRun(budget), false}}},
		{"an explicit Key decides", []step{
			{0, withKey(pressure, "k"), false},
			{m, withKey(back, "k"), true},
			{m, back, false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &dedup{window: 10 * m}
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				dup := d.duplicate(s.ev, now)
				assert.Equal(t, s.want, dup, "step %d", i)
				if !dup {
					d.record(s.ev, now)
				}
			}
		})
	}
}

func TestDedupForgetsQuietStreams(t *testing.T) {
	d := &dedup{window: time.Minute}
	for i, dep := range []string{"a", "b", "c"} {
		d.record(Event{Kind: KindTransition, Deployment: dep}, t0.Add(time.Duration(i)*time.Hour))
	}
	assert.Len(t, d.last, 1, "streams quiet for longer than the window are forgotten")
}

func withNumbers(ev Event, wc, hit float64) Event {
	ev.WorkingSetOverCache, ev.HitRate = wc, hit
	return ev
}
func withAfter(ev Event, after string) Event { ev.After = after; return ev }
func withDryRun(ev Event) Event              { ev.DryRun = true; return ev }
func withKey(ev Event, k string) Event       { ev.Key = k; return ev }

// fakeSlack records what Run posts, with the bubble's clock.
type fakeSlack struct {
	mu    sync.Mutex
	posts []fakePost
	block chan struct{} // when non-nil, a post waits for it (or for its context)
}

type fakePost struct {
	at   time.Time
	text string
}

func (f *fakeSlack) post(ctx context.Context, m message) error {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.posts = append(f.posts, fakePost{at: time.Now(), text: m.text})
	return nil
}

func (f *fakeSlack) times(start time.Time) []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Duration
	for _, p := range f.posts {
		out = append(out, p.at.Sub(start))
	}
	return out
}

// startRun runs n.Run in the bubble until the test function returns.
func startRun(t *testing.T, n *Notifier) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
}

// TestRunSpacesAndDeduplicates runs the real sender loop in fake time: a burst of five goes out
// at once, the rest 10 s apart, and repeats never reach Slack.
func TestRunSpacesAndDeduplicates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		n, err := New(Options{BotToken: "xoxb-test", Channel: "C1", Registerer: reg})
		require.NoError(t, err)
		fake := &fakeSlack{}
		n.post = fake.post
		startRun(t, n)

		start := time.Now()
		for i, act := range []string{"budget", "shed", "lending", "pause", "a", "b", "c"} {
			n.Notify(Event{Kind: KindAction, Deployment: "prod", Action: act, After: "x"})
			if i == 0 {
				n.Notify(Event{Kind: KindAction, Deployment: "prod", Action: act, After: "x"}) // a repeat
			}
		}
		time.Sleep(time.Minute)
		synctest.Wait()

		s := time.Second
		assert.Equal(t, []time.Duration{0, 0, 0, 0, 0, 10 * s, 20 * s}, fake.times(start))
		assert.Equal(t, 7.0, testutil.ToFloat64(n.metrics.messages.WithLabelValues("action", "sent")))
		assert.Equal(t, 1.0, testutil.ToFloat64(n.metrics.messages.WithLabelValues("action", "deduplicated")))
	})
}

// TestNotifyNeverBlocks: with Slack hanging, Notify still returns at once; what does not fit
// the queue is dropped and counted, and Run's stop drops the rest.
func TestNotifyNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, err := New(Options{BotToken: "xoxb-test", Channel: "C1", QueueSize: 3, Timeout: time.Hour})
		require.NoError(t, err)
		fake := &fakeSlack{block: make(chan struct{})}
		n.post = fake.post
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- n.Run(ctx) }()

		start := time.Now()
		for i := range 10 {
			n.Notify(Event{Kind: KindTransition, Deployment: "prod", To: string(rune('a' + i))})
			synctest.Wait() // Run takes the first event and hangs in the post
		}
		assert.Equal(t, start, time.Now(), "Notify did not wait")
		// One in the hung post, three queued, six dropped.
		assert.Equal(t, 6.0, testutil.ToFloat64(n.metrics.messages.WithLabelValues("transition", "dropped")))

		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, 9.0, testutil.ToFloat64(n.metrics.messages.WithLabelValues("transition", "dropped")),
			"the three queued are dropped at shutdown")
		assert.Equal(t, 1.0, testutil.ToFloat64(n.metrics.messages.WithLabelValues("transition", "failed")),
			"the post in flight fails")
	})
}

func TestRunTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, err := New(Options{WebhookURL: "https://hooks.example.com/services/x"})
		require.NoError(t, err)
		startRun(t, n)
		synctest.Wait()
		assert.Error(t, n.Run(t.Context()))
	})
}

func TestNilNotifier(t *testing.T) {
	var n *Notifier
	assert.NotPanics(t, func() { n.Notify(Event{Kind: KindTransition}) })
	assert.NoError(t, n.PostSummary(t.Context(), Summary{}))
}
