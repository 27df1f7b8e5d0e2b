-- CLAIM: take the workflow if its last claim has lapsed, and mint a fencing token above every
-- earlier one. One script, because "is it free?" and "take it" with a gap between is two winners.
-- KEYS[1] the workflow's claim hash
-- ARGV[1] alive: the liveness window, microseconds
-- ARGV[2] budget: how long the pass may hold at most, microseconds
-- ARGV[3] TTL of the claim hash beyond its budget, milliseconds
-- ARGV[4] this call's nonce: the driver re-sends a script whose reply was lost, and the re-sent
--         claim must get its own live claim back rather than be told it is contended
-- Returns {'ok', token} or {'contended'}.
local now = now_us()
local v = redis.call('HMGET', KEYS[1], 'token', 'alive', 'nonce')
if v[2] and tonumber(v[2]) > now then
  if v[3] == ARGV[4] then
    return {'ok', v[1]}
  end
  return {'contended'}
end
local token = mint(v[1], now)
local held = now + tonumber(ARGV[2])
local alive = math.min(now + tonumber(ARGV[1]), held)
redis.call('HSET', KEYS[1], 'token', int(token), 'held', int(held), 'alive', int(alive),
  'for', ARGV[1], 'nonce', ARGV[4])
arm_claim(KEYS[1], held, now, ARGV[3])
return {'ok', int(token)}
