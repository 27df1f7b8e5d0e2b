-- TRANSACT: perform an effect and record its result in one script, so no crash can fall between
-- them and the effect happens exactly once. The effect's source is spliced into effect() below; it
-- sees its own KEYS and ARGV (the ones its LuaEffect declared), and returns its result already
-- encoded by the checkpointer's codec (for JsonCodec: cjson.encode(x)).
-- KEYS[1] the workflow's records hash
-- KEYS[2] the workflow's claim hash
-- KEYS[3] the workflow's nonces (see append.lua)
-- KEYS[4..] the effect's keys (each carries the workflow's {id} tag)
-- ARGV[1] the pass's token
-- ARGV[2] the record key
-- ARGV[3] the largest encoding accepted, bytes
-- ARGV[4] TTL, milliseconds (the claim's beyond its budget; the records' once terminal)
-- ARGV[5] '1' when the codec renders JSON (the result must then parse as JSON), else '0'
-- ARGV[6] this call's nonce: a re-sent transact that finds its own record reports it as its own
-- ARGV[7..] the effect's args
-- Returns {'recorded', stored encoding} (performed nothing, or {'ok', ...} when this call's own
-- earlier run recorded it), {'fenced'}, {'failed', message}
-- (the effect's writes were undone), {'invalid', message} (likewise) or {'ok', encoding}.
--
-- Redis never rolls a script back: what it wrote before an error stays written. So the wrapper
-- snapshots every key the effect declared (DUMP and PTTL) and puts them back (RESTORE, or DEL for a
-- key that did not exist) when the effect fails or the pass turns out to have been superseded.
-- Keys an effect touches without declaring them are not restored (and a Redis Cluster refuses
-- them when they live on another node).

local function effect(KEYS, ARGV)
--[[effect]]
end

local stored = redis.call('HGET', KEYS[1], ARGV[2])
if stored then
  if redis.call('HGET', KEYS[3], ARGV[6]) then
    return {'ok', encoding_of(stored)}
  end
  return {'recorded', encoding_of(stored)}
end
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  return {'fenced'}
end

local effect_keys, effect_args = {}, {}
for i = 4, #KEYS do
  effect_keys[#effect_keys + 1] = KEYS[i]
end
for i = 7, #ARGV do
  effect_args[#effect_args + 1] = ARGV[i]
end

local snapshot = {}
for i, key in ipairs(effect_keys) do
  snapshot[i] = {redis.call('DUMP', key), redis.call('PTTL', key)}
end
local function undo()
  for i, key in ipairs(effect_keys) do
    local dump, ttl = snapshot[i][1], snapshot[i][2]
    if dump then
      if ttl < 0 then
        ttl = 0
      end
      redis.call('RESTORE', key, ttl, dump, 'REPLACE')
    else
      redis.call('DEL', key)
    end
  end
end

local ok, result = pcall(effect, effect_keys, effect_args)
if ok and type(result) == 'table' and result.err then
  ok, result = false, result.err -- the effect returned redis.error_reply(...)
end
if not ok then
  undo()
  if type(result) == 'table' then
    result = result.err or 'error'
  end
  return {'failed', tostring(result)}
end
if type(result) ~= 'string' then
  undo()
  return {'invalid', 'the effect returned a ' .. type(result) .. ', not its result encoded as a '
    .. 'string (for JsonCodec: return cjson.encode(value))'}
end
if #result > tonumber(ARGV[3]) then
  undo()
  return {'invalid', 'the effect returned ' .. #result .. ' bytes, over the store\'s limit of '
    .. ARGV[3] .. '; store large payloads elsewhere and record a reference'}
end
if ARGV[5] == '1' and not pcall(cjson.decode, result) then
  undo()
  return {'invalid', 'the effect returned text that is not JSON: ' .. string.sub(result, 1, 80)}
end

-- The fence again: nothing can interleave a script, so only the effect itself can have moved the
-- token, but if it did the pass is superseded and the effect must not survive.
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  undo()
  return {'fenced'}
end
local now = now_us()
put(KEYS[1], ARGV[2], result, now, ARGV[4])
redis.call('HSET', KEYS[3], ARGV[6], ARGV[2])
extend(KEYS[3], tonumber(ARGV[4]))
renew(KEYS[2], KEYS[1], now, ARGV[4])
return {'ok', result}
