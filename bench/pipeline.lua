-- wrk script: POST one iris row as JSON, count statuses, print a JSON summary (bench/pipeline.py).
local report = dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_report.lua")
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
  report(threads, summary, latency)
end
