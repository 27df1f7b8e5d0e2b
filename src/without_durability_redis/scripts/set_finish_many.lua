-- FINISH MANY (sorted set): set_wake.lua with no next time, for each delivery given: a workflow is
-- removed only while its score is still the one its take set.
-- KEYS[1] the namespace's queue
-- ARGV pairs: workflow, its receipt (the score its take set, microseconds)
-- Returns how many were removed.
local removed = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
