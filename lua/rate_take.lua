-- rate_take.lua: one call's turn under a rate limit of N starts in any window of P ms.
--
-- The log is one sorted set scored by server time (ms, with microseconds): the starts of the
-- last P ms (member "s:<call>:<time>", unique) and the turns handed out to calls that were
-- refused (member "r:<call>", scored by the turn's time, often in the future). The state hash
-- keeps the rule last used (for operators) and a pause.
--
-- Exact: a call is admitted at time a only while fewer than N entries scored in (a - P, a]
-- exist (turns of others that are due count as starts: never fewer), and every start stays in
-- the log for P. So any window of length P holds at most N starts: at the last start in it,
-- the others were in the log already.
--
-- Turns: a new call is admitted only while the log (window and turns ahead) has fewer than N
-- entries; else its turn is t = max(now, pause end, e[k - N] + P), e sorted, k entries. The
-- log so stays sorted by the order of the turns, any N + 1 consecutive entries P apart: the
-- calls refused together come back one turn each, not as a herd. A call coming back for its
-- turn drops the turn and is admitted by the exact rule alone; refused again (it came early,
-- or a start moved late), its new turn is when the window has room.
--
-- KEYS[1]  log (sorted set), KEYS[2]  state (hash: n limit, p period ms, u paused until ms)
-- ARGV[1]  N, the limit (a whole number >= 1)
-- ARGV[2]  P, the period in ms (a whole number >= 1)
-- ARGV[3]  the call's id (its turn is kept under it)
--
-- Returns {admitted (1 or 0), wait ms until the turn (0 when admitted), used (entries in the
-- window ending now, this start included), now ms, pause left ms}; the times as strings (a
-- Lua number would be cut to an integer).
--
-- Both keys expire P after their last entry (the state: or at the pause's end, if later): a
-- caller that dies leaves nothing that outlives time.

local log, state = KEYS[1], KEYS[2]
local limit, period, call = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
if not limit or limit < 1 or limit % 1 ~= 0 then
    return redis.error_reply('ERR limit must be a whole number >= 1, got ' .. tostring(ARGV[1]))
end
if not period or period < 1 or period % 1 ~= 0 or period > 9007199254740991 then
    return redis.error_reply('ERR period must be a whole number of ms >= 1, got '
        .. tostring(ARGV[2]))
end
if not call or call == '' then
    return redis.error_reply('ERR the call id must not be empty')
end

local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local function ms(x) return string.format('%.3f', x) end

redis.call('zremrangebyscore', log, '-inf', ms(now - period))
local rule = redis.call('hmget', state, 'n', 'p', 'u')
local paused = tonumber(rule[3])
if paused and paused <= now then paused = nil end

local turn = 'r:' .. call
local ahead  -- the entries this call counts, when refused: the (ahead - N)th frees its place
local counted
if redis.call('zrem', log, turn) == 1 then
    counted = redis.call('zcount', log, '-inf', ms(now))  -- a returning call: exact rule only
else
    counted = redis.call('zcard', log)  -- a new call: behind every turn handed out
end
local at = now
if counted >= limit then
    local e = redis.call('zrange', log, counted - limit, counted - limit, 'withscores')
    at = math.max(now, tonumber(e[2]) + period)
end
if paused then at = math.max(at, paused) end
local admitted = at <= now

if admitted then
    redis.call('zadd', log, ms(now), 's:' .. call .. ':' .. ms(now))
else
    redis.call('zadd', log, ms(at), turn)
end
local keep = math.ceil(at + period - now)
if redis.call('pttl', log) < keep then redis.call('pexpire', log, keep) end
if rule[1] ~= ARGV[1] or rule[2] ~= ARGV[2] then
    redis.call('hset', state, 'n', ARGV[1], 'p', ARGV[2])
end
local keep_state = math.max(keep, paused and math.ceil(paused - now) or 0)
if redis.call('pttl', state) < keep_state then redis.call('pexpire', state, keep_state) end

local used = redis.call('zcount', log, '-inf', ms(now))
return {admitted and 1 or 0, ms(at - now), used, ms(now), ms(paused and paused - now or 0)}
