package saar

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
)

// DefaultReplayQueue is the default number of records that may wait for
// the replay log writer (Options.ReplayQueue).
const DefaultReplayQueue = 4096

// replayBatchBytes is how much encoded JSON the writer gathers from records
// already queued before one Write.
const replayBatchBytes = 64 << 10

// replayLog writes records as JSON lines off the request path: Select
// queues a record without blocking (a full queue drops it, counted) and one
// goroutine encodes and writes, in queue order.
type replayLog struct {
	w      io.Writer
	mu     sync.RWMutex // read-held while queueing; Close write-holds it to close ch
	closed bool
	ch     chan *Record
	done   chan struct{}
	once   sync.Once

	dropped func() // counts one dropped record
	failed  func(n int)
}

func newReplayLog(w io.Writer, queue int, dropped func(), failed func(int)) *replayLog {
	l := &replayLog{w: w, ch: make(chan *Record, queue), done: make(chan struct{}), dropped: dropped, failed: failed}
	go l.run()
	return l
}

// enqueue queues rec (never modified afterwards); it never blocks on the
// writer.
func (l *replayLog) enqueue(rec *Record) {
	l.mu.RLock()
	ok := false
	if !l.closed {
		select {
		case l.ch <- rec:
			ok = true
		default:
		}
	}
	l.mu.RUnlock()
	if !ok {
		l.dropped()
	}
}

func (l *replayLog) run() {
	defer close(l.done)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for rec := range l.ch {
		buf.Reset()
		n, bad := 0, 0
		for {
			if enc.Encode(rec) != nil { // Encode writes nothing on error
				bad++
			} else {
				n++
			}
			if buf.Len() >= replayBatchBytes {
				break
			}
			var more bool
			select {
			case rec, more = <-l.ch:
			default:
			}
			if !more {
				break
			}
		}
		if bad > 0 {
			l.failed(bad)
		}
		if n > 0 {
			if _, err := l.w.Write(buf.Bytes()); err != nil {
				l.failed(n)
			}
		}
		if buf.Cap() > 4*replayBatchBytes {
			buf = bytes.Buffer{} // do not keep a huge buffer after a burst of large records
			enc = json.NewEncoder(&buf)
		}
	}
}

// close stops queueing, waits until every queued record is written and
// stops the writer.
func (l *replayLog) close() {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.ch)
		l.mu.Unlock()
	})
	<-l.done
}
