package daemon

import (
	"log/slog"
	"strings"
	"time"

	"github.com/basin-dev/basin/detector"
)

// GatewayUnseen prefixes the unseen entry of an unreadable gateway admin API.
const GatewayUnseen = "gateway admin API: "

// notStepped is the unseen entry before the first step: nothing has been looked at yet.
const notStepped = "no step completed yet"

// unseenOf lists what a step could not see: the detector's needed signals that were not fresh
// (its Blind list, "hit_rate stale"), and the gateway's admin API when one is configured and could
// not be read. A daemon that sees nothing must say so rather than show the state it last had —
// with every target down the detector holds its state, which reads as a green "healthy".
func unseenOf(a detector.Assessment, gatewayConfigured bool, gatewayErr string) []string {
	var out []string
	out = append(out, a.Blind...)
	if gatewayConfigured && gatewayErr != "" {
		out = append(out, GatewayUnseen+gatewayErr)
	}
	return out
}

// unseenNow is what the daemon cannot see now, for the status, readiness and metrics.
func (d *Daemon) unseenNow() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.mu.ready {
		return []string{notStepped}
	}
	return append([]string(nil), d.mu.unseen...)
}

// failureLogEvery is how often a failure that persists is logged again.
const failureLogEvery = 5 * time.Minute

// failureLog logs a recurring failure the way the collector logs a failed scrape: a warning when
// it starts, a reminder at most every failureLogEvery while it lasts (with how many attempts
// failed meanwhile), and one line when it recovers — never one line per attempt, which at a 5 s
// interval would bury everything else. Not safe for concurrent use: one loop owns it.
type failureLog struct {
	// down is the message of the warning that starts an outage, after the thing's name.
	down     string
	failing  bool
	since    time.Time
	lastWarn time.Time
	failures int
}

// observe records one attempt's outcome at now (wall time) and logs per the rules above.
func (f *failureLog) observe(log *slog.Logger, now time.Time, what string, err error, attrs ...any) {
	if err == nil {
		if f.failing {
			log.Info(what+" recovered", append(attrs, "down_for", now.Sub(f.since).Round(time.Second), "failed_attempts", f.failures)...)
		}
		*f = failureLog{down: f.down}
		return
	}
	f.failures++
	switch {
	case !f.failing:
		f.failing, f.since, f.lastWarn = true, now, now
		log.Warn(what+" "+f.down, append(attrs, "err", err)...)
	case now.Sub(f.lastWarn) >= failureLogEvery:
		f.lastWarn = now
		log.Warn(what+" still failing", append(attrs, "err", err, "since", f.since, "failed_attempts", f.failures)...)
	default:
		log.Debug(what+" failed", append(attrs, "err", err)...)
	}
}

// blindMessage is the reason readiness gives while blind.
func blindMessage(unseen []string) string {
	return "blind: cannot see " + strings.Join(unseen, "; ")
}
