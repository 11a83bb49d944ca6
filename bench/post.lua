-- wrk script: POST the benchmark sentences as JSON, count statuses, print a JSON summary.
-- Optional pacing: WRK_DELAY_MS (per connection) turns wrk into a paced load.
local report = dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_report.lua")
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
  report(threads, summary, latency)
end
