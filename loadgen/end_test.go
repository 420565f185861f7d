package loadgen

import (
	"context"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkEnded asserts that every session of the report the server saw a call of was ended once
// when it did not complete, and never when it did (its last call's x-session-end ended it), and
// that the report counts them. A session whose call, cut by a cancelled run, reached the server
// only after the end it was sent was refused (not live yet) is the one exception: the client
// cannot order a request it abandoned, and the report counts it not live.
func checkEnded(t *testing.T, f *fake, rep *Report) {
	t.Helper()
	require.NotEmpty(t, rep.PerSession, "run with PerSession")
	seen, ends, crossed := f.attempts(), f.ends(), f.crossed()
	want := 0
	for _, s := range rep.PerSession {
		if _, ok := seen[s.ID]; !ok {
			assert.Zero(t, ends[s.ID], "session %s: the server never saw it", s.ID)
			continue
		}
		if crossed[s.ID] {
			assert.True(t, rep.Interrupted, "session %s: its call crossed its end in a run not cancelled", s.ID)
			assert.Zero(t, ends[s.ID], "session %s: its end was refused", s.ID)
			continue
		}
		if s.Outcome == Completed {
			assert.Zero(t, ends[s.ID], "session %s completed: its last call ended it", s.ID)
			continue
		}
		want++
		assert.Equal(t, 1, ends[s.ID], "session %s (%s) ended once at the server", s.ID, s.Outcome)
	}
	assert.Equal(t, want, rep.SessionEnds.Ended, "report: sessions ended")
	assert.Zero(t, rep.SessionEnds.Failed, "report: sessions not ended %v (%s)", rep.SessionEnds.FailedIDs,
		rep.SessionEnds.LastError)
	assert.Equal(t, rep.SessionEnds.Asked, rep.SessionEnds.Ended+rep.SessionEnds.NotLive)
}

// TestSessionsThatDoNotCompleteAreEnded: whatever stops a session after the server saw it — an
// upstream error, a broken stream, a refusal, a shed — the load generator ends it at the server,
// so that it does not hold its budget there until the idle timeout.
func TestSessionsThatDoNotCompleteAreEnded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		script  func(attempt int) reply
		outcome Outcome
	}{
		{"upstream error on the second call", func(n int) reply {
			if n == 1 {
				return reply{status: 502, body: `{"error":{"message":"upstream unreachable"}}`}
			}
			return reply{}
		}, Error},
		{"stream cut on the second call", func(n int) reply {
			if n == 1 {
				return reply{broken: "cut"}
			}
			return reply{}
		}, Error},
		{"refused past the retry budget", func(int) reply { return reply{status: 503, retryAfter: "0"} }, Rejected},
		{"shed", func(int) reply { return reply{status: 529} }, Shed},
		{"completed", func(int) reply { return reply{} }, Completed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(func(_ string, n int) reply { return tc.script(n) })
			ts := httptest.NewServer(f)
			defer ts.Close()
			var sl sleeps
			rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: traceScenario(t, 3, "10m", "{rate_per_min: 1}"),
				Speed: 600, Sleep: sl.sleep, RetryBudget: 2, PerSession: true, HTTPClient: ts.Client()})
			require.NoError(t, err)
			require.Positive(t, rep.Sessions.Arrived)
			for _, s := range rep.PerSession {
				require.Equal(t, tc.outcome, s.Outcome, "session %s: %s", s.ID, s.Error)
			}
			checkEnded(t, f, rep)
			if tc.outcome == Completed {
				assert.Zero(t, rep.SessionEnds.Asked)
			} else {
				assert.Equal(t, len(rep.PerSession), rep.SessionEnds.Asked)
			}
		})
	}
}

// TestCancelledRunEndsItsSessions: an interrupted run (Ctrl-C, or calibrate stopping its load at
// the last step) cuts its sessions mid-call and mid-pause; each is ended at the server all the
// same, on a context of its own, before Run returns.
func TestCancelledRunEndsItsSessions(t *testing.T) {
	f := newFake(func(_ string, n int) reply {
		if n == 0 {
			return reply{} // the first call answered: the sessions are live, between calls or in one
		}
		return reply{blockUntil: time.Now().Add(5 * time.Second)}
	})
	ts := httptest.NewServer(f)
	defer ts.Close()
	check := noLeaks(t)
	sc := traceScenario(t, 9, "10m", "{rate_per_min: 6}")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	rep, err := Run(ctx, Options{Target: ts.URL, Scenario: sc, Speed: 600, PerSession: true})
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 3*time.Second)
	check()
	require.True(t, rep.Interrupted)
	require.Positive(t, rep.Sessions.Unfinished)
	checkEnded(t, f, rep)
	// Every session whose first call was answered is live at the server and was ended (a
	// session that arrived as the run was cancelled, its first call not yet answered, may not
	// have reached it: checkEnded holds those to no end).
	answered := 0
	for _, s := range rep.PerSession {
		if s.CallsDone > 0 {
			answered++
		}
	}
	require.Positive(t, answered, "sessions got their first call answered before the cancel")
	assert.GreaterOrEqual(t, rep.SessionEnds.Ended, answered, "every session whose first call was answered was ended")
}

// TestEndsWhenTheServerComesBack: a server that crashes mid-run fails the sessions it was
// serving, and their ends find nobody; they are asked again while the run lasts, and the server
// back up ends them at once, not at the run's end.
func TestEndsWhenTheServerComesBack(t *testing.T) {
	// The server crashes as the eighth session's second call comes in, and is back 200 ms later,
	// in a run of about two seconds (2 virtual minutes at 60×): the sessions whose next call falls
	// in between fail, and the server had seen the first call of many of them.
	var downAt atomic.Int64
	var second atomic.Int32
	f := newFake(func(_ string, n int) reply {
		if n == 1 && second.Add(1) == 8 {
			downAt.Store(time.Now().UnixNano())
			return reply{status: 502}
		}
		return reply{}
	})
	f.down = func(now time.Time) bool {
		at := downAt.Load()
		return at != 0 && now.UnixNano()-at < int64(200*time.Millisecond)
	}
	ts := httptest.NewServer(f)
	defer ts.Close()
	// Waits are real but for the ends' retry pause, shortened to keep the test short.
	sleep := func(ctx context.Context, d time.Duration) error {
		if d == EndRetryEvery {
			d = 20 * time.Millisecond
		}
		return Sleep(ctx, d)
	}
	sc := traceScenario(t, 9, "2m", "{rate_per_min: 60}")
	rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: sc, Speed: 60, PerSession: true,
		Sleep: sleep, HTTPClient: ts.Client()})
	require.NoError(t, err)
	require.Positive(t, rep.Sessions.Error, "the crash failed sessions")
	checkEnded(t, f, rep)
	f.mu.Lock()
	defer f.mu.Unlock()
	early := 0
	for _, at := range f.mu.endAt {
		if at.Before(f.mu.lastCall) {
			early++
		}
	}
	assert.Positive(t, early, "ended while the run went on, not only at its end")
}

// TestEndsThatFailAreCountedAndNamed: a server that stays down leaves sessions it cannot end;
// the report counts and names them, and Run does not wait on them past EndTimeout.
func TestEndsThatFailAreCountedAndNamed(t *testing.T) {
	f := newFake(nil)
	f.script = func(_ string, n int) reply {
		if n == 1 {
			f.crashed.Store(true)
			return reply{status: 502}
		}
		return reply{}
	}
	ts := httptest.NewServer(f)
	defer ts.Close()
	var sl sleeps
	start := time.Now()
	rep, err := Run(context.Background(), Options{Target: ts.URL, Scenario: oneSessionScenario(t), Speed: 600,
		Sleep: sl.sleep, PerSession: true, HTTPClient: ts.Client(), RunID: "down"})
	require.NoError(t, err)
	assert.Less(t, time.Since(start), EndTimeout)
	require.True(t, f.crashed.Load())
	require.Len(t, rep.PerSession, 1)
	assert.Equal(t, Error, rep.PerSession[0].Outcome)
	assert.Equal(t, SessionEnds{Asked: 1, Failed: 1, FailedIDs: []string{"down-1"}, LastError: rep.SessionEnds.LastError},
		rep.SessionEnds)
	assert.Contains(t, rep.SessionEnds.LastError, "end session down-1")
}
