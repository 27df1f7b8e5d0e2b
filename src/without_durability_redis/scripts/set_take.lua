-- TAKE (sorted set): hand out the earliest visible workflow and hide it for the visibility window by
-- moving its score to now + visibility. One script, so two takers never both see it visible.
-- The take is numbered (KEYS[3] counts every take of the namespace) and the number kept per
-- workflow (KEYS[2]): the receipt is the score and the number. The score alone can repeat (a take
-- for 3u, a wakeup at u, a take for 2u both hide the member until the same microsecond), so a
-- superseded holder's answer would act on the newer take's delivery; the number cannot repeat.
-- KEYS[1] the namespace's queue
-- KEYS[2] the namespace's take numbers (hash: workflow -> number of the take that last hid it)
-- KEYS[3] the namespace's take counter
-- ARGV[1] visibility, microseconds
-- Returns {workflow, new score, take number} (the delivery's receipt), or nil when nothing is due.
local now = now_us()
local due = redis.call('ZRANGE', KEYS[1], '-inf', int(now), 'BYSCORE', 'LIMIT', 0, 1)
if #due == 0 then
  return false
end
local hidden = int(now + tonumber(ARGV[1]))
local took = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[1], hidden, due[1])
redis.call('HSET', KEYS[2], due[1], took)
return {due[1], hidden, took}
