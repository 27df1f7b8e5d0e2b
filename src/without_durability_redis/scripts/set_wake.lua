-- WAKE (sorted set): answer for a delivery. Only if the score is still the one the take set: a
-- removed member means it was cancelled (not reinstated), a moved score means a wakeup arrived since
-- or another take has it now (that one stands).
-- KEYS[1] the namespace's queue
-- ARGV[1] the workflow
-- ARGV[2] the receipt: the score the take set, microseconds
-- ARGV[3] the next visible-at, microseconds, or '' to remove
-- Returns 1 if answered, 0 if the delivery was no longer the current one.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
