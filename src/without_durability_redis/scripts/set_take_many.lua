-- TAKE MANY (sorted set): set_take.lua for up to ARGV[2] workflows at once, each hidden until the
-- same now + visibility, each with its own take number (score and number: each one's receipt).
-- KEYS[1] the namespace's queue
-- KEYS[2] the namespace's take numbers
-- KEYS[3] the namespace's take counter
-- ARGV[1] visibility, microseconds
-- ARGV[2] how many at most
-- Returns {hidden score, workflow, take number, workflow, take number, ...}; just {hidden score}
-- when nothing is due.
local now = now_us()
local due = redis.call('ZRANGE', KEYS[1], '-inf', int(now), 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
local hidden = int(now + tonumber(ARGV[1]))
local out = {hidden}
for _, workflow in ipairs(due) do
  local took = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[1], hidden, workflow)
  redis.call('HSET', KEYS[2], workflow, took)
  out[#out + 1] = workflow
  out[#out + 1] = took
end
return out
