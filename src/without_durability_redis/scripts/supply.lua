-- SUPPLY: write from outside a pass: no claim is consulted, first writer wins.
-- KEYS[1] the workflow's records hash
-- ARGV[1] the record key
-- ARGV[2] the value's encoding
-- ARGV[3] TTL of the records hash, milliseconds
-- Returns {1} (the stored encoding is the one offered) or {0, stored encoding}.
return put(KEYS[1], ARGV[1], ARGV[2], now_us(), ARGV[3])
