-- SCHEDULE (sorted set): make a workflow visible no later than a time; the earlier time wins
-- (ZADD LT), so a wakeup never pushes an earlier one back.
-- KEYS[1] the namespace's queue (sorted set: member = workflow, score = visible-at microseconds)
-- ARGV[1] the workflow
-- ARGV[2] visible-at, microseconds, or '' for the server's now
-- Returns 1.
local at = ARGV[2]
if at == '' then
  at = int(now_us())
end
redis.call('ZADD', KEYS[1], 'LT', at, ARGV[1])
return 1
