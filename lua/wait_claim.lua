-- wait_claim.lua: a message of a waiting queued copy (Celery's lock_at="queue") claims the
-- copy's wait, so that only one of its messages runs it.
--
-- A copy that waits has two messages that may run it: the wake a run sends when it ends, and
-- its own fallback, delayed until about when the run's lease would run out (a run's end may
-- also wake it twice: each slot of a lock_limit). Each message carries the wait token and a
-- mark of its own. The first to claim the token runs the copy; its claim stays in the record
-- until its run ends (wait_end.lua), so a redelivery of that same message (acks_late) claims
-- it again.
--
-- KEYS[1]  the job's wait records (see wait_park.lua)
-- ARGV[1]  the waiting task id
-- ARGV[2]  the wait token the message carries
-- ARGV[3]  the message's own mark
--
-- Returns {1, ""}: this message claimed the wait and runs the copy; {1, "again"}: it had
--                  claimed it before (it is delivered again) and runs the copy;
--         {0, ""}: the copy waits no more (its run ended, its wait was dropped or ran out);
--         {2, ""}: another message claimed this wait, or the copy waits again with another
--                  token;
--         {3, id}: the copy was replaced by task id (see wait_mark.lua): this message ends it
--                  as replaced, and its record goes (its other message finds {0, ""}).

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
