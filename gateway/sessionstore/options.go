package sessionstore

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/internal/lease"
)

// MaxChunk is the most sessions one script call of Save or of a group commit carries (and the
// default chunk). Why a bound at all: a script runs alone in the store, so one call holding
// 100,000 HSETs would stall every other client — the leases' renewals included — for the whole
// write (about half a second), and the fenced-write script passes each command's arguments
// through Lua's unpack, which fails past about 8,000 values (4,000 sessions in one HSET).
// 500 sessions (≈ 125 KB of JSON) take about 2 ms of the store's time per call on a busy 2-core
// VM (TestRealRedisSaveLoad20k logs it), short next to a lease's TTL, while a 100,000-session
// rewrite still needs only 200 round trips.
const MaxChunk = 500

// DefaultWriteTimeout bounds one group-committed write when Options.WriteTimeout is zero.
const DefaultWriteTimeout = 2 * time.Second

// DefaultSaveParallelism is how many of a Save's chunks are in flight at once when
// Options.SaveParallelism is zero.
const DefaultSaveParallelism = 4

// Options configure a Store. Zero fields take the defaults named on each; New and Validate
// reject bad values with the field's name.
type Options struct {
	// Prefix is the gateway lease's prefix (P:gateway for store prefix P). The table's keys are
	// Prefix+":sessions", ":admission", ":leader", ":replicas" and ":replica_ids". Required; no whitespace or
	// control characters. On Redis Cluster it must carry a hash tag so that these keys share a
	// slot with the lease's epoch key, which every fenced write names.
	Prefix string
	// Logger receives the failures of group commits, whose callers may have stopped waiting
	// (discarded when nil).
	Logger *slog.Logger
	// Registerer receives the basin_gateway_store_* metrics; a private registry when nil.
	Registerer prometheus.Registerer
	// Now is the clock the write latencies are measured on (time.Now when nil).
	Now func() time.Time
	// WriteTimeout bounds each group-committed write of Admit and End (DefaultWriteTimeout).
	// Such a write serves many callers, so it cannot run under one caller's context.
	WriteTimeout time.Duration
	// Chunk is the most sessions per script call, 1 to MaxChunk (MaxChunk).
	Chunk int
	// SaveParallelism is how many of a Save's script calls are in flight at once
	// (DefaultSaveParallelism): a 100,000-session rewrite is 200 calls, and keeping a few in
	// flight hides the round trips the way a pipeline would.
	SaveParallelism int
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.Chunk == 0 {
		o.Chunk = MaxChunk
	}
	if o.SaveParallelism == 0 {
		o.SaveParallelism = DefaultSaveParallelism
	}
	return o
}

// Validate reports every option New refuses, naming each. Zero fields stand for their defaults.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if err := lease.CheckPrefix(o.Prefix); err != nil {
		errs = append(errs, fmt.Errorf("Prefix: %w", err))
	}
	if o.WriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("WriteTimeout: must be ≥ 0, got %v", o.WriteTimeout))
	}
	if o.Chunk < 1 || o.Chunk > MaxChunk {
		errs = append(errs, fmt.Errorf("Chunk: must be 1 to %d, got %d", MaxChunk, o.Chunk))
	}
	if o.SaveParallelism < 1 {
		errs = append(errs, fmt.Errorf("SaveParallelism: must be ≥ 1, got %d", o.SaveParallelism))
	}
	return errors.Join(errs...)
}

// keys are the store keys of one gateway's table.
type keys struct {
	sessions, admission, leader, replicas, claims, queued string
}

func (o Options) keys() keys {
	return keys{sessions: o.Prefix + ":sessions", admission: o.Prefix + ":admission",
		leader: o.Prefix + ":leader", replicas: o.Prefix + ":replicas", claims: o.Prefix + ":replica_ids",
		queued: o.Prefix + ":queued"}
}
