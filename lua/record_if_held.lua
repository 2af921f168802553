-- record_if_held.lua: write one record beside a lock, only while its owner holds it with enough
-- of its lease left: a holder about to lose its lease records nothing (and so does nothing
-- that the record stands for), and the next holder reads what was recorded.
--
-- KEYS[1]  lock hash, KEYS[2] records hash ("<lock key>:<kind>", in the lock's hash tag)
-- ARGV[1]  owner token, ARGV[2] the record's field, ARGV[3] its value
-- ARGV[4]  the least lease, ms, that must be left on the lock
-- ARGV[5]  how long the records hash lives after this write, ms
--
-- Returns {1, lease_left_ms} when recorded, {0, 0} when the owner does not hold the lock, and
-- {-1, lease_left_ms} when less than ARGV[4] ms of its lease is left (nothing written).

local lock, records = KEYS[1], KEYS[2]
local margin, keep = tonumber(ARGV[4]), tonumber(ARGV[5])
-- Checked before any write (see acquire.lua).
if not margin or margin < 0 or margin % 1 ~= 0 then
    return redis.error_reply('ERR the least lease must be a whole number of milliseconds, got '
        .. ARGV[4])
end
if not keep or keep < 1 or keep % 1 ~= 0 or keep > 9007199254740991 then
    return redis.error_reply('ERR the records lifetime must be a whole number of milliseconds '
        .. 'from 1 to 2^53 - 1, got ' .. ARGV[5])
end
if redis.call('hexists', lock, ARGV[1]) == 0 then
    return {0, 0}
end
local pttl = redis.call('pttl', lock)
if pttl >= 0 and pttl < margin then
    return {-1, pttl}
end
redis.call('hset', records, ARGV[2], ARGV[3])
redis.call('pexpire', records, string.format('%d', keep))
return {1, pttl}
