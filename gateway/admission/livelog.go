package admission

// The live log: the recent changes of the live set, numbered, for a replicated gateway's
// followers. A follower keeps the ids of every session live at the leader (not only those it
// served), so that while no leader answers it still passes the calls of sessions that were live
// at its last contact instead of holding them as new. The log also carries the hold list, so
// that a follower holds the calls of the sessions the leader holds (a hold or a resume is a
// change of a live session). The leader sends each follower the changes since the number it
// last saw, or the whole set when the log no longer reaches back that far.

// LiveChange is one change of the live set.
type LiveChange struct {
	ID   string `json:"id"`
	Live bool   `json:"live"` // true: admitted (or merged, restored, held, resumed); false: ended
	// Held: the live session is on the hold list after this change. A follower that predates
	// holds reads a hold or a resume as the session being live, which it already knew.
	Held bool `json:"held,omitempty"`
}

// liveLog keeps the last changes. seq numbers every change since the core was made; changes
// holds the numbers after start.
type liveLog struct {
	keep    int
	seq     uint64
	start   uint64
	changes []LiveChange
}

// noteLocked records a change of the live set or of the hold list (c.mu held).
func (c *Core) noteLocked(id string, live, held bool) {
	l := &c.mu.liveLog
	if l.keep <= 0 {
		return
	}
	l.seq++
	l.changes = append(l.changes, LiveChange{ID: id, Live: live, Held: live && held})
	if len(l.changes) > 2*l.keep {
		// Amortised: cut back to keep once the log has doubled.
		drop := len(l.changes) - l.keep
		l.changes = append(l.changes[:0:0], l.changes[drop:]...)
		l.start += uint64(drop)
	}
}

// LiveSince returns the changes of the live set after number seq and the number of the last one.
// ok is false when the log does not reach back to seq (or Options.LiveLog is 0, or seq is from
// another core): the caller then takes LiveIDs whole.
func (c *Core) LiveSince(seq uint64) (changes []LiveChange, last uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := &c.mu.liveLog
	if l.keep <= 0 || seq < l.start || seq > l.seq {
		return nil, l.seq, false
	}
	return append([]LiveChange(nil), l.changes[seq-l.start:]...), l.seq, true
}

// LiveIDs returns the ids of the live sessions and the number of the last change they include.
func (c *Core) LiveIDs() (ids []string, last uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids = make([]string, 0, len(c.mu.live))
	for id := range c.mu.live {
		ids = append(ids, id)
	}
	return ids, c.mu.liveLog.seq
}

// LiveSet returns the ids of the live sessions, those of them on the hold list, and the number
// of the last change they include: a follower's copy of the live set taken whole.
func (c *Core) LiveSet() (ids, held []string, last uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids = make([]string, 0, len(c.mu.live))
	for id, s := range c.mu.live {
		ids = append(ids, id)
		if s.held {
			held = append(held, id)
		}
	}
	return ids, held, c.mu.liveLog.seq
}
