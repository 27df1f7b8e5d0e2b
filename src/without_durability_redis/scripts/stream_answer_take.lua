-- ANSWER AND TAKE (stream): stream_wake.lua's answer, then a take as stream_take.lua's, in one
-- script and so one round trip. The take passes over the answered workflow: when it is ready again
-- (a sleep answer already due, or a wakeup since its take), its fresh entry is made only after the
-- take has read, so another taker gets it.
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- ARGV[1] the answered workflow
-- ARGV[2] its delivery's entry id
-- ARGV[3] its delivery's timer, microseconds
-- ARGV[4] its next visible-at, microseconds, or '' to remove
-- ARGV[5] the take's visibility, microseconds
-- ARGV[6] the consumer name (whose pending list the delivery joins)
-- ARGV[7] how many due timers to move at most
-- Returns what stream_take.lua returns.
local now = now_us()
local ready_again = false
if still_current(ARGV[1], ARGV[2], ARGV[3]) then
  drop_entry(ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  if ARGV[4] ~= '' then
    if tonumber(ARGV[4]) <= now then
      ready_again = true
    else
      redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
    end
  end
end
-- The answered workflow may be ready anyway (a wakeup since its take): the take passes over its
-- entry, which is then made afresh, as a due sleep answer's is.
local taken, skipped = take_one(now, tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), ARGV[1])
ready_again = ready_again or skipped
if taken then
  if ready_again then
    make_ready(ARGV[1])
  end
  return taken
end
-- Where to wait from is read before the answered workflow's fresh entry is added, so a reader
-- waiting after it sees that entry at once.
local idle = nothing_ready()
if ready_again then
  make_ready(ARGV[1])
end
return idle
