-- wrk script: POST one iris row as JSON, count statuses, print a JSON summary (bench/pipeline.py).
local body = '{"sepal_length": 6.1, "sepal_width": 2.8, "petal_length": 4.7, "petal_width": 1.2}'
local threads = {}

function setup(thread)
  threads[#threads + 1] = thread
end

function init(args)
  statuses = {}
end

function request()
  return wrk.format("POST", "/predict", {["Content-Type"] = "application/json"}, body)
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
    '"statuses": {%s}}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, table.concat(parts, ", ")))
end
