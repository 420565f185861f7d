// Package progress draws a one-line progress bar on a terminal stream for work that takes more
// than a second. Short work draws nothing, so quick commands stay quiet and scripts that capture
// stderr do not fill with carriage returns.
package progress

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Bar is a progress bar. The zero value is unusable; use New. Safe for concurrent use.
type Bar struct {
	w     io.Writer
	label string
	now   func() time.Time
	delay time.Duration

	mu struct {
		sync.Mutex
		start time.Time
		drawn bool
		last  int
	}
}

// New returns a bar that writes to w once delay has passed since New; a nil w disables it.
func New(w io.Writer, label string, now func() time.Time, delay time.Duration) *Bar {
	b := &Bar{w: w, label: label, now: now, delay: delay}
	b.mu.start = now()
	b.mu.last = -1
	return b
}

const width = 30

// Set reports the fraction done, in [0, 1].
func (b *Bar) Set(done float64) {
	if b == nil || b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.now().Sub(b.mu.start) < b.delay {
		return
	}
	pct := int(min(max(done, 0), 1) * 100)
	if pct == b.mu.last {
		return
	}
	b.mu.last = pct
	b.mu.drawn = true
	n := pct * width / 100
	fmt.Fprintf(b.w, "\r%s [%s%s] %3d%%", b.label, strings.Repeat("=", n), strings.Repeat(" ", width-n), pct)
}

// Done ends the bar's line if anything was drawn.
func (b *Bar) Done() {
	if b == nil || b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.drawn {
		fmt.Fprintln(b.w)
		b.mu.drawn = false
	}
}

// Clear erases the bar's line, if drawn, so that other output can be written on it; the next Set
// draws the bar again below that output.
func (b *Bar) Clear() {
	if b == nil || b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.drawn {
		n := len(b.label) + width + 8 // label, " [", the bar, "] ", "100%"
		fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", n))
		b.mu.drawn = false
		b.mu.last = -1
	}
}
