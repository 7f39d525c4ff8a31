-- wrk script: POST a KServe v2 JSON inference request for the add_sub model.
-- Usage: wrk -t1 -c8 -d10s -s wrk_infer.lua http://127.0.0.1:8000/v2/models/add_sub/infer
-- Same body for every server so the comparison measures the servers, not the payload.

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs":['
  .. '{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1.0,2.0,3.0,4.0]},'
  .. '{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[10.0,20.0,30.0,40.0]}'
  .. ']}'

-- Emit one machine-readable line at the end so the driver script does not have
-- to parse wrk's human-oriented text (units vary: us/ms/s). Latencies are in us.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"stdev":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.stdev, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
