package reqview

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bytedance/sonic"
	"github.com/bytedance/sonic/encoder"
)

// Benchmarks of Parse on realistic agentic chat bodies (SampleChatBodyOfSize:
// a system prompt of min(6 KB, size/8), three tool schemas, then user turns
// answered by tool calls, JSON tool results full of escaped quotes, and
// assistant replies), with the baselines in the same file:
//   - SonicValid: sonic's validator alone, the bar of docs/design.md §7
//     (Parse validates in its own single pass and must keep up with it);
//   - SonicGetModel: sonic.Get of "model" only (what a minimal router does;
//     it does not validate the rest of the body);
//   - SonicUnmarshal: a full sonic.Unmarshal into a map (what we avoid).
//   - Maphash (View64KB): hash/maphash over the body, reading it once at
//     hash speed: the least a router pays to prove a resent history
//     unchanged instead of parsing it again (docs/design.md §7, "Closing
//     the end-to-end gap").
//
// BenchmarkView64KB puts the §7 comparison side by side: Parse (Chat),
// Parse (Other: model and session fields), ParseModel, and sonic's validator, on
// the same 64 KB agent body. Compare within one run only:
//
//	go test -run=^$ -bench=View64KB -benchmem -count=6 ./reqview
//
// Run all: go test -run=^$ -bench=. -benchmem -benchtime=200ms ./reqview

var benchSizes = []int{1 << 10, 16 << 10, 64 << 10, 1 << 20}

func benchName(size int) string {
	if size >= 1<<20 {
		return fmt.Sprintf("%dMB", size>>20)
	}
	return fmt.Sprintf("%dKB", size>>10)
}

var sinkInt int

// benchOp runs op once per iteration on body, reporting bytes/s (of body)
// and allocations.
func benchOp(b *testing.B, body []byte, op func() error) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchEachSize runs op (benchOp) on the body bodyOf returns for each of
// benchSizes, each size with a View of its own.
func benchEachSize(b *testing.B, bodyOf func(size int) []byte, op func(v *View, body []byte) error) {
	for _, size := range benchSizes {
		body := bodyOf(size)
		b.Run(benchName(size), func(b *testing.B) {
			var v View
			benchOp(b, body, func() error { return op(&v, body) })
			sinkInt += len(v.History)
		})
	}
}

// sonicValid is sonic's validator as an op: an error where the body breaks.
func sonicValid(body []byte) error {
	if ok, off := encoder.Valid(body); !ok {
		return malformed(off)
	}
	return nil
}

// sonicGetModel is sonic.Get of "model" alone, as an op.
func sonicGetModel(body []byte) error {
	n, err := sonic.Get(body, "model")
	if err == nil {
		var s string
		s, err = n.String()
		sinkInt += len(s)
	}
	return err
}

func BenchmarkParse(b *testing.B) {
	benchEachSize(b, SampleChatBodyOfSize, func(v *View, body []byte) error { return Parse(v, body, Chat) })
}

func BenchmarkView64KB(b *testing.B) {
	body := SampleChatBodyOfSize(64 << 10)
	run := func(name string, op func() error) {
		b.Run(name, func(b *testing.B) { benchOp(b, body, op) })
	}
	var v View
	run("Parse", func() error { return Parse(&v, body, Chat) })
	run("ParseOther", func() error { return Parse(&v, body, Other) })
	run("ParseModel", func() error { return ParseModel(&v, body) })
	run("SonicValid", func() error { return sonicValid(body) })
	seed := maphash.MakeSeed()
	run("Maphash", func() error {
		sinkInt += int(maphash.Bytes(seed, body) & 1)
		return nil
	})
	run("SonicGetModel", func() error { return sonicGetModel(body) })
}

func BenchmarkParseModel(b *testing.B) {
	benchEachSize(b, SampleChatBodyOfSize, func(v *View, body []byte) error { return ParseModel(v, body) })
}

func BenchmarkSonicValid(b *testing.B) {
	benchEachSize(b, SampleChatBodyOfSize, func(_ *View, body []byte) error { return sonicValid(body) })
}

func BenchmarkSonicGetModel(b *testing.B) {
	benchEachSize(b, SampleChatBodyOfSize, func(_ *View, body []byte) error { return sonicGetModel(body) })
}

func BenchmarkSonicUnmarshal(b *testing.B) {
	benchEachSize(b, SampleChatBodyOfSize, func(_ *View, body []byte) error {
		var m map[string]any
		err := sonic.Unmarshal(body, &m)
		sinkInt += len(m)
		return err
	})
}

// zeroWorkAnswer is the fixed answer of simworker --zero-work (its
// zeroWorkBody, model sample-model): what the load test's proxies learn
// from on every request.
const zeroWorkAnswer = `{"id":"chatcmpl-zero-work","object":"chat.completion","created":1700000000,"model":"sample-model","choices":[{"index":0,"message":{"role":"assistant","content":"zero-work mode: body not parsed."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":16,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":0}}}`

// BenchmarkScanUsage: ScanResponse against ScanUsage, which the cache-aware
// policy alone needs, on the load test's answer and on a tool call.
func BenchmarkScanUsage(b *testing.B) {
	for _, c := range []struct{ name, body string }{{"zerowork", zeroWorkAnswer}, {"toolcall", toolCallAnswer}} {
		body := []byte(c.body)
		for _, f := range []struct {
			name string
			scan func(*Learned, []byte) error
		}{{"ScanResponse", ScanResponse}, {"ScanUsage", ScanUsage}} {
			b.Run(c.name+"/"+f.name, func(b *testing.B) {
				var l Learned
				benchOp(b, body, func() error {
					l.Reset()
					if err := f.scan(&l, body); err != nil || !l.HasUsage {
						return fmt.Errorf("%v, usage learned: %v", err, l.HasUsage)
					}
					return nil
				})
			})
		}
	}
}

// toolCallAnswer is a chat completion that calls one tool.
const toolCallAnswer = `{"id":"chatcmpl-abc123","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"search","arguments":"{\"query\":\"x\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":15000,"completion_tokens":20,"total_tokens":15020,"prompt_tokens_details":{"cached_tokens":14800}}}`

func BenchmarkScanResponse(b *testing.B) {
	body := []byte(toolCallAnswer)
	var l Learned
	benchOp(b, body, func() error {
		l.Reset()
		return ScanResponse(&l, body)
	})
}

// proseChatBody is a chat body of about size bytes made of long plain-text
// turns (a 6 KB system prompt, user/assistant prose with a newline every line,
// few quotes): the shape of ordinary chat, as opposed to SampleChatBody's
// escape-dense agentic tool results.
func proseChatBody(size int) []byte {
	line := "The router keeps each session on a warm worker so that the prefix cache stays hot.\n"
	text := func(n int) string { return strings.Repeat(line, max(1, n/len(line))) }
	msgs := []map[string]string{{"role": "system", "content": text(min(6<<10, size/8))}}
	for k := 0; ; k++ {
		b, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": msgs})
		if len(b) >= size {
			return b
		}
		role := "user"
		if k%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": text(600 + 300*(k%5))})
	}
}

func BenchmarkParseProse(b *testing.B) {
	for _, size := range benchSizes {
		body := proseChatBody(size)
		b.Run(benchName(size), func(b *testing.B) {
			var v View
			benchOp(b, body, func() error { return Parse(&v, body, Chat) })
		})
		b.Run(benchName(size)+"/SonicValid", func(b *testing.B) {
			benchOp(b, body, func() error { return sonicValid(body) })
		})
	}
}

// BenchmarkView64KBBestOf times single calls of Parse (Chat) and of
// sonic's validator on the 64 KB agent body, one of each in turn, and
// reports each one's best call (parse-best-ns, sonic-best-ns, in GB/s too)
// and Parse's speed relative to sonic's validator by best call and by
// median (x-sonic-best, x-sonic-median; above 1: Parse is faster), the
// comparison of docs/design.md §7. On a shared, loaded machine the best
// single call is stable where -bench averages swing; ns/op is one pair.
//
//	go test -run=^$ -bench=View64KBBestOf -benchtime=4000x ./reqview
func BenchmarkView64KBBestOf(b *testing.B) {
	body := SampleChatBodyOfSize(64 << 10)
	var v View
	var tp, ts []time.Duration
	for b.Loop() {
		a := time.Now()
		if err := Parse(&v, body, Chat); err != nil {
			b.Fatal(err)
		}
		tp = append(tp, time.Since(a))
		a = time.Now()
		if ok, _ := encoder.Valid(body); !ok {
			b.Fatal("invalid")
		}
		ts = append(ts, time.Since(a))
	}
	slices.Sort(tp)
	slices.Sort(ts)
	gbs := func(d time.Duration) float64 { return float64(len(body)) / float64(d.Nanoseconds()) }
	b.ReportMetric(float64(tp[0].Nanoseconds()), "parse-best-ns")
	b.ReportMetric(float64(ts[0].Nanoseconds()), "sonic-best-ns")
	b.ReportMetric(gbs(tp[0]), "parse-GB/s")
	b.ReportMetric(gbs(ts[0]), "sonic-GB/s")
	b.ReportMetric(float64(ts[0])/float64(tp[0]), "x-sonic-best")
	b.ReportMetric(float64(ts[len(ts)/2])/float64(tp[len(tp)/2]), "x-sonic-median")
}

// BenchmarkParseViewsInFlight parses the 64 KB agent body into 1 or 64
// Views in turn, a request's worth of other memory (a body's size) written
// between two parses: with 64 Views, as when each request in flight on a
// core holds its own until its answer, every parse writes its key into
// memory that has left the cache. The router hands a View back as soon as
// the choice is made (fastproxy dropView, docs/design.md §7).
func BenchmarkParseViewsInFlight(b *testing.B) {
	body := SampleChatBodyOfSize(64 << 10)
	other := make([]byte, 64*len(body)) // the other requests' bodies
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("views=%d", n), func(b *testing.B) {
			vs := make([]View, n)
			for k := range vs { // warmed: their buffers grown
				if err := Parse(&vs[k], body, Chat); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := Parse(&vs[i%n], body, Chat); err != nil {
					b.Fatal(err)
				}
				o := other[(i%64)*len(body):][:len(body)]
				for j := 0; j < len(o); j += 64 {
					o[j]++
				}
				i++
			}
		})
	}
}
