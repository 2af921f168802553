-- renew.lua: extend the leases of many locks in one call (the heartbeat's batch).
--
-- KEYS     pairs: KEYS[2i-1] = lock hash, KEYS[2i] = its meta hash, for i = 1..n
--          (on Redis Cluster the caller groups the pairs so that one call touches one slot)
-- ARGV     triples: ARGV[3i-2] = owner token, ARGV[3i-1] = lease ms,
--          ARGV[3i] = how long the meta hash outlives the lease, ms
--
-- Each renewal writes the lock's TTL, the meta hash's TTL, and 'x' in the meta hash (see
-- acquire.lua): 3 writes, and one TIME per call.
--
-- Returns one integer per lock, in order: 1 renewed, 0 gone (the owner no longer holds it:
-- expired, force-released or deleted behind the holder's back).

local result = {}
-- acquire.lua's 'x' (a time the meta hash is known to live until, at least) is set anew with
-- each TTL, a second early (TIME is read before the PEXPIREs run).
local now = redis.call('time')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000) - 1000
for i = 1, #KEYS / 2 do
    local lock, meta = KEYS[2 * i - 1], KEYS[2 * i]
    local owner, lease = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1])
    if redis.call('hexists', lock, owner) == 1 then
        -- %d: Lua would print a large number in exponent notation (see acquire.lua)
        redis.call('pexpire', lock, string.format('%d', lease))
        local keep = lease + tonumber(ARGV[3 * i])
        redis.call('hset', meta, 'x', now_ms + keep) -- first: it may create the meta hash
        redis.call('pexpire', meta, string.format('%d', keep))
        result[i] = 1
    else
        result[i] = 0
    end
end
return result
