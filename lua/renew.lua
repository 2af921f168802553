-- renew.lua: extend the leases of many locks in one call (the heartbeat's batch).
--
-- KEYS     pairs: KEYS[2i-1] lock hash, KEYS[2i] its meta hash, i = 1..n (on Redis Cluster
--          the caller groups them so that one call touches one slot)
-- ARGV     triples: ARGV[3i-2] owner token, ARGV[3i-1] lease, ms, ARGV[3i] the meta hash's
--          retention, ms
--
-- Returns one integer per lock, in order: 1 renewed, 0 gone (the owner no longer holds it).
-- The meta hash's TTL is only ever lengthened (see acquire.lua's x), here to outlive the new
-- lease by the retention.

local result = {}
for i = 1, #KEYS / 2 do
    local lock, meta = KEYS[2 * i - 1], KEYS[2 * i]
    local lease = tonumber(ARGV[3 * i - 1])
    if redis.call('hexists', lock, ARGV[3 * i - 2]) == 1 then
        -- %d: Lua would write a large number in exponent notation
        redis.call('pexpire', lock, string.format('%d', lease))
        local keep = lease + tonumber(ARGV[3 * i])
        if redis.call('pttl', meta) < keep then
            redis.call('pexpire', meta, string.format('%d', keep))
        end
        result[i] = 1
    else
        result[i] = 0
    end
end
return result
