-- WAKE (stream): answer for a delivery. Asks whether its entry is still the workflow's current one
-- and its timer still the one the take set: a cancel dropped the entry (not reinstated), a wakeup
-- or a redelivery replaced it or moved the timer (that one stands).
-- KEYS[1..3] stream, timer set, entry hash (see _stream.lua)
-- ARGV[1] the workflow
-- ARGV[2] the delivery's entry id
-- ARGV[3] the delivery's timer, microseconds
-- ARGV[4] the next visible-at, microseconds, or '' to remove
-- Returns 1 if answered, 0 if the delivery was no longer the current one.
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return 0
end
local timer = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not timer or tonumber(timer) ~= tonumber(ARGV[3]) then
  return 0
end
drop_entry(ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[4] ~= '' then
  if tonumber(ARGV[4]) <= now_us() then
    make_ready(ARGV[1])
  else
    redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
  end
end
return 1
