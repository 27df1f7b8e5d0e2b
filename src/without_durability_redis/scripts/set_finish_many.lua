-- FINISH MANY (sorted set): set_wake.lua with no next time, for each delivery given: a workflow is
-- removed only while its receipt (score and take number) is still current.
-- KEYS[1] the namespace's queue
-- KEYS[2] the namespace's take numbers
-- ARGV triples: workflow, its receipt's score (microseconds), its receipt's take number
-- Returns how many were removed.
local removed = 0
for i = 1, #ARGV, 3 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) and redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 2] then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    removed = removed + 1
  end
end
return removed
