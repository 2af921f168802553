-- cancel.lua: undo an acquire whose reply never came (a timeout, a dropped connection). That
-- acquire may have run, may still run (a stalled server, a resend), or never run: after this
-- script it holds nothing, and never will.
--
-- KEYS[1]  lock hash, KEYS[2]  meta hash
-- ARGV[1]  owner token of that acquire
-- ARGV[2]  its request id (acquire.lua's ARGV[3])
-- ARGV[3]  "publish", or "spublish" on Redis Cluster, ARGV[6] the lock's wake-up channel: a
--          lock this frees is published there (see release.lua)
-- ARGV[4]  the meta hash's retention, ms
-- ARGV[5]  the lease that acquire asked for, ms: the void mark outlives any hold it made
--
-- Returns 1 when that acquire had run and its hold was dropped, 0 otherwise: the field
-- void:<request id> makes acquire.lua refuse it should it run later. When another acquire of
-- the owner has run since (the meta hash's req is another), which of the owner's holds came
-- from the cancelled one cannot be told: nothing is dropped, and that hold ends with its lease.
-- The client runs a cancel it could not send before the owner's next acquire, release or park
-- of the lock, so only another process acting as the same owner can get there first.

local lock, meta = KEYS[1], KEYS[2]
local owner, request = ARGV[1], ARGV[2]
if ARGV[3] ~= 'publish' and ARGV[3] ~= 'spublish' then
    return redis.error_reply('ERR the wake-up command must be publish or spublish, got ' .. ARGV[3])
end

local done = 0
if redis.call('hget', meta, 'req') == request then
    local count = tonumber(redis.call('hget', lock, owner))
    if count and count > 1 then
        redis.call('hincrby', lock, owner, -1)
        done = 1
    elseif count then
        if redis.call('hlen', lock) > 1 then
            redis.call('hdel', lock, owner)
        else
            redis.call('del', lock)
            redis.call(ARGV[3], ARGV[6], lock)
        end
        done = 1
    end
end
-- req is cleared with the hold it dropped: a resend of this call drops no second one.
if done == 1 then
    redis.call('hset', meta, 'void:' .. request, '1', 'req', '')
else
    redis.call('hset', meta, 'void:' .. request, '1')
end
-- Past the lock as well as past the cancelled acquire's lease (the HSET above may have made
-- the meta hash anew under a longer hold), and only ever lengthened (see acquire.lua's x).
local keep = math.max(tonumber(ARGV[5]), redis.call('pttl', lock)) + tonumber(ARGV[4])
if redis.call('pttl', meta) < keep then
    redis.call('pexpire', meta, string.format('%d', keep))
end
return done
