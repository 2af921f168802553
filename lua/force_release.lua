-- force_release.lua: an operator's release, whoever holds the lock.
--
-- KEYS[1]  lock hash
-- KEYS[2]  meta hash
-- ARGV[1]  "publish", or "spublish" on Redis Cluster: how the lock's key is published on its
--          wake-up channel (KEYS[1] cut after its hash tag, plus ":wake"; not a key: see
--          release.lua) when the lock was deleted
-- ARGV[2]  how long the meta hash (and with it the last fencing token) outlives the lock, ms
-- ARGV[3]  expected holder: "" for any, else release only when this owner holds it
-- ARGV[4..] the hold states to release (see acquire.lua's 'state'): when any are given, the
--          lock is released only while its hold is in one of them and no run has entered it
--          (no run token recorded); none given: whatever its state
--
-- Returns 1 when a lock was released, 0 when it was free (or held by someone other than
-- ARGV[3], or in another state than ARGV[4..]). The fencing token is kept, so the next
-- holder still gets a larger one. 'x' goes too (see acquire.lua): the TTL set here may be
-- shorter than the one it stood for.

local lock, meta = KEYS[1], KEYS[2]
if ARGV[1] ~= 'publish' and ARGV[1] ~= 'spublish' then
    return redis.error_reply('ERR the wake-up command must be publish or spublish, got ' .. ARGV[1])
end
if redis.call('exists', lock) == 0 then
    return 0
end
if ARGV[3] ~= '' and redis.call('hexists', lock, ARGV[3]) == 0 then
    return 0
end
if #ARGV >= 4 then
    local held = redis.call('hmget', meta, 'state', 'run')
    if held[2] and held[2] ~= '' then
        return 0
    end
    local wanted = false
    for i = 4, #ARGV do
        if held[1] == ARGV[i] then
            wanted = true
        end
    end
    if not wanted then
        return 0
    end
end
redis.call('del', lock)
redis.call('hdel', meta, 'req', 'info', 'run', 'state', 'x')
redis.call('pexpire', meta, tonumber(ARGV[2]))
redis.call(ARGV[1], (string.match(lock, '^(.*})') or lock) .. ':wake', lock)
return 1
