package admission

// The live log: the recent changes of the live set, numbered, for a replicated gateway's
// followers. A follower keeps the ids of every session live at the leader (not only those it
// served), so that while no leader answers it still passes the calls of sessions that were live
// at its last contact instead of holding them as new. The leader sends each follower the changes
// since the number it last saw, or the whole set when the log no longer reaches back that far.

// LiveChange is one change of the live set.
type LiveChange struct {
	ID   string `json:"id"`
	Live bool   `json:"live"` // true: admitted (or merged, restored); false: ended
}

// liveLog keeps the last changes. seq numbers every change since the core was made; changes
// holds the numbers after start.
type liveLog struct {
	keep    int
	seq     uint64
	start   uint64
	changes []LiveChange
}

// noteLocked records a change of the live set (c.mu held).
func (c *Core) noteLocked(id string, live bool) {
	l := &c.mu.liveLog
	if l.keep <= 0 {
		return
	}
	l.seq++
	l.changes = append(l.changes, LiveChange{ID: id, Live: live})
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
