package sessionstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/lease"
)

// Fencer is what a leader writes through: the commands run only while the store's epoch is the
// writer's, and otherwise fail with lease.ErrFenced. *lease.Campaign satisfies it.
type Fencer interface {
	Write(ctx context.Context, epoch uint64, cmds ...lease.Cmd) ([]any, error)
}

var _ Fencer = (*lease.Campaign)(nil)

// Client is the part of a go-redis client the store reads and heartbeats through;
// *redis.Client, *redis.ClusterClient and *redis.Ring satisfy it.
type Client interface {
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	HScan(ctx context.Context, key string, cursor uint64, match string, count int64) *redis.ScanCmd
	HKeys(ctx context.Context, key string) *redis.StringSliceCmd
	Get(ctx context.Context, key string) *redis.StringCmd
	ZRangeByScore(ctx context.Context, key string, opt *redis.ZRangeBy) *redis.StringSliceCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
	// Scripter runs the heartbeat's claim of a replica id in one step.
	redis.Scripter
}

// loadScanCount is the COUNT of Load's HSCAN steps: 1–2 ms of the store's time each.
const loadScanCount = 1000

// Fields of the admission hash.
const (
	fieldMeta  = "meta"
	fieldRetry = "retry"
	fieldShed  = "shed"
)

// Meta is what the leader keeps besides the sessions, stored as the admission hash's "meta"
// field.
type Meta struct {
	// CountOnly, Budget and ReferenceBudget are the admission core's, as in admission.State.
	// Load fills them (and the State's) from the store; Save writes the State's and ignores
	// these, so a caller need not copy them and cannot save two different budgets.
	CountOnly       bool  `json:"count_only"`
	Budget          int64 `json:"budget_tokens"`
	ReferenceBudget int64 `json:"reference_budget_tokens"`
	// DaemonTerm is the highest Basin-Daemon-Term the gateway has accepted on an admin write.
	DaemonTerm uint64 `json:"daemon_term"`
	// Affinity is the affinity switch as last set, nil when never set.
	Affinity *bool `json:"affinity"`
}

// Store reads and writes one gateway's session table. Its methods are safe for concurrent use;
// Saves run one at a time.
type Store struct {
	client  Client
	fencer  Fencer
	opts    Options
	keys    keys
	metrics *metrics

	// saveMu serializes Save and Load, and guards base.
	saveMu sync.Mutex
	// base is what the store holds as far as this Store knows (nil: unknown, the next Save
	// rewrites everything).
	base *base

	mu struct {
		sync.Mutex
		// touched are the sessions an Admit or End wrote since the last Save built its diff.
		touched map[string]struct{}
		// forget is set when a group commit was fenced: the next Save starts over.
		forget bool
		// queue holds the group commits waiting for a write, oldest first.
		queue    []*batch
		flushing bool
	}
}

// base is the diff base: the table as this Store last wrote or loaded it.
type base struct {
	// epoch is the term it was written in; loaded is true when it was read by Load since, and
	// then holds for whatever term saves next.
	epoch  uint64
	loaded bool
	// sessions are the stored sessions; gen marks those seen by the Save in progress.
	sessions map[string]*entry
	gen      uint64
	// dirty are sessions whose stored value is unknown (touched by a group commit during the
	// last Save, or found in the store by a full rewrite): the next Save writes or deletes them.
	dirty map[string]struct{}
	// meta is the stored meta field's JSON; retry and shed the stored memories.
	meta        []byte
	retry, shed map[string]time.Time
	// full is true when nothing of the admission hash is known: write all of it.
	full bool
}

type entry struct {
	ls  admission.LiveSession
	gen uint64
}

// New returns a Store writing through f on client. f must be the campaign of the gateway's
// admission lease (Options.Prefix), whose epoch fences the writes.
func New(client Client, f Fencer, o Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("sessionstore: client is nil")
	}
	if f == nil {
		return nil, errors.New("sessionstore: fencer is nil")
	}
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("sessionstore options: %w", err)
	}
	o = o.withDefaults()
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("sessionstore %s: %w", o.Prefix, err)
	}
	s := &Store{client: client, fencer: f, opts: o, keys: o.keys(), metrics: m}
	s.mu.touched = map[string]struct{}{}
	return s, nil
}

// Load reads the whole table for a leader taking over, in steps that leave the store to its
// other clients in between: call it after winning the term and
// before the first Save, so that the first Save writes only what changed since. A value that
// does not decode is an error naming the key and the field (the session id): dropping it would
// admit that session's next call as new. Fields this version does not know are ignored, so a
// newer gateway's table still loads during a rolling upgrade. Live is sorted by id; Retry and
// Shed are never nil.
func (s *Store) Load(ctx context.Context) (admission.State, Meta, error) {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	st, m, b, err := s.load(ctx)
	if err != nil {
		s.metrics.errors.WithLabelValues(opLoad).Inc()
		return admission.State{}, Meta{}, err
	}
	s.base = b
	s.metrics.sessions.Set(float64(len(st.Live)))
	return st, m, nil
}

func (s *Store) load(ctx context.Context) (admission.State, Meta, *base, error) {
	st := admission.State{Retry: map[string]time.Time{}, Shed: map[string]time.Time{}}
	var m Meta
	b := &base{loaded: true, sessions: map[string]*entry{}, dirty: map[string]struct{}{}}
	// HSCAN rather than HGETALL: one HGETALL of 100,000 sessions would hold the store for about
	// 150 ms on a busy 2-core VM (29 ms for 20,000), every other client (lease renewals,
	// heartbeats) waiting; a scan step of loadScanCount takes 1–2 ms (TestRealRedisSaveLoad20k
	// logs the scan step). A scan may return a field twice, never miss one that stays
	// put, and nobody else writes the table while a new leader loads it.
	for cursor := uint64(0); ; {
		kv, next, err := s.client.HScan(ctx, s.keys.sessions, cursor, "", loadScanCount).Result()
		if err != nil {
			return st, m, nil, fmt.Errorf("sessionstore: load %s: %w", s.keys.sessions, err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			id, v := kv[i], kv[i+1]
			if _, dup := b.sessions[id]; dup {
				continue
			}
			var ls admission.LiveSession
			if err := json.Unmarshal([]byte(v), &ls); err != nil {
				return st, m, nil, fmt.Errorf("sessionstore: load %s field %q: %w", s.keys.sessions, id, err)
			}
			if ls.ID != id {
				return st, m, nil, fmt.Errorf("sessionstore: load %s field %q: the session's id is %q", s.keys.sessions, id, ls.ID)
			}
			st.Live = append(st.Live, ls)
			b.sessions[id] = &entry{ls: ls}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if st.Live == nil {
		st.Live = []admission.LiveSession{}
	}
	sort.Slice(st.Live, func(i, j int) bool { return st.Live[i].ID < st.Live[j].ID })

	adm, err := s.client.HGetAll(ctx, s.keys.admission).Result()
	if err != nil {
		return st, m, nil, fmt.Errorf("sessionstore: load %s: %w", s.keys.admission, err)
	}
	if v, ok := adm[fieldMeta]; ok {
		if err := json.Unmarshal([]byte(v), &m); err != nil {
			return st, m, nil, fmt.Errorf("sessionstore: load %s field %q: %w", s.keys.admission, fieldMeta, err)
		}
		st.CountOnly, st.Budget, st.ReferenceBudget = m.CountOnly, m.Budget, m.ReferenceBudget
		if b.meta, err = json.Marshal(m); err != nil {
			return st, m, nil, fmt.Errorf("sessionstore: load %s field %q: %w", s.keys.admission, fieldMeta, err)
		}
	}
	for field, dst := range map[string]map[string]time.Time{fieldRetry: st.Retry, fieldShed: st.Shed} {
		v, ok := adm[field]
		if !ok {
			continue
		}
		var mm map[string]time.Time
		if err := json.Unmarshal([]byte(v), &mm); err != nil {
			return st, m, nil, fmt.Errorf("sessionstore: load %s field %q: %w", s.keys.admission, field, err)
		}
		maps.Copy(dst, mm)
	}
	b.retry, b.shed = maps.Clone(st.Retry), maps.Clone(st.Shed)
	// Sessions queued since the last Save (Queue): their arrivals are retry memories too. After
	// the base is taken, so that the next Save writes them into the retry field before it
	// deletes them here.
	queued, err := s.client.HGetAll(ctx, s.keys.queued).Result()
	if err != nil {
		return st, m, nil, fmt.Errorf("sessionstore: load %s: %w", s.keys.queued, err)
	}
	live := make(map[string]bool, len(st.Live))
	for _, ls := range st.Live {
		live[ls.ID] = true
	}
	for id, v := range queued {
		a, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return st, m, nil, fmt.Errorf("sessionstore: load %s field %q: %w", s.keys.queued, id, err)
		}
		if r, ok := st.Retry[id]; !live[id] && (!ok || a.Before(r)) {
			st.Retry[id] = a
		}
	}
	return st, m, b, nil
}

// queuedKeep is how long a queued arrival no Save has covered is kept: past the admission
// core's retry memory it no longer matters.
const queuedKeep = time.Hour

// cleanQueued deletes the queued arrivals a successful Save of st covers (now in its retry
// field, or live), and those older than queuedKeep. Entries written after st was exported are
// left for the next Save.
func (s *Store) cleanQueued(ctx context.Context, epoch uint64, st admission.State) error {
	queued, err := s.client.HGetAll(ctx, s.keys.queued).Result()
	if err != nil || len(queued) == 0 {
		return err
	}
	live := make(map[string]bool, len(st.Live))
	for _, ls := range st.Live {
		live[ls.ID] = true
	}
	cutoff := s.opts.Now().Add(-queuedKeep)
	var del []any
	for id, v := range queued {
		_, retry := st.Retry[id]
		a, perr := time.Parse(time.RFC3339Nano, v)
		if retry || live[id] || perr != nil || a.Before(cutoff) {
			del = append(del, id)
		}
	}
	var cmds []lease.Cmd
	for len(del) > 0 {
		n := min(len(del), s.opts.Chunk)
		cmds = append(cmds, lease.Cmd{Name: "HDEL", Keys: []string{s.keys.queued}, Args: del[:n]})
		del = del[n:]
	}
	if len(cmds) == 0 {
		return nil
	}
	return s.write(ctx, opSave, epoch, cmds...)
}

// Save writes the leader's state at epoch as a diff against what this Store last wrote or
// loaded: new and changed sessions are set, ended ones deleted, and the meta, retry and shed
// fields written when they changed; nothing at all when nothing changed. The first Save after
// New, after an error or in a term other than the base's rewrites everything and deletes the
// sessions the store holds that st lacks. Sessions go in chunks of Options.Chunk per fenced
// script call, a few calls in flight.
//
// Any error forgets the diff base, so the next Save rewrites everything: a call that failed may
// still have been applied, and a fenced one means another leader has written since. A fenced
// error is returned as is (errors.Is lease.ErrFenced). Sessions an Admit or End touched since
// the last Save are left to the next one (see the package doc).
func (s *Store) Save(ctx context.Context, epoch uint64, st admission.State, m Meta) error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	err := s.save(ctx, epoch, st, m)
	if err == nil {
		err = s.cleanQueued(ctx, epoch, st)
	}
	if err != nil {
		s.base = nil
		if !errors.Is(err, lease.ErrFenced) {
			s.metrics.errors.WithLabelValues(opSave).Inc()
		}
	}
	return err
}

func (s *Store) save(ctx context.Context, epoch uint64, st admission.State, m Meta) error {
	s.mu.Lock()
	if s.mu.forget {
		s.mu.forget = false
		s.base = nil
	}
	s.mu.Unlock()

	b := s.base
	if b != nil && !b.loaded && b.epoch != epoch {
		b = nil // another term may have written since this Store did
	}
	if b == nil {
		ids, err := s.client.HKeys(ctx, s.keys.sessions).Result()
		if err != nil {
			return fmt.Errorf("sessionstore: save: list %s: %w", s.keys.sessions, err)
		}
		b = &base{sessions: make(map[string]*entry, len(st.Live)), dirty: make(map[string]struct{}, len(ids)), full: true}
		for _, id := range ids {
			b.dirty[id] = struct{}{}
		}
	}
	// b is mutated in place below: on any error Save forgets it.

	// The sessions group commits touched up to now are left to the next Save. Taken after the
	// listing, so that a session admitted while it ran, which it may list, is among them.
	s.mu.Lock()
	touched := s.mu.touched
	s.mu.touched = map[string]struct{}{}
	s.mu.Unlock()

	b.gen++
	var sets, dels []string // sets: id, JSON pairs
	// The loop runs over every live session at every Save: no copies of sessions, no lookups
	// in the (usually empty) touched and dirty sets when they are empty.
	known0, matched := len(b.sessions), 0
	for i := range st.Live {
		ls := &st.Live[i]
		if ls.ID == "" {
			return fmt.Errorf("sessionstore: save: live[%d].id: empty", i)
		}
		e, known := b.sessions[ls.ID]
		if known && e.gen == b.gen {
			return fmt.Errorf("sessionstore: save: live[%d].id: %q twice", i, ls.ID)
		}
		if known {
			matched++
		} else {
			e = &entry{}
			b.sessions[ls.ID] = e
		}
		e.gen = b.gen
		if len(touched) > 0 {
			if _, ok := touched[ls.ID]; ok {
				continue
			}
		}
		dirty := false
		if len(b.dirty) > 0 {
			_, dirty = b.dirty[ls.ID]
		}
		if known && !dirty && sameSession(&e.ls, ls) {
			continue
		}
		v, err := json.Marshal(ls)
		if err != nil {
			return fmt.Errorf("sessionstore: save: session %q: %w", ls.ID, err)
		}
		e.ls = *ls
		sets = append(sets, ls.ID, string(v))
	}
	// Ended sessions: the known0 − matched known ones st lacks (the walk stops when it has them
	// all), then dirty ones st lacks (each id once).
	for id, e := range b.sessions {
		if matched == known0 {
			break
		}
		if e.gen == b.gen {
			continue
		}
		delete(b.sessions, id)
		matched++
		_, dirty := b.dirty[id]
		if _, ok := touched[id]; !ok && !dirty {
			dels = append(dels, id)
		}
	}
	for id := range b.dirty {
		if _, live := b.sessions[id]; live {
			continue
		}
		if _, ok := touched[id]; !ok {
			dels = append(dels, id)
		}
	}

	var adm []any
	m.CountOnly, m.Budget, m.ReferenceBudget = st.CountOnly, st.Budget, st.ReferenceBudget
	meta, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("sessionstore: save: meta: %w", err)
	}
	if b.full || !bytes.Equal(meta, b.meta) {
		adm = append(adm, fieldMeta, string(meta))
	}
	retry, shed := nonNil(st.Retry), nonNil(st.Shed)
	for _, f := range []struct {
		name       string
		stored, to map[string]time.Time
	}{{fieldRetry, b.retry, retry}, {fieldShed, b.shed, shed}} {
		if !b.full && sameTimes(f.stored, f.to) {
			continue
		}
		v, err := json.Marshal(f.to)
		if err != nil {
			return fmt.Errorf("sessionstore: save: %s: %w", f.name, err)
		}
		adm = append(adm, f.name, string(v))
	}

	if err := s.writeChunks(ctx, epoch, sets, dels, adm); err != nil {
		return err
	}
	b.epoch, b.loaded, b.full, b.dirty = epoch, false, false, touched
	b.meta, b.retry, b.shed = meta, maps.Clone(retry), maps.Clone(shed)
	s.base = b
	s.metrics.sessions.Set(float64(len(st.Live)))
	return nil
}

// writeChunks sends the session sets (id, JSON pairs) and deletions in fenced calls of at most
// Options.Chunk sessions each, the admission hash's fields with the first, at most
// SaveParallelism calls in flight. The first error cancels the calls not yet sent; a fenced
// error wins over the others (and is returned unwrapped), so the caller sees it.
func (s *Store) writeChunks(ctx context.Context, epoch uint64, sets, dels []string, adm []any) error {
	var calls [][]lease.Cmd
	chunk := s.opts.Chunk
	for len(sets) > 0 || len(dels) > 0 || len(adm) > 0 {
		var cmds []lease.Cmd
		n := min(chunk, len(sets)/2)
		if n > 0 {
			cmds = append(cmds, lease.Cmd{Name: "HSET", Keys: []string{s.keys.sessions}, Args: strArgs(sets[:2*n])})
			sets = sets[2*n:]
		}
		if d := min(chunk-n, len(dels)); d > 0 {
			cmds = append(cmds, lease.Cmd{Name: "HDEL", Keys: []string{s.keys.sessions}, Args: strArgs(dels[:d])})
			dels = dels[d:]
		}
		if len(adm) > 0 {
			cmds = append(cmds, lease.Cmd{Name: "HSET", Keys: []string{s.keys.admission}, Args: adm})
			adm = nil
		}
		calls = append(calls, cmds)
	}
	if len(calls) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	sem := make(chan struct{}, s.opts.SaveParallelism)
	for i, cmds := range calls {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := s.write(ctx, opSave, epoch, cmds...); err != nil {
				errMu.Lock()
				switch {
				case errors.Is(err, lease.ErrFenced):
					if !errors.Is(first, lease.ErrFenced) {
						first = err // as is: the *lease.FencedError with both epochs
					}
				case first == nil:
					first = fmt.Errorf("sessionstore: save call %d of %d: %w", i+1, len(calls), err)
				}
				errMu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = fmt.Errorf("sessionstore: save: %w", ctx.Err())
	}
	return first
}

// write runs one fenced call and records it.
func (s *Store) write(ctx context.Context, op string, epoch uint64, cmds ...lease.Cmd) error {
	start := s.opts.Now()
	_, err := s.fencer.Write(ctx, epoch, cmds...)
	s.metrics.seconds.WithLabelValues(op).Observe(s.opts.Now().Sub(start).Seconds())
	s.metrics.writes.WithLabelValues(op).Inc()
	return err
}

func strArgs(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// sameSession compares two sessions as their JSON would: times by instant (a round trip
// through the store loses the monotonic reading and may change the location).
// TestSameSessionCoversEveryField fails when LiveSession gains a field this does not compare.
func sameSession(a, b *admission.LiveSession) bool {
	return a.ID == b.ID && a.Tenant == b.Tenant && a.Arrival.Equal(b.Arrival) && a.Admitted.Equal(b.Admitted) &&
		a.LastDone.Equal(b.LastDone) && a.Context == b.Context && a.Peak == b.Peak && a.PredictedPeak == b.PredictedPeak &&
		a.Priority.Equal(b.Priority) && a.Held == b.Held && a.HeldCallSeconds == b.HeldCallSeconds && a.Dormant == b.Dormant
}

func sameTimes(a, b map[string]time.Time) bool {
	if a == nil || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !w.Equal(v) {
			return false
		}
	}
	return true
}

func nonNil(m map[string]time.Time) map[string]time.Time {
	if m == nil {
		return map[string]time.Time{}
	}
	return m
}
