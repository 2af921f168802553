-- inspect.lua: everything an operator needs to know about one lock, read atomically.
--
-- KEYS[1]  lock hash
-- KEYS[2]  meta hash
--
-- Returns {remaining_lease_ms, fence, since_ms, info, owner1, count1, owner2, count2, ...}
--   remaining_lease_ms is -2 when the lock is free (no owners follow then);
--   fence, since_ms and info are "" when unknown.

local lock, meta = KEYS[1], KEYS[2]
local reply = {
    redis.call('pttl', lock),
    redis.call('hget', meta, 'fence') or '',
    redis.call('hget', meta, 'since') or '',
    redis.call('hget', meta, 'info') or '',
}
local fields = redis.call('hgetall', lock)
for i = 1, #fields do
    reply[#reply + 1] = fields[i]
end
return reply
