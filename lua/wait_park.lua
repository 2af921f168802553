-- wait_park.lua: a waiter that a lock refused leaves, to be woken by the lock's next release.
--
-- Its record is written only while every permit of the lock is held, checked in this step. A
-- holder that ends releases first and reads the records after (wait_end.lua): either this
-- script finds a permit free and writes nothing (the waiter tries again at once), or that read
-- finds the record and wakes it. The waiter's own fallback (a wake-up it schedules for itself,
-- about when the lease that frees first would run out) covers a holder that ends without a word.
--
-- KEYS[1]   the waiter records: a hash "<lock key>:wait" (field = waiter id, value = its record)
-- KEYS[2..] the lock's permits (one key unless there are several)
-- ARGV[1]   the waiter id
-- ARGV[2]   its record: the wait token (one per wait), a newline, what its wake-up carries
-- ARGV[3]   how long the records live at least after this write, ms
-- ARGV[4]   "1": write the record even when a permit is free (the waiter found one free and
--           lost it again too often; it wakes itself at once)
--
-- Returns {1, lease_left_ms} when written: the lease that frees first (0 when a permit is
-- free, -1 when none has a lease); {0, 0} when a permit is free and nothing was written. A
-- record replaces the waiter's earlier one (its previous wait, or its claim).

local records = KEYS[1]
local keep = tonumber(ARGV[3])
-- Checked before any write (see acquire.lua).
if not keep or keep < 1 or keep % 1 ~= 0 or keep > 9007199254740991 then
    return redis.error_reply('ERR the records lifetime must be a whole number of milliseconds '
        .. 'from 1 to 2^53 - 1, got ' .. ARGV[3])
end
local soonest = -1
for i = 2, #KEYS do
    local pttl = redis.call('pttl', KEYS[i])
    if pttl == -2 then
        if ARGV[4] ~= '1' then
            return {0, 0}
        end
        soonest = 0
    elseif pttl >= 0 and (soonest < 0 or pttl < soonest) then
        soonest = pttl
    end
end
redis.call('hset', records, ARGV[1], ARGV[2])
-- Only ever lengthened: the records of other copies (a replaced one) keep their time.
if redis.call('pttl', records) < keep then
    redis.call('pexpire', records, string.format('%d', keep))
end
return {1, soonest}
