-- wait_claim.lua: one of a waiter's wake-ups claims its wait, so that only one of them goes on.
--
-- A waiter has two wake-ups: the one a release sends, and its own fallback (a release of a
-- lock of several permits may send more). Each carries the wait token and a mark of its own;
-- the first to claim the token goes on, and its claim stays in the record until the waiter's
-- hold ends (wait_end.lua), so that the same wake-up delivered again claims it again.
--
-- KEYS[1]  the waiter records (see wait_park.lua)
-- ARGV[1]  the waiter id, ARGV[2] the wait token the wake-up carries, ARGV[3] its mark
--
-- Returns {1, ""}: claimed, go on; {1, "again"}: this wake-up had claimed it (delivered again);
--         {0, ""}: the waiter waits no more (its wait ended, was dropped or ran out);
--         {2, ""}: another wake-up claimed it, or the waiter waits again with another token;
--         {3, id}: the waiter was replaced by id (wait_mark.lua): its record goes, and its
--                  other wake-up finds {0, ""}.

local record = redis.call('hget', KEYS[1], ARGV[1])
if not record then
    return {0, ''}
end
if string.sub(record, 1, 1) == '~' then
    redis.call('hdel', KEYS[1], ARGV[1])
    return {3, string.sub(record, 2)}
end
local token = string.match(record, '^[^\n]*')
local claim = '!' .. ARGV[2] .. ' ' .. ARGV[3]
if token == ARGV[2] then
    redis.call('hset', KEYS[1], ARGV[1], claim)
    return {1, ''}
end
if token == claim then
    return {1, 'again'}
end
return {2, ''}
