-- rate_inspect.lua: a rate limiter as an operator sees it (reads only).
--
-- KEYS[1]  log (sorted set, see rate_take.lua), KEYS[2]  state (hash: n, p, u)
--
-- Returns {limit, period ms, used (starts and due turns in the window ending now), waiting
-- (turns handed out), next free ms (when a new call would be admitted), pause left ms}; the
-- times as strings. limit and period are 0 when the state is gone.

local log, state = KEYS[1], KEYS[2]
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local function ms(x) return string.format('%.3f', x) end
local rule = redis.call('hmget', state, 'n', 'p', 'u')
local limit, period = tonumber(rule[1]) or 0, tonumber(rule[2]) or 0
local paused = tonumber(rule[3])
if paused and paused <= now then paused = nil end
local since = '(' .. ms(now - period)
local used = redis.call('zcount', log, since, ms(now))
local entries = redis.call('zrangebyscore', log, since, '+inf', 'withscores')
local waiting = 0
for i = 1, #entries, 2 do
    if string.sub(entries[i], 1, 2) == 'r:' then waiting = waiting + 1 end
end
local count = #entries / 2
local at = now
if limit > 0 and count >= limit then
    at = math.max(now, tonumber(entries[2 * (count - limit) + 2]) + period)
end
if paused then at = math.max(at, paused) end
return {limit, period, used, waiting, ms(at - now), ms(paused and paused - now or 0)}
