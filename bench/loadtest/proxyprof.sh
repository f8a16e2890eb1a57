#!/usr/bin/env bash
# Where a proxy spends its CPU per request under the load test's traffic
# (bench/loadtest/run.sh): syscalls, context switches and CPU time per
# request, from perf's software counters and syscall tracepoints (no hardware
# counters needed), and a perf CPU profile (cpu-clock, kernel + user) of the
# proxy process.
#
#   bench/loadtest/proxyprof.sh [SIZE] [TARGET...]      # default 16384 bare nginx
#
# SIZE: a body size in bytes or a body kind of run.sh's KINDS (esc16k).
# TARGET: bare, ca, rr, nginx, or X with TARGET_CMD_X as in run.sh. Same
# setup as run.sh: one zero-work worker and wrk on LOAD_CPU, the proxy alone on
# PROXY_CPU. Output: $OUT/<target>-<size>.{stat,perf.txt,children.txt,user.txt,parts.txt} and a
# summary on stdout (CPU µs/req from /proc utime+stime over the measured run;
# the counters are perf's over the same DURATION). KEEP_DATA=1 also keeps
# each perf.data there, for perf report's call graphs. Syscall counts per request
# are steady even on a busy machine; CPU times are not (compare in one run).
# Needs perf (Debian linux-perf) with tracepoint access (root or perf_event_paranoid <= 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SIZE=${1:-16384}
shift || true
TARGETS=${*:-bare nginx}
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
SESSIONS=${SESSIONS:-10000}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
OUT=${OUT:-bench/results/raw/proxyprof}
PORT_BASE=${PORT_BASE:-$((20000 + RANDOM % 20000))}
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/warmroute-proxyprof.XXXXXX)
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
command -v perf >/dev/null || { echo "proxyprof: perf not found (apt-get install linux-perf)" >&2; exit 1; }
mkdir -p "$TMP/bin"
if [ -n "${BIN:-}" ]; then cp "$BIN/warmroute" "$BIN/simworker" "$BIN/bareproxy" "$TMP/bin/"; else
	go build -o "$TMP/bin/" ./cmd/warmroute ./cmd/simworker ./bench/bareproxy; fi
case $SIZE in # a size in bytes, or a body kind (run.sh's KINDS)
*[!0-9]*) BODYARGS=(--sizes "" --kinds "$SIZE") ;;
*) BODYARGS=(--sizes "$SIZE") ;;
esac
go run ./bench/loadtest/mkbody --out "$TMP" "${BODYARGS[@]}" --model sample-model --max-tokens 16 >/dev/null
BODY=$TMP/chat-$SIZE.json
wait_http() { for _ in $(seq 1 300); do curl -s -o /dev/null --max-time 1 "$1" && return 0; sleep 0.1; done; return 1; }
WPORT=$PORT_BASE
taskset -c "$LOAD_CPU" "$TMP/bin/simworker" --port "$WPORT" --model sample-model --zero-work --log-level warn >"$TMP/w.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$WPORT/health"
port=$((PORT_BASE + 1))
printf '%-10s %8s %10s %9s %9s %9s %9s %9s %9s %9s\n' target req/s cpu_us/req syscl/req read/req write/req wrtv/req epoll/req futex/req csw/req
for t in $TARGETS; do
	port=$((port + 1))
	listen=127.0.0.1:$port
	v="TARGET_CMD_$t"
	case $t in
	bare) cmd=("$TMP/bin/bareproxy" --listen "$listen" --upstream "127.0.0.1:$WPORT") ;;
	ca | rr) cmd=("$TMP/bin/warmroute" --host 127.0.0.1 --port "$port" --worker-urls "http://127.0.0.1:$WPORT"
		--policy "$([ "$t" = rr ] && echo round_robin || echo cache_aware)" --prometheus-port 0 --log-level warn) ;;
	nginx)
		mkdir -p "$TMP/nginx/tmp"
		sed -e "s|@D@|$TMP/nginx|g" -e "s|@LISTEN@|$listen|" -e "s|@UP@|127.0.0.1:$WPORT|" >"$TMP/nginx/nginx.conf" <<'CONF'
user root;
worker_processes 1;
error_log @D@/error.log warn;
pid @D@/nginx.pid;
events { worker_connections 8192; multi_accept on; }
http {
  access_log off;
  client_body_temp_path @D@/tmp/body; proxy_temp_path @D@/tmp/proxy;
  fastcgi_temp_path @D@/tmp/fcgi; uwsgi_temp_path @D@/tmp/uwsgi; scgi_temp_path @D@/tmp/scgi;
  client_max_body_size 64m; client_body_buffer_size 256k;
  keepalive_timeout 120s; keepalive_requests 1000000;
  upstream workers { hash $http_x_session_id consistent; server @UP@ max_fails=0; keepalive 256; keepalive_requests 1000000; keepalive_timeout 120s; }
  server { listen @LISTEN@ reuseport backlog=4096; location = /health { return 200; }
    location / { proxy_pass http://workers; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } }
}
CONF
		cmd=(nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;') ;;
	*)
		c=${!v:?unknown target $t}
		c=${c//\{listen\}/$listen}; c=${c//\{port\}/$port}; c=${c//\{upstream\}/127.0.0.1:$WPORT}; c=${c//\{url\}/http://127.0.0.1:$WPORT}
		read -r -a cmd <<<"$c" ;;
	esac
	taskset -c "$PROXY_CPU" "${cmd[@]}" >"$TMP/$t.log" 2>&1 &
	pid=$!
	PIDS+=("$pid")
	if ! wait_http "http://$listen/health"; then
		echo "proxyprof: $t did not answer on $listen; see its log:" >&2
		tail -5 "$TMP/$t.log" >&2 || true
		kill "$pid" 2>/dev/null || true
		continue
	fi
	ppid=$pid
	[ "$t" = nginx ] && ppid=$(pgrep -P "$pid" | head -1)
	taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d1s -s bench/loadtest/chat.lua "http://$listen" -- "$BODY" "$SESSIONS" >/dev/null 2>&1
	# counters over the whole run (-p: all threads of the process)
	perf stat -x, -o "$OUT/$t-$SIZE.stat" -p "$ppid" -e task-clock,context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_readv,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_futex,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_nanosleep \
		-- sleep "$DURATION" &
	spid=$!
	# the whole proxy core, then only the proxy's threads (-p misses samples on some VMs)
	perf record -q -F 999 -e cpu-clock -g -C "$PROXY_CPU" -o "$TMP/$t.data" -- sleep "$DURATION" >/dev/null 2>&1 &
	rpid=$!
	comm=$(cat "/proc/$ppid/comm")
	u0=$(cut -d')' -f2 "/proc/$ppid/stat" | awk '{print $12+$13}')
	res=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -s bench/loadtest/chat.lua "http://$listen" -- "$BODY" "$SESSIONS" 2>&1 | grep '^RESULT')
	u1=$(cut -d')' -f2 "/proc/$ppid/stat" | awk '{print $12+$13}')
	wait "$spid" "$rpid" || true
	perf report -i "$TMP/$t.data" --comm "$comm" --no-children --sort sym --stdio -g none --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' >"$OUT/$t-$SIZE.perf.txt" || true
	perf report -i "$TMP/$t.data" --comm "$comm" --children --sort sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' |
		grep -E '__x64_sys_|\] (runtime\.(sysmon|mcall|findRunnable)|main\.|github\.com/)' | head -60 >"$OUT/$t-$SIZE.children.txt" || true
	perf report -i "$TMP/$t.data" --comm "$comm" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -8 >>"$OUT/$t-$SIZE.perf.txt" || true
	req=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$res")
	dur=$(sed 's/.*duration_us=\([0-9]*\).*/\1/' <<<"$res")
	awk -F, -v req="$req" -v dur="$dur" -v t="$t" -v ticks=$((u1 - u0)) -v hz="$(getconf CLK_TCK)" '
		{ v[$3] = $1 }
		END {
			r = req * 1.0
			# CPU: utime+stime of the proxy over the measured wrk run
			printf "%-10s %8.0f %10.1f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", t, req / (dur / 1e6), ticks / hz * 1e6 / r,
				v["raw_syscalls:sys_enter"] / r, (v["syscalls:sys_enter_read"] + v["syscalls:sys_enter_recvfrom"] + v["syscalls:sys_enter_readv"]) / r,
				(v["syscalls:sys_enter_write"] + v["syscalls:sys_enter_sendto"]) / r, v["syscalls:sys_enter_writev"] / r,
				(v["syscalls:sys_enter_epoll_wait"] + v["syscalls:sys_enter_epoll_pwait"]) / r, v["syscalls:sys_enter_futex"] / r, v["context-switches"] / r
		}' "$OUT/$t-$SIZE.stat"
	# user-space functions in µs per request: each one's share of the
	# proxy's samples × its CPU µs per request (compare two targets with
	# join on the symbol: what one adds over the other)
	us_req=$(awk -v ticks=$((u1 - u0)) -v hz="$(getconf CLK_TCK)" -v r="$req" 'BEGIN { printf "%.3f", ticks / hz * 1e6 / r }')
	perf report -i "$TMP/$t.data" --comm "$comm" --no-children --sort dso,sym --stdio -g none --percent-limit 0.05 2>/dev/null |
		grep -v '^#' | grep -v '^$' | grep -v 'kernel.kallsyms' |
		awk -v us="$us_req" '{ p = $1; sub("%", "", p); $1 = ""; $2 = ""; $3 = ""; sub(/^ +/, ""); printf "%7.3f %s\n", p * us / 100, $0 }' >"$OUT/$t-$SIZE.user.txt" || true
	# the same samples by part of the request: each user-space sample goes to
	# the first part (in this order) that its call stack passes through
	# ("name(" parts are one function; the others, every function of that prefix)
	perf script -i "$TMP/$t.data" --comm "$comm" -F ip,sym 2>/dev/null | awk -v us="$us_req" '
		BEGIN {
			n = split("/reqview.Parse(|/reqview.ParseModel(|/reqview.ScanResponse(|/sessionshard.|/radix.|" \
				"/route.(*CacheAware).Observe(|/route.|/upstream.(*Transport).exchange(|/upstream.(*Transport).register(|" \
				"/upstream.(*Transport).unregister(|fasthttp.(*HostClient)|/upstream.|/fastproxy.(*Server).forward(|" \
				"/fastproxy.|fasthttp.(*Server)|fasthttp.", part, "|")
		}
		/^$/ {
			if (nl > 0) {
				all++
				if (!kern) { p = "(runtime and the rest)"; for (i = 1; i <= n; i++) if (index(st, part[i])) { p = part[i]; break }; c[p]++ }
			}
			nl = 0; kern = 0; st = ""; next
		}
		{ nl++; if (nl == 1 && $1 ~ /^ffffffff/) kern = 1; st = st " " $2 "(" }
		END { for (p in c) printf "%7.3f %s\n", c[p] / all * us, p }' | sort -rn >"$OUT/$t-$SIZE.parts.txt" || true
	[ -n "${KEEP_DATA:-}" ] && cp "$TMP/$t.data" "$OUT/$t-$SIZE.perf.data"
	kill "$pid" 2>/dev/null || true
	[ "$t" = nginx ] && kill "$(cat "$TMP/nginx/nginx.pid" 2>/dev/null)" 2>/dev/null || true
	sleep 0.3
done
echo "profiles: $OUT/<target>-$SIZE.perf.txt" >&2
