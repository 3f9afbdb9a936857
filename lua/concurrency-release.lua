-- tollgate concurrency slots: gives slots back (lib/core/concurrency.ts).
-- ZREM of a member that is gone (released before, or its lease ended) does
-- nothing, so a release is safe to send twice.
--
-- KEYS[1]   a slot set, `<bucket key>!slots`
-- ARGV[1..] the ids of the slots to give back
--
-- Returns the number of slots given back. No TIME: nothing here depends on
-- the clock.

return redis.call('ZREM', KEYS[1], unpack(ARGV))
