package fastproxy

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// latencyBounds are the histogram's upper bounds in seconds (Prometheus
// `le`), from sub-millisecond proxying to long generations.
var latencyBounds = [...]float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}

// latencyHistogram is a Prometheus histogram updated with atomics only: the
// request path never takes a lock for it (VictoriaMetrics' histograms lock
// a mutex per update, which the profile showed under load).
type latencyHistogram struct {
	buckets [len(latencyBounds) + 1]atomic.Uint64 // last: +Inf
	sumNs   atomic.Uint64
}

func (h *latencyHistogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(latencyBounds) && s > latencyBounds[i] {
		i++
	}
	h.buckets[i].Add(1)
	h.sumNs.Add(uint64(max(d, 0)))
}

// write emits the histogram in Prometheus text format; labels is the label
// set without braces, e.g. `route="/v1/chat/completions"`.
func (h *latencyHistogram) write(w io.Writer, name, labels string) {
	var cum uint64
	for i, b := range latencyBounds {
		cum += h.buckets[i].Load()
		fmt.Fprintf(w, "%s_bucket{%s,le=\"%g\"} %d\n", name, labels, b, cum)
	}
	cum += h.buckets[len(latencyBounds)].Load()
	fmt.Fprintf(w, "%s_bucket{%s,le=\"+Inf\"} %d\n", name, labels, cum)
	fmt.Fprintf(w, "%s_sum{%s} %g\n", name, labels, float64(h.sumNs.Load())/1e9)
	fmt.Fprintf(w, "%s_count{%s} %d\n", name, labels, cum)
}
