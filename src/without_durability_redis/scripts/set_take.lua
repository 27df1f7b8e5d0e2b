-- TAKE (sorted set): hand out the earliest visible workflow and hide it for the visibility window by
-- moving its score to now + visibility. One script, so two takers never both see it visible.
-- KEYS[1] the namespace's queue
-- ARGV[1] visibility, microseconds
-- Returns {workflow, new score} (the score is the delivery's receipt), or nil when nothing is due.
local now = now_us()
local due = redis.call('ZRANGE', KEYS[1], '-inf', int(now), 'BYSCORE', 'LIMIT', 0, 1)
if #due == 0 then
  return false
end
local hidden = int(now + tonumber(ARGV[1]))
redis.call('ZADD', KEYS[1], hidden, due[1])
return {due[1], hidden}
