#!/usr/bin/env bash
# Side-by-side load test of warmroute (DESIGN §7), in one command:
#
#   bench/loadtest/run.sh                 # 10 s per cell
#   QUICK=1 bench/loadtest/run.sh         # 2 s per cell, to check the setup
#   DURATION=30 SIZES="65536" bench/loadtest/run.sh
#
# Same zero-latency simulated workers (simworker --time-scale 0) for every
# target; wrk with 64 connections POSTs chat bodies of 1 KB, 16 KB and 64 KB
# with an X-Session-ID drawn from SESSIONS sessions, against:
#   direct  one worker directly                 (the physical limit)
#   bare    bench/bareproxy -> one worker        (the proxy limit: fasthttp, no logic)
#   ca      warmroute --policy cache_aware       over all workers
#   rr      warmroute --policy round_robin       over all workers
#   nginx   nginx, hash $http_x_session_id consistent, tuned (keepalive, HTTP/1.1, no buffering)
# For each cell: requests/s, p50/p99 latency, CPU µs per request of the proxy
# process (utime+stime from /proc/<pid>/stat over the run ÷ requests) and of
# the workers, and the ratios to "bare" measured in the same run. Cells are
# interleaved by body size (all targets of one size back to back) so that the
# ratios compare measurements taken close in time.
#
# Pinning (taskset; 2-core machine): the proxy under test alone on PROXY_CPU
# (default 1); wrk and the simulated workers share LOAD_CPU (default 0). In the
# "direct" cell the proxy core is idle. Override with PROXY_CPU / LOAD_CPU, or
# PIN=0 to disable pinning.
#
# Output: bench/results/loadtest.md and bench/results/loadtest.csv (override
# with OUT_MD / OUT_CSV); raw wrk output under bench/results/raw/loadtest/.
# Every process started here is stopped on exit (trap); every wrk is bounded.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

QUICK=${QUICK:-0}
DURATION=${DURATION:-$([ "$QUICK" = 1 ] && echo 2 || echo 10)}   # seconds per cell
WARMUP=${WARMUP:-$([ "$QUICK" = 1 ] && echo 1 || echo 2)}        # seconds of warm-up per cell (not measured)
SIZES=${SIZES:-"1024 16384 65536"}
TARGETS=${TARGETS:-"direct bare ca rr nginx"}
CONNS=${CONNS:-64}
SESSIONS=${SESSIONS:-10000}
WORKERS=${WORKERS:-4}
MAX_TOKENS=${MAX_TOKENS:-16}
STREAM=${STREAM:-0}
PIN=${PIN:-1}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
PORT_BASE=${PORT_BASE:-$((20000 + RANDOM % 20000))}
OUT_MD=${OUT_MD:-bench/results/loadtest.md}
OUT_CSV=${OUT_CSV:-bench/results/loadtest.csv}
RAW=${RAW:-bench/results/raw/loadtest}
MODEL=sample-model

WORKER_PORT=$PORT_BASE
PROXY_PORT=$((PORT_BASE + 100))

TMP=$(mktemp -d /tmp/warmroute-loadtest.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	sleep 0.3
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	if [ -f "$TMP/nginx/nginx.pid" ]; then kill -9 "$(cat "$TMP/nginx/nginx.pid")" 2>/dev/null || true; fi
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[loadtest %s] %s\n' "$(date +%T)" "$*" >&2; }

pin() { # pin CPU CMD...: run CMD pinned to CPU (when PIN=1 and taskset exists)
	local cpu=$1
	shift
	if [ "$PIN" = 1 ] && command -v taskset >/dev/null; then
		taskset -c "$cpu" "$@"
	else
		"$@"
	fi
}

pinbg() { # pinbg CPU CMD... &: as pin, but exec'd so that $! is CMD's own pid
	local cpu=$1
	shift
	if [ "$PIN" = 1 ] && command -v taskset >/dev/null; then
		exec taskset -c "$cpu" "$@"
	else
		exec "$@"
	fi
}

# --- tools ------------------------------------------------------------------
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	if [ "$(id -u)" = 0 ]; then
		timeout 300 apt-get update -qq && timeout 300 apt-get install -y -qq "${need[@]}" >/dev/null
	else
		timeout 300 sudo apt-get update -qq && timeout 300 sudo apt-get install -y -qq "${need[@]}" >/dev/null
	fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

log "building warmroute, simworker, bareproxy"
mkdir -p "$TMP/bin" "$RAW"
go build -trimpath -o "$TMP/bin/" ./cmd/warmroute ./cmd/simworker ./bench/bareproxy
go run ./bench/loadtest/mkbody --out "$TMP/bodies" --sizes "$(echo $SIZES | tr ' ' ',')" \
	--model "$MODEL" --max-tokens "$MAX_TOKENS" $([ "$STREAM" = 1 ] && echo --stream) >"$TMP/bodies.txt"

CLK_TCK=$(getconf CLK_TCK)
# cpu_ticks PID...: utime+stime (clock ticks) summed over the processes
cpu_ticks() {
	local t=0 p s
	for p in "$@"; do
		s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
		s=${s##*) }                        # fields from 3 on (comm may hold spaces)
		set -- $s
		t=$((t + ${12} + ${13}))           # fields 14 and 15: utime, stime
	done
	echo "$t"
}

wait_http() { # wait_http URL: until it answers (any status), 30 s at most
	local i
	for i in $(seq 1 300); do
		if curl -s -o /dev/null --max-time 1 "$1"; then return 0; fi
		sleep 0.1
	done
	log "no answer from $1"
	return 1
}

# --- workers ----------------------------------------------------------------
log "starting $WORKERS zero-latency simulated workers on ports $WORKER_PORT.."
pinbg "$LOAD_CPU" "$TMP/bin/simworker" --host 127.0.0.1 --port "$WORKER_PORT" --count "$WORKERS" \
	--model "$MODEL" --time-scale 0 --log-level warn >"$TMP/simworker.log" 2>&1 &
WPID=$!
PIDS+=("$WPID")
URLS=()
for i in $(seq 0 $((WORKERS - 1))); do
	URLS+=("http://127.0.0.1:$((WORKER_PORT + i))")
	wait_http "http://127.0.0.1:$((WORKER_PORT + i))/health"
done

# --- targets ----------------------------------------------------------------
TPID=""     # pid(s) of the running target, for CPU accounting
TPIDS=()
start_target() { # start_target NAME: start it and set TURL, TPIDS
	local name=$1
	TPIDS=()
	case $name in
	direct)
		TURL="http://127.0.0.1:$WORKER_PORT"
		return
		;;
	bare)
		pinbg "$PROXY_CPU" "$TMP/bin/bareproxy" --listen "127.0.0.1:$PROXY_PORT" \
			--upstream "127.0.0.1:$WORKER_PORT" >"$TMP/target.log" 2>&1 &
		;;
	ca | rr)
		local policy=cache_aware
		[ "$name" = rr ] && policy=round_robin
		pinbg "$PROXY_CPU" "$TMP/bin/warmroute" --host 127.0.0.1 --port "$PROXY_PORT" \
			--worker-urls "${URLS[@]}" --policy "$policy" --prometheus-port 0 \
			--log-level warn >"$TMP/target.log" 2>&1 &
		;;
	nginx)
		write_nginx_conf
		pinbg "$PROXY_CPU" "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;' \
			>"$TMP/target.log" 2>&1 &
		;;
	esac
	TPID=$!
	PIDS+=("$TPID")
	TURL="http://127.0.0.1:$PROXY_PORT"
	wait_http "$TURL/health"
	TPIDS=("$TPID")
	if [ "$name" = nginx ]; then
		local c
		for c in $(pgrep -P "$TPID" || true); do TPIDS+=("$c"); done
	fi
}

stop_target() {
	[ -n "$TPID" ] || return 0
	kill "$TPID" 2>/dev/null || true
	local i
	for i in $(seq 1 30); do
		kill -0 "$TPID" 2>/dev/null || break
		sleep 0.1
	done
	kill -9 "$TPID" 2>/dev/null || true
	wait "$TPID" 2>/dev/null || true
	TPID=""
}

write_nginx_conf() {
	local d=$TMP/nginx s=""
	mkdir -p "$d/tmp"
	for u in "${URLS[@]}"; do s+="    server ${u#http://} max_fails=0;"$'\n'; done
	local user=""
	[ "$(id -u)" = 0 ] && user="user root;"
	cat >"$d/nginx.conf" <<CONF
# nginx as its users tune it for an LLM gateway: consistent hashing on the
# session header, upstream keep-alive pool larger than the client connections,
# HTTP/1.1 upstream, no response buffering (streaming), request bodies held in
# memory, no access log, one worker process for the one core it is pinned to.
$user
worker_processes 1;
error_log $d/error.log warn;
pid $d/nginx.pid;
events { worker_connections 8192; multi_accept on; }
http {
  access_log off;
  client_body_temp_path $d/tmp/body; proxy_temp_path $d/tmp/proxy;
  fastcgi_temp_path $d/tmp/fcgi; uwsgi_temp_path $d/tmp/uwsgi; scgi_temp_path $d/tmp/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 256k;
  keepalive_timeout 120s;
  keepalive_requests 1000000;
  upstream workers {
    hash \$http_x_session_id consistent;
$s    keepalive 256;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
  }
  server {
    listen 127.0.0.1:$PROXY_PORT reuseport backlog=4096;
    location = /health { return 200; }
    location / {
      proxy_pass http://workers;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
CONF
}

# --- one cell -----------------------------------------------------------------
CSV_ROWS=()
run_cell() { # run_cell SIZE TARGET
	local size=$1 name=$2 body=$TMP/bodies/chat-$1.json
	local bytes
	bytes=$(stat -c %s "$body")
	start_target "$name"
	# warm-up: connections, session map, tree, upstream pools (not measured)
	pin "$LOAD_CPU" timeout $((WARMUP + 10)) wrk -t1 -c"$CONNS" -d"${WARMUP}s" --timeout 5s \
		-s bench/loadtest/chat.lua "$TURL" -- "$body" "$SESSIONS" >/dev/null 2>&1 || true
	local t0 w0 out
	t0=$(cpu_ticks "${TPIDS[@]}")
	w0=$(cpu_ticks "$WPID")
	out=$(pin "$LOAD_CPU" timeout $((DURATION + 15)) wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 5s --latency \
		-s bench/loadtest/chat.lua "$TURL" -- "$body" "$SESSIONS" 2>&1) || true
	local t1 w1
	t1=$(cpu_ticks "${TPIDS[@]}")
	w1=$(cpu_ticks "$WPID")
	stop_target
	printf '%s\n' "$out" >"$RAW/$name-$size.txt"
	local res
	res=$(printf '%s\n' "$out" | grep '^RESULT ' || true)
	if [ -z "$res" ]; then
		log "cell $name/$size: wrk produced no result:"
		printf '%s\n' "$out" | tail -5 >&2
		CSV_ROWS+=("$size,$bytes,$name,0,0,0,0,0,0,0,0,0")
		return
	fi
	# shellcheck disable=SC2086
	local requests duration_us non2xx connect read write timeout p50_us p90_us p99_us mean_us
	eval "$(printf '%s\n' "${res#RESULT }" | tr ' ' '\n' | sed 's/^/local /')"
	local errors=$((non2xx + connect + read + write + timeout))
	local row
	row=$(awk -v req="$requests" -v dur="$duration_us" -v tk=$((t1 - t0)) -v wk=$((w1 - w0)) -v hz="$CLK_TCK" \
		-v p50="$p50_us" -v p99="$p99_us" -v name="$name" '
		BEGIN {
			rps = req / (dur / 1e6)
			pcpu = (name == "direct") ? "" : sprintf("%.1f", tk / hz * 1e6 / req)
			putil = (name == "direct") ? "" : sprintf("%.0f", tk / hz / (dur / 1e6) * 100)
			wcpu = sprintf("%.1f", wk / hz * 1e6 / req)
			printf "%.0f,%.3f,%.3f,%s,%s,%s", rps, p50 / 1000, p99 / 1000, pcpu, putil, wcpu
		}')
	CSV_ROWS+=("$size,$bytes,$name,$row,$requests,$errors")
	log "cell size=$size target=$name: rps,p50_ms,p99_ms,proxy_cpu_us/req,proxy_cpu_%,worker_cpu_us/req = $row; errors=$errors"
}

START=$(date -u +%FT%TZ)
for size in $SIZES; do
	for name in $TARGETS; do
		run_cell "$size" "$name"
	done
done

# --- report -------------------------------------------------------------------
HDR="size,body_bytes,target,rps,p50_ms,p99_ms,proxy_cpu_us_per_req,proxy_cpu_pct,worker_cpu_us_per_req,requests,errors"
printf '%s\n' "$HDR" "${CSV_ROWS[@]}" >"$TMP/raw.csv"
# add the ratios to bare of the same size
awk -F, -v OFS=, '
	NR == 1 { print $0, "rps_vs_bare", "p99_added_ms_vs_bare", "cpu_vs_bare"; next }
	{ rows[NR] = $0; if ($3 == "bare") { brps[$1] = $4; bp99[$1] = $6; bcpu[$1] = $7 } }
	END {
		for (i = 2; i <= NR; i++) {
			split(rows[i], f, ",")
			r = (brps[f[1]] > 0) ? sprintf("%.2f", f[4] / brps[f[1]]) : ""
			d = (f[3] != "direct" && brps[f[1]] > 0) ? sprintf("%.3f", f[6] - bp99[f[1]]) : ""
			c = (f[7] != "" && bcpu[f[1]] > 0) ? sprintf("%.2f", f[7] / bcpu[f[1]]) : ""
			print rows[i], r, d, c
		}
	}' "$TMP/raw.csv" >"$OUT_CSV"

{
	echo "# Load test: warmroute vs the bare fasthttp proxy vs nginx"
	echo
	echo "Produced by \`bench/loadtest/run.sh\` (\`make loadtest\`) on $START."
	echo "Ratios are to **bare** (bench/bareproxy: fasthttp pass-through, no logic) of the same body size, measured in the same run."
	echo
	echo "| body | target | req/s | × bare | p50 ms | p99 ms | p99 added vs bare (ms) | proxy CPU µs/req | × bare CPU | proxy CPU % | worker CPU µs/req | errors |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	awk -F, 'NR > 1 {
		label["direct"] = "direct (1 worker)"; label["bare"] = "bare proxy"; label["ca"] = "warmroute cache_aware"
		label["rr"] = "warmroute round_robin"; label["nginx"] = "nginx hash consistent"
		size = ($1 >= 1024) ? sprintf("%d KB", $1 / 1024) : $1 " B"
		printf "| %s (%s B) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", size, $2, label[$3], $4, $12, $5, $6, $13, $7, $14, $8, $9, $11
	}' "$OUT_CSV"
	echo
	echo "Goals (DESIGN §7): cache_aware ≥ 0.9× bare req/s at 1 KB and 16 KB, ≥ 0.8× at 64 KB; stretch: ahead of nginx."
	echo
	echo "**Reading.** On a 2-core machine the load core (wrk + the simulated workers, which fully decode every body) saturates first: the proxies run at 20–80 % of their own core, so req/s ratios are bounded by the load core and compress towards 1 (and carry its noise). The discriminating number is **proxy CPU µs/req** (and its ratio to bare): what each proxy spends per request on the same traffic. Note that CPU per request rises when a proxy is less busy (less batching per syscall), so compare cells of similar CPU %."
	echo
	echo "## How it was produced"
	echo
	echo '```'
	echo "DURATION=$DURATION WARMUP=$WARMUP SIZES=\"$SIZES\" CONNS=$CONNS SESSIONS=$SESSIONS WORKERS=$WORKERS MAX_TOKENS=$MAX_TOKENS STREAM=$STREAM PIN=$PIN PROXY_CPU=$PROXY_CPU LOAD_CPU=$LOAD_CPU bench/loadtest/run.sh"
	echo '```'
	echo
	echo "- workers: \`taskset -c $LOAD_CPU simworker --count $WORKERS --model $MODEL --time-scale 0\` (zero latency; full sonic decode of each body; $MAX_TOKENS completion tokens, stream=$STREAM)"
	echo "- load: \`taskset -c $LOAD_CPU wrk -t1 -c$CONNS -d${DURATION}s --latency -s bench/loadtest/chat.lua URL -- chat-SIZE.json $SESSIONS\` after a ${WARMUP}s warm-up; X-Session-ID uniform over $SESSIONS sessions"
	echo "- bare: \`taskset -c $PROXY_CPU bareproxy --upstream <worker 1>\`"
	echo "- ca / rr: \`taskset -c $PROXY_CPU warmroute --worker-urls <$WORKERS workers> --policy cache_aware|round_robin --prometheus-port 0 --log-level warn\`"
	echo "- nginx: \`taskset -c $PROXY_CPU nginx\` (1 worker process), \`hash \$http_x_session_id consistent\`, \`keepalive 256\`, \`keepalive_requests 1000000\`, \`proxy_http_version 1.1\`, \`proxy_set_header Connection \"\"\`, \`proxy_buffering off\`, \`client_body_buffer_size 256k\`, \`access_log off\`"
	echo "- proxy CPU µs/req: (utime+stime of the proxy process(es), /proc/PID/stat, ${CLK_TCK} Hz ticks) over the measured run ÷ requests; proxy CPU %: of one core. worker CPU µs/req: the same for the simworker process."
	echo "- bodies (reqview.SampleChatBodyOfSize via bench/loadtest/mkbody): $(awk '{printf "%s%s B", (NR>1?", ":""), $2}' "$TMP/bodies.txt")"
	echo
	echo "## Machine"
	echo
	echo '```'
	uname -a
	grep -m1 'model name' /proc/cpuinfo || true
	echo "nproc: $(nproc)"
	go version
	wrk --version 2>&1 | head -1 || true
	"$NGINX" -v 2>&1 || true
	echo "date: $START"
	echo '```'
	echo
	echo "The machine is shared (other jobs run concurrently): absolute numbers are noisy; compare the ratios, which are measured minutes apart in one run."
} >"$OUT_MD"
log "wrote $OUT_MD and $OUT_CSV"
cat "$OUT_MD"
