package notify

import (
	"strconv"
	"strings"
	"time"
)

// limiter spaces posts: a burst of up to burst posts, then one per interval. It is the generic
// cell rate algorithm — a theoretical arrival time tat advanced by interval per post — so the
// arithmetic is exact durations, not a refilled float that can be a nanosecond short. Not safe
// for concurrent use: only Run's goroutine touches it.
type limiter struct {
	interval time.Duration
	burst    int
	tat      time.Time // the zero time: nothing sent yet, the whole burst is available
}

// wait is how long from now until a post is allowed (zero or less: now).
func (l *limiter) wait(now time.Time) time.Duration {
	if l.tat.IsZero() {
		return 0
	}
	tolerance := time.Duration(l.burst-1) * l.interval
	return l.tat.Sub(now) - tolerance
}

// take records a post at now.
func (l *limiter) take(now time.Time) {
	if l.tat.Before(now) {
		l.tat = now
	}
	l.tat = l.tat.Add(l.interval)
}

// holdUntil allows no post before t (Slack's Retry-After), and then none of the burst: after a
// 429 the channel should be approached one post at a time.
func (l *limiter) holdUntil(t time.Time) {
	tolerance := time.Duration(l.burst-1) * l.interval
	if t = t.Add(tolerance); l.tat.Before(t) {
		l.tat = t
	}
}

// dedup suppresses a message that repeats the latest posted message of its stream within
// window. The stream is what a message speaks about (one deployment's state, or one of its
// actions); the key is what it says. Only a repeat of the latest word is suppressed: after
// healthy → pressure → healthy, a second healthy → pressure is posted even within the window,
// because suppressing it would leave the channel saying healthy while the deployment is not.
// Not safe for concurrent use: only Run's goroutine touches it.
type dedup struct {
	window time.Duration
	last   map[string]posted // by stream
}

type posted struct {
	key string
	at  time.Time
}

// duplicate says whether ev repeats its stream's latest posted message within the window.
func (d *dedup) duplicate(ev Event, now time.Time) bool {
	stream, key := dedupKey(ev)
	p, ok := d.last[stream]
	return ok && p.key == key && now.Sub(p.at) < d.window
}

// record notes that ev was posted at now, and forgets streams quiet for longer than the window
// so the map stays as small as the set of recently active streams.
func (d *dedup) record(ev Event, now time.Time) {
	if d.last == nil {
		d.last = make(map[string]posted)
	}
	for s, p := range d.last {
		if now.Sub(p.at) >= d.window {
			delete(d.last, s)
		}
	}
	stream, key := dedupKey(ev)
	d.last[stream] = posted{key: key, at: now}
}

// dedupKey returns ev's stream and key. An explicit Event.Key is both (the caller decides what
// counts as the same message). Otherwise the stream is kind, deployment and action, and the key
// adds what changed — states, before and after, dry run — but not the measurements or the
// reasons, which differ in their digits from one control step to the next while saying the
// same thing.
func dedupKey(ev Event) (stream, key string) {
	if ev.Key != "" {
		k := "key\x00" + ev.Key
		return k, k
	}
	stream = strings.Join([]string{string(ev.Kind), ev.Deployment, ev.Action}, "\x00")
	key = strings.Join([]string{stream, ev.From, ev.To, ev.Before, ev.After, strconv.FormatBool(ev.DryRun)}, "\x00")
	return stream, key
}
