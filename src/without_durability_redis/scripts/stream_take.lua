-- TAKE (stream): first move every due timer into the stream (a sleeper whose time came, or a
-- delivery nobody answered within its visibility, whose old entry is dropped), then read one entry
-- for the group and hide it by setting its timer to now + visibility. One script, so a delivery is
-- never handed out without the timer that brings it back.
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- ARGV[1] visibility, microseconds
-- ARGV[2] the consumer name (whose pending list the delivery joins)
-- ARGV[3] how many due timers to move at most
-- Returns {workflow, entry id, timer} (the receipt is the id and the timer), or, when nothing is
-- ready, {'', the id to wait after, the next timer or ''} (see nothing_ready in _stream.lua).
local now = now_us()
ensure_group(KEYS[1])
local due = redis.call('ZRANGE', KEYS[2], '-inf', int(now), 'BYSCORE', 'LIMIT', 0,
  tonumber(ARGV[3]))
for _, workflow in ipairs(due) do
  make_ready(workflow)
end
while true do
  local read = redis.call('XREADGROUP', 'GROUP', GROUP, ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
  if not read then
    return nothing_ready()
  end
  local id = read[1][2][1][1]
  local workflow = read[1][2][1][2][2]
  if redis.call('HGET', KEYS[3], workflow) == id then
    local hidden = int(now + tonumber(ARGV[1]))
    redis.call('ZADD', KEYS[2], hidden, workflow)
    return {workflow, id, hidden}
  end
  -- An entry that is no longer its workflow's current one (never left behind by these scripts,
  -- but never handed out either).
  redis.call('XACK', KEYS[1], GROUP, id)
  redis.call('XDEL', KEYS[1], id)
end
