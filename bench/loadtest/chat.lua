-- wrk script of the side-by-side load test (bench/loadtest/run.sh).
--
--   wrk -t1 -c64 -d10s --latency -s chat.lua URL -- BODY_FILE SESSIONS
--
-- Every request is POST /v1/chat/completions with the body read from
-- BODY_FILE and an X-Session-ID header drawn uniformly from SESSIONS
-- sessions (default 10000). A BODY_FILE of several lines (mkbody --variants)
-- holds one body per line: session s gets line s mod lines + 1, always the
-- same. done() prints one machine-readable line:
--   RESULT requests=N duration_us=N non2xx=N connect=N read=N write=N timeout=N p50_us=N p90_us=N p99_us=N mean_us=N

-- The request is built from two strings made once (everything before the
-- session number, and everything after it with the body), so that a request
-- costs the load core one concatenation: wrk.format per request (a headers
-- table walked, the body copied through string.format) cost the load core
-- 10 % of its capacity at 1 KB and a third at 64 KB, capacity that the load
-- test needs to leave the proxy as the bottleneck.

local nsess = 10000
local head  -- the request before the session number
local tails -- per body: the request after the session number

function init(args)
  local f = assert(io.open(args[1], "rb"))
  local body = f:read("*a")
  f:close()
  nsess = tonumber(args[2] or "10000")
  math.randomseed(os.time() * 1000 + (tonumber(tostring(wrk.thread):match("0x(%x+)") or "0", 16) % 1000))
  head = "POST /v1/chat/completions HTTP/1.1\r\nHost: " .. wrk.headers["Host"] ..
    "\r\nContent-Type: application/json\r\nX-Session-ID: sess-"
  tails = {}
  for line in body:gmatch("[^\n]+") do
    tails[#tails + 1] = "\r\nContent-Length: " .. #line .. "\r\n\r\n" .. line
  end
end

function request()
  local s = math.random(nsess)
  return head .. s .. tails[s % #tails + 1]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d p50_us=%d p90_us=%d p99_us=%d mean_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
