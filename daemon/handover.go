package daemon

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/basin-dev/basin/internal/lease"
)

// BlindHandover is how long the acting daemon stays blind, while a standby sees, before it gives
// the lease up. A blind daemon acts on nothing it cannot see; one whose gateway replica died, or
// whose network lost the engines, would otherwise hold the lease indefinitely while a standby
// that sees everything watches. A minute of the deployment's time rides out a scrape or two that
// fail, so that the role does not flap on a blip.
const BlindHandover = time.Minute

// Sight: every daemon with a store says whether it sees, under P:daemon:sight:<instance> (set
// with the lease's TTL while it sees, deleted as soon as it is blind), and lists its instance in
// the set P:daemon:instances. The acting daemon hands over only to a daemon that sees; a blind
// daemon does not campaign while another sees (if none sees, they all campaign: a blind daemon
// still keeps an incident cut and enters incident mode on an alert, so one of them must act).

func (h *ha) sightKey(instance string) string { return h.prefix + ":sight:" + instance }
func (h *ha) instancesKey() string            { return h.prefix + ":instances" }

// publishSight records whether this daemon sees, after a step. Errors are logged at debug: the
// worst a lost write does is a handover a step later or sooner, and the store's outages are
// reported by the lease.
func (d *Daemon) publishSight(ctx context.Context, blind bool) {
	h := d.ha
	ctx, cancel := context.WithTimeout(ctx, time.Duration(d.cfg.Store.OpTimeout))
	defer cancel()
	var err error
	if blind {
		err = h.client.Del(ctx, h.sightKey(h.instance)).Err()
	} else {
		_, err = h.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.SAdd(ctx, h.instancesKey(), h.instance)
			p.Set(ctx, h.sightKey(h.instance), "1", time.Duration(d.cfg.Store.LeaseTTL))
			return nil
		})
	}
	if err != nil {
		h.log.Debug("publishing sight failed", "blind", blind, "err", err)
	}
}

// othersSee lists the other daemons that see now, sorted; none when the store cannot say.
func (d *Daemon) othersSee(ctx context.Context) []string {
	h := d.ha
	ctx, cancel := context.WithTimeout(ctx, time.Duration(d.cfg.Store.OpTimeout))
	defer cancel()
	names, err := h.client.SMembers(ctx, h.instancesKey()).Result()
	if err != nil {
		return nil
	}
	var keys, others []string
	for _, n := range names {
		if n != h.instance {
			keys, others = append(keys, h.sightKey(n)), append(others, n)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	vals, err := h.client.MGet(ctx, keys...).Result()
	if err != nil {
		return nil
	}
	var out []string
	for i, v := range vals {
		if v != nil {
			out = append(out, others[i])
		}
	}
	return out
}

// noteSight is the step's part: it tracks how long this daemon has been blind, publishes its
// sight, and hands the lease over when it acts, has been blind for BlindHandover, and another
// daemon sees. It returns whether it handed over (the step then goes on as standby's).
func (d *Daemon) noteSight(ctx context.Context, now time.Time, unseen []string, term uint64, acting bool) bool {
	if d.ha == nil {
		return false
	}
	blind := len(unseen) > 0
	switch {
	case !blind:
		d.blindSince = time.Time{}
	case d.blindSince.IsZero():
		d.blindSince = now
	}
	d.publishSight(ctx, blind)
	if !acting || !blind || now.Sub(d.blindSince) < BlindHandover {
		return false
	}
	seers := d.othersSee(ctx)
	if len(seers) == 0 {
		return false // nobody sees better: keep acting (a cut is held, alerts still count)
	}
	reason := "blind for " + now.Sub(d.blindSince).Round(time.Second).String() + " (cannot see " + strings.Join(unseen, "; ") +
		") while " + strings.Join(seers, ", ") + " sees"
	d.stepDown(term, "blind", reason)
	rctx, cancel := context.WithTimeout(ctx, time.Duration(d.cfg.Store.OpTimeout))
	defer cancel()
	if err := d.ha.camp.Release(rctx); err != nil && !errors.Is(err, lease.ErrNotOwner) {
		d.ha.log.Warn("handing over: releasing the lease failed; it lapses after its TTL", "err", err)
	}
	return true
}

// campaignStep is one round of the campaign: the leader renews; a follower tries to take a free
// lease unless it is blind while another daemon sees (it would take the lease only to hand it
// back a minute later, or hold it blind).
func (d *Daemon) campaignStep(ctx context.Context) {
	h := d.ha
	if _, leader := h.camp.Leader(); !leader && d.isBlind() && len(d.othersSee(ctx)) > 0 {
		return
	}
	h.camp.Step(ctx)
}

// isBlind is whether the last step could not see everything (before the first step: not
// known, not blind: a daemon starting alone must be able to campaign).
func (d *Daemon) isBlind() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.ready && len(d.mu.unseen) > 0
}

// campaign runs the campaign until ctx is done, a round every renewInterval (wall time), then
// releases a lease it still holds so that a successor need not wait for the TTL.
func (d *Daemon) campaign(ctx context.Context, renewInterval time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), renewInterval)
			err := d.ha.camp.Release(rctx)
			cancel()
			if err != nil && !errors.Is(err, lease.ErrNotOwner) {
				d.ha.log.Warn("lease: release on stop failed; successor waits for the TTL", "err", err)
			}
			return
		case <-t.C:
		}
		d.campaignStep(ctx)
		t.Reset(renewInterval)
	}
}
