-- Prepended to every script below; defines helpers only, touches no key.
-- Units everywhere: times are integer microseconds since the Unix epoch on the server's clock
-- (TIME), durations are integer microseconds, TTLs are milliseconds. Numbers are written with
-- string.format('%d'): tostring rounds anything past 14 digits, and a microsecond clock has 16.

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(n)
  return string.format('%d', n)
end
