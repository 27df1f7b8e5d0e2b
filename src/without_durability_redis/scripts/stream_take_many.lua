-- TAKE MANY (stream): stream_take.lua for up to ARGV[4] deliveries at once.
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- ARGV[1] visibility, microseconds
-- ARGV[2] the consumer name
-- ARGV[3] how many due timers to move at most
-- ARGV[4] how many deliveries at most
-- Returns {workflow, entry id, timer, workflow, entry id, timer, ...}; empty when nothing is ready.
local now = now_us()
local out = {}
for _ = 1, tonumber(ARGV[4]) do
  local taken = take_one(now, tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]))
  if not taken then
    break
  end
  for _, part in ipairs(taken) do
    out[#out + 1] = part
  end
end
return out
