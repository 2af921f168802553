-- inspect.lua: everything an operator needs to know about one lock, read atomically.
--
-- KEYS[1]  lock hash
-- KEYS[2]  meta hash
--
-- Returns {remaining_lease_ms, fence, since_ms, info, run, state, owner1, count1, owner2,
--          count2, ...}
--   remaining_lease_ms is -2 when the lock is free (no owners follow then);
--   fence, since_ms, info, run (the run token of the run that entered it) and state (the
--   hold's state, see acquire.lua) are "" when unknown or none. since_ms is the fence's time: a new holder's token is the server time in
--   microseconds when it took the lock (or one more than the last token, when that was ahead).

local lock, meta = KEYS[1], KEYS[2]
local state = redis.call('hmget', meta, 'fence', 'info', 'run', 'state')
local fence = tonumber(state[1])
local reply = {
    redis.call('pttl', lock),
    state[1] or '',
    fence and string.format('%d', math.floor(fence / 1000)) or '',
    state[2] or '',
    state[3] or '',
    state[4] or '',
}
local fields = redis.call('hgetall', lock)
for i = 1, #fields do
    reply[#reply + 1] = fields[i]
end
return reply
