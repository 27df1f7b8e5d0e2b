-- FINISH MANY (stream): stream_wake.lua with no next time, for each delivery given: a workflow is
-- removed only while the delivery is still its current one.
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- ARGV triples: workflow, its delivery's entry id, its delivery's timer (microseconds)
-- Returns how many were removed.
local removed = 0
for i = 1, #ARGV, 3 do
  if still_current(ARGV[i], ARGV[i + 1], ARGV[i + 2]) then
    drop_entry(ARGV[i])
    redis.call('ZREM', KEYS[2], ARGV[i])
    removed = removed + 1
  end
end
return removed
