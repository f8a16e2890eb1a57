package loadview

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"unsafe"
)

// Series of a vLLM /metrics exposition that the load scrape reads
// (docs/design.md §8.3). vllm:gpu_cache_usage_perc is the name vLLM used
// before kv_cache_usage_perc.
var (
	nameRunning = []byte("vllm:num_requests_running")
	nameWaiting = []byte("vllm:num_requests_waiting")
	nameKV      = []byte("vllm:kv_cache_usage_perc")
	nameKVOld   = []byte("vllm:gpu_cache_usage_perc")
	// The KV capacity an engine states (docs/design.md §4, "The tree's
	// budget"): vLLM's info gauge, whose labels num_gpu_blocks and
	// block_size multiply to tokens, and SGLang's token pool size.
	nameCacheConfig = []byte("vllm:cache_config_info")
	nameSGLTokens   = []byte("sglang:max_total_num_tokens")
	// A decode worker of a disaggregated fleet counts the KV transfers it
	// could not load (its blocks were gone: it recomputed them) in vLLM's
	// NIXL connector counter (docs/design.md §9).
	nameKVLoadFails = []byte("vllm:nixl_num_failed_transfers_total")
)

const (
	seenRunning = 1 << iota
	seenWaiting
	seenKV
	seenCapVLLM // a vllm:cache_config_info series with both numbers
	seenCapSGL  // an sglang:max_total_num_tokens series
	seenKVFails // a vllm:nixl_num_failed_transfers_total series
)

// maxReportedRequests bounds a reported running or waiting count: larger
// sums are garbage, not load.
const maxReportedRequests = 1 << 30

// Bounds of a stated capacity: a block of more tokens, more blocks, or a
// total of more tokens than these is garbage, not a cache.
const (
	maxBlockSize      = 1 << 16
	maxGPUBlocks      = 1 << 32
	maxCapacityTokens = 1 << 40
)

// engineLoad is what an exposition says about one engine, or about all.
type engineLoad struct {
	running, waiting float64 // summed over models (and engines, in the total)
	kv               float64 // the largest usage seen (engines share nothing, models share the cache)
	capVLLM          float64 // num_gpu_blocks × block_size, summed over cache_config_info series (engines)
	capSGL           float64 // the largest sglang:max_total_num_tokens (ranks of one pool repeat it)
	kvFails          float64 // vllm:nixl_num_failed_transfers_total, summed over engines
	seen             uint8   // seenRunning | seenWaiting | seenKV | seenCapVLLM | seenCapSGL | seenKVFails
}

// capacityTokens is the KV capacity in tokens the engine states, vLLM's
// before SGLang's; 0 when it states none.
func (e *engineLoad) capacityTokens() int64 {
	switch {
	case e.seen&seenCapVLLM != 0:
		return int64(e.capVLLM)
	case e.seen&seenCapSGL != 0:
		return int64(e.capSGL)
	}
	return 0
}

// cacheLabels are the labels of a vllm:cache_config_info series that state
// the capacity; -1 when absent or not a number (vLLM writes "None" before
// the cache is sized).
type cacheLabels struct {
	blocks, blockSize int64
}

// vllmLoad is the parsed load of one /metrics exposition: the total, and per
// engine (vLLM's data-parallel rank, label engine="N") when labelled.
type vllmLoad struct {
	total    engineLoad
	engines  bool // some series carried an engine label
	byEngine []engineLoad
}

var errBadExposition = errors.New("malformed vllm load series")

// parseVLLMLoad scans a Prometheus text exposition for num_requests_running,
// num_requests_waiting and kv_cache_usage_perc, summing the counts over
// every label set (models, engines) and keeping the largest KV usage; and
// for the capacity the engine states: vllm:cache_config_info's
// num_gpu_blocks × block_size summed over series (one per engine), else the
// largest sglang:max_total_num_tokens. A cache_config_info series whose two
// labels are not both decimal numbers (vLLM's "None") states nothing; a
// capacity beyond the bounds above is an error. Series
// labelled engine="N" with N < len(out.byEngine) are also added to
// out.byEngine[N]. Other series, comments (# HELP, # TYPE) and blank lines are
// skipped unread. A line of one of those series that is malformed, or whose
// value is NaN, infinite, negative or too large (a KV usage above 1), makes
// the whole exposition an error: a partial sum would under-report. It never
// allocates.
func parseVLLMLoad(body []byte, out *vllmLoad) error {
	out.total = engineLoad{}
	out.engines = false
	for i := range out.byEngine {
		out.byEngine[i] = engineLoad{}
	}
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		line = trimSpace(line)
		if len(line) == 0 || line[0] != 'v' && line[0] != 's' { // comments, other series
			continue
		}
		var which uint8
		var rest []byte
		var info *cacheLabels
		var cl cacheLabels
		switch {
		case hasName(line, nameCacheConfig):
			which, rest, info = seenCapVLLM, line[len(nameCacheConfig):], &cl
		case hasName(line, nameSGLTokens):
			which, rest = seenCapSGL, line[len(nameSGLTokens):]
		case hasName(line, nameKVLoadFails):
			which, rest = seenKVFails, line[len(nameKVLoadFails):]
		case hasName(line, nameRunning):
			which, rest = seenRunning, line[len(nameRunning):]
		case hasName(line, nameWaiting):
			which, rest = seenWaiting, line[len(nameWaiting):]
		case hasName(line, nameKV):
			which, rest = seenKV, line[len(nameKV):]
		case hasName(line, nameKVOld):
			which, rest = seenKV, line[len(nameKVOld):]
		default:
			continue
		}
		rest = trimSpace(rest)
		engine, labelled := -1, false
		if len(rest) > 0 && rest[0] == '{' {
			var err error
			if rest, engine, labelled, err = scanLabels(rest[1:], info); err != nil {
				return err
			}
			rest = trimSpace(rest)
		}
		tok := rest
		if i := bytes.IndexAny(rest, " \t"); i >= 0 {
			tok = rest[:i] // a timestamp may follow; it is ignored
		}
		v, ok := parseValue(tok)
		switch {
		case !ok:
			return errBadExposition
		case which == seenCapVLLM:
			if info == nil || cl.blocks < 0 || cl.blockSize < 0 {
				continue // states nothing
			}
			if cl.blocks > maxGPUBlocks || cl.blockSize > maxBlockSize {
				return errBadExposition
			}
			v = float64(cl.blocks * cl.blockSize)
		case which == seenCapSGL || which == seenKVFails:
			if v > maxCapacityTokens {
				return errBadExposition
			}
		case which == seenKV && v > 1 || which != seenKV && v > maxReportedRequests:
			return errBadExposition
		default:
			out.engines = out.engines || labelled // only the load series split a URL's ranks
		}
		out.total.add(which, v)
		if engine >= 0 && engine < len(out.byEngine) {
			out.byEngine[engine].add(which, v)
		}
	}
	if out.total.running > maxReportedRequests || out.total.waiting > maxReportedRequests || out.total.capVLLM > maxCapacityTokens {
		return errBadExposition
	}
	return nil
}

func (e *engineLoad) add(which uint8, v float64) {
	e.seen |= which
	switch which {
	case seenRunning:
		e.running += v
	case seenWaiting:
		e.waiting += v
	case seenCapVLLM:
		e.capVLLM += v
	case seenCapSGL:
		e.capSGL = max(e.capSGL, v)
	case seenKVFails:
		e.kvFails += v
	default:
		e.kv = max(e.kv, v)
	}
}

// hasName reports whether line starts with the metric name followed by a
// label set, a blank or nothing.
func hasName(line, name []byte) bool {
	if !bytes.HasPrefix(line, name) {
		return false
	}
	if len(line) == len(name) {
		return true
	}
	c := line[len(name)]
	return c == '{' || c == ' ' || c == '\t'
}

// scanLabels reads label pairs after '{' up to the closing '}' and returns
// what follows it, the value of an engine label when it is a small decimal
// number (-1 otherwise), and whether an engine label was present. With info
// it also reads num_gpu_blocks and block_size into it (-1 when absent or not
// a decimal number).
func scanLabels(b []byte, info *cacheLabels) (rest []byte, engine int, labelled bool, err error) {
	engine = -1
	if info != nil {
		info.blocks, info.blockSize = -1, -1
	}
	for {
		b = trimSpace(b)
		if len(b) == 0 {
			return nil, -1, false, errBadExposition
		}
		if b[0] == '}' {
			return b[1:], engine, labelled, nil
		}
		eq := bytes.IndexByte(b, '=')
		if eq <= 0 {
			return nil, -1, false, errBadExposition
		}
		name := trimSpace(b[:eq])
		b = trimSpace(b[eq+1:])
		if len(b) == 0 || b[0] != '"' {
			return nil, -1, false, errBadExposition
		}
		// The value runs to the first '"' not escaped by a backslash.
		end := -1
		for i := 1; i < len(b); i++ {
			if b[i] == '\\' {
				i++
				continue
			}
			if b[i] == '"' {
				end = i
				break
			}
		}
		if end < 0 {
			return nil, -1, false, errBadExposition
		}
		switch {
		case string(name) == "engine":
			labelled = true
			engine = smallInt(b[1:end])
		case info != nil && string(name) == "num_gpu_blocks":
			info.blocks = decimal(b[1:end])
		case info != nil && string(name) == "block_size":
			info.blockSize = decimal(b[1:end])
		}
		b = trimSpace(b[end+1:])
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		} else if len(b) == 0 || b[0] != '}' {
			return nil, -1, false, errBadExposition
		}
	}
}

// smallInt parses 1 to 6 decimal digits, or returns -1.
func smallInt(b []byte) int {
	if len(b) == 0 || len(b) > 6 {
		return -1
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// decimal parses 1 to 12 decimal digits, or returns -1.
func decimal(b []byte) int64 {
	if len(b) == 0 || len(b) > 12 {
		return -1
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// parseValue parses a sample value: finite and not negative.
func parseValue(tok []byte) (float64, bool) {
	if len(tok) == 0 || len(tok) > 64 {
		return 0, false
	}
	// The string does not outlive the call (the error, if any, is dropped).
	v, err := strconv.ParseFloat(unsafe.String(&tok[0], len(tok)), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
