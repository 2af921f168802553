-- force_release.lua: an operator's release, whoever holds the lock.
--
-- KEYS[1]  lock hash, KEYS[2]  meta hash
-- ARGV[1]  "publish", or "spublish" on Redis Cluster, ARGV[2] the lock's wake-up channel (see
--          release.lua)
-- ARGV[3]  the meta hash's retention, ms
-- ARGV[4]  the holder expected: "" for any, else only while this owner holds it
-- ARGV[5..] hold states (see acquire.lua): when given, only while the hold is in one of them
--          and no run token is recorded
-- KEYS[3]  optional: a note about the released hold (keys.py's note: in the lock's hash tag; a
--          hash whose field v holds it), written in the same step as the release and kept for
--          as long as the hold had lease left (lock_debounce's "replaced": the replaced message
--          may arrive until then). Its value is then ARGV[5], and the states start at ARGV[6].
--
-- Returns 1 when the lock was released, 0 when it was free, held by another than ARGV[4], or
-- in another state. The fence is kept (the next holder gets a larger one); the hold's fields
-- go, and the meta hash lives at least the retention (only ever lengthened: see acquire.lua).

local lock, meta = KEYS[1], KEYS[2]
if ARGV[1] ~= 'publish' and ARGV[1] ~= 'spublish' then
    return redis.error_reply('ERR the wake-up command must be publish or spublish, got ' .. ARGV[1])
end
if redis.call('exists', lock) == 0 then
    return 0
end
if ARGV[4] ~= '' and redis.call('hexists', lock, ARGV[4]) == 0 then
    return 0
end
local note = KEYS[3]
local first = note and 6 or 5
if #ARGV >= first then
    local held = redis.call('hmget', meta, 'state', 'run')
    if held[2] and held[2] ~= '' then
        return 0
    end
    local wanted = false
    for i = first, #ARGV do
        wanted = wanted or held[1] == ARGV[i]
    end
    if not wanted then
        return 0
    end
end
if note then
    -- a hash of one field, 'v': written with the commands the documented ACL rule allows
    local left = redis.call('pttl', lock)
    redis.call('hset', note, 'v', ARGV[5])
    redis.call('pexpire', note, left > 0 and left or tonumber(ARGV[3]))
end
redis.call('del', lock)
redis.call('hdel', meta, 'req', 'info', 'run', 'state')
if redis.call('pttl', meta) < tonumber(ARGV[3]) then
    redis.call('pexpire', meta, ARGV[3])
end
redis.call(ARGV[1], ARGV[2], lock)
return 1
