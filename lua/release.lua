-- release.lua: drop holds of one owner; the last one deletes the lock and wakes a waiter.
--
-- KEYS[1]  lock hash, KEYS[2]  meta hash (see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  holds to drop: a whole number >= 1, or 0 for every hold of the owner
-- ARGV[3]  request id ("" for none): a resend of a release that ran answers as it did, and
--          drops nothing more
-- ARGV[4]  the meta hash's retention, ms (used only when this release recreates it)
-- ARGV[5]  the lock's wake-up channel (keys.py names it; not a key: Redis Cluster refuses a
--          script whose declared keys are missing in a migrating slot)
-- ARGV[6]  "spublish" on Redis Cluster (the message stays on the lock's shard); absent or
--          "publish" otherwise
--
-- Returns -1: not the owner (never held, released, or its lease was lost); n > 0: n holds of
-- the owner are left; 0: released, the lock hash is gone. The last release publishes the lock
-- key on the channel only while a refused acquire may wait (acquire.lua's w), or when the meta
-- hash that would say so was lost.

local lock, meta = KEYS[1], KEYS[2]
local owner, request = ARGV[1], ARGV[3]
local command = ARGV[6] or 'publish'
if command ~= 'publish' and command ~= 'spublish' then
    return redis.error_reply('ERR the wake-up command must be publish or spublish, got ' .. command)
end

local count = redis.call('hget', lock, owner)
local m = redis.call('hmget', meta, 'rel', 'w', 'req')
if request ~= '' and m[1] == request then
    return tonumber(count) or 0 -- a resend: what is left now
end
if not count then
    return -1
end

local drop, left = tonumber(ARGV[2]), 0
if drop > 0 and tonumber(count) > drop then
    left = redis.call('hincrby', lock, owner, -drop)
else
    -- HDEL, not DEL: another owner's field, were there one, would stay.
    redis.call('hdel', lock, owner)
end
if request ~= '' then
    redis.call('hset', meta, 'rel', request)
    -- 'req' is there whenever the meta hash is: without it, HSET just made the hash
    if not m[3] and redis.call('pttl', meta) < 0 then
        redis.call('pexpire', meta, math.max(redis.call('pttl', lock), 0) + tonumber(ARGV[4]))
    end
end
if left == 0 and (m[2] or not m[3]) then
    redis.call(command, ARGV[5], lock)
end
return left
