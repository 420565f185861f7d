package sessionstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
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

// ReplicaFresh is how recently a replica must have heartbeated to count as running: replicas
// heartbeat every second, so one not heard of for this long has stopped (or cannot reach the
// store). Its id is then free for another process (Heartbeat), and it no longer counts among the
// replicas seen.
const ReplicaFresh = 5 * time.Second

// Replica is one gateway process's identity in the store.
type Replica struct {
	// ID is the configured replica_id, unique among the running replicas.
	ID string
	// Instance tells this process from another with the same ID (a random token drawn at
	// start): a restarted replica has a new one.
	Instance string
	// AdvertiseURL is the replica's admin listener as the others reach it.
	AdvertiseURL string
}

// ReplicaIDInUseError is Heartbeat's refusal: another running process heartbeats under the same
// replica id.
type ReplicaIDInUseError struct {
	ReplicaID string
	// Other is the process holding the id: its advertise URL names it to the operator.
	Other Replica
	// LastSeen is its last heartbeat, on its own clock.
	LastSeen time.Time
}

func (e *ReplicaIDInUseError) Error() string {
	return fmt.Sprintf("replica id %q is in use by another running replica, advertised at %s (last heartbeat %s)",
		e.ReplicaID, e.Other.AdvertiseURL, e.LastSeen.UTC().Format(time.RFC3339Nano))
}

// heartbeatScript claims a replica id for one process and records its heartbeat, in one step: a
// claim held by another process (another instance at another advertise URL) that heartbeated at
// or after the freshness cutoff is refused, so two replicas with the same id cannot both run. The
// same advertise URL is the same replica restarted (two running processes cannot listen on one
// address): its new process takes the id over at once. Heartbeats older than the retention
// cutoff are dropped with their claims.
//
// KEYS: replicas (sorted set), claims (hash). ARGV: id, instance, advertise URL, now ms,
// freshness cutoff ms, retention cutoff ms. Returns {1} or {0, instance, at ms, advertise URL}.
var heartbeatScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if cur then
  local inst, at, url = string.match(cur, '^([^|]*)|(%-?%d+)|(.*)$')
  if inst and inst ~= ARGV[2] and url ~= ARGV[3] and tonumber(at) >= tonumber(ARGV[5]) then
    return {0, inst, at, url}
  end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. '|' .. ARGV[4] .. '|' .. ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[6])
for _, id in ipairs(gone) do
  redis.call('HDEL', KEYS[2], id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[6])
return {1}
`)

// leaveScript drops a replica's heartbeat and claim if the claim is still this process's.
//
// KEYS: replicas, claims. ARGV: id, instance. Returns 1 if it left, 0 if the claim was not its.
var leaveScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if cur and string.match(cur, '^([^|]*)|') == ARGV[2] then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
`)

// Heartbeat records that replica rp is alive at now, claiming its id, and drops the heartbeats
// older than ReplicaRetention, in one round trip. It fails with a *ReplicaIDInUseError when
// another process heartbeated under the same id within ReplicaFresh before now: replicas left
// with the same id (the default, the host name, is the same for every replica on one host) would
// each take the others' leader announcement for their own and stay degraded, each admitting
// against its own slice. Every replica heartbeats, leader or not, so it is not fenced.
func (s *Store) Heartbeat(ctx context.Context, rp Replica, now time.Time) error {
	switch {
	case rp.ID == "":
		return errors.New("sessionstore: heartbeat: replica id is empty")
	case rp.Instance == "" || strings.Contains(rp.Instance, "|"):
		return fmt.Errorf("sessionstore: heartbeat %s: instance %q must be non-empty, without '|'", rp.ID, rp.Instance)
	}
	start := s.opts.Now()
	ms := func(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
	res, err := heartbeatScript.Run(ctx, s.client, []string{s.keys.replicas, s.keys.claims},
		rp.ID, rp.Instance, rp.AdvertiseURL, ms(now), ms(now.Add(-ReplicaFresh)), ms(now.Add(-ReplicaRetention))).Slice()
	s.metrics.seconds.WithLabelValues(opHeartbeat).Observe(s.opts.Now().Sub(start).Seconds())
	s.metrics.writes.WithLabelValues(opHeartbeat).Inc()
	if err != nil {
		s.metrics.errors.WithLabelValues(opHeartbeat).Inc()
		return fmt.Errorf("sessionstore: heartbeat %s %s: %w", s.keys.replicas, rp.ID, err)
	}
	if len(res) == 4 {
		inst, _ := res[1].(string)
		atStr, _ := res[2].(string)
		url, _ := res[3].(string)
		at, _ := strconv.ParseInt(atStr, 10, 64)
		return &ReplicaIDInUseError{ReplicaID: rp.ID, Other: Replica{ID: rp.ID, Instance: inst, AdvertiseURL: url},
			LastSeen: time.UnixMilli(at)}
	}
	return nil
}

// Leave drops replica rp's heartbeat and its claim of its id, if the claim is still this
// process's: a replica that stops cleanly is no longer counted among the replicas seen, and its id
// is free at once.
func (s *Store) Leave(ctx context.Context, rp Replica) error {
	if err := leaveScript.Run(ctx, s.client, []string{s.keys.replicas, s.keys.claims}, rp.ID, rp.Instance).Err(); err != nil {
		s.metrics.errors.WithLabelValues(opHeartbeat).Inc()
		return fmt.Errorf("sessionstore: leave %s %s: %w", s.keys.replicas, rp.ID, err)
	}
	return nil
}

// ReplicaURLs maps the replicas that heartbeated at or after since to their advertise URLs: the
// replicas a new leader tells of itself at once.
func (s *Store) ReplicaURLs(ctx context.Context, since time.Time) (map[string]string, error) {
	ids, err := s.Replicas(ctx, since)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	claims, err := s.client.HGetAll(ctx, s.keys.claims).Result()
	if err != nil {
		s.metrics.errors.WithLabelValues(opReplicas).Inc()
		return nil, fmt.Errorf("sessionstore: replicas %s: %w", s.keys.claims, err)
	}
	out := make(map[string]string, len(ids))
	for _, id := range ids {
		if v, ok := claims[id]; ok {
			if _, rest, ok := strings.Cut(v, "|"); ok {
				if _, url, ok := strings.Cut(rest, "|"); ok && url != "" {
					out[id] = url
				}
			}
		}
	}
	return out, nil
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
