-- rate_pause.lua: pause a rate limiter for every caller (the service behind it said "slow
-- down"). A pause only ever lengthens the pause in force, never shortens it.
--
-- KEYS[1]  log (sorted set, see rate_take.lua), KEYS[2]  state (hash: u paused until, ms)
-- ARGV[1]  the pause, ms (a whole number >= 1)
--
-- Returns the pause left, ms (a string). The state hash lives at least until the pause ends.

local state = KEYS[2]
local pause = tonumber(ARGV[1])
if not pause or pause < 1 or pause % 1 ~= 0 or pause > 9007199254740991 then
    return redis.error_reply('ERR pause must be a whole number of ms >= 1, got '
        .. tostring(ARGV[1]))
end
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local until_ms = math.max(tonumber(redis.call('hget', state, 'u')) or 0, now + pause)
redis.call('hset', state, 'u', string.format('%.3f', until_ms))
local keep = math.ceil(until_ms - now)
if redis.call('pttl', state) < keep then redis.call('pexpire', state, keep) end
return string.format('%.3f', until_ms - now)
