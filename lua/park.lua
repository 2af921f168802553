-- park.lua: hand a running hold back to the queue, for a Celery retry.
--
-- The run ends but the job is not done: the retry message (same task id, same owner) is on
-- its way. The lock stays held by the owner, with a lease long enough to cover the wait, and
-- the run token is cleared, so the retry's run may re-enter it from any worker.
--
-- KEYS[1]  lock hash
-- KEYS[2]  meta hash
-- ARGV[1]  owner token (the task id)
-- ARGV[2]  lease in milliseconds for the wait in the queue
-- ARGV[3]  how long the meta hash outlives the lease, ms
-- ARGV[4]  operator info ("" to keep the current one)
-- ARGV[5]  the hold's state while parked (see acquire.lua; absent or "" to keep the current one)
--
-- Returns 1 when parked, 0 when the owner did not hold the lock (its lease was lost).

local lock, meta = KEYS[1], KEYS[2]
local lease = tonumber(ARGV[2])
-- Checked before any write, and passed on as %d (see acquire.lua).
if not lease or lease < 1 or lease % 1 ~= 0 or lease + tonumber(ARGV[3]) > 9007199254740991 then
    return redis.error_reply('ERR lease must be a whole number of milliseconds from 1 to '
        .. '2^53 - 1 - retention, got ' .. ARGV[2])
end
if redis.call('hexists', lock, ARGV[1]) == 0 then
    return 0
end
redis.call('pexpire', lock, string.format('%d', lease))
redis.call('hdel', meta, 'run', 'x') -- x: the TTL set below may be shorter (see acquire.lua)
if ARGV[4] ~= '' then
    redis.call('hset', meta, 'info', ARGV[4])
end
if ARGV[5] and ARGV[5] ~= '' then
    redis.call('hset', meta, 'state', ARGV[5])
end
redis.call('pexpire', meta, string.format('%d', lease + tonumber(ARGV[3])))
return 1
