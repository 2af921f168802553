-- acquire.lua: take or re-enter a reentrant hash lock.
--
-- The lock is one hash: field = owner token, value = hold count, with a lease (PEXPIRE).
-- Its companion meta hash keeps the last fencing token, the request id of the last acquire
-- (so a resent acquire is not counted twice), operator info, and a "void:<request id>" field
-- for each acquire whose caller gave up on the reply (see cancel.lua). Both keys share one hash tag,
-- so they live in one Redis Cluster slot.
--
-- KEYS[1]  lock hash             e.g. lock:{tasks.add:3f1c...}
-- KEYS[2]  meta hash             e.g. lock:{tasks.add:3f1c...}:meta
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds (integer > 0)
-- ARGV[3]  request id, unique per acquire call (a resend of the same call carries the same id)
-- ARGV[4]  operator info (opaque string, "" for none)
-- ARGV[5]  how long the meta hash outlives the lock, in milliseconds
-- ARGV[6]  run token ("" for none). Celery passes one per delivery of a task: the owner (the
--          task id) may re-enter, but not while another run of the same owner holds it, so a
--          message redelivered while its first run is alive is refused ({0, pttl, owner, "run"}).
--
-- Returns, after Redisson's "nil or remaining lease" reply, with the details callers need:
--   {1, hold_count, fence}        acquired (new holder) or re-entered (same owner)
--   {0, remaining_lease_ms, holder}  held by another owner
--   {0, remaining_lease_ms, owner, "run"}  held by this owner, but by another live run
--   {0, -2, ""}                   this request was voided by cancel.lua (its caller gave up
--                                 on the reply): it must never take a hold, however late it runs
-- A lease that is not a whole number of milliseconds in [1, 2^53 - retention] is an error,
-- raised before anything is written: a lock is never left without a lease.
-- The fencing token increases for every new holder, also after the lock hash was deleted:
-- it is max(last token + 1, server time in microseconds), so it survives the meta hash
-- expiring as long as the server clock does not step back.
--
-- Every redis.call costs about a microsecond of server time beyond the command itself, and
-- this script runs once per acquire: the paths below use as few calls as they can (7 on a
-- free lock, 7 on a re-entry from another process, 2 on a refusal).

local lock, meta = KEYS[1], KEYS[2]
local owner, lease, request = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local info, retention, run = ARGV[4], tonumber(ARGV[5]), ARGV[6]
-- Checked before any write (a later PEXPIRE refusing the lease would leave the hash immortal),
-- and passed on as %d: Lua would print a large number in exponent notation, which PEXPIRE
-- refuses.
if not lease or lease < 1 or lease % 1 ~= 0 or lease + retention > 9007199254740991 then
    return redis.error_reply('ERR lease must be a whole number of milliseconds from 1 to '
        .. '2^53 - 1 - retention, got ' .. ARGV[2])
end
local void = 'void:' .. request

-- One call tells a free lock (the common case) from a held one, and gives a holder's lease.
local pttl = redis.call('pttl', lock)

if pttl == -2 then
    -- A new holder.
    local now = redis.call('time')
    local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    local state = redis.call('hmget', meta, 'fence', void)
    if state[2] then
        return {0, -2, ''}
    end
    local last = tonumber(state[1])
    if last and last >= fence then
        fence = last + 1
    end
    redis.call('hset', lock, owner, 1)
    redis.call('pexpire', lock, string.format('%d', lease))
    -- %d: tostring() would print a large number in exponent notation. Every field is
    -- written (run as "" when none), so nothing of an earlier holder survives.
    redis.call('hset', meta, 'fence', string.format('%d', fence), 'req', request,
        'since', string.format('%d', math.floor(fence / 1000)), 'info', info, 'run', run)
    redis.call('pexpire', meta, string.format('%d', lease + retention))
    return {1, 1, fence}
end

local count = redis.call('hget', lock, owner)
if not count then
    return {0, pttl, redis.call('hkeys', lock)[1]}
end

-- A re-entry by the same owner (from another process: in-process nesting never gets here).
local state = redis.call('hmget', meta, 'fence', 'req', 'run', void)
if state[4] then
    return {0, -2, ''}
end
local fence = tonumber(state[1])
if fence and state[2] == request then
    -- a resend of a call that already succeeded: report it, do not count it again
    return {1, tonumber(count), fence}
end
if run ~= '' and state[3] and state[3] ~= '' and state[3] ~= run then
    return {0, pttl, owner, 'run'}
end
if not fence then
    -- The meta hash was deleted or evicted while the lock was held: mint a new token (by the
    -- server clock, larger than any before it) rather than reply without one.
    local now = redis.call('time')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
end
count = redis.call('hincrby', lock, owner, 1)
redis.call('pexpire', lock, string.format('%d', lease))
if run == '' then run = state[3] or '' end
if info ~= '' then
    redis.call('hset', meta, 'fence', string.format('%d', fence), 'req', request, 'run', run,
        'info', info)
else
    redis.call('hset', meta, 'fence', string.format('%d', fence), 'req', request, 'run', run)
end
redis.call('pexpire', meta, string.format('%d', lease + retention))
return {1, count, fence}
