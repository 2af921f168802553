-- wait_mark.lua: a waiter was replaced by another: its record says so from now on, so that its
-- first wake-up ends it as replaced (naming who replaced it), and no release wakes it.
--
-- KEYS[1]  the waiter records (see wait_park.lua)
-- ARGV[1]  the replaced waiter id, ARGV[2] the id that replaced it
--
-- Returns 1 when the waiter had a record (now "~" and ARGV[2]), 0 when it had none.

if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return 0
end
redis.call('hset', KEYS[1], ARGV[1], '~' .. ARGV[2])
return 1
