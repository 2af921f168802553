-- acquire.lua: take or re-enter a reentrant hash lock.
--
-- The lock is one hash: field = owner token, value = hold count, with a lease (PEXPIRE).
-- Its companion meta hash (same hash tag, so one Redis Cluster slot) keeps:
--   fence       the last fencing token
--   req         the request id of the last acquire (a resent acquire is not counted twice)
--   run, info   the holder's run token and operator info
--   state       the hold's state, a label its holder gives it (the Celery layer's queued,
--               running, requeued, cooldown): operator commands act on it (a release of only
--               the holds in a given state, see force_release.lua), so it is a field of its own,
--               never read out of the display text in info
--   rel         the request id of the last release (see release.lua)
--   w           while acquires may wait: until when (server time, ms) a refused acquire waits
--               for a wake-up at most (the holder's lease left when it was refused, plus a
--               second). A release publishes a wake-up only while it is set; every refusal
--               sets it again (a waiter tries again at least once a lease), and the first new
--               holder past it removes it: a lock nobody waits for publishes nothing.
--   x           a time (server time, ms) the meta hash is known to live until, at least: an
--               acquire writes the meta hash's TTL only when x is less than its lease plus the
--               retention ahead, and then half a retention longer (most acquires of a busy lock
--               write no TTL). What may shorten the TTL (park, force_release, a re-entry)
--               removes x; renew.lua sets it with the TTL it writes.
--   void:<id>   one per acquire whose caller gave up on the reply (see cancel.lua)
--
-- KEYS[1]  lock hash             e.g. lock:{tasks.add:3f1c...}
-- KEYS[2]  meta hash             e.g. lock:{tasks.add:3f1c...}:meta
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds (integer > 0)
-- ARGV[3]  request id, unique per acquire call (a resend of the same call carries the same id)
-- ARGV[4]  the lease plus the retention (how long the meta hash outlives the lock), ms. The
--          meta hash lives at least that long from this acquire, at most half a retention
--          longer.
-- ARGV[5]  operator info (opaque string; absent or "" for none)
-- ARGV[6]  run token (absent or "" for none). Celery passes one per delivery of a task: the
--          owner (the task id) may re-enter, but not while another run of the same owner
--          holds it, so a message redelivered while its first run is alive is refused
--          ({0, pttl, owner, "run"}).
-- ARGV[7]  the hold's state (absent or "" for none; on a re-entry, "" keeps the one it has)
--
-- Returns, after Redisson's "nil or remaining lease" reply, with the details callers need:
--   fence (an integer)            acquired by a new holder (hold count 1)
--   {1, hold_count, fence}        re-entered (same owner), or a resend of an acquire that ran
--   {0, remaining_lease_ms, holder}  held by another owner
--   {0, remaining_lease_ms, owner, "run"}  held by this owner, but by another live run
--   {0, -2, ""}                   this request was voided by cancel.lua (its caller gave up
--                                 on the reply): it must never take a hold, however late it runs
-- A lease that is not a whole number of milliseconds in [1, 2^53 - 1 - retention] is an error,
-- raised before anything is written: a lock is never left without a lease.
-- The fencing token increases for every new holder, also after the lock hash was deleted and
-- after a failover to a replica that missed the last writes: it is max(last token + 1, server
-- time in microseconds), so it survives the meta hash expiring as long as the server clock
-- does not step back. (Numbers are passed to redis.call as they are: Redis writes integers
-- below 2^53 in full, where Lua's tostring would use exponent notation.)
--
-- Server time: each redis.call costs about 0.3 to 0.6 microseconds (more with more arguments
-- and replies), and this script runs once per acquire. A free lock takes 6 calls: PTTL lock,
-- HMGET meta, TIME, HSET + PEXPIRE lock, HSET meta (a 7th, PEXPIRE meta, about once per half
-- retention). A refusal is PTTL, HMGET, HKEYS, and TIME + HSET when it announces a waiter; a
-- re-entry from another process 8 (in-process nesting never gets here).

local lock, meta = KEYS[1], KEYS[2]
local owner, lease, request, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Checked before any write (a later PEXPIRE refusing the lease would leave the hash immortal).
-- The lease and the TTL are passed on to PEXPIRE as the strings they came as.
local l, t = tonumber(lease), tonumber(ttl)
if not l or l < 1 or l % 1 ~= 0 or not t or t < l or t > 9007199254740991 then
    return redis.error_reply('ERR lease must be a whole number of milliseconds from 1 to '
        .. '2^53 - 1 - retention, got ' .. lease)
end

-- One call tells a free lock (the common case) from a held one, and gives a holder's lease.
local pttl = redis.call('pttl', lock)
local m = redis.call('hmget', meta, 'fence', 'void:' .. request, 'x', 'w')
if m[2] then
    return {0, -2, ''}
end

if pttl == -2 then
    -- A new holder.
    local now = redis.call('time')
    local fence = now[1] * 1000000 + now[2]
    local now_ms = fence / 1000
    local last = tonumber(m[1])
    if last and last >= fence then
        fence = last + 1
    end
    redis.call('hset', lock, owner, 1)
    redis.call('pexpire', lock, lease)
    -- Every field of the holder is written (info and run as "" when none), so nothing of an
    -- earlier holder survives.
    local x = tonumber(m[3])
    if x and x >= now_ms + t then
        redis.call('hset', meta, 'fence', fence, 'req', request, 'info', ARGV[5] or '',
            'run', ARGV[6] or '', 'state', ARGV[7] or '')
    else
        -- Half a retention more than needed, so the acquires of the next half retention need
        -- not write it (x: a second early, for the time PEXPIRE counts from).
        local keep = t + math.floor((t - l) / 2)
        redis.call('hset', meta, 'fence', fence, 'req', request, 'info', ARGV[5] or '',
            'run', ARGV[6] or '', 'state', ARGV[7] or '', 'x', math.floor(now_ms) - 1000 + keep)
        redis.call('pexpire', meta, keep)
    end
    if m[4] and tonumber(m[4]) < now_ms then
        redis.call('hdel', meta, 'w') -- every waiter has tried again since: none is left
    end
    return fence
end

-- A refusal: announce a waiter until the holder's lease, as it is now, is over (plus a second:
-- the waiter's own clock starts later). A blocked acquire subscribes to the wake-up channel
-- before the acquire that lands here, and waits for at most that lease before it tries again.
local function announce_waiter()
    local now = redis.call('time')
    local until_ms = now[1] * 1000 + math.floor(now[2] / 1000) + math.max(pttl, 0) + 1000
    local was = tonumber(m[4])
    if not was or was < until_ms then
        if redis.call('hset', meta, 'w', until_ms) == 1 and redis.call('pttl', meta) < 0 then
            -- the meta hash was gone: HSET just made it, and no key of a lock lives forever
            redis.call('pexpire', meta, math.max(pttl, 0) + t)
        end
    end
end

local count = redis.call('hget', lock, owner)
if not count then
    -- Held by another owner.
    announce_waiter()
    return {0, pttl, redis.call('hkeys', lock)[1]}
end

-- A re-entry by the same owner (from another process: in-process nesting never gets here).
local state = redis.call('hmget', meta, 'req', 'run')
local fence = tonumber(m[1])
if fence and state[1] == request then
    -- a resend of a call that already succeeded: report it, do not count it again
    return {1, tonumber(count), fence}
end
local run, held_run = ARGV[6] or '', state[2]
if run ~= '' and held_run and held_run ~= '' and held_run ~= run then
    announce_waiter()
    return {0, pttl, owner, 'run'}
end
if not fence then
    -- The meta hash was deleted or evicted while the lock was held: mint a new token (by the
    -- server clock, larger than any before it) rather than reply without one.
    local now = redis.call('time')
    fence = now[1] * 1000000 + now[2]
end
count = redis.call('hincrby', lock, owner, 1)
redis.call('pexpire', lock, lease)
if run == '' then run = held_run or '' end
-- info and state are written only when given: a re-entry without them keeps the hold's
local info, hold_state = ARGV[5] or '', ARGV[7] or ''
local fields = {'fence', fence, 'req', request, 'run', run}
if info ~= '' then
    fields[#fields + 1] = 'info'
    fields[#fields + 1] = info
end
if hold_state ~= '' then
    fields[#fields + 1] = 'state'
    fields[#fields + 1] = hold_state
end
redis.call('hset', meta, unpack(fields))
-- This lease may be another than the holder's: the meta hash is set to outlive it (x goes,
-- as this may shorten the TTL).
redis.call('hdel', meta, 'x')
redis.call('pexpire', meta, ttl)
return {1, count, fence}
