#!/usr/bin/env bash
# go test -bench suites, benchstat-ready, and comparison against a base commit.
#
#   bench/loadtest/gobench.sh run [OUT]        # every package with benchmarks, -benchmem -count=$COUNT → OUT
#   bench/loadtest/gobench.sh compare BASE     # same suites on BASE (a git worktree in a temp dir) and here; benchstat
#   bench/loadtest/gobench.sh ab BASE          # the test binaries of BASE and here run alternately, -count 1 each, COUNT
#                                              # rounds, then benchstat: a slow spell of the machine hits both alike
#
# Environment: COUNT (default 6), BENCH (regexp, default .), BENCHTIME (default
# go's 1s), PKGS (default: every package holding a func Benchmark),
# BENCHSTAT (default: go run golang.org/x/perf/cmd/benchstat@latest).
# Compare only numbers measured in the same invocation: the machine is shared.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
COUNT=${COUNT:-6}
BENCH=${BENCH:-.}
BENCHSTAT=${BENCHSTAT:-go run golang.org/x/perf/cmd/benchstat@latest}

bench_pkgs() { # packages (./dir) of the tree at $1 holding benchmarks
	(cd "$1" && grep -rl --include='*_test.go' -E '^func Benchmark' . 2>/dev/null |
		grep -v '/testdata/' | xargs -r -n1 dirname | sort -u)
}

run_suites() { # run_suites DIR OUT
	local dir=$1 out=$2 pkgs
	pkgs=${PKGS:-$(bench_pkgs "$dir" | tr '\n' ' ')}
	[ -n "$pkgs" ] || { echo "gobench: no benchmarks under $dir" >&2; return 1; }
	echo "gobench: $(cd "$dir" && git rev-parse --short HEAD 2>/dev/null || echo '?') $pkgs (count $COUNT) → $out" >&2
	# shellcheck disable=SC2086
	(cd "$dir" && go test -run '^$' -bench "$BENCH" -benchmem -count="$COUNT" ${BENCHTIME:+-benchtime="$BENCHTIME"} \
		-timeout 60m $pkgs) | tee "$out"
}

# base_worktree BASE: a detached worktree of BASE at $tmp/base, removed with $tmp on exit.
base_worktree() {
	tmp=$(mktemp -d /tmp/warmroute-bench.XXXXXX)
	trap 'git -C "$ROOT" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
	git -C "$ROOT" worktree add --detach "$tmp/base" "$1" >/dev/null
}

# report BASE NOTE: keeps $tmp/old.txt and new.txt under bench/results/raw and compares them.
report() {
	mkdir -p "$ROOT/bench/results/raw"
	cp "$tmp/old.txt" "$ROOT/bench/results/raw/bench-base.txt"
	cp "$tmp/new.txt" "$ROOT/bench/results/raw/bench-new.txt"
	echo "== benchstat $1 (old) vs working tree (new)$2 ==" >&2
	(cd "$tmp" && $BENCHSTAT old.txt new.txt)
}

cmd=${1:-run}
case $cmd in
run)
	out=${2:-bench/results/raw/bench-$(date +%Y%m%d-%H%M%S).txt}
	mkdir -p "$(dirname "$out")"
	run_suites "$ROOT" "$out" >/dev/null
	echo "gobench: wrote $out; compare two such files with: $BENCHSTAT old.txt new.txt" >&2
	;;
compare)
	base=${2:?usage: gobench.sh compare BASE_REF}
	base_worktree "$base"
	run_suites "$tmp/base" "$tmp/old.txt" >/dev/null
	run_suites "$ROOT" "$tmp/new.txt" >/dev/null
	report "$base" ""
	;;
ab)
	base=${2:?usage: gobench.sh ab BASE_REF}
	base_worktree "$base"
	pkgs=${PKGS:-$(bench_pkgs "$ROOT" | tr '\n' ' ')}
	for p in $pkgs; do
		n=$(echo "$p" | tr '/.' '__')
		(cd "$tmp/base" && go test -c -o "$tmp/$n.old" "$p") && (cd "$ROOT" && go test -c -o "$tmp/$n.new" "$p")
	done
	for _ in $(seq "$COUNT"); do
		for p in $pkgs; do
			n=$(echo "$p" | tr '/.' '__')
			for v in old new; do
				dir=$ROOT/$p # each binary runs in its own tree (testdata)
				[ "$v" = old ] && dir=$tmp/base/$p
				[ -x "$tmp/$n.$v" ] || continue
				(cd "$dir" && "$tmp/$n.$v" -test.run '^$' -test.bench "$BENCH" -test.benchmem -test.count 1 \
					${BENCHTIME:+-test.benchtime "$BENCHTIME"} >>"$tmp/$v.txt")
			done
		done
	done
	report "$base" ", alternating"
	;;
*)
	echo "usage: $0 run [OUT] | compare BASE_REF | ab BASE_REF" >&2
	exit 2
	;;
esac
