-- wrk script for cpu_path.py: a fixed number of POSTs per thread (WRK_REQUESTS), each body
-- unique (no cache hit), then the thread stops and writes WRK_DONE to stderr (wrk itself runs
-- on to its -d; cpu_path.py sends it SIGINT once every thread is done); prints a JSON summary
-- like post.lua's.
local per_thread = tonumber(os.getenv("WRK_REQUESTS") or "10000")
local path = os.getenv("WRK_PATH") or "/predict"
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  threads[#threads + 1] = thread
end

function init(args)
  statuses = {}
  sent = 0
  answered = 0
end

function request()
  sent = sent + 1
  return wrk.format("POST", path, {["Content-Type"] = "application/json"},
                    string.format('{"text": "The quarterly report, copy %d of thread %d."}',
                                  sent, id))
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  answered = answered + 1
  if answered == per_thread then
    wrk.thread:stop()
    io.stderr:write("WRK_DONE\n")
    io.stderr:flush()
  end
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
