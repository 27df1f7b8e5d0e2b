-- SCHEDULE (stream): make a workflow visible no later than a time; the earlier time wins. A time
-- already due puts it in the stream at once (where a blocked reader sees it); a later one is a timer.
-- A workflow handed out always has its timer or entry changed, so the holder's answer finds its
-- receipt stale and leaves this wakeup standing.
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- ARGV[1] the workflow
-- ARGV[2] visible-at, microseconds, or '' for the server's now
-- Returns 1.
local now = now_us()
local at = now
if ARGV[2] ~= '' then
  at = tonumber(ARGV[2])
end
local entry = redis.call('HGET', KEYS[3], ARGV[1])
local timer = redis.call('ZSCORE', KEYS[2], ARGV[1])
if entry and not timer then
  return 1 -- ready already: nothing is earlier than that
end
if entry and timer and tonumber(timer) <= now then
  -- handed out, and the pass outlived its visibility (slow, or the server clock stepped ahead):
  -- a fresh entry, so the pass's answer, which names the old one, cannot remove this wakeup
  make_ready(ARGV[1])
  return 1
end
if entry and timer and tonumber(timer) <= at then
  -- handed out, hidden until a time no later than this one: that time stands, a microsecond
  -- earlier, so the holder's receipt (which names the timer) no longer matches and its answer
  -- cannot remove this wakeup
  redis.call('ZADD', KEYS[2], int(tonumber(timer) - 1), ARGV[1])
  return 1
end
if timer and tonumber(timer) <= at then
  return 1 -- sleeping until an earlier time, which stands
end
if at <= now then
  make_ready(ARGV[1])
else
  redis.call('ZADD', KEYS[2], int(at), ARGV[1])
end
return 1
