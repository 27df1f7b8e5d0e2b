-- SCHEDULE (sorted set): make a workflow visible no later than a time; the earlier time wins
-- (ZADD LT), so a wakeup never pushes an earlier one back. And the score always moves, at least a
-- microsecond earlier: a pass whose take's receipt is already in the past (a pass slower than its
-- visibility, or a server clock stepped forward) must find its receipt gone when it answers, or its
-- answer would remove the wakeup this call asked for.
-- KEYS[1] the namespace's queue (sorted set: member = workflow, score = visible-at microseconds)
-- ARGV[1] the workflow
-- ARGV[2] visible-at, microseconds, or '' for the server's now
-- Returns 1.
local at = ARGV[2]
if at == '' then
  at = int(now_us())
end
local current = redis.call('ZSCORE', KEYS[1], ARGV[1])
if current and tonumber(current) <= tonumber(at) then
  at = int(tonumber(current) - 1)
end
redis.call('ZADD', KEYS[1], 'LT', at, ARGV[1])
return 1
