package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/loadgen"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim/scenario"
)

// shortScenario is the paper's 1P1D spike scenario cut to 24 minutes (spike at 5–12, ×3), so a
// test plays it in seconds.
func shortScenario(t *testing.T) *scenario.Scenario {
	t.Helper()
	sc, err := scenario.Load(DefaultScenario)
	require.NoError(t, err)
	m := func(v int) scenario.Duration { return scenario.Duration(time.Duration(v) * time.Minute) }
	sc.Duration = m(24)
	sc.Measure = scenario.Window{From: m(10), To: m(24)}
	sc.Arrivals.Spikes = []scenario.Spike{{From: m(5), To: m(12), Multiplier: 3}}
	return sc
}

func TestOptionsNameTheBadField(t *testing.T) {
	calm, err := scenario.Load("paper-1p1d-h100")
	require.NoError(t, err)
	spiked, err := scenario.Load(DefaultScenario)
	require.NoError(t, err)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no scenario", Options{Dir: dir}, "scenario: required"},
		{"no spike", Options{Scenario: calm, Dir: dir}, "scenario: paper-1p1d-h100 has no spike"},
		{"negative speed", Options{Scenario: spiked, Dir: dir, Speed: -1}, "speed: must be a finite number > 0"},
		{"negative interval", Options{Scenario: spiked, Dir: dir, Interval: -time.Second}, "interval: must be > 0"},
		{"negative queue wait", Options{Scenario: spiked, Dir: dir, QueueWait: -time.Second}, "queue_wait: must be > 0"},
		{"no dir", Options{Scenario: spiked}, "dir: required"},
		{"dir missing", Options{Scenario: spiked, Dir: filepath.Join(dir, "nope")}, "is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Run(t.Context(), tc.o)
			require.ErrorContains(t, err, tc.want)
			assert.Nil(t, res)
		})
	}
}

// TestRun plays a short spike on the three runs and checks what a user of `basin demo` relies
// on: every run reports, the dry run's daemon only records what it would do and its gateway's
// budget is untouched, the acting daemon changes the budget through the admin API, and nothing
// is left running afterwards.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("plays 24 simulated minutes on three deployments (about 8 s)")
	}
	if raceEnabled {
		t.Skip("wall-clock run: under the race detector the simulated deployments answer too slowly")
	}
	before := runtime.NumGoroutine()
	dir := t.TempDir()
	var (
		mu     sync.Mutex
		events []Event
	)
	var progress []float64
	res, err := Run(t.Context(), Options{
		Scenario: shortScenario(t), Speed: 180, Dir: dir,
		OnEvent:  func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() },
		Progress: func(f float64) { mu.Lock(); progress = append(progress, f); mu.Unlock() },
	})
	require.NoError(t, err)
	require.Len(t, res.Runs, 3)

	for i, name := range []string{NoSpike, DryRun, Acting} {
		r := res.Runs[i]
		assert.Equal(t, name, r.Name)
		require.NotNil(t, r.Report, name)
		assert.Positive(t, r.Report.Sessions.Arrived, "%s: sessions arrived in the window", name)
		assert.NotNil(t, r.Report.GoodputPerHour, "%s: goodput is known (the scenario's deployment gives deadlines)", name)
		if r.Report.Sessions.Completed > 0 {
			assert.NotNil(t, r.Report.PrefixHitRate, "%s: the simulator reports cached tokens", name)
		}
		assert.Equal(t, name != NoSpike, r.StatusURL != "", "%s: a status page exactly when there is a daemon", name)
		assert.GreaterOrEqual(t, r.Timing.Waits, minWaits, "%s: the load generator's waits were timed", name)
	}
	assert.Greater(t, res.Runs[1].Report.Offered, res.Runs[0].Report.Offered, "the spiked runs offer more sessions")
	// Both spiked runs offer the same sessions, but for the last moment: the load is cut at the
	// scenario's end on the wall clock, and a session due just then starts in one run or not.
	assert.InDelta(t, res.Runs[1].Report.Offered, res.Runs[2].Report.Offered, 2, "both spiked runs offer the same sessions")

	// The dry run decided but did nothing: its audit log has only dry-run records, its gateway's
	// budget is still out of reach.
	dry := readAudit(t, filepath.Join(dir, "dryrun", "data", "audit.jsonl"))
	would := 0
	for _, r := range dry {
		assert.NotEqual(t, remediate.PhaseDone, r.Phase, "a dry run takes no action: %+v", r)
		if r.Phase == remediate.PhaseDryRun && (r.Budget == nil || r.Budget.From != r.Budget.To) {
			would++ // a record that only moves B_ref is not reported
		}
	}
	assert.Positive(t, would, "the dry run's daemon records what it would have done")
	assert.True(t, res.Runs[1].CountOnly, "the dry run's gateway still only counts")
	assert.Equal(t, would, res.Runs[1].Actions, "every dry-run record was reported")

	// The acting daemon set the budget through the gateway's admin API.
	act := readAudit(t, filepath.Join(dir, "acting", "data", "audit.jsonl"))
	done := 0
	for _, r := range act {
		if r.Phase == remediate.PhaseDone && r.Budget != nil {
			done++
		}
	}
	assert.Positive(t, done, "the acting daemon changed the budget")
	assert.Less(t, res.Runs[2].Budget, int64(1e11), "the acting gateway's budget was set")
	assert.False(t, res.Runs[2].CountOnly, "the acting gateway enforces a budget")
	assert.Positive(t, res.Runs[2].Actions)

	mu.Lock()
	defer mu.Unlock()
	started := map[string]string{}
	for _, e := range events {
		switch e.Kind {
		case EventStarted:
			started[e.Run] = e.Text
		case EventState, EventAction:
			assert.Contains(t, started, e.Run, "events come after their run started")
			assert.NotEmpty(t, e.Text)
			// The scenario's 24 minutes, and up to 5 more: the daemon may step once more while
			// the run is torn down, and on a loaded machine (make test's two passes side by
			// side) a second of wall time late is 3 minutes at 180×. A time on the wrong
			// clock (the wall's, or the Unix epoch's) is hours off.
			assert.LessOrEqual(t, e.At, 24*time.Minute+5*time.Minute, "event times are in the scenario's minutes: %+v", e)
		}
	}
	assert.Len(t, started, 3)
	require.NotEmpty(t, progress)
	assert.Equal(t, 1.0, progress[len(progress)-1], "progress ends at 1")

	// Nothing is left running: the status pages are gone, and so are the goroutines.
	for _, r := range res.Runs[1:] {
		_, err := http.Get(r.StatusURL)
		assert.Error(t, err, "%s: the daemon's listener is closed", r.Name)
	}
	http.DefaultClient.CloseIdleConnections()
	assertGoroutinesBack(t, before)
}

// TestRunFallsBehind makes every wait of the load generators end 30 ms of wall time late — 5.4 s
// of the deployment's time at 180×, as on a machine short of CPU — and checks what the user
// sees: one line per run while it runs, the lag in the table, no verdict or ratio from the live
// runs, and then the same runs played in virtual time with a verdict from them.
func TestRunFallsBehind(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("wall-clock run")
	}
	const (
		speed = 180
		late  = 30 * time.Millisecond
	)
	var (
		mu         sync.Mutex
		lag        = map[string][]Event{}
		sawVirtual atomic.Bool
	)
	res, err := Run(t.Context(), Options{Scenario: shortScenario(t), Speed: speed, Dir: t.TempDir(),
		OnEvent: func(e Event) {
			if e.Kind == EventLag {
				mu.Lock()
				lag[e.Run] = append(lag[e.Run], e)
				mu.Unlock()
			}
			if e.Kind == EventVirtual {
				sawVirtual.Store(true)
			}
		},
		sleep: func(ctx context.Context, d time.Duration) error { return loadgen.Sleep(ctx, max(d, 0)+late) },
	})
	require.NoError(t, err)
	require.Len(t, res.Runs, 3)
	for _, r := range res.Runs {
		assert.GreaterOrEqual(t, r.Timing.Waits, minWaits, r.Name)
		assert.GreaterOrEqual(t, r.Timing.Worst, late*speed, "%s: every wait was at least 5.4 s late: %+v", r.Name, r.Timing)
		assert.False(t, r.Timing.Kept(), r.Name)
	}
	assert.False(t, res.KeptTime())

	mu.Lock()
	for _, name := range []string{NoSpike, DryRun, Acting} {
		if assert.Len(t, lag[name], 1, "%s: said once, not at every check", name) {
			assert.Contains(t, lag[name][0].Text, "falling behind the wall clock")
		}
	}
	mu.Unlock()

	var b strings.Builder
	Write(&b, res)
	live, virtual, ok := strings.Cut(b.String(), "So the same three runs were played in virtual time")
	require.True(t, ok, "the runs were played again in virtual time:\n%s", b.String())
	assert.Contains(t, live, "NOT KEEPING TIME at 180×")
	assert.Contains(t, live, "NOT KEPT")
	assert.Contains(t, live, "No verdict from the live runs: the no spike, dry run, acting runs did not keep time.")
	assert.NotContains(t, live, "% of", "no ratio to the reference in the live runs' verdict")
	assert.NotContains(t, live, "kept ")
	assert.Regexp(t, `ratio to no spike\s+—\s+—\s+—`, live)

	// The story goes on off the wall clock: the same runs in virtual time, and a verdict from them.
	require.Len(t, res.Virtual, 3)
	for i, name := range []string{NoSpike, DryRun, Acting} {
		assert.Equal(t, name, res.Virtual[i].Name)
		assert.Positive(t, res.Virtual[i].Result.Sessions.Arrived, name)
	}
	assert.Regexp(t, `ratio to no spike\s+1\.00\s+\d\.\d\d\s+\d\.\d\d`, virtual)
	assert.Contains(t, virtual, "In virtual time: ")
	assert.Contains(t, virtual, "% of")
	assert.NotContains(t, virtual, "No verdict")
	t.Logf("what the user reads:\n%s", b.String())
	assert.True(t, sawVirtual.Load(), "the user is told the runs are played again")
}

// TestRunInterrupted cancels the demo early: Run says so, returns what it measured and stops
// everything.
func TestRunInterrupted(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("wall-clock run")
	}
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan struct{}, 3)
	go func() {
		for range 3 {
			<-started
		}
		time.Sleep(500 * time.Millisecond)
		cancel()
	}()
	var (
		mu   sync.Mutex
		last float64
	)
	res, err := Run(ctx, Options{Scenario: shortScenario(t), Speed: 180, Dir: t.TempDir(),
		OnEvent: func(e Event) {
			if e.Kind == EventStarted {
				started <- struct{}{}
			}
		},
		Progress: func(f float64) { mu.Lock(); last = f; mu.Unlock() }})
	require.ErrorContains(t, err, "interrupted after")
	mu.Lock()
	assert.Less(t, last, 1.0, "an interrupted run does not report itself done")
	mu.Unlock()
	require.NotNil(t, res)
	for _, r := range res.Runs {
		require.NotNil(t, r.Report, r.Name)
		assert.True(t, r.Report.Interrupted, r.Name)
	}
	assertGoroutinesBack(t, before)
}

func readAudit(t *testing.T, path string) []remediate.Record {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var recs []remediate.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r remediate.Record
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		recs = append(recs, r)
	}
	require.NoError(t, sc.Err())
	return recs
}

// assertGoroutinesBack waits a moment for goroutines to wind down (idle HTTP connections close
// asynchronously) and fails if more remain than before the run.
func assertGoroutinesBack(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the run, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestWallRetryAfter: the gateway runs on the deployment's clock, so its Retry-After is in the
// deployment's seconds; the load generator waits wall seconds. At 90×, the gateway's 90 s is one
// wall second; other answers and other forms of the header pass as they are.
func TestWallRetryAfter(t *testing.T) {
	clock, err := scaledclock.New(90, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		name       string
		code       int
		retryAfter string
		want       string
	}{
		{"seconds", http.StatusServiceUnavailable, "90", "1.000"},
		{"one second", http.StatusServiceUnavailable, "1", "0.011"},
		{"an HTTP date", http.StatusTooManyRequests, "Wed, 21 Oct 2026 07:28:00 GMT", "Wed, 21 Oct 2026 07:28:00 GMT"},
		{"none", http.StatusOK, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := wallRetryAfter(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte("{}"))
			}), clock)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
			assert.Equal(t, tc.code, rec.Code)
			assert.Equal(t, tc.want, rec.Header().Get("Retry-After"))
			assert.Equal(t, "{}", rec.Body.String())
		})
	}
}
