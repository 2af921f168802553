-- acquire.lua: take or re-enter a reentrant hash lock.
--
-- The lock is one hash (field = owner token, value = hold count) with a lease (PEXPIRE). Its
-- meta hash, in the same hash tag, keeps what outlives a hold:
--   fence       the last fencing token
--   req         the request id of the last acquire (a resend is not counted twice)
--   run, info   the holder's run token and operator info
--   state       a label the holder gives its hold (force_release.lua acts on it)
--   rel         the request id of the last release (see release.lua)
--   w           until when (server ms) a refused acquire may wait for a wake-up: set by every
--               refusal, read by release.lua (it publishes only while set), removed by the
--               first new holder past it
--   x           a time (server ms) the meta hash lives until at least. Written here only;
--               every other script only ever lengthens the meta hash's TTL, so x stays a lower
--               bound, and an acquire writes the TTL only when x is not far enough ahead
--   void:<id>   an acquire whose caller gave up on the reply (see cancel.lua)
--
-- KEYS[1]  lock hash, KEYS[2]  meta hash
-- ARGV[1]  owner token
-- ARGV[2]  lease, ms (a whole number >= 1)
-- ARGV[3]  request id, the same for a resend of this call
-- ARGV[4]  the lease plus the meta hash's retention, ms
-- ARGV[5]  operator info, ARGV[6] run token, ARGV[7] state (absent or "": none; on a
--          re-entry, "" keeps the hold's info and state)
--
-- Returns
--   fence                        a new holder (hold count 1)
--   {1, hold_count, fence}       a re-entry by the same owner, or a resend of one that ran
--   {0, lease_left_ms, holder}   held by another owner
--   {0, lease_left_ms, owner, "run"}  held by this owner with another run token: while a hold
--                                has a run token, the owner re-enters only without one or
--                                with the same one
--   {0, -2, ""}                  this request was voided by cancel.lua: it never takes a hold
-- The fence grows for every new holder: max(last + 1, server time in us), so it survives the
-- meta hash's loss and a failover to a replica that missed the last writes, as long as the
-- server clock does not step back.
--
-- Server time: every call and every reply element costs (see docs/benchmarks.md): a new
-- holder makes 6 calls (EXISTS, HMGET, TIME, HSET, PEXPIRE, HSET), 7 about once per half
-- retention (PEXPIRE of the meta hash); a re-entry reads req and run apart, so that a new
-- holder does not read them.

local lock, meta = KEYS[1], KEYS[2]
local owner, lease, request, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Checked before any write: a lock is never left without a lease.
local l, t = tonumber(lease), tonumber(ttl)
if not l or l < 1 or l % 1 ~= 0 or not t or t < l or t > 9007199254740991 then
    return redis.error_reply('ERR lease must be a whole number of milliseconds from 1 to '
        .. '2^53 - 1 - retention, got ' .. lease)
end

local held = redis.call('exists', lock) == 1
local m = redis.call('hmget', meta, 'fence', 'void:' .. request, 'x', 'w')
if m[2] then
    return {0, -2, ''}
end

local count, now, fence, fields
if not held then
    now = redis.call('time')
    fence = now[1] * 1000000 + now[2]
    local last = tonumber(m[1])
    if last and last >= fence then
        fence = last + 1
    end
    redis.call('hset', lock, owner, 1)
    redis.call('pexpire', lock, lease)
    if m[4] and tonumber(m[4]) < fence / 1000 then
        redis.call('hdel', meta, 'w') -- every waiter has tried again since
    end
    -- Every field of a holder is written, so nothing of an earlier one survives.
    fields = {'fence', fence, 'req', request, 'info', ARGV[5] or '', 'run', ARGV[6] or '',
        'state', ARGV[7] or ''}
    count = 1
else
    count = redis.call('hget', lock, owner)
    local hold, run = {}, ARGV[6] or ''
    if count then
        -- A re-entry from another process (nesting in a process never gets here).
        hold = redis.call('hmget', meta, 'req', 'run')
        fence = tonumber(m[1])
        if fence and hold[1] == request then
            return {1, tonumber(count), fence} -- a resend of a call that ran: not again
        end
    end
    if not count or (run ~= '' and (hold[2] or '') ~= '' and hold[2] ~= run) then
        -- Refused. The waiter may wait for the holder's lease as it is now (plus a second: its
        -- clock starts later); a release publishes a wake-up while w is ahead.
        local pttl = redis.call('pttl', lock)
        now = redis.call('time')
        local until_ms = now[1] * 1000 + math.floor(now[2] / 1000) + math.max(pttl, 0) + 1000
        if not m[4] or tonumber(m[4]) < until_ms then
            if redis.call('hset', meta, 'w', until_ms) == 1 and redis.call('pttl', meta) < 0 then
                redis.call('pexpire', meta, math.max(pttl, 0) + t) -- HSET just made it
            end
        end
        if count then
            return {0, pttl, owner, 'run'}
        end
        return {0, pttl, redis.call('hkeys', lock)[1]}
    end
    now = redis.call('time')
    -- the meta hash was lost under the hold: a new token, larger than any before it
    fence = fence or now[1] * 1000000 + now[2]
    count = redis.call('hincrby', lock, owner, 1)
    redis.call('pexpire', lock, lease)
    fields = {'fence', fence, 'req', request, 'run', run ~= '' and run or hold[2] or ''}
    if (ARGV[5] or '') ~= '' then
        fields[#fields + 1] = 'info'
        fields[#fields + 1] = ARGV[5]
    end
    if (ARGV[7] or '') ~= '' then
        fields[#fields + 1] = 'state'
        fields[#fields + 1] = ARGV[7]
    end
end

-- The meta hash lives at least t from now; when its TTL is written, half a retention longer,
-- so that most acquires of a busy lock write none.
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local x = tonumber(m[3])
if x and x >= now_ms + t then
    redis.call('hset', meta, unpack(fields))
else
    local keep = t + math.floor((t - l) / 2)
    fields[#fields + 1] = 'x'
    fields[#fields + 1] = now_ms - 1000 + keep -- (a second early: PEXPIRE counts from later)
    redis.call('hset', meta, unpack(fields))
    redis.call('pexpire', meta, keep)
end
if count == 1 then
    return fence
end
return {1, count, fence}
