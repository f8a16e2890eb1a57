# warmroute — the two commands a newcomer needs are `make run` and `make test`.
GO       ?= go
PKGS     ?= ./...
BENCHCOUNT ?= 6

.PHONY: run test build vet fmt bench bench-compare bench-ab profile loadtest scale bench-replay bench-replay-all bench-matrix bench-saar chaos soak bench-replicas bench-overload

## run: start warmroute on 127.0.0.1:30000 with embedded simulated workers (demo mode).
run:
	$(GO) run ./cmd/warmroute --demo

## test: every test with the race detector, then the allocation and memory tests (//go:build !race) without it.
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 $(PKGS)
	$(GO) test -count=1 -run 'Alloc|Memory|NodeOverhead|TreeHeap|SessionCost|HotPath' $(PKGS)

build:
	mkdir -p bin
	$(GO) build -trimpath -o bin/ ./cmd/...

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -l -w $$(git ls-files '*.go')

## bench-saar: the SAAR policy matrix (25,200 turns per policy) and the live check through the real router.
bench-saar:
	$(GO) run ./cmd/saarmatrix -out bench/results
	$(GO) run ./cmd/saarlive -out bench/results

## bench: every go test -bench suite, -benchmem -count=$(BENCHCOUNT), benchstat-ready (bench/results/raw/bench.txt).
bench:
	COUNT=$(BENCHCOUNT) bench/loadtest/gobench.sh run bench/results/raw/bench.txt

## bench-compare BASE=<git ref>: the same suites on BASE (temporary worktree) and here, then benchstat.
bench-compare:
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<git ref>"; exit 2; }
	COUNT=$(BENCHCOUNT) bench/loadtest/gobench.sh compare $(BASE)

## bench-ab BASE=<git ref>: the test binaries of BASE and here run alternately ($(BENCHCOUNT) rounds), then benchstat.
bench-ab:
	@test -n "$(BASE)" || { echo "usage: make bench-ab BASE=<git ref>"; exit 2; }
	COUNT=$(BENCHCOUNT) bench/loadtest/gobench.sh ab $(BASE)

## profile: CPU/alloc/mutex/block profiles of the router under agent load -> profiles/ (+ SUMMARY.md).
profile:
	$(GO) run ./bench/profile --duration 10s --out profiles

## loadtest: warmroute vs a bare fasthttp proxy vs nginx, each alone on one core in front of one zero-work worker, 1/16/64 KB
## and a 16 KB escape-dense coding-agent body (esc16k), medians of 10 x 3 s (~15 min) -> bench/results/loadtest.md (QUICK=1: 1 x 2 s;
## ZERO_WORK=0: full simulated workers). esc16k alone: SIZES= KINDS=esc16k TARGETS="bare ca rr nginx" OUT_MD=... bench/loadtest/run.sh
## Where a proxy's CPU goes (syscalls per request, perf profile): bench/loadtest/proxyprof.sh 16384 bare ca nginx
loadtest:
	bench/loadtest/run.sh

## scale: scale-curve benchmarks -> bench/results/scale.md + scale.svg.
scale:
	mkdir -p bench/results/raw
	$(GO) test -run '^$$' -bench . -benchmem -count 3 -benchtime=300ms ./bench/scale | tee bench/results/raw/scale.txt
	$(GO) run ./bench/scale/plot -in bench/results/raw/scale.txt -svg bench/results/scale.svg -md bench/results/scale.md

## bench-replay: the default replay comparison of every policy (synthetic; ~3 min) -> bench/results/replay-synthetic.{md,csv,svg}.
bench-replay:
	$(GO) run ./cmd/warmbench

## bench-replay-all: also without session ids, tau-bench (../shared/traces) and the RFC's setup (~11 min).
bench-replay-all: bench-replay
	$(GO) run ./cmd/warmbench --session-via none --name replay-synthetic-no-session-id
	$(GO) run ./cmd/warmbench --trace tau
	$(GO) run ./cmd/warmbench --preset seed

## bench-matrix: the replay matrix, fleets a/b/c/d x workloads x session ids x in flight, precise (the true-cache ceiling) among the policies, and fleet e (2 prefill + 2 decode workers, PD mode, prefill+decode policy pairs) on fleet a's synthetic and tau cells, fleet f (the same with fleet c's caches) at 64 in flight (~40 min, <= 50) -> bench/results/matrix.{md,csv,svg};
## QUICK=1: a smoke run of a few short cells (~1 min) -> matrix-quick.*; ONLY=<regexp> runs the cells whose name matches (e.g. a/tau/.*/64; '^(a|e)/(tau|synthetic)/' fleet e beside fleet a), still written as matrix.* (warmbench --name for another).
bench-matrix:
	$(GO) run ./cmd/warmbench --matrix $(if $(QUICK),--quick) $(if $(ONLY),--cells '$(ONLY)')

## chaos: attack the real router binary (loopback, <= 10 min) -> bench/results/chaos.md; ONLY=<regexp> runs a subset. Exit 1 if a probe fails.
chaos:
	@command -v promtool >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; } || \
		echo "chaos: promtool not available; /metrics is checked by the built-in strict parser"
	$(GO) run ./bench/chaos --out bench/results $(if $(ONLY),--only '$(ONLY)')

## soak: mixed agent traffic under scheduled faults for $(SOAK) (default 10m) -> bench/results/soak.md. Exit 1 on a bad verdict.
soak:
	$(GO) run ./bench/chaos --soak $(or $(SOAK),10m) --out bench/results

## bench-replicas: 3 router replicas on one real redis-server (installed if missing) and simulated workers over loopback:
## the tau-bench tool-using sessions through the logical model auto, a random replica per turn, with and without session
## ids, and Redis killed 10 s mid-run (~3 min; skipped without ../shared/traces) -> bench/results/replicas.md.
bench-replicas:
	@command -v redis-server >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }
	$(GO) run ./bench/replicas --out bench/results

## bench-overload: the router's queue under overload: the real binary over loopback before four batching simulated workers; Poisson
## sessions (tau-bench, synthetic), two priorities, two tenants; the capacity searched, then pass-through, fifo and the new queue at
## 0.7/1/1.5/2x of it (~45 min) -> bench/results/overload.{md,csv,svg}. QUICK=1: a smoke run (< 1 min) -> overload-quick.*; exit 1
## if a request had no outcome or two. The workers schedule by priority as vLLM's --scheduling-policy priority, every router
## forwards it and the new one preempts (OVERLOAD_FLAGS; empty: first-come workers, no preemption).
OVERLOAD_FLAGS ?= --worker-scheduling priority --router-args --forward-priority --new-args --queue-preempt
bench-overload:
	$(GO) run ./bench/overload --out bench/results $(if $(QUICK),--quick) $(OVERLOAD_FLAGS)
