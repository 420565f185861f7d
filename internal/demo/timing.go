package demo

import (
	"context"
	"sync"
	"time"
)

// Keeping time.
//
// A simulated deployment cannot fall behind on its own: sim/serve computes its virtual time from
// the wall clock, (wall − start) × speed, and when its loop runs late the discrete-event core
// still plays every event at its virtual instant. What falls behind on a machine short of CPU is
// whatever waits on a wall-clock timer and must then be scheduled: the load generator's arrivals
// and its sessions' tool pauses, the simulator's wake-ups that deliver answers, the gateway, the
// daemon. A wake-up δ late in wall time is δ × speed late in the deployment's time; at 90× a
// 10 ms hiccup is most of a second. The demo measures this where the load generator waits
// (loadgen.Options.Sleep, which every arrival, tool pause and Retry-After goes through): how much
// later than asked each wait ends. Every part of a run shares this process's scheduler, so these
// waits stand for the rest.
//
// What breaks the result is a tool pause that ends late. The session's next call comes later, at
// every call, so each session lives longer; more sessions are live at once (Little's law) and the
// working set grows toward the knee. The deployment is pushed toward the trap by the machine, not
// by the traffic: that is how a busy machine collapsed the no-spike reference. A terminal-bench
// session's call cycle (a tool run, median 6 s, then a call of several seconds) lasts about
// 15–20 s, so MaxLag, 1 s late per wait, lengthens its life and the live sessions by about 5–7%.
// It is also a thirtieth of the detector's 30 s holds and of the daemon's 30 s loop.
const (
	// MaxLag is the most, in the deployment's time, that the load generator's waits may end late
	// on average over any LagWindow for a run to count as keeping time.
	MaxLag = time.Second
	// LagWindow is the span the lateness is averaged over: ten of the daemon's loops. One
	// hiccup is spread over a window's waits; a machine that stays behind for a few minutes of
	// the deployment's time — a fifth of the ten-minute spike — shows.
	LagWindow = 5 * time.Minute
	// minWaits is how many waits a window needs before its mean counts (a run's first minutes
	// have few sessions, and one late wait among three is not a trend).
	minWaits = 30
)

// Timing is how well a run kept the deployment's time: how late its load generator's waits
// (arrivals, tool pauses, Retry-After) ended, in the deployment's time.
type Timing struct {
	// Waits is how many waits were measured.
	Waits int
	// Mean is the mean lateness over the whole run.
	Mean time.Duration
	// Worst is the largest mean lateness over any LagWindow with enough waits to count (Mean
	// when no window had).
	Worst time.Duration
	// Max is the latest single wait.
	Max time.Duration
}

// Kept reports whether the run kept time: enough waits were measured and none of the windows'
// means (nor the run's) passed MaxLag. A run with too few waits to tell has not shown it kept
// time.
func (t Timing) Kept() bool {
	return t.Waits >= minWaits && t.Worst <= MaxLag && t.Mean <= MaxLag
}

// lagMeter wraps the load generator's wall-clock wait and records how late each one ends, by
// minute of the deployment's time since the load began. It is safe for concurrent use.
type lagMeter struct {
	speed float64
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error

	mu struct {
		sync.Mutex
		start   time.Time   // wall; zero until the load begins
		minutes []lagBucket // by minute of the deployment's time since start
		n       int
		sum     time.Duration
		max     time.Duration
	}
}

type lagBucket struct {
	n   int
	sum time.Duration
}

func newLagMeter(speed float64, now func() time.Time, sleep func(context.Context, time.Duration) error) *lagMeter {
	return &lagMeter{speed: speed, now: now, sleep: sleep}
}

// begin sets the wall time the load began; waits before it are not counted.
func (m *lagMeter) begin(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.start = t
}

// Sleep is loadgen.Options.Sleep: it waits d (or until ctx is done) and records how much later
// than asked the wait ended. A negative d is a wait already |d| late when asked (an arrival
// dispatched after its time). Interrupted waits are not counted: they did not end when asked to.
func (m *lagMeter) Sleep(ctx context.Context, d time.Duration) error {
	asked := m.now()
	if err := m.sleep(ctx, d); err != nil || ctx.Err() != nil {
		return err
	}
	late := m.now().Sub(asked) - max(d, 0)
	if d < 0 {
		late -= d
	}
	m.record(asked, time.Duration(float64(max(late, 0))*m.speed))
	return nil
}

func (m *lagMeter) record(at time.Time, late time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.start.IsZero() || at.Before(m.mu.start) {
		return
	}
	i := m.minuteLocked(at)
	for len(m.mu.minutes) <= i {
		m.mu.minutes = append(m.mu.minutes, lagBucket{})
	}
	m.mu.minutes[i].n++
	m.mu.minutes[i].sum += late
	m.mu.n++
	m.mu.sum += late
	m.mu.max = max(m.mu.max, late)
}

// minuteLocked is the minute of the deployment's time since the load began at wall time t.
func (m *lagMeter) minuteLocked(t time.Time) int {
	return int(time.Duration(float64(t.Sub(m.mu.start))*m.speed) / time.Minute)
}

// recent is the mean lateness over the LagWindow up to wall time t, and how many waits it has.
func (m *lagMeter) recent(t time.Time) (time.Duration, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.start.IsZero() {
		return 0, 0
	}
	end := min(m.minuteLocked(t), len(m.mu.minutes)-1)
	return m.windowLocked(end)
}

// windowLocked is the mean over the LagWindow of minutes ending with minute end.
func (m *lagMeter) windowLocked(end int) (time.Duration, int) {
	var b lagBucket
	for i := max(0, end-int(LagWindow/time.Minute)+1); i <= end; i++ {
		b.n += m.mu.minutes[i].n
		b.sum += m.mu.minutes[i].sum
	}
	if b.n == 0 {
		return 0, 0
	}
	return b.sum / time.Duration(b.n), b.n
}

// timing summarises the waits so far.
func (m *lagMeter) timing() Timing {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := Timing{Waits: m.mu.n, Max: m.mu.max}
	if t.Waits == 0 {
		return t
	}
	t.Mean = m.mu.sum / time.Duration(t.Waits)
	t.Worst = -1
	for end := range m.mu.minutes {
		if mean, n := m.windowLocked(end); n >= minWaits {
			t.Worst = max(t.Worst, mean)
		}
	}
	if t.Worst < 0 {
		t.Worst = t.Mean
	}
	return t
}
