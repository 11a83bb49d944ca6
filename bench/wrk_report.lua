-- The summary line every bench wrk script prints, for bench/*.py to parse:
--   WRK_JSON {"requests", "duration_s", "p50_ms", "p99_ms", "socket_errors", "statuses"}
-- statuses summed over the threads, each of which counts its own in a global
-- `statuses` table. A script loads it beside itself:
--   local report = dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_report.lua")
return function(threads, summary, latency)
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
