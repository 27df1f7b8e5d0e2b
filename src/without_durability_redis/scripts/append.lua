-- APPEND: record under a key the store names. Count the workflow's records, then write under that
-- number: the count is the new record's load position, so the key and the position are one number,
-- and scripts run one at a time, so two appends never count the same.
-- KEYS[1] the workflow's records hash
-- ARGV[1] the value's encoding
-- ARGV[2] the inbox prefix ("inbox/")
-- ARGV[3] the width the number is zero-padded to
-- ARGV[4] TTL of the records hash, milliseconds
-- Returns the key.
local position = redis.call('HLEN', KEYS[1])
local key = ARGV[2] .. string.format('%0' .. ARGV[3] .. 'd', position)
redis.call('HSET', KEYS[1], key, int(position) .. ':' .. int(now_us()) .. ':' .. ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return key
