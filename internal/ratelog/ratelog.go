// Package ratelog limits how often a recurring event is logged: the first occurrence at once, then
// at most one line per interval with the number held back meanwhile, so that a flood (a scanner
// knocking on an admin API, a disk refusing every write) cannot fill the log and no occurrence
// goes uncounted. The gateway and the daemon use it for refused logins and failing writes.
package ratelog

import (
	"sync"
	"time"
)

// Limiter decides when to log. Its zero value logs every event; it is safe for concurrent use.
type Limiter struct {
	// Every is the least time between two logged lines.
	Every time.Duration
	mu    struct {
		sync.Mutex
		last time.Time
		held int
	}
}

// Allow reports whether to log an event that happens at now, and how many were held back since
// the last logged one. A clock that went back logs at once.
func (l *Limiter) Allow(now time.Time) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.mu.last.IsZero() && now.Sub(l.mu.last) < l.Every && !now.Before(l.mu.last) {
		l.mu.held++
		return false, 0
	}
	held, l.mu.held, l.mu.last = l.mu.held, 0, now
	return true, held
}
