package lease

import "github.com/redis/go-redis/v9"

// The scripts run atomically in the store: no other client's command runs between the check
// and the write. Each returns a status (1 done, 0 refused) followed by what the caller needs to
// know either way. Epochs are decimal strings in the store and compared as such.

// acquireScript takes a free lease and starts a new term in one step: SET NX PX, then INCR of
// the epoch. ARGV[3] is the highest epoch this campaigner has seen: were the epoch key ever
// lost (a store restored from an old snapshot), the new term still comes after every term the
// campaigners knew, so a fenced write of an old term cannot pass again.
//
// KEYS: lease, epoch. ARGV: owner, ttl ms, floor. Returns {1, epoch} or {0, owner, epoch}.
var acquireScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tonumber(ARGV[3]) > cur then
    redis.call('SET', KEYS[2], ARGV[3])
  end
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('GET', KEYS[1]) or '', redis.call('GET', KEYS[2]) or '0'}
`)

// renewScript extends the lease for its owner in the same term only.
//
// KEYS: lease, epoch. ARGV: owner, epoch, ttl ms. Returns {1} or {0, owner, epoch}.
var renewScript = redis.NewScript(`
local owner = redis.call('GET', KEYS[1])
local epoch = redis.call('GET', KEYS[2]) or '0'
if owner == ARGV[1] and epoch == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1}
end
return {0, owner or '', epoch}
`)

// releaseScript frees the lease for its owner in the same term only; the epoch stays, so the
// next leader's term is higher.
//
// KEYS: lease, epoch. ARGV: owner, epoch. Returns {1} or {0, owner, epoch}.
var releaseScript = redis.NewScript(`
local owner = redis.call('GET', KEYS[1])
local epoch = redis.call('GET', KEYS[2]) or '0'
if owner == ARGV[1] and epoch == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0, owner or '', epoch}
`)

// fenceScript runs the caller's commands only while the epoch is the caller's.
//
// KEYS: epoch, then every command's keys in order. ARGV: epoch, number of commands, then for
// each command its name, number of keys, number of arguments and the arguments. A command is
// called as name, its keys, its arguments. Returns {1, {replies…}} or {0, current epoch}.
var fenceScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1]) or '0'
if cur ~= ARGV[1] then
  return {0, cur}
end
local out = {}
local k, a = 2, 3
for i = 1, tonumber(ARGV[2]) do
  local call = {ARGV[a]}
  local nk, na = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  for _ = 1, nk do
    call[#call + 1] = KEYS[k]
    k = k + 1
  end
  for _ = 1, na do
    call[#call + 1] = ARGV[a]
    a = a + 1
  end
  out[i] = redis.call(unpack(call))
end
return {1, out}
`)
