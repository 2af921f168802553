-- wait_end.lua: a run of a job ended (its lock, or a slot of it, was released just before):
-- the records of the queued copies that wait for it (Celery's lock_at="queue"), to wake
-- them; and the end of one copy's own wait, if this run was that copy.
--
-- KEYS[1]  the job's wait records (see wait_park.lua)
-- ARGV[1]  a task id whose record goes ("" for none): the run's own claim, or the wait of a
--          copy that was revoked
-- ARGV[2]  that record's wait token: the record goes while its first line is this token
--          (the copy still waits with it) or ARGV[3]; any other record of the task id (a
--          newer wait) stays
-- ARGV[3]  the claim of that wait ("!token mark"; "" for none)
-- ARGV[4]  "1": return the waiting records
--
-- Returns {task id, record, ...} of the copies that wait (claimed and replaced ones are left
-- out) when ARGV[4] is "1", else {}.

local records = KEYS[1]
if ARGV[1] ~= '' then
    local record = redis.call('hget', records, ARGV[1])
    if record then
        local first = string.match(record, '^[^\n]*')
        if first == ARGV[2] or (ARGV[3] ~= '' and first == ARGV[3]) then
            redis.call('hdel', records, ARGV[1])
        end
    end
end
if ARGV[4] ~= '1' then
    return {}
end
local waiting = {}
local all = redis.call('hgetall', records)
for i = 1, #all, 2 do
    local first = string.sub(all[i + 1], 1, 1)
    if first ~= '!' and first ~= '~' then
        waiting[#waiting + 1] = all[i]
        waiting[#waiting + 1] = all[i + 1]
    end
end
return waiting
