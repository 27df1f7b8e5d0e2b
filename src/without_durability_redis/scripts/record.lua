-- RECORD: write under the fence. Read the token, refuse if it is not the pass's, else renew the
-- claim (an accepted write is a sign of life) and write first-writer-wins. A refused write renews
-- nobody. One script, or a claim could land between the check and the write.
-- KEYS[1] the workflow's records hash
-- KEYS[2] the workflow's claim hash
-- ARGV[1] the pass's token
-- ARGV[2] the record key
-- ARGV[3] the value's encoding
-- ARGV[4] TTL, milliseconds (the claim's beyond its budget; the records' once terminal)
-- Returns {'fenced'}, {'ok', 1} (the stored encoding is the one offered) or
-- {'ok', 0, stored encoding}.
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  return {'fenced'}
end
local now = now_us()
local r = put(KEYS[1], ARGV[2], ARGV[3], now, ARGV[4])
renew(KEYS[2], KEYS[1], now, ARGV[4])
return {'ok', r[1], r[2]}
