-- wait_mark.lua: a waiting queued copy (Celery's lock_at="queue") was replaced by a later call
-- (lock_debounce): its record says so from now on, so that the first of its messages to
-- start ends it as replaced, naming the call that replaced it, and no run's end wakes it.
--
-- KEYS[1]  the job's wait records (see wait_park.lua)
-- ARGV[1]  the replaced task id
-- ARGV[2]  the task id that replaced it
--
-- Returns 1 when the copy had a record (now "~" followed by ARGV[2]), 0 when it had none (it
-- has not waited yet: its message finds its queued lock taken, as any replaced one does).

if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return 0
end
redis.call('hset', KEYS[1], ARGV[1], '~' .. ARGV[2])
return 1
