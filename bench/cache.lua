-- wrk script for bench/cache.py: POST sentences to /predict, count statuses and X-Cache.
-- WRK_MODE=hits: only the hot sentences (every request a repeat).
-- WRK_MODE=half: every other request a hot sentence, the rest never seen before.
local sentences = {}
for line in io.lines(os.getenv("WRK_SENTENCES")) do sentences[#sentences + 1] = line end
local mode = os.getenv("WRK_MODE") or "half"
local run = os.getenv("WRK_RUN") or "0"
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  threads[#threads + 1] = thread
end

function init(args)
  statuses = {}
  caches = {}
  counter = 0
end

function request()
  counter = counter + 1
  local n = counter
  if mode == "half" then n = math.floor(counter / 2) end
  local text = sentences[(n % #sentences) + 1]
  if mode == "half" and counter % 2 == 0 then
    -- unique: the run, this thread and its counter, so nothing ever repeats it
    text = string.format("%s (%s.%d.%d)", text, run, id, counter)
  end
  return wrk.format("POST", "/predict", {["Content-Type"] = "application/json"},
                    '{"text": "' .. text .. '"}')
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  local cache = headers["X-Cache"] or headers["x-cache"] or "none"
  caches[cache] = (caches[cache] or 0) + 1
end

local function merged(name, quote)
  local counts = {}
  for _, thread in ipairs(threads) do
    for key, n in pairs(thread:get(name)) do counts[key] = (counts[key] or 0) + n end
  end
  local parts = {}
  for key, n in pairs(counts) do parts[#parts + 1] = string.format('"%s": %d', key, n) end
  return table.concat(parts, ", ")
end

function done(summary, latency, requests)
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_s": %.3f, "p50_ms": %.3f, "p99_ms": %.3f, ' ..
    '"socket_errors": %d, "statuses": {%s}, "x_cache": {%s}}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    merged("statuses"), merged("caches")))
end
