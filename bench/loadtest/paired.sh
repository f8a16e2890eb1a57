#!/usr/bin/env bash
# Two targets of one load-test run compared round by round: for each round
# of SIZE, B's CPU µs per request over A's (and its req/s over A's), then
# their medians and how many rounds B came out ahead. Rounds of all targets
# run back to back, so a ratio within one round is the comparison a slow
# spell of the machine moves least (bench/loadtest/run.sh).
#
#   bench/loadtest/paired.sh RAW/rounds.csv SIZE A B     # e.g. ... 65536 old new
#
# SIZE is a body size or a body kind of run.sh's KINDS (e.g. esc16k).
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 ROUNDS_CSV SIZE A B" >&2; exit 2; }
awk -F, -v size="$2" -v a="$3" -v b="$4" '
	function median(x, n,   i, j, t) {
		for (i = 2; i <= n; i++) { t = x[i]; for (j = i - 1; j >= 1 && x[j] > t; j--) x[j + 1] = x[j]; x[j + 1] = t }
		return (n % 2) ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
	}
	NR > 1 && $1 == size { cpu[$3, $4] = $8; rps[$3, $4] = $5; if ($3 > last) last = $3 }
	END {
		for (r = 1; r <= last; r++) {
			if (cpu[r, a] > 0 && cpu[r, b] > 0 && rps[r, a] > 0) {
				n++; c[n] = cpu[r, b] / cpu[r, a]; q[n] = rps[r, b] / rps[r, a]
				if (c[n] < 1) ahead++
				line = line sprintf(" %.2f", c[n])
			}
		}
		if (n == 0) { print "no round has both " a " and " b " at size " size > "/dev/stderr"; exit 1 }
		printf "size %s, %s vs %s, %d rounds: CPU/request ratio median %.3f (rounds:%s), req/s ratio median %.3f; %s used less CPU in %d\n",
			size, b, a, n, median(c, n), line, median(q, n), b, ahead + 0
	}' "$1"
