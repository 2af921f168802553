-- rate_pause.lua: refuse every caller of a rate limiter until a time on the server's clock.
--
-- The state hash's u (see rate_take.lua) is the time (ms) the pause lasts until. A pause only
-- ever lengthens the one in force, never shortens it: two callers that each pause for what
-- they were told (a 429's Retry-After, say) both get at least their own pause.
--
-- KEYS[1]  log (not touched: declared so that Redis Cluster routes by both keys' hash tag),
-- KEYS[2]  state
-- ARGV[1]  ms to pause from now (a number >= 0; 0 writes nothing and reads the pause left)
--
-- Returns the ms of pause left, a string ("0": not paused).

local state = KEYS[2]
local ms = tonumber(ARGV[1])
-- Checked before any write.
if not ms or ms ~= ms or ms < 0 or ms > 315360000000 then
    return redis.error_reply('ERR pause must be a number of ms from 0 to ten years, got '
        .. tostring(ARGV[1]))
end

local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
local u = tonumber(redis.call('hget', state, 'u'))
if ms > 0 and (not u or u < now + ms) then
    u = now + ms
    redis.call('hset', state, 'u', u)
    -- the state lives at least as long as the pause (never shorter than it already does)
    local pttl = redis.call('pttl', state)
    if pttl < 0 or pttl < math.ceil(ms) then
        redis.call('pexpire', state, math.ceil(ms))
    end
end
if not u or u <= now then
    return '0'
end
return string.format('%.3f', u - now)
