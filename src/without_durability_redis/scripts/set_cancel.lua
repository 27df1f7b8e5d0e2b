-- CANCEL (sorted set): remove a workflow's member and its take number, so the number kept for it
-- never outlives its entry (a later schedule starts a member with no take yet).
-- KEYS[1] the namespace's queue
-- KEYS[2] the namespace's take numbers
-- ARGV[1] the workflow
-- Returns 1 if there was a member, else 0.
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
