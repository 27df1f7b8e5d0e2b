-- Prepended to the checkpointer's scripts after _common.lua; defines helpers only.
--
-- The claim hash: token (the fencing token), held (the budget's deadline), alive (the liveness
-- deadline, never past held) and for (the liveness window a renewal grants), all microseconds.
--
-- The records hash: field = record key, value = "<position>:<written_at>:<encoding>". The position
-- rides in the value because a hash keeps insertion order only while it is a listpack; once it
-- converts to a hashtable HGETALL comes back in any order. Keeping it in the one key means nothing
-- else has to expire in step with it. The position is HLEN at insertion: nothing removes a single
-- field, so it only grows, and an append names its key from the same number.

-- The next fencing token: a hybrid logical clock. At least the server's clock in milliseconds, so a
-- claim hash that expired and was re-created still mints above every token issued before it; and at
-- least one past the last token, so two claims in one millisecond (or a clock stepping back) still
-- increase. Milliseconds keep a token within 13 digits, exact in any double and in cjson's output.
-- Claims faster than one a millisecond run the tokens ahead of the clock; arm_claim therefore keeps
-- the hash until the clock has passed its token, so a re-created hash never mints one handed out.
local function mint(previous, now)
  local clock = math.floor(now / 1000)
  local last = tonumber(previous)
  if last ~= nil and last >= clock then
    return last + 1
  end
  return clock
end

-- Re-arm a TTL: the key lives at least ms more from now. Never shortens one (a pass's long budget
-- may have armed it further out than a later supply would).
local function extend(key, ms)
  local left = redis.call('PTTL', key)
  if left ~= -2 and left < ms then
    redis.call('PEXPIRE', key, int(ms))
  end
end

-- Extend a TTL already running (a terminal workflow's retention runs from its last write), never
-- start one: a workflow that is not finished or failed keeps its records however long it waits.
local function keep(key, ms)
  local left = redis.call('PTTL', key)
  if left >= 0 and left < ms then
    redis.call('PEXPIRE', key, int(ms))
  end
end

-- The records expire only once the workflow is terminal (without_durability.lifecycle): a
-- finished or failed record starts the retention TTL, a rearm takes it away, any other write only
-- extends one already running. So no waiting workflow is restarted because its records expired.
local function retain(records, key, ms)
  if key == 'wd/finished' or string.sub(key, 1, 10) == 'wd/failed/' then
    extend(records, ms)
  elseif string.sub(key, 1, 11) == 'wd/rearmed/' then
    redis.call('PERSIST', records)
  else
    keep(records, ms)
  end
end

-- Re-arm the claim's TTL to the budget still to run plus the TTL, so a live claim never expires
-- and is re-created under a pass that still holds it; and to at least one millisecond past the
-- moment the server's clock reaches the hash's token (see mint), so the hash outlives every token
-- it minted ahead of the clock. Returns the span, in milliseconds.
local function arm_claim(claim, held, now, ttl_ms)
  local left_ms = math.ceil((held - now) / 1000)
  if left_ms < 0 then
    left_ms = 0
  end
  local ms = tonumber(ttl_ms) + left_ms
  local ahead_ms = (tonumber(redis.call('HGET', claim, 'token')) or 0) - math.floor(now / 1000) + 1
  if ahead_ms > ms then
    ms = ahead_ms
  end
  extend(claim, ms)
  return ms
end

-- A sign of life from the holder: liveness becomes min(now + window, budget). A terminal
-- workflow's records are kept at least as long as the claim (an open one's never expire), so a
-- pass never outlives the records it resumed from.
local function renew(claim, records, now, ttl_ms)
  local v = redis.call('HMGET', claim, 'held', 'for')
  local held = tonumber(v[1])
  local alive = math.min(now + tonumber(v[2]), held)
  redis.call('HSET', claim, 'alive', int(alive))
  keep(records, arm_claim(claim, held, now, ttl_ms))
end

local function encoding_of(stored)
  local first = string.find(stored, ':', 1, true)
  local second = string.find(stored, ':', first + 1, true)
  return string.sub(stored, second + 1)
end

-- The records hash's one field that is not a record: '' (a record key is never empty) holds the
-- latest written_at. A server clock stepped back (NTP, an operator, a resumed VM) would otherwise
-- stamp a record before the one loaded ahead of it; never before the latest, as the SQLite and
-- Postgres stores stamp. Positions count records only.
local LATEST = ''

local function count(records)
  return redis.call('HLEN', records) - redis.call('HEXISTS', records, LATEST)
end

local function stamp(records, now)
  local latest = tonumber(redis.call('HGET', records, LATEST))
  if latest ~= nil and latest > now then
    now = latest
  end
  redis.call('HSET', records, LATEST, int(now))
  return now
end

-- First writer wins. Returns {1} when the stored encoding is the one offered (this write, or an
-- identical earlier one), else {0, the stored encoding}. A losing write moves neither the position
-- nor the time.
local function put(records, key, encoded, now, ttl_ms)
  local stored = redis.call('HGET', records, key)
  if not stored then
    local position = count(records)
    redis.call('HSET', records, key, int(position) .. ':' .. int(stamp(records, now)) .. ':' .. encoded)
  end
  retain(records, key, tonumber(ttl_ms))
  if not stored then
    return {1}
  end
  local held = encoding_of(stored)
  if held == encoded then
    return {1}
  end
  return {0, held}
end
