-- DISCARD: forget every record and raise the fence. The claim hash stays (that is the point: a pass
-- in flight is refused at its next write), its token goes up, and its claim lapses now, so the
-- workflow is claimable at once with a token above the discarded pass's.
-- KEYS[1] the workflow's records hash
-- KEYS[2] the workflow's claim hash
-- KEYS[3] the workflow's nonces (see append.lua)
-- ARGV[1] TTL of the claim hash, milliseconds
-- Returns 1.
redis.call('DEL', KEYS[1], KEYS[3])
local v = redis.call('HMGET', KEYS[2], 'token', 'held', 'alive')
if v[1] then
  local now = now_us()
  local held = math.min(tonumber(v[2]) or now, now)
  redis.call('HSET', KEYS[2], 'token', int(mint(v[1], now)), 'held', int(held),
    'alive', int(math.min(tonumber(v[3]) or now, now)))
  arm_claim(KEYS[2], held, now, ARGV[1])
end
return 1
