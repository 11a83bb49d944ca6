-- wrk script: POST the benchmark sentences as JSON, count statuses, print a JSON summary.
-- Optional pacing: WRK_DELAY_MS (per connection) turns wrk into a paced load.
local sentences = {}
for line in io.lines(os.getenv("WRK_SENTENCES")) do sentences[#sentences + 1] = line end
local delay_ms = tonumber(os.getenv("WRK_DELAY_MS") or "0")
local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", #threads)
  threads[#threads + 1] = thread
end

function init(args)
  statuses = {}
  counter = id * 7919
  -- each request sends its own sentence; a fresh random start per thread
end

function request()
  counter = counter + 1
  local text = sentences[(counter % #sentences) + 1]
  return wrk.format("POST", "/predict", {["Content-Type"] = "application/json"},
                    '{"text": "' .. text .. '"}')
end

if delay_ms > 0 then
  function delay() return delay_ms end
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local counts = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      counts[status] = (counts[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(counts) do parts[#parts + 1] = string.format('"%d": %d', status, n) end
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_s": %.3f, "p50_ms": %.2f, "p99_ms": %.2f, ' ..
    '"socket_errors": %d, "statuses": {%s}}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    table.concat(parts, ", ")))
end
