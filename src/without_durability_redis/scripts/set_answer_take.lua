-- ANSWER AND TAKE (sorted set): set_wake.lua's answer, then set_take.lua's take, in one script and
-- so one round trip; the take passes over the answered workflow (a sleep answer that is already due
-- is left for the next take, never handed back to the worker that just answered it).
-- KEYS[1] the namespace's queue
-- KEYS[2] the namespace's take numbers
-- KEYS[3] the namespace's take counter
-- ARGV[1] the answered workflow
-- ARGV[2] its receipt's score: the one its take set, microseconds
-- ARGV[3] its receipt's take number
-- ARGV[4] its next visible-at, microseconds, or '' to remove
-- ARGV[5] the visibility of the take, microseconds
-- Returns {workflow, new score, take number} as set_take does, or nil when nothing else is due.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) and redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[3] then
  if ARGV[4] == '' then
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('HDEL', KEYS[2], ARGV[1])
  else
    redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
  end
end
local now = now_us()
-- Two candidates: the answered workflow may be the earliest visible one, and is skipped.
local due = redis.call('ZRANGE', KEYS[1], '-inf', int(now), 'BYSCORE', 'LIMIT', 0, 2)
local pick = due[1]
if pick == ARGV[1] then
  pick = due[2]
end
if not pick then
  return false
end
local hidden = int(now + tonumber(ARGV[5]))
local took = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[1], hidden, pick)
redis.call('HSET', KEYS[2], pick, took)
return {pick, hidden, took}
