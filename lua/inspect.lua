-- inspect.lua: one lock as an operator sees it, read atomically.
--
-- KEYS[1]  lock hash, KEYS[2]  meta hash
--
-- Returns {lease_left_ms, fence, info, run, state, owner1, count1, owner2, count2, ...}:
-- lease_left_ms is -2 when the lock is free (no owners follow), -1 without a lease; fence,
-- info, run and state (see acquire.lua) are "" when none. A new holder's fence is the server
-- time in microseconds when it took the lock (or one more than the last, when that was ahead).

local reply = redis.call('hmget', KEYS[2], 'fence', 'info', 'run', 'state')
table.insert(reply, 1, redis.call('pttl', KEYS[1]))
for i = 2, 5 do
    reply[i] = reply[i] or ''
end
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields do
    reply[#reply + 1] = fields[i]
end
return reply
