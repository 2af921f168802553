-- release.lua: drop holds of one owner; the final release deletes the lock and wakes waiters.
--
-- KEYS[1]  lock hash
-- KEYS[2]  meta hash (see acquire.lua for its fields)
-- ARGV[1]  owner token
-- ARGV[2]  holds to drop: a positive integer, or 0 for all of this owner's holds
-- ARGV[3]  request id, unique per release call ("" for none): a resend of a release that
--          already ran (redis-py resends after a timeout, the lock resends a failed release
--          from the background) answers as the first time did, instead of dropping a second
--          hold or reporting "not the owner"
-- ARGV[4]  how long the meta hash outlives the lock, ms (used only when the meta hash was lost
--          and this release recreates it)
-- ARGV[5]  "spublish" on Redis Cluster (sharded pub/sub: the message stays on the lock's
--          shard); absent or "publish" otherwise
--
-- The wake-up channel is not a key of the script: it is KEYS[1] cut after its hash tag, plus
-- ":wake", built here (prefix:{name}:wake: for a plain lock that is KEYS[1] .. ":wake", and
-- every permit of a semaphore, prefix:{name}:s<k>, shares it with permit 1, so one
-- subscription hears them all; the payload, KEYS[1], says which one was freed). A channel
-- declared as a key would be a key that never exists, and Redis Cluster answers a script with
-- some of its keys missing in a migrating slot with TRYAGAIN, on both nodes, until the
-- migration ends.
--
-- Returns the three-way answer of Redisson's unlock, as one integer:
--   -1   not the owner (never held, already released, or the lease was lost)
--   n>0  still held: n holds of this owner remain
--    0   released: the lock hash is gone, and waiters were woken
-- The final release makes 4 calls: HGET lock, HMGET meta, HDEL lock, HSET meta (this
-- request id). It publishes the wake-up (a 5th call) only while acquires may be waiting (the
-- "w" field, see acquire.lua): a blocked acquire subscribes before the acquire that sets it,
-- and each wake-up wakes one waiter of a process. It leaves the meta hash's TTL as the last
-- acquire or renewal set it (past the lease by the retention): no second write for it.
-- When the owner's holds reach 0 but another owner's field is present (cannot happen through
-- this library, which never lets two owners hold at once) only this owner's field is removed.

local lock, meta = KEYS[1], KEYS[2]
local owner, drop, request = ARGV[1], ARGV[2], ARGV[3]
local command = ARGV[5]
if not command then
    command = 'publish'
elseif command ~= 'publish' and command ~= 'spublish' then
    return redis.error_reply('ERR the wake-up command must be publish or spublish, got ' .. command)
end

local count = redis.call('hget', lock, owner)
-- 'req' is there whenever the meta hash is (every acquire writes it): without it, a write
-- below may create the meta hash, which then needs a TTL.
local m = redis.call('hmget', meta, 'rel', 'w', 'req')

-- A resend of a release that already ran answers what is left now: 0 after the release that
-- freed it, the remaining count after a partial one (which must not be counted twice).
if request ~= '' and m[1] == request then
    return tonumber(count) or 0
end
if not count then
    return -1
end

local dropping = tonumber(drop)
if dropping > 0 and count ~= '1' and tonumber(count) > dropping then
    local left = redis.call('hincrby', lock, owner, -dropping)
    if request ~= '' then
        redis.call('hset', meta, 'rel', request)
        if not m[3] and redis.call('pttl', meta) < 0 then
            -- the meta hash was deleted or evicted while the lock was held: HSET just
            -- recreated it, and no key of a lock may be left without a TTL
            redis.call('pexpire', meta, math.max(redis.call('pttl', lock), 0) + tonumber(ARGV[4]))
        end
    end
    return left
end

-- HDEL, not DEL: the hash goes with its last field, and another owner's field, were there
-- one, would stay.
redis.call('hdel', lock, owner)
if request ~= '' then
    redis.call('hset', meta, 'rel', request)
    if not m[3] and redis.call('pttl', meta) < 0 then
        redis.call('pexpire', meta, tonumber(ARGV[4])) -- (as above)
    end
end
if m[2] or not m[3] then
    -- waiters may be there (or the meta hash that would say so was lost)
    redis.call(command, (string.match(lock, '^(.*})') or lock) .. ':wake', lock)
end
return 0
