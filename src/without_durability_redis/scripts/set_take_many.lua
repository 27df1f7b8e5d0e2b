-- TAKE MANY (sorted set): set_take.lua for up to ARGV[2] workflows at once, each hidden until the
-- same now + visibility (each one's receipt).
-- KEYS[1] the namespace's queue
-- ARGV[1] visibility, microseconds
-- ARGV[2] how many at most
-- Returns {hidden score, workflow, workflow, ...}; just {hidden score} when nothing is due.
local now = now_us()
local due = redis.call('ZRANGE', KEYS[1], '-inf', int(now), 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
local hidden = int(now + tonumber(ARGV[1]))
local out = {hidden}
for _, workflow in ipairs(due) do
  redis.call('ZADD', KEYS[1], hidden, workflow)
  out[#out + 1] = workflow
end
return out
