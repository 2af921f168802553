-- wait_end.lua: a hold of the lock ended (released just before): the records of the waiters to
-- wake, and the end of one waiter's own wait (the hold that ended was that waiter's).
--
-- KEYS[1]  the waiter records (see wait_park.lua)
-- ARGV[1]  a waiter id whose record goes ("" for none)
-- ARGV[2]  its wait token: the record goes while its first line is this token or ARGV[3]; a
--          newer wait of the same id stays
-- ARGV[3]  that wait's claim ("!token mark"; "" for none)
-- ARGV[4]  "1": return the waiting records
--
-- Returns {waiter id, record, ...} of the waiters not claimed nor replaced when ARGV[4] is "1",
-- else {}.

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
