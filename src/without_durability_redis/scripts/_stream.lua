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

-- Whether a delivery is still its workflow's current one: its entry is the workflow's entry and its
-- timer the one its take set (a cancel, a wakeup or a redelivery since changes one of them).
local function still_current(workflow, entry, timer)
  if redis.call('HGET', KEYS[3], workflow) ~= entry then
    return false
  end
  local score = redis.call('ZSCORE', KEYS[2], workflow)
  return score ~= false and tonumber(score) == tonumber(timer)
end

-- stream_take.lua's take for the scripts that take along with something else: move up to `batch`
-- due timers into the stream, read one entry for `consumer` and hide it until now + visibility.
-- An entry of workflow `skip` (nil: none) is passed over: dropped, so the caller re-adds it.
-- Returns {workflow, entry id, timer} or nil when nothing is ready, and whether `skip` was dropped.
local function take_one(now, visibility, consumer, batch, skip)
  ensure_group(KEYS[1])
  local due = redis.call('ZRANGE', KEYS[2], '-inf', int(now), 'BYSCORE', 'LIMIT', 0, batch)
  for _, workflow in ipairs(due) do
    make_ready(workflow)
  end
  local skipped = false
  while true do
    local read = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', 1, 'STREAMS', KEYS[1], '>')
    if not read then
      return nil, skipped
    end
    local id = read[1][2][1][1]
    local workflow = read[1][2][1][2][2]
    local current = redis.call('HGET', KEYS[3], workflow) == id
    if current and workflow == skip then
      drop_entry(workflow)
      skipped = true
    elseif current then
      local hidden = int(now + visibility)
      redis.call('ZADD', KEYS[2], hidden, workflow)
      return {workflow, id, hidden}, skipped
    else
      redis.call('XACK', KEYS[1], GROUP, id)
      redis.call('XDEL', KEYS[1], id)
    end
  end
end
