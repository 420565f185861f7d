// Package progress shows how far long work has got. On a terminal it redraws one line in place (a
// bar); on anything else — a file, a pipe, a CI log — carriage returns would pile up into one
// unreadable line, so it writes a plain line now and then instead. Short work shows nothing, so
// quick commands stay quiet.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// PlainEvery is how often, at most, a bar not on a terminal writes a line: often enough to see a
// long run is alive, rarely enough not to flood a log.
const PlainEvery = 10 * time.Second

// Bar is a progress bar. The zero value is unusable; use New. Safe for concurrent use.
type Bar struct {
	w     io.Writer
	label string
	now   func() time.Time
	delay time.Duration
	tty   bool

	mu struct {
		sync.Mutex
		start time.Time
		drawn bool   // tty: a bar is on the current line; plain: a line was written
		last  int    // the percentage last shown
		note  string // the note last shown
		at    time.Time
		// cur and curNote are the latest reported, shown or not (plain lines are throttled).
		cur     int
		curNote string
	}
}

// New returns a bar that writes to w once delay has passed since New; a nil w disables it. Whether
// w is a terminal decides how: see IsTerminal.
func New(w io.Writer, label string, now func() time.Time, delay time.Duration) *Bar {
	b := &Bar{w: w, label: label, now: now, delay: delay, tty: IsTerminal(w)}
	b.mu.start = now()
	b.mu.last = -1
	return b
}

// IsTerminal says whether w is a character device (a terminal), by its file mode: w must have a
// Stat method, as *os.File does. Anything else — a buffer, a regular file, a pipe — is not.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Stat() (os.FileInfo, error) })
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

const width = 30

// Set reports the fraction done, in [0, 1].
func (b *Bar) Set(done float64) { b.SetNote(done, "") }

// SetNote reports the fraction done with a short note on what has been done so far ("step 2/6,
// 14 sessions"), shown after the percentage.
func (b *Bar) SetNote(done float64, note string) {
	if b == nil || b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if now.Sub(b.mu.start) < b.delay {
		return
	}
	pct := int(min(max(done, 0), 1) * 100)
	b.mu.cur, b.mu.curNote = pct, note
	if pct == b.mu.last && note == b.mu.note {
		return
	}
	if !b.tty {
		if b.mu.drawn && now.Sub(b.mu.at) < PlainEvery {
			return
		}
		b.plainLocked(now)
		return
	}
	if len(note) < len(b.mu.note) { // a shorter line would leave the longer one's tail
		b.clearLocked()
	}
	b.mu.last, b.mu.note, b.mu.drawn = pct, note, true
	n := pct * width / 100
	fmt.Fprintf(b.w, "\r%s [%s%s] %3d%%", b.label, strings.Repeat("=", n), strings.Repeat(" ", width-n), pct)
	if note != "" {
		fmt.Fprintf(b.w, " %s", note)
	}
}

// plainLocked writes the latest state as a line of its own.
func (b *Bar) plainLocked(now time.Time) {
	b.mu.last, b.mu.note, b.mu.at, b.mu.drawn = b.mu.cur, b.mu.curNote, now, true
	s := fmt.Sprintf("%s: %d%% after %v", b.label, b.mu.cur, now.Sub(b.mu.start).Round(time.Second))
	if b.mu.curNote != "" {
		s += ", " + b.mu.curNote
	}
	fmt.Fprintln(b.w, s)
}

// Done ends the bar's line if anything was drawn. Not on a terminal, it writes the final state if
// it changed since the last line, so a log ends with where the work got to.
func (b *Bar) Done() {
	if b == nil || b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.tty {
		if b.mu.drawn && (b.mu.cur != b.mu.last || b.mu.curNote != b.mu.note) {
			b.plainLocked(b.now())
		}
		return
	}
	if b.mu.drawn {
		fmt.Fprintln(b.w)
		b.mu.drawn = false
	}
}

// Clear erases the bar's line, if drawn, so that other output can be written on it; the next Set
// draws the bar again below that output. Not on a terminal there is nothing to erase.
func (b *Bar) Clear() {
	if b == nil || b.w == nil || !b.tty {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.clearLocked()
	b.mu.last = -1
}

func (b *Bar) clearLocked() {
	if b.mu.drawn {
		n := len(b.label) + width + 8 + len(b.mu.note) + 1 // label, " [", the bar, "] ", "100%", " note"
		fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", n))
		b.mu.drawn = false
	}
}
