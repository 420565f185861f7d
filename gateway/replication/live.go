package replication

import (
	"github.com/basin-dev/basin/gateway/admission"
)

// knownLive is a follower's copy of the leader's live set, as of position at: the ids of every
// session live at the leader, not only those this replica served, and of those the leader holds.
// It is brought up to date by each report's answer. While no leader answers, a call of a session
// in it passes as the call of a live session (passKnown) instead of being held as a new one: a
// session's calls may reach any replica, and a leader's death must not turn its live sessions
// into new ones. The held ones are the hold list this replica enforces (followHolds).
type knownLive struct {
	at   livePosition
	ids  map[string]struct{}
	held map[string]struct{}
}

// apply brings the copy at position from up to date with u. A partial update that does not
// start where the copy is (which the protocol does not send) resets the position, so the next
// report asks for the set whole. It returns the sessions whose hold the update may have changed,
// or all when it replaced the copy whole.
func (k *knownLive) apply(from livePosition, u liveUpdate) (changed []string, all bool) {
	switch {
	case u.To.Epoch == 0:
		return nil, false // nothing said
	case u.Whole:
		k.ids = make(map[string]struct{}, len(u.Live))
		for _, id := range u.Live {
			k.ids[id] = struct{}{}
		}
		k.held = make(map[string]struct{}, len(u.Held))
		for _, id := range u.Held {
			k.held[id] = struct{}{}
		}
		all = true
	case from != k.at || k.ids == nil:
		k.at = livePosition{}
		return nil, false
	default:
		if k.held == nil {
			k.held = map[string]struct{}{}
		}
		changed = make([]string, 0, len(u.Changes))
		for _, ch := range u.Changes {
			if ch.Live {
				k.ids[ch.ID] = struct{}{}
			} else {
				delete(k.ids, ch.ID)
			}
			if ch.Held {
				k.held[ch.ID] = struct{}{}
			} else {
				delete(k.held, ch.ID)
			}
			changed = append(changed, ch.ID)
		}
	}
	k.at = u.To
	return changed, all
}

// knowOwn sets the copy to this replica's own live set: on stepping down, its table is the
// freshest copy of the deployment's there is.
func (r *Replica) knowOwn(epoch uint64) {
	ids, held, seq := r.core.LiveSet()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.known.apply(livePosition{}, liveUpdate{To: livePosition{Epoch: epoch, Seq: seq}, Whole: true, Live: ids, Held: held})
}

// followHolds brings this follower's hold list to its copy of the leader's, for the sessions an
// update changed (all: every session live here). A session the leader holds is held here, so its
// next call waits on this replica as it would on the leader, bounded by the hold bound on this
// replica's clock; one the leader resumed (or no longer has live) is resumed here, which
// releases its waiting call. Under the gateway's lock, as every change of the hold list
// (Host.Hold), so that a release is delivered before the session's next call can be held.
func (r *Replica) followHolds(changed []string, all bool) {
	if all {
		changed, _ = r.core.LiveIDs()
	}
	if len(changed) == 0 {
		return
	}
	r.mu.Lock()
	var hold, resume []string
	for _, id := range changed {
		if _, held := r.mu.known.held[id]; held {
			hold = append(hold, id)
		} else {
			resume = append(resume, id)
		}
	}
	r.mu.Unlock()
	if n := r.host.Hold(hold, resume); n > 0 {
		r.log.Debug("holding the sessions the leader holds", "added", n)
	}
}

// passKnown lets c through as the call of a live session when no leader can decide and c's
// session was live at the leader at this replica's last contact. The session enters the local
// core (its context estimated by this call's prompt) and its calls are reported as any live
// session's. It is not reported as admitted here: it is in the table the next leader loads
// (admissions are persisted before their first call goes), unless it ended meanwhile — and a
// session reported live after its end would hold budget until its idle timeout. A leader that
// does not know it answers so, and this replica ends it locally; a later call then asks the
// leader as a first call. It reports whether c may go; a held session's call (the leader held it
// at the last contact) is held here, by adopt.
func (r *Replica) passKnown(c Call, adopt AdoptFunc) bool {
	r.mu.Lock()
	_, known := r.mu.known.ids[c.ID]
	_, held := r.mu.known.held[c.ID]
	r.mu.Unlock()
	if !known || c.Anonymous {
		return false
	}
	now := r.now()
	waits := r.adopt(adopt, admission.LiveSession{ID: c.ID, Tenant: c.Tenant, Arrival: now, Admitted: now, LastDone: now,
		Context: c.Req.Prompt, Peak: c.Req.Prompt, Held: held}, false)
	r.report(repBegin, c.ID, c.Req.Prompt) // adopt counts the call here only
	r.metrics.knownPassed.Inc()
	r.log.Info("a session live at the last contact with the leader passes while no leader answers", "session", c.ID,
		"held", waits)
	return true
}
