-- wrk script for cpu_path.py: a fixed number of POSTs per thread (WRK_REQUESTS), each body
-- unique (no cache hit), then the thread stops and writes WRK_DONE to stderr (wrk itself runs
-- on to its -d; cpu_path.py sends it SIGINT once every thread is done); prints a JSON summary
-- like post.lua's. WRK_V2_MODEL=<name>: the same text as a V2 REST request (a BYTES tensor of
-- shape [1]) to /v2/models/<name>/infer (bench/framework_cost.py).
local report = dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_report.lua")
local per_thread = tonumber(os.getenv("WRK_REQUESTS") or "10000")
local path = os.getenv("WRK_PATH") or "/predict"
local v2_model = os.getenv("WRK_V2_MODEL")
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
  if v2_model then
    return wrk.format("POST", "/v2/models/" .. v2_model .. "/infer",
                      {["Content-Type"] = "application/json"},
                      string.format('{"inputs": [{"name": "text", "shape": [1], ' ..
                                    '"datatype": "BYTES", "data": ["The quarterly report, ' ..
                                    'copy %d of thread %d."]}]}', sent, id))
  end
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
  report(threads, summary, latency)
end
