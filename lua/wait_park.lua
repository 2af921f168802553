-- wait_park.lua: a queued copy (Celery's lock_at="queue") that its job's lock refused waits
-- beside that lock, until the run that holds it ends.
--
-- The copy writes its wait record only while the lock is still held, in one step with the
-- check. A run that ends releases its lock first and reads the records after (wait_end.lua),
-- so one of the two sees the other: either this script finds a slot free and writes nothing
-- (the copy tries the lock again at once), or the ending run reads the record and wakes the
-- copy. The copy's own delayed message (the fallback) comes back about when the lease that
-- frees first would run out, for a holder that dies without a word.
--
-- KEYS[1]   the job's wait records: a hash "<job lock key>:wait", field = the waiting task
--           id, value = its record (see below), in the lock's hash tag
-- KEYS[2..] the job's lock: each of its slots (one key unless lock_limit says more)
-- ARGV[1]   the waiting task id
-- ARGV[2]   its record: the wait token (unique per wait), a newline, what the wake sends
-- ARGV[3]   how long the records live at least after this write, ms
-- ARGV[4]   "1": write the record even when a slot is free (the copy found one free and lost
--           it again too often meanwhile; it sends its own wake at once)
--
-- Returns {1, pttl} when the record was written: pttl = ms left on the lease that frees
-- first (0 when a slot is free, -1 when no slot has a lease); {0, 0} when a slot is free and
-- nothing was written. A record replaces the task id's earlier one (its previous wait, or the
-- claim of the message that is waiting again).

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
