package sessionstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/basin-dev/basin/internal/lease"
)

// ErrNoLeader is what Leader returns when no leader has announced itself.
var ErrNoLeader = errors.New("sessionstore: no gateway leader announced")

// ReplicaRetention is how long a replica's last heartbeat is kept: Heartbeat drops older ones,
// so replicas that left do not accumulate.
const ReplicaRetention = time.Hour

// LeaderInfo is what the admission leader announces: followers forward the admin API to
// AdminURL.
type LeaderInfo struct {
	ReplicaID string `json:"replica_id"`
	Epoch     uint64 `json:"epoch"`
	AdminURL  string `json:"admin_url"`
}

// SetLeader announces li at epoch, fenced: a leader that lost its term cannot announce itself
// over its successor. The announcement does not expire; readers tell a stale one by its epoch
// (lower than the lease's) or by the replica's heartbeats.
func (s *Store) SetLeader(ctx context.Context, epoch uint64, li LeaderInfo) error {
	v, err := json.Marshal(li)
	if err != nil {
		return fmt.Errorf("sessionstore: set leader: %w", err)
	}
	err = s.write(ctx, opLeader, epoch, lease.Cmd{Name: "SET", Keys: []string{s.keys.leader}, Args: []any{string(v)}})
	if err != nil && !errors.Is(err, lease.ErrFenced) {
		s.metrics.errors.WithLabelValues(opLeader).Inc()
		return fmt.Errorf("sessionstore: set leader %s: %w", s.keys.leader, err)
	}
	return err
}

// Leader reads the last announced leader; ErrNoLeader when there is none.
func (s *Store) Leader(ctx context.Context) (LeaderInfo, error) {
	var li LeaderInfo
	v, err := s.client.Get(ctx, s.keys.leader).Result()
	if errors.Is(err, redis.Nil) {
		return li, ErrNoLeader
	}
	if err != nil {
		s.metrics.errors.WithLabelValues(opLeader).Inc()
		return li, fmt.Errorf("sessionstore: leader %s: %w", s.keys.leader, err)
	}
	if err := json.Unmarshal([]byte(v), &li); err != nil {
		return li, fmt.Errorf("sessionstore: leader %s: %w", s.keys.leader, err)
	}
	return li, nil
}

// Heartbeat records that replicaID is alive at now, and drops the heartbeats older than
// ReplicaRetention, in one round trip. Every replica heartbeats, leader or not, so it is not
// fenced.
func (s *Store) Heartbeat(ctx context.Context, replicaID string, now time.Time) error {
	if replicaID == "" {
		return errors.New("sessionstore: heartbeat: replica id is empty")
	}
	start := s.opts.Now()
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, s.keys.replicas, redis.Z{Score: float64(now.UnixMilli()), Member: replicaID})
		p.ZRemRangeByScore(ctx, s.keys.replicas, "-inf", "("+strconv.FormatInt(now.Add(-ReplicaRetention).UnixMilli(), 10))
		return nil
	})
	s.metrics.seconds.WithLabelValues(opHeartbeat).Observe(s.opts.Now().Sub(start).Seconds())
	s.metrics.writes.WithLabelValues(opHeartbeat).Inc()
	if err != nil {
		s.metrics.errors.WithLabelValues(opHeartbeat).Inc()
		return fmt.Errorf("sessionstore: heartbeat %s %s: %w", s.keys.replicas, replicaID, err)
	}
	return nil
}

// Replicas lists the replicas whose last heartbeat is at or after since, sorted by id.
func (s *Store) Replicas(ctx context.Context, since time.Time) ([]string, error) {
	ids, err := s.client.ZRangeByScore(ctx, s.keys.replicas, &redis.ZRangeBy{
		Min: strconv.FormatInt(since.UnixMilli(), 10), Max: "+inf"}).Result()
	if err != nil {
		s.metrics.errors.WithLabelValues(opReplicas).Inc()
		return nil, fmt.Errorf("sessionstore: replicas %s: %w", s.keys.replicas, err)
	}
	sort.Strings(ids)
	return ids, nil
}
