package fastproxy

import (
	"strconv"
	"time"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// failure says why an attempt failed, in words a client may see (kind) and
// with what the worker said (status, Retry-After); the worker's address and
// the raw error stay in the log.
type failure struct {
	kind       string
	status     int    // the worker's status, for kindStatus and kindBackpressure
	retryAfter string // the worker's Retry-After, for kindBackpressure
	detail     string // for the log only
}

// retryDecision is what the failed attempts of one request said so far, and
// decides after each whether another worker may serve it (docs/design.md
// §8.2, "faults are classified"):
//   - connect errors, first-byte timeouts, resets and unparseable answers
//     are the worker's fault: counted toward its breaker (classify), failed
//     over;
//   - 429 and 503 are back pressure: never counted, failed over, and passed
//     through with the worker's Retry-After when every worker tried pushed
//     back (a busy worker between two others' faults does not hide them);
//   - 408, 500, 502, 504 fail over; the same status from two workers is the
//     request's fault, answered with that status and counted against
//     neither; otherwise each is counted against its worker.
type retryDecision struct {
	tried            []*loadview.Worker
	last             route.Choice // the choice of the latest attempt
	lastFail         failure      // the latest failure that was not back pressure
	backpressure     failure      // the latest back pressure
	lastStatus       int          // the status of the latest kindStatus failure, whatever came between
	onlyBackpressure bool         // every failed attempt so far was back pressure
	suspect          *loadview.Worker
}

// tryAgain records the failure f of w's attempt and reports whether another
// worker may serve the request: false when w failed it with the same status
// as the worker before, which makes the request the cause.
func (d *retryDecision) tryAgain(reg *loadview.Registry, w *loadview.Worker, f failure) bool {
	if f.kind != kindBackpressure {
		d.onlyBackpressure = false
	}
	switch f.kind {
	case kindBackpressure:
		d.backpressure = f
		return true // says nothing about the request or the other workers
	case kindStatus:
		if d.lastStatus == f.status && d.suspect != nil {
			d.suspect = nil // counted against neither
			return false
		}
		d.charge(reg)
		d.suspect, d.lastStatus = w, f.status
	default:
		d.charge(reg)
	}
	d.lastFail = f
	return true
}

// charge counts a pending status failure against its worker: the attempts
// that followed did not show the request to be the cause. It is an answer
// the worker gave, which never ejects a model's last healthy worker.
func (d *retryDecision) charge(reg *loadview.Registry) {
	if d.suspect != nil {
		reg.RecordAnswerFailure(d.suspect)
		d.suspect = nil
	}
}

// statusFailure classifies a worker status that is worth another worker.
func statusFailure(code int, retryAfter []byte) (failure, bool) {
	switch code {
	case 429, 503:
		return failure{kind: kindBackpressure, status: code, retryAfter: validRetryAfter(retryAfter)}, true
	case 408, 500, 502, 504:
		return failure{kind: kindStatus, status: code}, true
	}
	return failure{}, false
}

// validRetryAfter passes on a worker's Retry-After only in one of its two
// valid forms (delay seconds, HTTP date); anything else is dropped.
func validRetryAfter(v []byte) string {
	if len(v) == 0 || len(v) > 64 {
		return ""
	}
	if n, err := strconv.Atoi(string(v)); err == nil && n >= 0 {
		return string(v)
	}
	if _, err := time.Parse(time.RFC1123, string(v)); err == nil {
		return string(v)
	}
	return ""
}
