"""The Lua scripts behind ``queue``: each state change of a job, atomic in Redis.

Every script reads the job's hash first and acts only if the job is in the
state the change expects, so a stale consumer, a cancelled job or a repeated
call changes nothing. A job's stream entry is acked *and* deleted when it
finishes, is re-added, or turns out cancelled, so the stream holds exactly
the unfinished jobs. Values are strings; timestamps are unix seconds as
``repr(float)``; TTLs are milliseconds.
"""

from __future__ import annotations

# KEYS: stream, job hash, idempotency key, finished, owners. ARGV: job id, params,
# now, ttl_ms, max_queue, has_key ('1'/'0'), prefix, digest, owner, max_stored,
# max_per_caller, the expiry past which a finished job counts as drained lately
# (jobs.drainrate), traceparent (the submitter's span, '' untraced). Returns
# {'new', entry}, {'existing', job fields}, {'full', depth, jobs drained lately},
# {'stored', jobs held, the oldest finished job's expiry or ''} or {'quota', held}.
# ZCOUNT is O(log n), and runs only on a refusal.
SUBMIT = """
if ARGV[6] == '1' then
  local existing = redis.call('GET', KEYS[3])
  if existing then
    local job = redis.call('HGETALL', ARGV[7] .. 'job:' .. existing)
    if #job > 0 then return {'existing', job} end
  end
end
local depth = redis.call('XLEN', KEYS[1])
if depth >= tonumber(ARGV[5]) then
  return {'full', depth, redis.call('ZCOUNT', KEYS[4], '(' .. ARGV[12], '+inf')}
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[3])
local stored = depth + redis.call('ZCARD', KEYS[4])
if stored >= tonumber(ARGV[10]) then
  local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  return {'stored', stored, oldest[2] or ''}
end
local owner = ARGV[9]
if owner ~= '' and tonumber(ARGV[11]) > 0 then
  local held = tonumber(redis.call('HGET', KEYS[5], owner) or '0')
  if held >= tonumber(ARGV[11]) then return {'quota', held} end
end
local entry = redis.call('XADD', KEYS[1], '*', 'job', ARGV[1])
redis.call('HSET', KEYS[2], 'id', ARGV[1], 'status', 'queued', 'params', ARGV[2],
  'attempts', 0, 'created_at', ARGV[3], 'entry', entry, 'lease', '', 'owner', owner,
  'digest', ARGV[8], 'traceparent', ARGV[13])
if owner ~= '' then redis.call('HINCRBY', KEYS[5], owner, 1) end
if ARGV[6] == '1' then redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[4]) end
return {'new', entry}
"""

# Every script that finishes a job calls this after setting its status: the job
# drops its parameters, is counted among the stored jobs until it expires
# (``finished``, scored by its expiry) and no longer among its owner's unfinished
# ones (``owners``, a hash of counts).
FINISH = """
local function finished(key, finished_key, owners_key, now, ttl_ms)
  local job = redis.call('HMGET', key, 'id', 'owner')
  redis.call('HDEL', key, 'params')
  redis.call('PEXPIRE', key, ttl_ms)
  redis.call('ZADD', finished_key, tonumber(now) + tonumber(ttl_ms) / 1000, job[1])
  if job[2] and job[2] ~= '' and redis.call('HINCRBY', owners_key, job[2], -1) <= 0 then
    redis.call('HDEL', owners_key, job[2])
  end
end
"""

# Shared by the two take scripts. KEYS: stream, dead. ARGV: group, prefix, now,
# max_attempts, ttl_ms, lease, lease_expired error, then the script's own. Each
# returns {the marked jobs' fields, the ids whose record was missing}.
MARK_PRELUDE = (
    FINISH
    + """
local stream, dead = KEYS[1], KEYS[2]
local group, prefix, now = ARGV[1], ARGV[2], ARGV[3]
local max_attempts, ttl_ms, lease = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local function drop(entry)
  redis.call('XACK', stream, group, entry)
  redis.call('XDEL', stream, entry)
end
local missing = {}
local function mark(entry, id, out)
  local key = prefix .. 'job:' .. id
  local state = redis.call('HMGET', key, 'status', 'attempts', 'entry')
  if not state[1] then
    drop(entry)  -- no record: evicted or deleted, since a finished job's entry goes first
    missing[#missing + 1] = id
    return
  end
  if (state[1] ~= 'queued' and state[1] ~= 'running') or state[3] ~= entry then
    drop(entry)  -- cancelled, finished or expired while its entry waited
    return
  end
  local attempts = tonumber(state[2])
  if state[1] == 'running' and attempts >= max_attempts then
    drop(entry)  -- its last lease expired: a dead letter, not another try
    redis.call('HSET', key, 'status', 'failed', 'error', ARGV[7], 'finished_at', now, 'lease', '')
    finished(key, prefix .. 'finished', prefix .. 'owners', now, ttl_ms)
    redis.call('ZADD', dead, now, id)
    return
  end
  redis.call('HSET', key, 'status', 'running', 'attempts', attempts + 1,
    'started_at', now, 'lease', lease)
  out[#out + 1] = redis.call('HGETALL', key)
end
local out = {}
"""
)

# ARGV[8..]: consumer, lease_ms, count.
RECLAIM = (
    MARK_PRELUDE
    + """
local reply = redis.call('XAUTOCLAIM', stream, group, ARGV[8], ARGV[9], '0-0', 'COUNT', ARGV[10])
for _, e in ipairs(reply[2]) do
  if type(e) == 'table' and e[2] then mark(e[1], e[2][2], out)
  elseif type(e) == 'table' then redis.call('XACK', stream, group, e[1]) end
end
return {out, missing}
"""
)

# ARGV[8..]: entry id, job id, entry id, job id, ...
MARK = (
    MARK_PRELUDE
    + """
for i = 8, #ARGV, 2 do mark(ARGV[i], ARGV[i + 1], out) end
return {out, missing}
"""
)

# KEYS: stream, job hash, finished, owners. ARGV: group, result, now, ttl_ms. Any
# unfinished job takes the result (a late consumer's result is as good); a finished
# one keeps its first.
COMPLETE = (
    FINISH
    + """
local state = redis.call('HMGET', KEYS[2], 'status', 'entry')
if state[1] ~= 'queued' and state[1] ~= 'running' then return 0 end
redis.call('XACK', KEYS[1], ARGV[1], state[2])
redis.call('XDEL', KEYS[1], state[2])
redis.call('HSET', KEYS[2], 'status', 'done', 'result', ARGV[2], 'finished_at', ARGV[3],
  'lease', '')
finished(KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[4])
return 1
"""
)

# KEYS: stream, job hash, dead, finished, owners. ARGV: group, lease, error, now,
# ttl_ms, max_attempts, job id, retry ('1'/'0'), the dead set's expiry cut-off. Only
# the current lease.
FAIL = (
    FINISH
    + """
local state = redis.call('HMGET', KEYS[2], 'status', 'lease', 'attempts', 'entry')
if state[1] ~= 'running' or state[2] ~= ARGV[2] then return 0 end
redis.call('XACK', KEYS[1], ARGV[1], state[4])
redis.call('XDEL', KEYS[1], state[4])
if ARGV[8] == '0' or tonumber(state[3]) >= tonumber(ARGV[6]) then
  redis.call('HSET', KEYS[2], 'status', 'failed', 'error', ARGV[3], 'finished_at', ARGV[4],
    'lease', '')
  finished(KEYS[2], KEYS[4], KEYS[5], ARGV[4], ARGV[5])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[7])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[9])
  return 2
end
local entry = redis.call('XADD', KEYS[1], '*', 'job', ARGV[7])
redis.call('HSET', KEYS[2], 'status', 'queued', 'error', ARGV[3], 'entry', entry,
  'started_at', '', 'lease', '')
return 1
"""
)

# KEYS: stream. ARGV: group, prefix, then job id, lease, ... Gives back the attempt.
RELEASE = """
for i = 3, #ARGV, 2 do
  local key = ARGV[2] .. 'job:' .. ARGV[i]
  local state = redis.call('HMGET', key, 'status', 'lease', 'attempts', 'entry')
  if state[1] == 'running' and state[2] == ARGV[i + 1] then
    redis.call('XACK', KEYS[1], ARGV[1], state[4])
    redis.call('XDEL', KEYS[1], state[4])
    local entry = redis.call('XADD', KEYS[1], '*', 'job', ARGV[i])
    redis.call('HSET', key, 'status', 'queued', 'attempts', tonumber(state[3]) - 1,
      'entry', entry, 'started_at', '', 'lease', '')
  end
end
return 0
"""

# KEYS: stream. ARGV: group, prefix, consumer, then job id, lease, ... XCLAIM with
# min-idle 0 by the same consumer resets the entry's idle time: the lease starts
# over. Only jobs still running under that lease. Returns how many were renewed.
RENEW = """
local renewed = 0
for i = 4, #ARGV, 2 do
  local state = redis.call('HMGET', ARGV[2] .. 'job:' .. ARGV[i], 'status', 'lease', 'entry')
  if state[1] == 'running' and state[2] == ARGV[i + 1] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, state[3], 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
"""

# KEYS: stream, job hash, finished, owners. ARGV: group, now, ttl_ms. Returns the
# job's fields after.
CANCEL = (
    FINISH
    + """
local state = redis.call('HMGET', KEYS[2], 'status', 'entry')
if state[1] == 'queued' then
  redis.call('XACK', KEYS[1], ARGV[1], state[2])
  redis.call('XDEL', KEYS[1], state[2])
  redis.call('HSET', KEYS[2], 'status', 'cancelled', 'finished_at', ARGV[2])
  finished(KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3])
end
return redis.call('HGETALL', KEYS[2])
"""
)
