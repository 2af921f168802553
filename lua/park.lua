-- park.lua: keep an owner's hold, unrenewed, for a later process of the same owner.
--
-- The process that held it stops (a retry or a redelivery of the same owner is on its way);
-- the lock stays held with a lease long enough for the wait, and the run token is cleared, so
-- the next process of the owner re-enters it with a run token of its own.
--
-- KEYS[1]  lock hash, KEYS[2]  meta hash
-- ARGV[1]  owner token
-- ARGV[2]  lease, ms
-- ARGV[3]  the meta hash's retention, ms
-- ARGV[4]  operator info, ARGV[5] the hold's state ("" or absent: keep the current one)
--
-- Returns 1 when parked, 0 when the owner did not hold the lock (its lease was lost).

local lock, meta = KEYS[1], KEYS[2]
local lease = tonumber(ARGV[2])
-- Checked before any write, and passed on as %d (Lua would write a large number in exponent
-- notation).
if not lease or lease < 1 or lease % 1 ~= 0 or lease + tonumber(ARGV[3]) > 9007199254740991 then
    return redis.error_reply('ERR lease must be a whole number of milliseconds from 1 to '
        .. '2^53 - 1 - retention, got ' .. ARGV[2])
end
if redis.call('hexists', lock, ARGV[1]) == 0 then
    return 0
end
redis.call('pexpire', lock, string.format('%d', lease))
local fields = {'run', ''}
if ARGV[4] ~= '' then
    fields[3], fields[4] = 'info', ARGV[4]
end
if (ARGV[5] or '') ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'state', ARGV[5]
end
redis.call('hset', meta, unpack(fields))
-- only ever lengthened (see acquire.lua's x)
local keep = lease + tonumber(ARGV[3])
if redis.call('pttl', meta) < keep then
    redis.call('pexpire', meta, string.format('%d', keep))
end
return 1
