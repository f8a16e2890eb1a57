// Package scale holds the cross-package scale curves of the routing hot path
// as go test benchmarks (scale_test.go), and cmd-like tooling under plot/
// that turns their output into bench/results/scale.svg and scale.md:
//
//	go test -run '^$' -bench . -benchmem -count 3 ./bench/scale | tee /tmp/scale.txt
//	go run ./bench/scale/plot -in /tmp/scale.txt -svg bench/results/scale.svg -md bench/results/scale.md
//
// Curves: the session-hit routing decision (route.CacheAware.Select) as the
// session map grows 1k → 1M and the fleet 2 → 512 workers; the body scan and
// prefix match (reqview.Parse + radix Match) as the history grows 1 KB →
// 1 MB; radix memory per stored character as the tree grows; heap in use per
// 100k sessions. route/route_timing_test.go keeps the per-package
// benchmarks; this package is for the curves and the plot.
package scale
