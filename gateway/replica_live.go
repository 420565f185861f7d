package gateway

import (
	"github.com/basin-dev/basin/gateway/admission"
)

// knownLive is a follower's copy of the leader's live set, as of position at: the ids of every
// session live at the leader, not only those this replica served. It is brought up to date by
// each report's answer. While no leader answers, a call of a session in it passes as the call of
// a live session (passKnown) instead of being held as a new one: a session's calls may reach
// any replica, and a leader's death must not turn its live sessions into new ones.
type knownLive struct {
	at  livePosition
	ids map[string]struct{}
}

// apply brings the copy at position from up to date with u. A partial update that does not
// start where the copy is (which the protocol does not send) resets the position, so the next
// report asks for the set whole.
func (k *knownLive) apply(from livePosition, u liveUpdate) {
	switch {
	case u.To.Epoch == 0:
		return // nothing said
	case u.Whole:
		k.ids = make(map[string]struct{}, len(u.Live))
		for _, id := range u.Live {
			k.ids[id] = struct{}{}
		}
	case from != k.at || k.ids == nil:
		k.at = livePosition{}
		return
	default:
		for _, ch := range u.Changes {
			if ch.Live {
				k.ids[ch.ID] = struct{}{}
			} else {
				delete(k.ids, ch.ID)
			}
		}
	}
	k.at = u.To
}

// knowOwn sets the copy to this replica's own live set: on stepping down, its table is the
// freshest copy of the deployment's there is.
func (r *replica) knowOwn(epoch uint64) {
	ids, seq := r.g.core.Core.LiveIDs()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.known.apply(livePosition{}, liveUpdate{To: livePosition{Epoch: epoch, Seq: seq}, Whole: true, Live: ids})
}

// passKnown lets c through as the call of a live session when no leader can decide and c's
// session was live at the leader at this replica's last contact. The session enters the local
// core (its context estimated by this call's prompt) and its calls are reported as any live
// session's. It is not reported as admitted here: it is in the table the next leader loads
// (admissions are persisted before their first call goes), unless it ended meanwhile — and a
// session reported live after its end would hold budget until its idle timeout. A leader that
// does not know it answers so, and this replica ends it locally; a later call then asks the
// leader as a first call. It reports whether c may go.
func (r *replica) passKnown(c *call) bool {
	r.mu.Lock()
	_, known := r.mu.known.ids[c.id]
	r.mu.Unlock()
	if !known || c.anonymous {
		return false
	}
	now := r.g.now()
	r.adopt(c, admission.LiveSession{ID: c.id, Tenant: c.tenant, Arrival: now, Admitted: now, LastDone: now,
		Context: c.req.Prompt, Peak: c.req.Prompt})
	r.report(repBegin, c.id, c.req.Prompt) // adopt counts the call here only
	r.metrics.knownPassed.Inc()
	r.log.Info("a session live at the last contact with the leader passes while no leader answers", "session", c.id)
	return true
}
