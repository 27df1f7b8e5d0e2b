-- APPEND: record under a key the store names. Count the workflow's records, then write under that
-- number: the count is the new record's load position, so the key and the position are one number,
-- and scripts run one at a time, so two appends never count the same.
-- KEYS[1] the workflow's records hash
-- KEYS[2] the workflow's nonces: nonce of a call that wrote -> what it was given
-- ARGV[1] the value's encoding
-- ARGV[2] the inbox prefix ("inbox/")
-- ARGV[3] the width the number is zero-padded to
-- ARGV[4] TTL of the nonces, and of the records once terminal, milliseconds
-- ARGV[5] this call's nonce: the driver re-sends a script whose reply was lost, and the re-sent
--         append must return the key it was given rather than append the message twice
-- Returns the key.
local done = redis.call('HGET', KEYS[2], ARGV[5])
if done then
  return done
end
local position = count(KEYS[1])
local key = ARGV[2] .. string.format('%0' .. ARGV[3] .. 'd', position)
redis.call('HSET', KEYS[1], key, int(position) .. ':' .. int(stamp(KEYS[1], now_us())) .. ':' .. ARGV[1])
redis.call('HSET', KEYS[2], ARGV[5], key)
keep(KEYS[1], tonumber(ARGV[4]))  -- an open workflow's records never expire (see retain)
extend(KEYS[2], tonumber(ARGV[4]))  -- a nonce only has to outlive a re-sent script
return key
