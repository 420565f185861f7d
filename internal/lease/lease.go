// Package lease elects one leader among basin processes through a lease in Redis or Valkey,
// and fences the leader's writes with the lease's term, so that a leader paused past its lease
// (a GC pause, SIGSTOP, a VM migration) and then resumed cannot overwrite what its successor
// wrote. It is the foundation of basin's replicated mode: the admission leader and the daemon's
// lock both campaign through it; nothing else in basin depends on it yet.
//
// The store holds two keys per lease: Prefix:lease, the owner's id with a TTL, and
// Prefix:epoch, a counter that never expires. A campaigner takes a free lease with SET NX PX
// and, in the same Lua script, INCRs the epoch: every term has its own number, strictly higher
// than the last. The leader renews every RenewInterval through a script that extends the TTL
// only if the lease still names this owner and this epoch. It steps down at once when a
// renewal is refused (another owner or a later epoch), and without hearing from the store at
// TTL − Margin after the last renewal it sent — before the lease can have lapsed in the store
// and passed to another, whatever the network did. A renewal that fails for a store error is
// retried until then: stepping down at the first error would leave no leader at all until the
// lease lapses, since nobody else can take it before.
//
// Leadership alone does not make a write safe: a process can be paused between checking it
// and writing. Every leader write therefore goes through Campaign.Write, a script that runs the
// caller's commands only if the epoch in the store is still the caller's and otherwise refuses
// with ErrFenced. Valkey speaks the same protocol and runs the same scripts. The store's
// durability bounds the guarantee: run it with an append-only file (appendfsync always or
// everysec) so the epoch survives a restart; the acquire script also never issues an epoch
// below the highest this campaigner has seen.
package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotOwner is returned by Release when the lease is not this campaigner's in its term.
var ErrNotOwner = errors.New("lease not held by this owner in this epoch")

// Change is a change of leadership as seen by one campaigner.
type Change struct {
	// Leader is true when this campaigner became leader, false when it stepped down.
	Leader bool
	// Epoch is the term: the one won, or the one lost.
	Epoch uint64
	// At is the time of the change on the campaign's clock.
	At time.Time
	// Reason says why, with the numbers: who holds the lease now, since when no renewal.
	Reason string
}

// Campaign campaigns for one lease. Drive it from one goroutine with Run (or Step, for a caller
// with its own loop); read it with Leader and write with Write from any goroutine.
type Campaign struct {
	client  redis.Scripter
	opts    Options
	metrics *metrics

	mu struct {
		sync.Mutex
		leader bool
		epoch  uint64 // the term held, or the last one lost
		// deadline is when the leader steps down without a successful renewal: TTL − Margin
		// after the last successful renewal was sent.
		deadline time.Time
		// seen is the highest epoch this campaigner has observed in the store.
		seen uint64
	}
}

// New returns a Campaign for the lease opts.Prefix on client (any go-redis client: single
// node, Sentinel failover or cluster). Create the client with ContextTimeoutEnabled so that a
// renewal stuck on an unreachable store gives up at the leader's deadline rather than at the
// client's read timeout.
func New(client redis.Scripter, opts Options) (*Campaign, error) {
	if client == nil {
		return nil, errors.New("lease: client is nil")
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("lease options: %w", err)
	}
	opts = opts.withDefaults()
	m, err := newMetrics(opts.Registerer, opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", opts.Prefix, err)
	}
	return &Campaign{client: client, opts: opts, metrics: m}, nil
}

// Leader reports the term this campaigner leads, if it does. It turns false by itself at the
// deadline, even when the goroutine driving the campaign is stuck in a call to the store.
func (c *Campaign) Leader() (epoch uint64, ok bool) {
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.mu.leader || !now.Before(c.mu.deadline) {
		return 0, false
	}
	return c.mu.epoch, true
}

// Run campaigns until ctx is done: it tries to take the lease every RenewInterval, renews it
// while it holds it, and steps down at the deadline when renewals fail. On return it releases
// a lease it still holds, so that a successor need not wait for the TTL. It returns nil when
// ctx is cancelled.
func (c *Campaign) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RenewInterval)
			err := c.Release(rctx)
			cancel()
			if err != nil && !errors.Is(err, ErrNotOwner) {
				c.opts.Logger.Warn("lease: release on stop failed; successor waits for the TTL", "lease", c.opts.Prefix, "err", err)
			}
			return nil
		case <-timer.C:
		}
		c.Step(ctx)
		timer.Reset(c.nextWait())
	}
}

// nextWait is how long Run sleeps after a step: RenewInterval, or less when the leader's
// deadline comes first, so that stepping down is never late by a tick.
func (c *Campaign) nextWait() time.Duration {
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	wait := c.opts.RenewInterval
	if c.mu.leader {
		wait = min(wait, c.mu.deadline.Sub(now))
	}
	return max(wait, 0)
}

// Step does one round of the campaign at the clock's now: a leader past its deadline steps
// down, a leader renews, a follower tries to take a free lease. Errors of the store are
// logged and counted, not returned: the campaign goes on.
func (c *Campaign) Step(ctx context.Context) {
	now := c.opts.Now()
	c.mu.Lock()
	leader, epoch, deadline, seen := c.mu.leader, c.mu.epoch, c.mu.deadline, c.mu.seen
	c.mu.Unlock()

	if leader && !now.Before(deadline) {
		c.stepDown(now, epoch, fmt.Sprintf("no successful renewal since %v: the lease may have lapsed in the store",
			deadline.Add(-c.opts.TTL+c.opts.Margin).Format(time.RFC3339Nano)))
		leader = false
	}
	if leader {
		c.renew(ctx, now, epoch, deadline)
		return
	}
	c.acquire(ctx, now, seen)
}

// renew extends a held lease; the call may last until the deadline at most.
func (c *Campaign) renew(ctx context.Context, now time.Time, epoch uint64, deadline time.Time) {
	cctx, cancel := context.WithTimeout(ctx, deadline.Sub(now))
	defer cancel()
	res, err := renewScript.Run(cctx, c.client,
		[]string{c.opts.leaseKey(), c.opts.epochKey()},
		c.opts.Owner, strconv.FormatUint(epoch, 10), c.opts.TTL.Milliseconds()).Slice()
	if err == nil {
		var ok bool
		var holder string
		var cur uint64
		ok, holder, cur, err = parseVerdict(res)
		if err == nil && ok {
			c.mu.Lock()
			if c.mu.leader && c.mu.epoch == epoch {
				c.mu.deadline = now.Add(c.opts.TTL - c.opts.Margin)
			}
			c.mu.Unlock()
			return
		}
		if err == nil {
			c.observe(cur)
			c.stepDown(c.opts.Now(), epoch, fmt.Sprintf("renewal refused: the store has owner %q at epoch %d", holder, cur))
			return
		}
	}
	if ctx.Err() != nil {
		return // the campaign is stopping (Run releases next): not a failure of the store
	}
	c.metrics.errors.WithLabelValues("renew").Inc()
	c.opts.Logger.Warn("lease: renewal failed; retrying until the deadline", "lease", c.opts.Prefix, "epoch", epoch,
		"deadline", deadline, "err", fmt.Errorf("renew %s: %w", c.opts.leaseKey(), err))
	if now := c.opts.Now(); !now.Before(deadline) {
		c.stepDown(now, epoch, fmt.Sprintf("renewal failed until the deadline: %v", err))
	}
}

// acquire tries to take a free lease and start a new term.
func (c *Campaign) acquire(ctx context.Context, now time.Time, seen uint64) {
	cctx, cancel := context.WithTimeout(ctx, c.opts.RenewInterval)
	defer cancel()
	res, err := acquireScript.Run(cctx, c.client,
		[]string{c.opts.leaseKey(), c.opts.epochKey()},
		c.opts.Owner, c.opts.TTL.Milliseconds(), strconv.FormatUint(seen, 10)).Slice()
	var won bool
	var epoch uint64
	if err == nil {
		if won, _, epoch, err = parseVerdict(res); err == nil && !won {
			c.observe(epoch)
			return
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return // the campaign is stopping
		}
		c.metrics.errors.WithLabelValues("acquire").Inc()
		c.opts.Logger.Warn("lease: acquire failed", "lease", c.opts.Prefix, "err", fmt.Errorf("acquire %s: %w", c.opts.leaseKey(), err))
		return
	}
	c.observe(epoch)
	c.mu.Lock()
	c.mu.leader, c.mu.epoch, c.mu.deadline = true, epoch, now.Add(c.opts.TTL-c.opts.Margin)
	c.mu.Unlock()
	c.changed(Change{Leader: true, Epoch: epoch, At: c.opts.Now(), Reason: "took the free lease"})
}

// Release frees the lease if this campaigner holds it in its term, and steps down. It returns
// ErrNotOwner when the store says otherwise (the campaigner steps down all the same). Called
// while Run runs, the next step campaigns again; to leave for good, cancel Run's context: Run
// releases on return.
func (c *Campaign) Release(ctx context.Context) error {
	c.mu.Lock()
	leader, epoch := c.mu.leader, c.mu.epoch
	c.mu.Unlock()
	res, err := releaseScript.Run(ctx, c.client,
		[]string{c.opts.leaseKey(), c.opts.epochKey()},
		c.opts.Owner, strconv.FormatUint(epoch, 10)).Slice()
	if err != nil {
		c.metrics.errors.WithLabelValues("release").Inc()
		return fmt.Errorf("lease: release %s: %w", c.opts.leaseKey(), err)
	}
	ok, holder, cur, err := parseVerdict(res)
	if err != nil {
		return fmt.Errorf("lease: release %s: %w", c.opts.leaseKey(), err)
	}
	if leader {
		reason := "released the lease"
		if !ok {
			reason = fmt.Sprintf("release refused: the store has owner %q at epoch %d", holder, cur)
		}
		c.stepDown(c.opts.Now(), epoch, reason)
	}
	if !ok {
		c.observe(cur)
		return fmt.Errorf("lease: release %s at epoch %d: owner %q at epoch %d: %w", c.opts.leaseKey(), epoch, holder, cur, ErrNotOwner)
	}
	return nil
}

// stepDown records the loss of the term epoch, once.
func (c *Campaign) stepDown(now time.Time, epoch uint64, reason string) {
	c.mu.Lock()
	was := c.mu.leader && c.mu.epoch == epoch
	if was {
		c.mu.leader = false
	}
	c.mu.Unlock()
	if was {
		c.changed(Change{Leader: false, Epoch: epoch, At: now, Reason: reason})
	}
}

// observe raises the highest epoch seen.
func (c *Campaign) observe(epoch uint64) {
	c.mu.Lock()
	c.mu.seen = max(c.mu.seen, epoch)
	c.mu.Unlock()
}

func (c *Campaign) changed(ch Change) {
	c.metrics.changed(ch)
	c.opts.Logger.Info("lease: leadership changed", "lease", c.opts.Prefix, "owner", c.opts.Owner,
		"leader", ch.Leader, "epoch", ch.Epoch, "reason", ch.Reason)
	if c.opts.OnChange != nil {
		c.opts.OnChange(ch)
	}
}

// parseVerdict reads a script's {status, owner?, epoch?} or {1, epoch} reply.
func parseVerdict(res []any) (ok bool, owner string, epoch uint64, err error) {
	if len(res) == 0 {
		return false, "", 0, errors.New("empty script reply")
	}
	status, isInt := res[0].(int64)
	if !isInt {
		return false, "", 0, fmt.Errorf("script reply: status %T, want an integer", res[0])
	}
	ok = status == 1
	switch {
	case ok && len(res) == 2: // acquire: {1, epoch}
		epoch, err = parseEpoch(res[1])
	case !ok && len(res) == 3: // {0, owner, epoch}
		owner, _ = res[1].(string)
		epoch, err = parseEpoch(res[2])
	case ok && len(res) == 1:
	default:
		err = fmt.Errorf("script reply: %d elements with status %d", len(res), status)
	}
	return ok, owner, epoch, err
}

// parseEpoch reads an epoch replied as an integer (INCR) or a string (GET).
func parseEpoch(v any) (uint64, error) {
	switch e := v.(type) {
	case int64:
		if e < 0 {
			return 0, fmt.Errorf("epoch %d is negative", e)
		}
		return uint64(e), nil
	case string:
		n, err := strconv.ParseUint(e, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("epoch %q: %w", e, err)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("epoch of type %T", v)
	}
}
