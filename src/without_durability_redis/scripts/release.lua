-- RELEASE: bring the pass's budget, and so its liveness, down to now, so the workflow is claimable
-- at once and no later renew can lift it again. A superseded pass releases nothing.
-- KEYS[1] the workflow's claim hash
-- ARGV[1] the pass's token
-- ARGV[2] TTL of the claim hash, milliseconds
-- Returns 1 if released, 0 if the pass was not the holder.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
local now = now_us()
local v = redis.call('HMGET', KEYS[1], 'held', 'alive')
local held = math.min(tonumber(v[1]), now)
redis.call('HSET', KEYS[1], 'held', int(held), 'alive', int(math.min(tonumber(v[2]), now)))
arm_claim(KEYS[1], held, now, ARGV[2])
return 1
