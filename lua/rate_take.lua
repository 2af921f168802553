-- rate_take.lua: one call's try to start under a rate limit: admitted, or given a turn.
--
-- A rate limiter is two keys in one hash tag:
--   log     a sorted set scored by server time in ms (with microseconds):
--             s:<call id>:<sec>.<usec>   a start, kept for one period after it
--             r:<call id>                a reserved turn; score: the turn's time (maybe ahead)
--   state   a hash: n (limit) and p (period, ms), the rule last used, written only when it
--           changes; u, the time (ms) a pause lasts until (rate_pause.lua)
-- Nothing else: the log ends one period (to 1.5 periods, at most a minute more) after its
-- last entry, the state with the log or the pause, whichever is later; so a limiter frees by
-- time alone (a caller killed between calls leaves nothing stuck; its reserved turn counts as
-- a start for one period).
--
-- KEYS[1]  log, KEYS[2]  state
-- ARGV[1]  limit: at most this many starts in any window of the period (whole number >= 1)
-- ARGV[2]  period, ms (whole number >= 1)
-- ARGV[3]  call id: a refused call keeps its turn under it; the same id coming back owns it.
--          "" for a one-off try: refused, it keeps no turn (nobody could come back to it)
--
-- Returns {admitted, wait_ms, used, at, paused_ms}:
--   admitted   1 admitted (a start is logged), 0 refused (a turn is reserved)
--   wait_ms    ms from now to the reserved turn, or to the one a one-off try would have had
--              ("0" when admitted)
--   used       entries in the window (now - period, now] after the decision: starts, and
--              turns come due that are counted as starts until their owner comes back
--   at         the server time of the decision, "<sec>.<usec>": the start's, when admitted
--   paused_ms  ms of pause left ("0": not paused)
-- wait_ms and paused_ms are strings: a Lua number would reach the client as an integer.
--
-- Exact over any window: an admission at time a checks that fewer than `limit` entries are
-- scored in (a - period, a] (a new call counts every entry, turns ahead included; a returning
-- one counts those scored <= a), and a start stays in the log for a whole period after it
-- (step 1 removes only entries scored <= now - period). Take any window of one period and
-- the last start in it, at a: every earlier start of the window lies in (a - period, a] and
-- was in the log when a was admitted, so the window holds at most `limit` starts. Turns only
-- ever count more (a due turn counts as a start), never fewer, and a resend of this script
-- after a lost reply logs a second start at worst: stricter, never looser.
--
-- Turns: a refused new call is given the turn t = max(now, pause end, the entry `limit`
-- places before it + period), the earliest time it can be admitted if every call ahead of it
-- takes its turn; so waiting calls come back about once each, in order, not as a herd. After
-- an entry that is itself a turn, t is a little later (2% of the period, at most 20 ms): that
-- turn's owner starts when it comes back, some ms after its turn, and that start must have
-- left the window when t comes. A returning call refused (back early, or a pause) gets a turn
-- the same way, counted among the entries due by now.

local log, state = KEYS[1], KEYS[2]
local limit, period, id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
-- Checked before any write (the client checks first; this guards other callers).
if not limit or limit < 1 or limit % 1 ~= 0 or limit > 9007199254740991 then
    return redis.error_reply('ERR limit must be a whole number >= 1, got ' .. tostring(ARGV[1]))
end
if not period or period < 1 or period % 1 ~= 0 or period > 315360000000 then
    return redis.error_reply('ERR period must be a whole number of ms from 1 to ten years, got '
        .. tostring(ARGV[2]))
end
if not id then
    return redis.error_reply('ERR call id missing')
end

local time = redis.call('time')
local sec, usec = tonumber(time[1]), tonumber(time[2])
local now = sec * 1000 + usec / 1000
local at = string.format('%d.%06d', sec, usec)

-- 1. the window is (now - period, now]: an entry exactly one period old is out of it
redis.call('zremrangebyscore', log, '-inf', now - period)
-- 2. a pause in force
local s = redis.call('hmget', state, 'n', 'p', 'u')
local u = tonumber(s[3])
local paused = u ~= nil and u > now
local turn_member = 'r:' .. id
-- The turn one period after entry e = {member, score}. After another turn, a little later:
-- that turn's owner starts when it comes back, a sleep's overshoot and a round trip after it,
-- and a turn timed from the turn itself would come back to find that start still in the
-- window and be sent away again for a few ms.
local slack = math.min(period / 50, 20)
local function after(e)
    if string.sub(e[1], 1, 2) == 'r:' then
        return tonumber(e[2]) + period + slack
    end
    return tonumber(e[2]) + period
end
local admitted, turn, used = false, now, nil
if paused then
    turn = u
end

if id ~= '' and redis.call('zscore', log, turn_member) then
    -- 3. a returning call: its old turn goes, and the entries due by now decide
    redis.call('zrem', log, turn_member)
    local count = redis.call('zcount', log, '-inf', now)
    used = count
    if not paused and count < limit then
        admitted = true
    elseif count >= limit then
        local e = redis.call('zrangebyscore', log, '-inf', now, 'withscores', 'limit',
            count - limit, 1)
        turn = math.max(turn, after(e))
    end
else
    -- 4. a new call: every entry counts, turns ahead included, so it queues behind them
    local total = redis.call('zcard', log)
    if not paused and total < limit then
        admitted = true
    elseif total >= limit then
        local e = redis.call('zrange', log, total - limit, total - limit, 'withscores')
        turn = math.max(turn, after(e))
    end
end

-- 5. the start, or the turn
if admitted then
    local member, n = 's:' .. id .. ':' .. at, 0
    -- the same id twice in one microsecond must still log two starts
    while redis.call('zadd', log, 'nx', now, n == 0 and member or member .. ':' .. n) == 0 do
        n = n + 1
    end
elseif id ~= '' then
    redis.call('zadd', log, turn, turn_member)
end

-- 6. the log lives at least one period after its last entry (the entry just written is the
-- latest: a start now, or the latest turn), and half a period more (at most a minute) when its
-- TTL is written, so that most calls write none; the state lives as long as the log or the
-- pause, whichever ends later (a one-off try refused by a pause may leave no log at all)
local paused_ms = paused and u - now or 0
local added = admitted and now or (id ~= '' and turn) or nil
local ttl = 0
if added and redis.call('pttl', log) < added + period - now then
    ttl = math.ceil(added + period - now + math.min(period / 2, 60000))
    redis.call('pexpire', log, ttl)
end
local rule = tonumber(s[1]) ~= limit or tonumber(s[2]) ~= period
if rule then
    redis.call('hset', state, 'n', limit, 'p', period)
end
if ttl > 0 or rule then
    local live = ttl > 0 and ttl or redis.call('pttl', log)
    redis.call('pexpire', state, math.max(live, math.ceil(paused_ms), 1))
end

-- 7. the reply
if used == nil then
    used = redis.call('zcount', log, '-inf', now)
elseif admitted then
    used = used + 1
end
if admitted then
    return {1, '0', used, at, string.format('%.3f', paused_ms)}
end
return {0, string.format('%.3f', turn - now), used, at, string.format('%.3f', paused_ms)}
