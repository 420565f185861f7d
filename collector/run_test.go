package collector

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTripFunc is an in-process transport: Run's HTTP stays inside the synctest bubble without
// a network.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// fakeEngines answers scrapes of hosts "<name>.test" from families that advance on every scrape,
// and records when each was scraped.
type fakeEngines struct {
	t     *testing.T
	start time.Time
	mu    sync.Mutex
	fams  map[string]fams
	// advance changes a target's families before each answer.
	advance map[string]func(f fams)
	// down makes a target answer 503; hang makes it block until the request is cancelled.
	down, hang map[string]bool
	scrapes    map[string][]time.Duration
}

func newFakeEngines(t *testing.T) *fakeEngines {
	return &fakeEngines{t: t, start: time.Now(), fams: map[string]fams{}, advance: map[string]func(fams){},
		down: map[string]bool{}, hang: map[string]bool{}, scrapes: map[string][]time.Duration{}}
}

func (e *fakeEngines) client() *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		name := strings.TrimSuffix(r.URL.Hostname(), ".test")
		e.mu.Lock()
		e.scrapes[name] = append(e.scrapes[name], time.Since(e.start))
		hang := e.hang[name]
		e.mu.Unlock()
		if hang {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		// The engine keeps serving while its /metrics fails.
		f := e.fams[name]
		if adv := e.advance[name]; adv != nil {
			adv(f)
		}
		if e.down[name] {
			return response(r, http.StatusServiceUnavailable, "text/plain", []byte("scheduler down")), nil
		}
		return response(r, http.StatusOK, "text/plain; version=0.0.4; charset=utf-8", text(e.t, f)), nil
	})}
}

func response(r *http.Request, code int, contentType string, body []byte) *http.Response {
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {contentType}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       r,
	}
}

func (e *fakeEngines) set(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f()
}

func (e *fakeEngines) times(name string) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Duration(nil), e.scrapes[name]...)
}

// TestRunCadenceAndStaleness runs minutes of fake time: every target is scraped every interval
// on the dot; a decode instance that stops answering at 30 s turns its signals Stale after three
// intervals and OK again when it answers; a target added to the file at 12 s is scraped from the
// next round.
func TestRunCadenceAndStaleness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newFakeEngines(t)
		e.fams["prefill-0"] = fixture(t, "sglang_pd_prefill")
		e.fams["decode-0"] = fixture(t, "sglang_pd_decode")
		e.fams["gateway"] = fixture(t, "gateway")
		e.fams["decode-1"] = fixture(t, "sglang_pd_decode")
		e.advance["decode-0"] = func(f fams) {
			bump(t, f, sgRequests, map[string]string{"is_streaming": "true"}, 50) // 10 calls/s
		}
		e.advance["prefill-0"] = func(f fams) {
			bump(t, f, sgEffective, map[string]string{"mode": "device_hit"}, 3000)
			bump(t, f, sgEffective, map[string]string{"mode": "input"}, 1000)
		}
		dir := t.TempDir()
		file := filepath.Join(dir, "targets.json")
		require.NoError(t, os.WriteFile(file, []byte("[]"), 0o600))

		var logs bytes.Buffer
		c, reg, err := newRunCollector(Options{
			HTTPClient: e.client(), TargetFile: file, Logger: slogTo(&logs),
			Targets: []Target{
				{Name: "prefill-0", URL: "http://prefill-0.test/metrics", Role: RolePrefill},
				{Name: "decode-0", URL: "http://decode-0.test/metrics", Role: RoleDecode},
				{Name: "gateway", URL: "http://gateway.test/metrics", Role: RoleGateway},
			},
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()

		// at sleeps until the given offset from the start (between scrape instants).
		at := func(d time.Duration) Snapshot {
			time.Sleep(time.Until(e.start.Add(d)))
			synctest.Wait()
			return c.Snapshot()
		}

		snap := at(500 * time.Millisecond)
		assert.Equal(t, OK, snap.State(DecodeCapacity))
		assert.Equal(t, Missing, snap.State(CallRate), "one scrape is no rate")
		snap = at(5500 * time.Millisecond)
		assertSignals(t, snap, map[Signal]want{CallRate: ok(10), HitRate: ok(0.75), WorkingSet: ok(1_412_000)})

		at(12 * time.Second)
		require.NoError(t, os.WriteFile(file, []byte(`[{"targets": ["decode-1.test"], "labels": {"role": "decode", "name": "decode-1"}}]`), 0o600))

		at(29500 * time.Millisecond)
		e.set(func() { e.down["decode-0"] = true })
		snap = at(40 * time.Second)
		// Last good scrape at 25 s: at 40 s it is exactly three intervals old.
		assert.Equal(t, OK, snap.State(DecodeFree))
		snap = at(40500 * time.Millisecond)
		// With the gateway's sticky routing on, decode-0's retained KV is part of the cache
		// capacity, which therefore goes stale with it.
		for _, sig := range []Signal{DecodeFree, DecodeCapacity, CallRate, EngineQueue, KVUsageMax, CacheCapacity} {
			assert.Equal(t, Stale, snap.State(sig), "%s after decode-0 stopped", sig)
		}
		for _, sig := range []Signal{HitRate, WorkingSet, LiveSessions} {
			assert.Equal(t, OK, snap.State(sig), "%s does not depend on decode-0", sig)
		}
		assert.Equal(t, 2*372_000.0, snap.Signals[DecodeFree].V, "the last good data is kept")

		at(59500 * time.Millisecond)
		e.set(func() { delete(e.down, "decode-0") })
		snap = at(60500 * time.Millisecond)
		for _, sig := range []Signal{DecodeFree, DecodeCapacity, EngineQueue, KVUsageMax} {
			assert.Equal(t, OK, snap.State(sig), "%s after decode-0 is back", sig)
		}
		// 10 calls/s over the window 0…60 s, despite the 30 s gap.
		assertSignals(t, snap, map[Signal]want{CallRate: ok(10)})

		at(120500 * time.Millisecond)
		cancel()
		require.NoError(t, <-done)

		var want []time.Duration
		for s := time.Duration(0); s <= 120*time.Second; s += 5 * time.Second {
			want = append(want, s)
		}
		for _, name := range []string{"prefill-0", "decode-0", "gateway"} {
			assert.Equal(t, want, e.times(name), "%s scraped every interval", name)
		}
		assert.Equal(t, want[3:], e.times("decode-1"), "file target scraped from the round after it appeared")

		n, _ := metricValue(gather(t, reg), "basin_scrape_errors_total", map[string]string{"target": "decode-0", "reason": reasonStatus})
		assert.Equal(t, 6.0, n, "30, 35, …, 55 s")
		assert.Equal(t, 1, strings.Count(logs.String(), "scrape failed; keeping"), "one warning per outage")
		assert.Equal(t, 1, strings.Count(logs.String(), "scrape recovered"))
	})
}

// TestRunTimeout: a hanging target is cut at Timeout without delaying the others or the
// cadence; its signals go stale.
func TestRunTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newFakeEngines(t)
		e.fams["prefill-0"] = fixture(t, "sglang_pd_prefill")
		e.fams["decode-0"] = fixture(t, "sglang_pd_decode")
		c, reg, err := newRunCollector(Options{
			HTTPClient: e.client(), Interval: 10 * time.Second, Timeout: 3 * time.Second, StaleAfter: 2,
			Targets: []Target{
				{Name: "prefill-0", URL: "http://prefill-0.test/metrics", Role: RolePrefill},
				{Name: "decode-0", URL: "http://decode-0.test/metrics", Role: RoleDecode},
			},
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()

		time.Sleep(time.Second)
		e.set(func() { e.hang["decode-0"] = true })
		time.Sleep(time.Until(e.start.Add(35 * time.Second)))
		snap := c.Snapshot()
		assert.Equal(t, Stale, snap.State(DecodeCapacity), "last answer at 0 s, stale after 20 s")
		assert.Equal(t, OK, snap.State(CacheCapacity))
		cancel()
		require.NoError(t, <-done)

		want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 30 * time.Second}
		assert.Equal(t, want, e.times("prefill-0"))
		assert.Equal(t, want, e.times("decode-0"))
		fams := gather(t, reg)
		n, _ := metricValue(fams, "basin_scrape_errors_total", map[string]string{"target": "decode-0", "reason": reasonTimeout})
		assert.Equal(t, 3.0, n)
		// The duration histogram saw three scrapes of exactly the timeout.
		for _, m := range fams["basin_scrape_duration_seconds"].GetMetric() {
			if labelValue(m, "target") == "decode-0" {
				assert.Equal(t, uint64(4), m.GetHistogram().GetSampleCount())
				assert.InDelta(t, 9.0, m.GetHistogram().GetSampleSum(), 1e-9)
			}
		}
	})
}

// newRunCollector is newTest without the fixed clock: inside a bubble, time.Now is fake.
func newRunCollector(o Options) (*Collector, *prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	o.Registerer = reg
	c, err := New(o)
	return c, reg, err
}

// TestRunOnAFasterClock: a collector on a clock ten times faster than the wall clock (a simulated
// deployment served at 10×) scrapes every Interval of that clock's time — every half wall second
// for 5 s — and reads rates per second of it, but cuts a hanging target at Timeout of wall time:
// the network is no faster for a fast deployment (cut at Timeout/10, a busy simulated engine
// timed out on most scrapes).
func TestRunOnAFasterClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const speed = 10
		e := newFakeEngines(t)
		e.fams["prefill-0"] = fixture(t, "sglang_pd_prefill")
		e.fams["decode-0"] = fixture(t, "sglang_pd_decode")
		e.advance["decode-0"] = func(f fams) {
			bump(t, f, sgRequests, map[string]string{"is_streaming": "true"}, 50) // 50 calls per 5 s of the clock
		}
		fast := func() time.Time { return e.start.Add(speed * time.Since(e.start)) }
		c, reg, err := newRunCollector(Options{
			HTTPClient: e.client(), Timeout: 3 * time.Second, Now: fast,
			WallDuration: func(d time.Duration) time.Duration { return d / speed },
			Targets: []Target{
				{Name: "prefill-0", URL: "http://prefill-0.test/metrics", Role: RolePrefill},
				{Name: "decode-0", URL: "http://decode-0.test/metrics", Role: RoleDecode},
			},
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()

		time.Sleep(1250 * time.Millisecond) // 12.5 s of the clock: scrapes at 0, 5 and 10 s
		synctest.Wait()
		snap := c.Snapshot()
		assertSignals(t, snap, map[Signal]want{CallRate: ok(10)})
		assert.Equal(t, fast(), snap.At)

		e.set(func() { e.hang["prefill-0"] = true })
		time.Sleep(time.Until(e.start.Add(4600 * time.Millisecond)))
		synctest.Wait()
		// The scrape of the hanging prefill-0 at 1.5 s was cut 3 s of wall time later, at 4.5 s
		// (the round waited for it; the next began at once).
		n, _ := metricValue(gather(t, reg), "basin_scrape_errors_total", map[string]string{"target": "prefill-0", "reason": reasonTimeout})
		assert.Equal(t, 1.0, n, "a scrape cut at Timeout of wall time")
		cancel()
		require.NoError(t, <-done)
		want := []time.Duration{0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 4500 * time.Millisecond}
		assert.Equal(t, want, e.times("decode-0"), "scraped every 5 s of the clock, and once the slow round ended")
		assert.Equal(t, want, e.times("prefill-0"))
	})
}
