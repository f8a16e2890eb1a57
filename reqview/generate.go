package reqview

// /inference/v1/generate (docs/design.md §8.4): vLLM's tokens-in,
// tokens-out endpoint, {"model"?, "token_ids": [...], "sampling_params":
// {...}, "stream"?, ...}. Its history key is the token ids in canonical
// form: each element's raw JSON bytes followed by a comma, no whitespace
// ("1,2,3,"), so two spellings of one array give one key, and a request
// whose token_ids extend another's has a key the other's is a prefix of
// (the trailing comma keeps [1,2,3] from matching [1,2,34]). An empty or
// absent array gives an empty key.

// parseTokenIDs writes the key of the "token_ids" array at i into hbuf and
// returns the index after it (-1 when malformed; 0 when not an array, for
// the caller to skip).
func (v *View) parseTokenIDs(b []byte, i int) int {
	v.hbuf = v.hbuf[:0]
	if b[i] != '[' {
		return 0
	}
	var it arrIter
	it.init(b, i, 2)
	for it.next() {
		e := skipValue(b, it.val, 2)
		if e < 0 {
			return -1
		}
		v.hbuf = append(v.hbuf, b[it.val:e]...)
		v.hbuf = append(v.hbuf, ',')
		it.i = e
	}
	return it.i
}

// samplingParams reads "max_tokens" of the "sampling_params" object at i
// and returns the index after it.
func (v *View) samplingParams(b []byte, i int) int {
	var it objIter
	it.init(b, i, &v.bad, 2)
	for it.next() {
		if string(it.name()) == "max_tokens" {
			v.MaxTokens = max(v.MaxTokens, intAt(b, it.val))
		}
		it.skip()
	}
	return it.i
}

// intAt returns the non-negative integer literal at i, or 0 when the value
// there is something else (a fraction, an exponent, a string); at most
// 1<<40. It does not validate: the caller skips the value.
func intAt(b []byte, i int) int {
	n, j := 0, i
	for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
		if n < 1<<40 {
			n = n*10 + int(b[j]-'0')
		}
	}
	if j == i || j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0
	}
	return min(n, 1<<40)
}
