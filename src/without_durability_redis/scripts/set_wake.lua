-- WAKE (sorted set): answer for a delivery. Only while its receipt is current: the score is the one
-- its take set and the take number is its take's. A removed member means it was cancelled (not
-- reinstated), a moved score means a wakeup arrived since (that one stands), another number means
-- a later take has it now (this answer is stale).
-- KEYS[1] the namespace's queue
-- KEYS[2] the namespace's take numbers
-- ARGV[1] the workflow
-- ARGV[2] the receipt's score: the one the take set, microseconds
-- ARGV[3] the receipt's take number
-- ARGV[4] the next visible-at, microseconds, or '' to remove
-- Returns 1 if answered, 0 if the delivery was no longer the current one.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) or redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[3] then
  return 0
end
if ARGV[4] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
end
return 1
