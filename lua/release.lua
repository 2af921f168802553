-- release.lua: drop holds of one owner; the final release deletes the lock and wakes waiters.
--
-- KEYS[1]  lock hash
-- KEYS[2]  meta hash
-- KEYS[3]  the lock's wake-up channel (in its hash tag); its key (KEYS[1]) is published on it
--          when the lock is freed
-- ARGV[1]  owner token
-- ARGV[2]  holds to drop: a positive integer, or 0 for all of this owner's holds
-- ARGV[3]  "publish", or "spublish" on Redis Cluster (sharded pub/sub: the message stays on
--          the lock's shard)
-- ARGV[4]  how long the meta hash (and with it the last fencing token) outlives the lock, ms
-- ARGV[5]  request id, unique per release call ("" for none): a resend of a release that
--          already ran (redis-py resends after a timeout) answers as the first time did,
--          instead of dropping a second hold or reporting "not the owner"
--
-- Returns the three-way answer of Redisson's unlock, as one integer:
--   -1   not the owner (never held, already released, or the lease was lost)
--   n>0  still held: n holds of this owner remain
--    0   released: the lock hash is gone and waiters were woken
-- The final release (the common path) makes 6 calls. It leaves the earlier holder's fields in
-- the meta hash: they mean nothing once the lock is gone (the next acquire rewrites them all),
-- and the hash expires after ARGV[4] ms.
-- When the owner's holds reach 0 but another owner's field is present (cannot happen through
-- this library, which never lets two owners hold at once) only this owner's field is removed.

local lock, meta = KEYS[1], KEYS[2]
local owner, drop, request = ARGV[1], tonumber(ARGV[2]), ARGV[5]
if ARGV[3] ~= 'publish' and ARGV[3] ~= 'spublish' then
    return redis.error_reply('ERR the wake-up command must be publish or spublish, got ' .. ARGV[3])
end

-- One call for both the owner's count and whether anyone else holds it (a one-field hash).
local fields = redis.call('hgetall', lock)
local count, others = nil, false
for i = 1, #fields, 2 do
    if fields[i] == owner then
        count = tonumber(fields[i + 1])
    else
        others = true
    end
end

-- A resend of a release that already ran answers what is left now: 0 after the release that
-- freed it, the remaining count after a partial one (which must not be counted twice).
if request ~= '' and redis.call('hget', meta, 'rel') == request then
    return count or 0
end
if not count then
    return -1
end

if drop > 0 and count > drop then
    if request ~= '' then
        redis.call('hset', meta, 'rel', request)
        if redis.call('pttl', meta) < 0 then
            -- the meta hash was deleted or evicted while the lock was held: HSET just
            -- recreated it, and no key of a lock may be left without a TTL
            redis.call('pexpire', meta, math.max(redis.call('pttl', lock), 0) + tonumber(ARGV[4]))
        end
    end
    return redis.call('hincrby', lock, owner, -drop)
end

if others then
    redis.call('hdel', lock, owner)
    return 0
end
redis.call('del', lock)
if request ~= '' then
    redis.call('hset', meta, 'rel', request)
end
redis.call('pexpire', meta, tonumber(ARGV[4]))
redis.call(ARGV[3], KEYS[3], lock)
return 0
