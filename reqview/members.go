package reqview

// Members calls f with each member of the top-level JSON object body, in
// order: its key, unescaped (valid until f returns), and the spans of the
// member, body[from:end] (the key's opening quote to the value's end), and
// of its value, body[start:end]; f returns false to stop. It reports
// whether body is one object it walked to its end (or f stopped). Like the
// rest of the scan it delimits strings without checking their escapes:
// give it a body already validated. It never allocates: it is how the
// router rewrites a request's top-level fields without parsing it into a
// tree (the legs of a disaggregated request, docs/design.md §9).
func Members(body []byte, f func(key []byte, from, start, end int) bool) bool {
	var it objIter
	bad := -1
	i := skipWS(body, 0)
	if i < 0 || i >= len(body) {
		return false
	}
	it.init(body, i, &bad, 0)
	for it.next() {
		from := cap(body) - cap(it.key) - 1 // it.key is body[from+1 : …]
		start := it.val
		it.skip()
		if it.i < 0 {
			return false
		}
		if !f(it.name(), from, start, it.i) {
			return true
		}
	}
	if it.i < 0 {
		return false
	}
	return skipWS(body, it.i) == len(body)
}
