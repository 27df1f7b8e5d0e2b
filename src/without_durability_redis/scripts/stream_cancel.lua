-- CANCEL (stream): remove a workflow: its entry (ready or handed out) and its timer.
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- ARGV[1] the workflow
-- Returns 1.
drop_entry(ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
