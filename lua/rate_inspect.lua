-- rate_inspect.lua: one rate limiter as an operator sees it, read atomically (no write).
--
-- KEYS[1]  log, KEYS[2]  state (see rate_take.lua)
-- ARGV[1]  limit, ARGV[2] period ms: the rule to assume when the state has none ("0": none)
--
-- Returns {limit, period_ms, used, waiting, next_free_ms, paused_ms}:
--   limit, period_ms  the rule last used on it (the state's; else ARGV's; 0 when unknown)
--   used          entries in the window (now - period, now]: starts, and turns come due
--   waiting       reserved turns in the window or ahead of it
--   next_free_ms  ms until a new call would be admitted, a string ("0": now)
--   paused_ms     ms of pause left, a string ("0": not paused)
-- The window's entries are read to tell turns from starts: at most `limit` starts and the
-- turns, so the cost grows with the limit (an operator's call, not a hot path).

local log, state = KEYS[1], KEYS[2]
local s = redis.call('hmget', state, 'n', 'p', 'u')
local limit = tonumber(s[1]) or tonumber(ARGV[1]) or 0
local period = tonumber(s[2]) or tonumber(ARGV[2]) or 0
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
local u = tonumber(s[3])
local paused_ms = (u and u > now) and u - now or 0

-- without a known period, every entry of the log is taken as in the window
local low = period > 0 and string.format('(%.3f', now - period) or '-inf'
local now_s = string.format('%.3f', now)
local due = redis.call('zrangebyscore', log, low, now_s)
local waiting = redis.call('zcount', log, '(' .. now_s, '+inf')
for i = 1, #due do
    if string.sub(due[i], 1, 2) == 'r:' then
        waiting = waiting + 1
    end
end

local free = paused_ms
local total = #due + redis.call('zcount', log, '(' .. now_s, '+inf')
if limit > 0 and total >= limit then
    local e = redis.call('zrangebyscore', log, low, '+inf', 'withscores', 'limit',
        total - limit, 1)
    -- as rate_take.lua times a new call's turn (after a turn, 2% later, at most 20 ms)
    local slack = string.sub(e[1], 1, 2) == 'r:' and math.min(period / 50, 20) or 0
    free = math.max(free, tonumber(e[2]) + period + slack - now)
end
return {limit, period, #due, waiting, string.format('%.3f', free),
    string.format('%.3f', paused_ms)}
