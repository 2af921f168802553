-- cancel.lua: undo an acquire whose reply never came back (a socket timeout, a dropped
-- connection). That acquire may have run already, may still run (a stalled server, a request
-- still in flight on the old connection, redis-py's own resend of it), or may never run: after
-- this script it holds nothing, and never will. Without it, a caller told "Redis failed" would
-- leave behind a hold that nobody releases: a publish that raised would keep its job locked for
-- the whole queue lease.
--
-- KEYS[1]  lock hash
-- KEYS[2]  meta hash
-- ARGV[1]  owner token of that acquire
-- ARGV[2]  request id of that acquire (acquire.lua's ARGV[3])
-- ARGV[3]  "publish", or "spublish" on Redis Cluster: how the lock's key is published on its
--          wake-up channel (KEYS[1] cut after its hash tag, plus ":wake"; not a key: see
--          release.lua) when the lock is freed
-- ARGV[4]  how long the meta hash outlives the lock, ms
-- ARGV[5]  the lease that acquire asked for, ms: the void mark outlives any hold it could make
--
-- Returns 1 when that acquire had run and its hold was dropped, 0 when it had not run (the
-- "void:<request id>" field written in the meta hash makes acquire.lua refuse it if it ever
-- runs). When another acquire of the same owner has run since (its request id is the one in
-- the meta hash now), which of the owner's holds came from the cancelled one cannot be told:
-- nothing is dropped, and that hold ends with its lease (the caller is told, 0). The client
-- keeps a cancel it could not send pending, and runs it before the same owner's next acquire,
-- release or park of the lock (commands.settle), so only another process acting as the same
-- owner can get there first.

local lock, meta = KEYS[1], KEYS[2]
local owner, request = ARGV[1], ARGV[2]
local retention, lease = tonumber(ARGV[4]), tonumber(ARGV[5])
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
            redis.call(ARGV[3], (string.match(lock, '^(.*})') or lock) .. ':wake', lock)
        end
        done = 1
    end
end

-- 'req' cleared once its hold is dropped: a resend of this call (redis-py's retry) must not
-- drop a second one.
if done == 1 then
    redis.call('hset', meta, 'void:' .. request, '1', 'req', '')
else
    redis.call('hset', meta, 'void:' .. request, '1')
end
-- Past the lock as well as past the cancelled acquire's lease: when the meta hash had been
-- evicted under a hold with a longer lease than this acquire's, the HSET above recreated it,
-- and it must not expire before that hold (with it would go the hold's run token and fence).
-- Only ever extended: acquire.lua's 'x' (a time the meta hash lives until) stays true.
local keep = math.max(lease, redis.call('pttl', lock)) + retention
if redis.call('pttl', meta) < keep then
    redis.call('pexpire', meta, string.format('%d', keep))
end
return done
