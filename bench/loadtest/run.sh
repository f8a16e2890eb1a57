#!/usr/bin/env bash
# Side-by-side load test of warmroute (DESIGN §7, issue 12), in one command:
#
#   bench/loadtest/run.sh                 # 10 × 3 s per cell, medians (~15 minutes)
#   QUICK=1 bench/loadtest/run.sh         # 1 × 2 s per cell, to check the setup (~1.5 minutes)
#   REPS=5 DURATION=20 SIZES="16384" KINDS= bench/loadtest/run.sh
#   SIZES= KINDS=esc16k TARGETS="bare ca rr nginx" OUT_MD=bench/results/raw/loadtest-esc16k.md \
#     OUT_CSV=bench/results/raw/loadtest-esc16k.csv bench/loadtest/run.sh   # the escape-dense case alone (~3 minutes)
#
# The proxy under test is the bottleneck: ONE zero-work worker (simworker
# --zero-work: a fixed 346-byte chat completion, the request body never
# decoded) sits behind every proxy, wrk with 64 connections POSTs chat bodies
# of 1 KB, 16 KB and 64 KB (SIZES) and of the KINDS below with an X-Session-ID
# drawn from SESSIONS sessions, and the proxy runs alone on its own core.
# Targets:
#   direct  the worker directly                 (the load side's limit; the proxy core is idle)
#   bare    bench/bareproxy -> the worker       (the proxy limit: fasthttp, no logic)
#   ca      warmroute --policy cache_aware      -> the worker
#   rr      warmroute --policy round_robin      -> the worker
#   nginx   nginx, hash $http_x_session_id consistent, tuned (keepalive pool,
#           HTTP/1.1 upstream, no response buffering, access_log off, 1 worker process)
# For each cell: requests/s, p50/p99 latency, CPU µs per request of the proxy
# process (utime+stime from /proc/<pid>/stat over the run ÷ requests) and of
# the worker, and the ratios to "bare" (and nginx's CPU) of the same size.
# Every target is started once and stays up (idle when not under load); cells
# run size by size, REPS rounds of all targets back to back (the order rotates
# each round), each round a WARMUP then a DURATION measurement; the report
# gives the median of the REPS rounds of each (size, target).
#
# Pinning (taskset; 2-core machine): every proxy on PROXY_CPU (default 0),
# wrk and the worker on LOAD_CPU (default 1). PIN=0 disables pinning.
# ZERO_WORK=0 puts WORKERS (default 1) full simulated workers (simworker
# --time-scale 0: every body decoded) behind the proxies instead: the old
# setup, where the load core saturates first.
#
# KINDS (default esc16k; KINDS= for none) adds cells of bodies other than
# the sample chat of a size, each as its own row (its name in the "size"
# column): esc16k is a coding agent's conversation of exactly 16 KB, dense
# with escapes (quotes, tabs, newlines, backslashes, non-ASCII as raw UTF-8
# and as \uXXXX; mkbody --kinds), the case issue 28 adds to the load
# test. SIZES= runs no sample sizes. paired.sh takes a kind where it takes a
# size.
#
# VARIANTS=K (K > 1): the sessions send K different bodies of each size
# (mkbody --variants: tools and conversation differ; session s sends body
# s mod K), not all the same one: the routing view's tools memo then serves
# only a request whose View last parsed the same tools, and the tree holds K
# paths. Default 1.
# Experiments: a target named X with TARGET_CMD_X set runs that command on
# PROXY_CPU ({listen} = host:port to listen on, {port} = its port, {upstream} =
# the worker's host:port, {url} = its URL), e.g.
#   TARGET_CMD_bare2='/tmp/bareproxy2 --listen {listen} --upstream {upstream}' TARGETS="bare bare2" ...
# BIN=DIR uses prebuilt warmroute, simworker and bareproxy from DIR.
#
# Output: bench/results/loadtest.md and bench/results/loadtest.csv (medians;
# override with OUT_MD / OUT_CSV); every round's row in $RAW/rounds.csv
# (two targets round by round: bench/loadtest/paired.sh $RAW/rounds.csv SIZE A B) and
# raw wrk output under bench/results/raw/loadtest/ (gitignored).
# Every process started here is stopped on exit (trap); every wrk is bounded.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

QUICK=${QUICK:-0}
DURATION=${DURATION:-$([ "$QUICK" = 1 ] && echo 2 || echo 3)}  # seconds per measured run
WARMUP=${WARMUP:-1}                                           # seconds of warm-up before each run (not measured)
REPS=${REPS:-$([ "$QUICK" = 1 ] && echo 1 || echo 10)}        # rounds per cell; the report gives medians
SIZES=${SIZES-"1024 16384 65536"} # empty: none (KINDS only)
KINDS=${KINDS-esc16k}              # body kinds (mkbody --kinds); empty: none
CELLS="$SIZES $KINDS"              # the bodies of the cells, in order: sizes, then kinds
TARGETS=${TARGETS:-"direct bare ca rr nginx"}
CONNS=${CONNS:-64}
SESSIONS=${SESSIONS:-10000}
VARIANTS=${VARIANTS:-1} # >1: sessions carry VARIANTS different bodies (tools, conversation): mkbody --variants
ZERO_WORK=${ZERO_WORK:-1}
WORKERS=${WORKERS:-1}
MAX_TOKENS=${MAX_TOKENS:-16}
STREAM=${STREAM:-0}
PIN=${PIN:-1}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT_BASE=${PORT_BASE:-$((20000 + RANDOM % 20000))}
OUT_MD=${OUT_MD:-bench/results/loadtest.md}
OUT_CSV=${OUT_CSV:-bench/results/loadtest.csv}
RAW=${RAW:-bench/results/raw/loadtest}
MODEL=sample-model

WORKER_PORT=$PORT_BASE

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
case " $TARGETS " in *" nginx "*) command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx) ;; esac
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	if [ "$(id -u)" = 0 ]; then
		timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq "${need[@]}" >/dev/null
	else
		timeout 300 sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 300 sudo apt-get install -y -qq "${need[@]}" >/dev/null
	fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

mkdir -p "$TMP/bin" "$RAW"
if [ -n "${BIN:-}" ]; then
	log "using prebuilt binaries from $BIN"
	cp "$BIN/warmroute" "$BIN/simworker" "$BIN/bareproxy" "$TMP/bin/"
else
	log "building warmroute, simworker, bareproxy"
	go build -trimpath -o "$TMP/bin/" ./cmd/warmroute ./cmd/simworker ./bench/bareproxy
fi
[ -n "${CELLS// /}" ] || { log "no cells: SIZES and KINDS are both empty"; exit 2; }
go run ./bench/loadtest/mkbody --out "$TMP/bodies" --sizes "$(echo $SIZES | tr ' ' ',')" --kinds "$(echo $KINDS | tr ' ' ',')" \
	--model "$MODEL" --max-tokens "$MAX_TOKENS" $([ "$STREAM" = 1 ] && echo --stream) --variants "$VARIANTS" |
	grep '\.json ' >"$TMP/bodies.txt"
BODY_EXT=$([ "$VARIANTS" -gt 1 ] && echo jsonl || echo json)

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

# --- worker(s) ----------------------------------------------------------------
if [ "$ZERO_WORK" = 1 ]; then
	"$TMP/bin/simworker" -h 2>&1 | grep -q -- '-zero-work' || {
		log "simworker has no --zero-work flag: run with ZERO_WORK=0 (full simulated workers)"
		exit 1
	}
	WORKER_ARGS=(--zero-work)
	WORKER_DESC="simworker --zero-work (fixed 346-byte chat completion, request body not decoded)"
else
	WORKER_ARGS=(--time-scale 0)
	WORKER_DESC="simworker --time-scale 0 (zero latency; full decode of each body; $MAX_TOKENS completion tokens, stream=$STREAM)"
fi
log "starting $WORKERS worker(s) on ports $WORKER_PORT.. (${WORKER_ARGS[*]})"
pinbg "$LOAD_CPU" "$TMP/bin/simworker" --host 127.0.0.1 --port "$WORKER_PORT" --count "$WORKERS" \
	--model "$MODEL" "${WORKER_ARGS[@]}" --log-level warn >"$TMP/simworker.log" 2>&1 &
WPID=$!
PIDS+=("$WPID")
URLS=()
for i in $(seq 0 $((WORKERS - 1))); do
	URLS+=("http://127.0.0.1:$((WORKER_PORT + i))")
	wait_http "http://127.0.0.1:$((WORKER_PORT + i))/health"
done
ANSWER_BYTES=$(curl -s -X POST -H 'Content-Type: application/json' --data-binary @"$TMP/bodies/chat-$(echo $CELLS | cut -d' ' -f1).json" \
	"${URLS[0]}/v1/chat/completions" | wc -c)

# --- targets (all started once, before the first cell) -------------------------
declare -A TURL TPIDS_OF
write_nginx_conf() { # write_nginx_conf PORT
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
    listen 127.0.0.1:$1 reuseport backlog=4096;
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

start_target() { # start_target NAME PORT: start it, set TURL[NAME] and TPIDS_OF[NAME]
	local name=$1 port=$2 pid
	local listen="127.0.0.1:$port" up="${URLS[0]#http://}"
	local cmdvar="TARGET_CMD_$name"
	if [ "$name" = direct ]; then
		TURL[$name]=${URLS[0]}
		TPIDS_OF[$name]=""
		return
	fi
	if [ -n "${!cmdvar:-}" ]; then
		local c=${!cmdvar}
		c=${c//\{listen\}/$listen}
		c=${c//\{port\}/$port}
		c=${c//\{upstream\}/$up}
		c=${c//\{url\}/${URLS[0]}}
		# shellcheck disable=SC2086
		(pinbg "$PROXY_CPU" $c) >"$TMP/$name.log" 2>&1 &
	else
		case $name in
		bare)
			(pinbg "$PROXY_CPU" "$TMP/bin/bareproxy" --listen "$listen" --upstream "$up") >"$TMP/$name.log" 2>&1 &
			;;
		ca | rr)
			local policy=cache_aware
			[ "$name" = rr ] && policy=round_robin
			(pinbg "$PROXY_CPU" "$TMP/bin/warmroute" --host 127.0.0.1 --port "$port" \
				--worker-urls "${URLS[@]}" --policy "$policy" --prometheus-port 0 \
				--log-level warn) >"$TMP/$name.log" 2>&1 &
			;;
		nginx)
			write_nginx_conf "$port"
			(pinbg "$PROXY_CPU" "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;') \
				>"$TMP/$name.log" 2>&1 &
			;;
		*)
			log "unknown target $name (set TARGET_CMD_$name)"
			exit 2
			;;
		esac
	fi
	pid=$!
	PIDS+=("$pid")
	TURL[$name]="http://$listen"
	wait_http "${TURL[$name]}/health"
	local pids=$pid c
	if [ "$name" = nginx ]; then
		for c in $(pgrep -P "$pid" || true); do pids+=" $c"; done
	fi
	TPIDS_OF[$name]=$pids
}

port=$((PORT_BASE + 100))
for name in $TARGETS; do
	start_target "$name" "$port"
	port=$((port + 1))
done
log "targets up: $TARGETS"

# --- one cell -------------------------------------------------------------------
ROUNDS=$RAW/rounds.csv
echo "size,body_bytes,round,target,rps,p50_ms,p99_ms,proxy_cpu_us_per_req,proxy_cpu_pct,worker_cpu_us_per_req,requests,errors" >"$ROUNDS"
run_cell() { # run_cell SIZE ROUND TARGET (SIZE: a size in bytes or a kind of KINDS)
	local size=$1 round=$2 name=$3 body=$TMP/bodies/chat-$1.$BODY_EXT
	local bytes url=${TURL[$3]}
	local -a tp
	read -r -a tp <<<"${TPIDS_OF[$3]}"
	bytes=$(head -n1 "$body" | tr -d '\n' | wc -c) # one body (the variants have one size)
	# warm-up: connections, session map, tree, upstream pools, caches (not measured)
	pin "$LOAD_CPU" timeout $((WARMUP + 10)) wrk -t1 -c"$CONNS" -d"${WARMUP}s" --timeout 5s \
		-s bench/loadtest/chat.lua "$url" -- "$body" "$SESSIONS" >/dev/null 2>&1 || true
	local t0 w0 out
	t0=$(cpu_ticks "${tp[@]}")
	w0=$(cpu_ticks "$WPID")
	out=$(pin "$LOAD_CPU" timeout $((DURATION + 15)) wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 5s --latency \
		-s bench/loadtest/chat.lua "$url" -- "$body" "$SESSIONS" 2>&1) || true
	local t1 w1
	t1=$(cpu_ticks "${tp[@]}")
	w1=$(cpu_ticks "$WPID")
	printf '%s\n' "$out" >"$RAW/$name-$size-$round.txt"
	local res
	res=$(printf '%s\n' "$out" | grep '^RESULT ' || true)
	if [ -z "$res" ]; then
		log "cell $name/$size/$round: wrk produced no result:"
		printf '%s\n' "$out" | tail -5 >&2
		echo "$size,$bytes,$round,$name,0,0,0,,,0,0,0" >>"$ROUNDS"
		return
	fi
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
	echo "$size,$bytes,$round,$name,$row,$requests,$errors" >>"$ROUNDS"
	log "size=$size round=$round $name: rps,p50_ms,p99_ms,proxy_cpu_us/req,proxy_cpu_%,worker_cpu_us/req = $row; errors=$errors"
}

START=$(date -u +%FT%TZ)
T0=$SECONDS
read -r -a TLIST <<<"$TARGETS"
NT=${#TLIST[@]}
for size in $CELLS; do
	for round in $(seq 1 "$REPS"); do
		for i in $(seq 0 $((NT - 1))); do # rotate the order each round
			run_cell "$size" "$round" "${TLIST[$(((i + round - 1) % NT))]}"
		done
	done
done
ELAPSED=$((SECONDS - T0))

# --- report -------------------------------------------------------------------
# medians over the rounds of each (size, target), in TARGETS order, then the ratios: of the medians,
# and the median of each round's own ratio to bare (paired: the two measured seconds apart, so a
# slow spell of the machine that spans one round moves both sides of that round's ratio)
awk -F, -v OFS=, -v order="$TARGETS" -v sizes="$CELLS" '
	function median(s,   a, n, i, j, t) {
		n = split(s, a, " ")
		if (n == 0) return ""
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
		return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	NR == 1 { next }
	{
		k = $1 SUBSEP $4; bytes[$1] = $2; n[k]++
		for (c = 5; c <= 10; c++) if ($c != "") v[k, c] = v[k, c] " " $c
		req[k] += $11; err[k] += $12
		if (n[k] > 1) { lo[k] = ($5 < lo[k]) ? $5 : lo[k]; hi[k] = ($5 > hi[k]) ? $5 : hi[k] } else { lo[k] = hi[k] = $5 }
		rps[$1, $3, $4] = $5; cpu[$1, $3, $4] = $8; if ($3 > last[$1]) last[$1] = $3
	}
	# ratios(s, t, x): x[t] / x[bare] of each round of size s (the two measured seconds apart)
	function ratios(s, t, x,   r, l) {
		l = ""
		for (r = 1; r <= last[s]; r++)
			if ((s, r, t) in x && x[s, r, t] != "" && x[s, r, "bare"] > 0) l = l " " sprintf("%.4f", x[s, r, t] / x[s, r, "bare"])
		return l
	}
	# paired(s, t, x): the median of those ratios
	function paired(s, t, x,   l) {
		l = median(ratios(s, t, x))
		return (l == "") ? "" : sprintf("%.2f", l)
	}
	# quartile(s, t, x, q): their q-th quartile (q = 1 or 3), nearest rank: the
	# middle half of the rounds lies between quartiles 1 and 3
	function quartile(s, t, x, q,   a, n, i, j, v) {
		n = split(ratios(s, t, x), a, " ")
		if (n == 0) return ""
		for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > v + 0; j--) a[j + 1] = a[j]; a[j + 1] = v }
		i = int((q * n + 3) / 4); if (i < 1) i = 1; if (i > n) i = n
		return sprintf("%.2f", a[i])
	}
	END {
		print "size,body_bytes,target,rounds,rps,p50_ms,p99_ms,proxy_cpu_us_per_req,proxy_cpu_pct,worker_cpu_us_per_req,requests,errors,rps_min,rps_max,rps_vs_bare,p99_added_ms_vs_bare,cpu_vs_bare,cpu_vs_nginx,rps_vs_bare_paired,cpu_vs_bare_paired,rps_vs_bare_paired_q1,rps_vs_bare_paired_q3"
		ns = split(sizes, S, " "); nt = split(order, T, " ")
		for (i = 1; i <= ns; i++) {
			s = S[i]
			for (j = 1; j <= nt; j++) {
				k = s SUBSEP T[j]; if (!(k in n)) continue
				for (c = 5; c <= 10; c++) m[T[j], c] = median(v[k, c])
			}
			for (j = 1; j <= nt; j++) {
				t = T[j]; k = s SUBSEP t; if (!(k in n)) continue
				r = (m["bare", 5] > 0) ? sprintf("%.2f", m[t, 5] / m["bare", 5]) : ""
				d = (t != "direct" && m["bare", 5] > 0) ? sprintf("%.3f", m[t, 7] - m["bare", 7]) : ""
				cb = (m[t, 8] != "" && m["bare", 8] > 0) ? sprintf("%.2f", m[t, 8] / m["bare", 8]) : ""
				cn = (m[t, 8] != "" && m["nginx", 8] > 0) ? sprintf("%.2f", m[t, 8] / m["nginx", 8]) : ""
				print s, bytes[s], t, n[k], m[t, 5], m[t, 6], m[t, 7], m[t, 8], m[t, 9], m[t, 10], req[k], err[k], lo[k], hi[k], r, d, cb, cn, paired(s, t, rps), paired(s, t, cpu), quartile(s, t, rps, 1), quartile(s, t, rps, 3)
			}
			delete m
		}
	}' "$ROUNDS" >"$OUT_CSV"

{
	echo "# Load test: warmroute vs the bare fasthttp proxy vs nginx, the proxy as the bottleneck"
	echo
	echo "Produced by \`bench/loadtest/run.sh\` (\`make loadtest\`) on $START ($ELAPSED s of cells)."
	echo "One zero-work worker behind every proxy; each proxy alone on CPU $PROXY_CPU, wrk and the worker on CPU $LOAD_CPU."
	echo "Each row is the median of $REPS round(s) of ${DURATION} s; the rounds of all targets of one size run back to back, so the ratios"
	echo "(to **bare**, bench/bareproxy: fasthttp pass-through, no logic; and to nginx) compare measurements taken seconds apart."
	echo
	echo "| body | target | req/s | × bare | × bare, paired | p50 ms | p99 ms | p99 added vs bare (ms) | proxy CPU µs/req | × bare CPU | × bare CPU, paired | × nginx CPU | proxy CPU % | worker CPU µs/req | req/s min–max | errors |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	awk -F, 'NR > 1 {
		label["direct"] = "direct (the worker)"; label["bare"] = "bare proxy"; label["ca"] = "warmroute cache_aware"
		label["rr"] = "warmroute round_robin"; label["nginx"] = "nginx hash consistent"
		l = ($3 in label) ? label[$3] : $3
		kind["esc16k"] = "16 KB escape-dense"
		size = ($1 !~ /^[0-9]+$/) ? (($1 in kind) ? kind[$1] : $1) : ($1 >= 1024) ? sprintf("%d KB", $1 / 1024) : $1 " B"
		pr = ($19 != "" && $21 != "" && $3 != "bare") ? sprintf("%s (%s–%s)", $19, $21, $22) : $19
		printf "| %s (%s B) | %s | %.0f | %s | %s | %.3f | %.3f | %s | %s | %s | %s | %s | %s | %s | %s–%s | %s |\n", size, $2, l, $5, $15, pr, $6, $7, $16, $8, $17, $20, $18, $9, $10, $13, $14, $12
	}' "$OUT_CSV"
	echo
	echo "Goals (docs/design.md §7): cache_aware ≥ 0.95× bare req/s at 1 KB, ≥ 0.9× at 16 and 64 KB; then ahead of nginx at every size."
	echo "**× bare, paired** is the median over the rounds of each round's own ratio (the two measured seconds apart), which a slow spell"
	echo "of the shared machine moves less than the ratio of the medians beside it; in brackets, the quartiles of those ratios (nearest"
	echo "rank): half of the rounds fall between them."
	if [ -n "${KINDS// /}" ]; then
		echo
		echo "**16 KB escape-dense** (esc16k): a coding agent's conversation of exactly 16 KB, with the plain 16 KB body's system prompt and tools,"
		echo "dense with escapes (quotes, tabs, newlines, backslashes; non-ASCII as raw UTF-8 and as \\uXXXX): the case issue 28 adds;"
		echo "the refactor must not widen cache_aware's gap to nginx there, and closing it is welcome."
	fi
	echo
	if [ "$ZERO_WORK" = 1 ]; then
		echo "**Reading.** The worker does no work (a fixed answer, the body never decoded), so the proxy's own core is what runs out:"
		echo "a proxy near 100 % CPU is the bottleneck and its req/s measures it; **proxy CPU µs/req** is the cost per request, whatever the load."
		echo "\`direct\` is the load side's limit (wrk and the worker on one core, the proxy core idle); a proxy cannot pass it."
		echo "A proxy well below 100 % CPU is held back by something else: the load core, other jobs on the machine, or, for nginx, its"
		echo "upstream connections, which nginx opens without TCP_NODELAY: on loopback (64 KB MTU) the small tail segment of a request"
		echo "larger than one segment waits for the worker's delayed ACK (up to 40 ms), so nginx's req/s at 64 KB is latency-bound and"
		echo "its CPU µs/req is the number to compare. Where a proxy's CPU goes: \`bench/loadtest/proxyprof.sh\`, profiles/proxy-path.md."
	else
		echo "**Reading.** ZERO_WORK=0: the workers decode every body and share the load core with wrk, which saturates first; req/s ratios compress"
		echo "towards 1 and only **proxy CPU µs/req** separates the proxies."
	fi
	echo
	echo "## How it was produced"
	echo
	echo '```'
	echo "DURATION=$DURATION WARMUP=$WARMUP REPS=$REPS SIZES=\"$SIZES\" KINDS=\"$KINDS\" TARGETS=\"$TARGETS\" CONNS=$CONNS SESSIONS=$SESSIONS VARIANTS=$VARIANTS ZERO_WORK=$ZERO_WORK WORKERS=$WORKERS PIN=$PIN PROXY_CPU=$PROXY_CPU LOAD_CPU=$LOAD_CPU bench/loadtest/run.sh"
	echo '```'
	echo
	echo "- worker: \`taskset -c $LOAD_CPU $WORKER_DESC\`, $WORKERS worker(s); answer $ANSWER_BYTES B of body"
	echo "- load: \`taskset -c $LOAD_CPU wrk -t1 -c$CONNS -d${DURATION}s --latency -s bench/loadtest/chat.lua URL -- chat-SIZE.$BODY_EXT $SESSIONS\` (chat-KIND.$BODY_EXT for a kind) after a ${WARMUP} s warm-up of the same; X-Session-ID uniform over $SESSIONS sessions$([ "$VARIANTS" -gt 1 ] && echo ", session s sending body s mod $VARIANTS of $VARIANTS that differ in tools and conversation (mkbody --variants)" || echo ", every one sending the same body")"
	echo "- every target started once and left running (idle outside its cells); rounds rotate the target order"
	echo "- bare: \`taskset -c $PROXY_CPU bareproxy --upstream <the worker>\`"
	echo "- ca / rr: \`taskset -c $PROXY_CPU warmroute --worker-urls <the worker> --policy cache_aware|round_robin --prometheus-port 0 --log-level warn\`"
	echo "- nginx: \`taskset -c $PROXY_CPU nginx\` (1 worker process), \`hash \$http_x_session_id consistent\`, \`keepalive 256\`, \`keepalive_requests 1000000\`, \`proxy_http_version 1.1\`, \`proxy_set_header Connection \"\"\`, \`proxy_buffering off\`, \`client_body_buffer_size 256k\`, \`access_log off\`"
	for name in $TARGETS; do
		v="TARGET_CMD_$name"
		[ -n "${!v:-}" ] && echo "- $name: \`taskset -c $PROXY_CPU ${!v}\`"
	done
	echo "- proxy CPU µs/req: (utime+stime of the proxy process(es), /proc/PID/stat, ${CLK_TCK} Hz ticks) over the measured run ÷ requests; proxy CPU %: of one core. worker CPU µs/req: the same for the worker process."
	echo "- bodies (reqview.SampleChatBodyOfSize via bench/loadtest/mkbody; kinds: mkbody --kinds): $(awk '{k = $1; sub(/.*\/chat-/, "", k); sub(/\.json$/, "", k)
		printf "%s%s%s B", (NR > 1 ? ", " : ""), (k ~ /^[0-9]+$/ ? "" : k " "), $2}' "$TMP/bodies.txt")"
	echo "- every round: \`$RAW/rounds.csv\`; medians and ratios: \`$OUT_CSV\`"
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
	echo "loadavg at the end: $(cat /proc/loadavg)"
	echo "date: $START"
	echo '```'
	echo
	echo "The machine may be shared: absolute numbers are noisy; compare the ratios, measured seconds apart in one run."
} >"$OUT_MD"
log "wrote $OUT_MD and $OUT_CSV ($ELAPSED s of cells)"
cat "$OUT_MD"
