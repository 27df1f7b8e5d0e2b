-- CLAIM: take the workflow if its last claim has lapsed, and mint a fencing token above every
-- earlier one. One script, because "is it free?" and "take it" with a gap between is two winners.
-- KEYS[1] the workflow's claim hash
-- ARGV[1] alive: the liveness window, microseconds
-- ARGV[2] budget: how long the pass may hold at most, microseconds
-- ARGV[3] TTL of the claim hash beyond its budget, milliseconds
-- Returns {'ok', token} or {'contended'}.
local now = now_us()
local v = redis.call('HMGET', KEYS[1], 'token', 'alive')
if v[2] and tonumber(v[2]) > now then
  return {'contended'}
end
local token = mint(v[1], now)
local held = now + tonumber(ARGV[2])
local alive = math.min(now + tonumber(ARGV[1]), held)
redis.call('HSET', KEYS[1], 'token', int(token), 'held', int(held), 'alive', int(alive),
  'for', ARGV[1])
arm_claim(KEYS[1], held, now, ARGV[3])
return {'ok', int(token)}
