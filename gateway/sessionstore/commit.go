package sessionstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/lease"
)

// op is one change of a group commit: set a session (value is its JSON) or delete it; or, with
// queued, record a queued session's arrival (value, RFC 3339).
type op struct {
	del    bool
	queued bool
	id     string
	value  string
}

// batch is the ops of one group commit: one fenced script call at one epoch. Callers wait on
// done; err is set before done closes.
type batch struct {
	epoch uint64
	ops   []op
	done  chan struct{}
	err   error
}

// Admit makes one admission durable at epoch: it returns once the session is in the store, on
// an error (fenced: errors.Is lease.ErrFenced) or when ctx is done. Call it after the admission
// core admitted the session and before forwarding its first call.
//
// Concurrent Admits are group-committed: one call writes while the callers arriving meanwhile
// queue up, and the next write carries all of them (up to Options.Chunk) in one script call.
// At one admission at a time this is a round trip per admission; at thousands a second it is
// one round trip (and one fsync of the store's append-only file) per burst. The write runs on
// its own, bounded by Options.WriteTimeout: a caller whose ctx ends stops waiting but does not
// cancel the write it shares with others, so its admission may still become durable. (The
// first caller of a burst writes its batch itself, so it waits for that write, WriteTimeout at
// most, whatever its ctx.)
func (s *Store) Admit(ctx context.Context, epoch uint64, ls admission.LiveSession) error {
	if ls.ID == "" {
		return errors.New("sessionstore: admit: session id is empty")
	}
	v, err := json.Marshal(ls)
	if err != nil {
		return fmt.Errorf("sessionstore: admit %q: %w", ls.ID, err)
	}
	return s.commit(ctx, epoch, op{id: ls.ID, value: string(v)})
}

// Queue records a session that went into the leader's queue, with its arrival, in the queued
// hash, group-committed with the admissions. A successor loads it as a retry memory, so the
// session keeps its place in time even when its client, cut off with the old leader, asks
// again before the next Save would have written the queue out. Save deletes the entries it
// covers.
func (s *Store) Queue(ctx context.Context, epoch uint64, id string, arrival time.Time) error {
	if id == "" {
		return errors.New("sessionstore: queue: session id is empty")
	}
	return s.commit(ctx, epoch, op{queued: true, id: id, value: arrival.UTC().Format(time.RFC3339Nano)})
}

// End deletes ended sessions from the store at epoch, group-committed with Admits. It is
// optional (the next Save deletes them); it narrows the window in which a new leader would
// load a session that has ended.
func (s *Store) End(ctx context.Context, epoch uint64, ids ...string) error {
	ops := make([]op, 0, len(ids))
	for i, id := range ids {
		if id == "" {
			return fmt.Errorf("sessionstore: end: ids[%d]: empty", i)
		}
		ops = append(ops, op{del: true, id: id})
	}
	return s.commit(ctx, epoch, ops...)
}

// commit queues ops for the next group commit at epoch and waits for them.
func (s *Store) commit(ctx context.Context, epoch uint64, ops ...op) error {
	if len(ops) == 0 {
		return nil
	}
	var wait []*batch
	s.mu.Lock()
	for _, o := range ops {
		if !o.queued {
			s.mu.touched[o.id] = struct{}{}
		}
	}
	for len(ops) > 0 {
		var b *batch
		if n := len(s.mu.queue); n > 0 && s.mu.queue[n-1].epoch == epoch && len(s.mu.queue[n-1].ops) < s.opts.Chunk {
			b = s.mu.queue[n-1]
		} else {
			b = &batch{epoch: epoch, done: make(chan struct{})}
			s.mu.queue = append(s.mu.queue, b)
		}
		k := min(len(ops), s.opts.Chunk-len(b.ops))
		b.ops = append(b.ops, ops[:k]...)
		ops = ops[k:]
		if len(wait) == 0 || wait[len(wait)-1] != b {
			wait = append(wait, b)
		}
	}
	// With no write in flight the queue was empty, so the head batch is this caller's: it
	// writes it itself (a goroutine hand-off costs tens of microseconds on a busy machine,
	// against a round trip of 50–100), then leaves whatever queued meanwhile to a flusher.
	inline := !s.mu.flushing
	s.mu.flushing = true
	s.mu.Unlock()
	if inline {
		wctx := context.WithoutCancel(ctx)
		if s.flushOne(wctx) {
			go s.flush(wctx)
		}
	}

	for _, b := range wait {
		select {
		case <-b.done: // written already (by this caller, say): no race with ctx below
			if b.err != nil {
				return b.err
			}
			continue
		default:
		}
		select {
		case <-b.done:
			if b.err != nil {
				return b.err
			}
		case <-ctx.Done():
			return fmt.Errorf("sessionstore: waiting for the group commit: %w", ctx.Err())
		}
	}
	return nil
}

// flush writes the queued batches one after the other until none is left. Only one flush runs
// at a time: that is what lets the callers queued during a write share the next.
func (s *Store) flush(ctx context.Context) {
	for s.flushOne(ctx) {
	}
}

// flushOne writes the head batch of the queue and reports whether more are queued; when none
// is, the flush is over.
func (s *Store) flushOne(ctx context.Context) (more bool) {
	s.mu.Lock()
	if len(s.mu.queue) == 0 {
		s.mu.flushing = false
		s.mu.Unlock()
		return false
	}
	b := s.mu.queue[0]
	s.mu.queue[0] = nil
	s.mu.queue = s.mu.queue[1:]
	s.mu.Unlock()

	b.err = s.writeBatch(ctx, b)
	close(b.done)

	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.mu.queue) == 0 {
		s.mu.flushing = false
		return false
	}
	return true
}

// writeBatch writes one group commit: runs of sets and of deletions, in order, each one
// command.
func (s *Store) writeBatch(ctx context.Context, b *batch) error {
	var cmds []lease.Cmd
	for i := 0; i < len(b.ops); {
		j := i
		var args []any
		for ; j < len(b.ops) && b.ops[j].del == b.ops[i].del && b.ops[j].queued == b.ops[i].queued; j++ {
			args = append(args, b.ops[j].id)
			if !b.ops[j].del {
				args = append(args, b.ops[j].value)
			}
		}
		name, key := "HSET", s.keys.sessions
		if b.ops[i].del {
			name = "HDEL"
		}
		if b.ops[i].queued {
			key = s.keys.queued
		}
		cmds = append(cmds, lease.Cmd{Name: name, Keys: []string{key}, Args: args})
		i = j
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
	defer cancel()
	err := s.write(ctx, opCommit, b.epoch, cmds...)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, lease.ErrFenced):
		s.mu.Lock()
		s.mu.forget = true
		s.mu.Unlock()
		return err
	default:
		s.metrics.errors.WithLabelValues(opCommit).Inc()
		err = fmt.Errorf("sessionstore: group commit of %d sessions: %w", len(b.ops), err)
		s.opts.Logger.Warn("sessionstore: group commit failed; a later Save writes its sessions", "epoch", b.epoch, "err", err)
		return err
	}
}
