-- RENEW: a sign of life from the holder; liveness becomes min(now + window, budget).
-- KEYS[1] the workflow's claim hash
-- KEYS[2] the workflow's records hash (its TTL is re-armed with the claim's)
-- ARGV[1] the pass's token (compared as text, exactly as minted)
-- ARGV[2] TTL of the claim hash beyond its budget, milliseconds
-- Returns {'ok'} or {'fenced'} (a newer token exists, or the claim is gone).
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return {'fenced'}
end
renew(KEYS[1], KEYS[2], now_us(), ARGV[2])
return {'ok'}
