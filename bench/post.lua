-- wrk script: POST the benchmark sentences as JSON, count statuses, print a JSON summary.
-- Optional pacing: WRK_DELAY_MS (per connection) turns wrk into a paced load.
-- WRK_V2_MODEL=<name>: the same sentence as a V2 REST request (a BYTES tensor of
-- shape [1]) to /v2/models/<name>/infer instead of /predict (bench/protocols.py).
local report = dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_report.lua")
local sentences = {}
for line in io.lines(os.getenv("WRK_SENTENCES")) do sentences[#sentences + 1] = line end
local delay_ms = tonumber(os.getenv("WRK_DELAY_MS") or "0")
local v2_model = os.getenv("WRK_V2_MODEL")
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
  if v2_model then
    return wrk.format("POST", "/v2/models/" .. v2_model .. "/infer",
                      {["Content-Type"] = "application/json"},
                      '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", ' ..
                      '"data": ["' .. text .. '"]}]}')
  end
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
