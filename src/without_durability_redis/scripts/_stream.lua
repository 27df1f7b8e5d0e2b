-- Prepended to the stream scheduler's scripts after _common.lua; defines helpers only.
--
-- KEYS[1] the stream of ready workflows (one field: w = the workflow), read by the consumer group
--         'wd'; its pending list holds the deliveries handed out and not yet answered
-- KEYS[2] the timer set: member = workflow, score = when it becomes visible, microseconds. It holds
--         sleeping workflows and, for each delivery handed out, when it reappears if unanswered
-- KEYS[3] the entry hash: workflow -> id of its one current stream entry
-- A workflow has at most one entry. Entry and no timer: ready, waiting to be read. Entry and timer:
-- handed out, hidden until the timer. Timer and no entry: sleeping.
local GROUP = 'wd'

local function ensure_group(stream)
  if redis.call('EXISTS', stream) == 0 then
    redis.call('XGROUP', 'CREATE', stream, GROUP, '0', 'MKSTREAM')
  end
end

-- Drop a workflow's current entry: acknowledged (out of the pending list) and deleted, so whoever
-- holds a delivery of it can ask and find it gone.
local function drop_entry(workflow)
  local id = redis.call('HGET', KEYS[3], workflow)
  if id then
    redis.call('XACK', KEYS[1], GROUP, id)
    redis.call('XDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[3], workflow)
  end
end

-- Where a reader that found nothing should wait from: {'', the newest entry's id (every entry there
-- now is already handed out, so anything after it is new work), the next timer or ''}.
local function nothing_ready()
  local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  local next_timer = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {'', newest[1] and newest[1][1] or '0-0', next_timer[2] or ''}
end

-- Make a workflow ready now: its timer goes, any older entry goes, a fresh entry joins the stream.
local function make_ready(workflow)
  ensure_group(KEYS[1])
  redis.call('ZREM', KEYS[2], workflow)
  drop_entry(workflow)
  local id = redis.call('XADD', KEYS[1], '*', 'w', workflow)
  redis.call('HSET', KEYS[3], workflow, id)
end
