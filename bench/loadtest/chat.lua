-- wrk script of the side-by-side load test (bench/loadtest/run.sh).
--
--   wrk -t1 -c64 -d10s --latency -s chat.lua URL -- BODY_FILE SESSIONS
--
-- Every request is POST /v1/chat/completions with the body read from
-- BODY_FILE and an X-Session-ID header drawn uniformly from SESSIONS
-- sessions (default 10000). done() prints one machine-readable line:
--   RESULT requests=N duration_us=N non2xx=N connect=N read=N write=N timeout=N p50_us=N p90_us=N p99_us=N mean_us=N

local body
local nsess = 10000
local hdrs = { ["Content-Type"] = "application/json" }

function init(args)
  local f = assert(io.open(args[1], "rb"))
  body = f:read("*a")
  f:close()
  nsess = tonumber(args[2] or "10000")
  math.randomseed(os.time() * 1000 + (tonumber(tostring(wrk.thread):match("0x(%x+)") or "0", 16) % 1000))
end

function request()
  hdrs["X-Session-ID"] = "sess-" .. math.random(nsess)
  return wrk.format("POST", "/v1/chat/completions", hdrs, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d p50_us=%d p90_us=%d p99_us=%d mean_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
