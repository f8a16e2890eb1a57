package saar

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// Replay ring bounds (Options.RingSize, Options.RingBytes,
// Options.RingTextBytes).
const (
	// DefaultRingSize is the default number of records kept in memory.
	DefaultRingSize = 4096
	// DefaultRingBytes is the default bound on the ring's estimated bytes.
	DefaultRingBytes = 8 << 20
	// DefaultRingTextBytes is the default cap on a ring record's latest
	// user text.
	DefaultRingTextBytes = 1024
	// RingFieldBytes caps every other client-influenced string of a ring
	// record (session key, header values, worker and owner names).
	RingFieldBytes = 256
)

const maxRingShards = 16

// ring keeps the most recent records for /v1/router_replay, bounded in
// count and in estimated bytes. It is sharded by sequence number (seq mod
// shards), so concurrent Selects rarely share a lock; each shard's lock is
// held only to store a pointer and adjust its byte count (clipping and
// allocation happen before). Records copies the shards and sorts by Seq.
type ring struct {
	shards   []ringShard
	mask     uint64
	textCap  int
	perBytes int
}

type ringSlot struct {
	rec  *Record
	size int
}

type ringShard struct {
	mu    sync.Mutex
	slots []ringSlot // circular
	head  int        // oldest
	n     int
	bytes int
	_     [64]byte // keep shards on separate cache lines
}

// newRing returns a ring of size records (> 0) and maxBytes estimated
// bytes; textCap < 0 keeps no text.
func newRing(size, maxBytes, textCap int) *ring {
	// As many shards (a power of two ≤ 16) as divide size with at least 16
	// records each, so that the union of the shards is exactly the last
	// size records when the byte bound is not reached.
	n := maxRingShards
	for n > 1 && (size%n != 0 || size/n < 16) {
		n /= 2
	}
	g := &ring{shards: make([]ringShard, n), mask: uint64(n - 1), textCap: max(textCap, 0), perBytes: max(maxBytes/n, 1)}
	for i := range g.shards {
		g.shards[i].slots = make([]ringSlot, size/n)
	}
	return g
}

// put stores rec (never modified afterwards) of size bytes. A record larger
// than a shard's byte share is not kept.
func (g *ring) put(rec *Record, size int) {
	s := &g.shards[rec.Seq&g.mask]
	if size > g.perBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A shard is kept in Seq order, oldest at head. Concurrent Selects may
	// arrive a little out of order: a record older than everything a full
	// shard holds is not kept, any other goes to its place by Seq.
	if s.n == len(s.slots) && s.slots[s.head].rec.Seq > rec.Seq {
		return
	}
	for s.n > 0 && (s.n == len(s.slots) || s.bytes+size > g.perBytes) {
		old := &s.slots[s.head]
		s.bytes -= old.size
		*old = ringSlot{}
		s.head = (s.head + 1) % len(s.slots)
		s.n--
	}
	i := (s.head + s.n) % len(s.slots)
	s.slots[i] = ringSlot{rec, size}
	for j := s.n; j > 0; j-- { // insertion step: almost always zero iterations
		prev := (i - 1 + len(s.slots)) % len(s.slots)
		if s.slots[prev].rec.Seq < rec.Seq {
			break
		}
		s.slots[prev], s.slots[i] = s.slots[i], s.slots[prev]
		i = prev
	}
	s.n++
	s.bytes += size
}

// usage returns the records kept and their estimated bytes.
func (g *ring) usage() (n, bytes int) {
	for i := range g.shards {
		s := &g.shards[i]
		s.mu.Lock()
		n += s.n
		bytes += s.bytes
		s.mu.Unlock()
	}
	return n, bytes
}

// records returns up to limit of the most recent records of session (""
// all), oldest first.
func (g *ring) records(session string, limit int) []Record {
	if session != "" {
		session = clipField(session)
	}
	var ptrs []*Record
	for i := range g.shards {
		s := &g.shards[i]
		s.mu.Lock()
		for j := 0; j < s.n; j++ {
			if rec := s.slots[(s.head+j)%len(s.slots)].rec; session == "" || rec.Session == session {
				ptrs = append(ptrs, rec)
			}
		}
		s.mu.Unlock()
	}
	slices.SortFunc(ptrs, func(a, b *Record) int {
		switch {
		case a.Seq < b.Seq:
			return -1
		case a.Seq > b.Seq:
			return 1
		}
		return 0
	})
	if limit > 0 && len(ptrs) > limit {
		ptrs = ptrs[len(ptrs)-limit:]
	}
	if len(ptrs) == 0 {
		return nil
	}
	out := make([]Record, len(ptrs))
	for i, p := range ptrs {
		out[i] = *p
	}
	return out
}

// record returns the record of id (prefix + seq).
func (g *ring) record(prefix, id string) (Record, bool) {
	seq, err := strconv.ParseUint(strings.TrimPrefix(id, prefix), 10, 64)
	if err != nil || !strings.HasPrefix(id, prefix) {
		return Record{}, false
	}
	s := &g.shards[seq&g.mask]
	s.mu.Lock()
	defer s.mu.Unlock()
	for j := 0; j < s.n; j++ {
		if rec := s.slots[(s.head+j)%len(s.slots)].rec; rec.Seq == seq && rec.ID == id {
			return *rec, true
		}
	}
	return Record{}, false
}

// clipStr returns s cut to at most n bytes on a UTF-8 boundary, copied so
// that the result does not keep s's memory alive.
func clipStr(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.Clone(s[:n]), true
}

func clipField(s string) string { s, _ = clipStr(s, RingFieldBytes); return s }

// forRing returns the copy of rec the ring keeps: the latest user text cut
// to textCap bytes, every other client-influenced string to RingFieldBytes
// (Record.Clipped is set when anything was cut), and its estimated size.
// rec itself is returned when nothing needs cutting. Strings that come from
// the config (model, decision, phase, reason names) are kept as they are.
func (g *ring) forRing(rec *Record) (*Record, int) {
	if fits(rec, g.textCap) {
		return rec, recordBytes(rec)
	}
	c := *rec
	c.Clipped = true
	c.Session = clipField(rec.Session)
	in := &c.Inputs
	in.Text, _ = clipStr(in.Text, g.textCap)
	in.ToolResultID = clipField(in.ToolResultID)
	in.ToolOwner = clipField(in.ToolOwner)
	in.PreviousResponseID = clipField(in.PreviousResponseID)
	in.StateModel = clipField(in.StateModel)
	in.StateWorker = clipField(in.StateWorker)
	in.ReasoningEffort = clipField(in.ReasoningEffort)
	if len(in.Headers) > 0 {
		in.Headers = slices.Clone(in.Headers)
		for i := range in.Headers {
			in.Headers[i].Value = clipField(in.Headers[i].Value)
		}
	}
	if len(in.WorkersDown) > 0 {
		in.WorkersDown = slices.Clone(in.WorkersDown)
		for i := range in.WorkersDown {
			in.WorkersDown[i] = clipField(in.WorkersDown[i])
		}
	}
	if rec.Memory != nil {
		m := *rec.Memory
		m.Worker = clipField(m.Worker)
		m.Model, m.Lock = clipField(m.Model), clipField(m.Lock)
		c.Memory = &m
	}
	c.Outcome.PinnedWorker = clipField(c.Outcome.PinnedWorker)
	c.Outcome.LockModel = clipField(c.Outcome.LockModel)
	c.Outcome.Model = clipField(c.Outcome.Model)
	return &c, recordBytes(&c)
}

// fits reports whether rec needs no cutting for the ring.
func fits(rec *Record, textCap int) bool {
	in := &rec.Inputs
	if len(in.Text) > textCap {
		return false
	}
	for _, s := range [...]string{rec.Session, in.ToolResultID, in.ToolOwner, in.PreviousResponseID, in.StateModel,
		in.StateWorker, in.ReasoningEffort, rec.Outcome.PinnedWorker, rec.Outcome.LockModel, rec.Outcome.Model} {
		if len(s) > RingFieldBytes {
			return false
		}
	}
	for i := range in.Headers {
		if len(in.Headers[i].Value) > RingFieldBytes {
			return false
		}
	}
	for _, w := range in.WorkersDown {
		if len(w) > RingFieldBytes {
			return false
		}
	}
	if m := rec.Memory; m != nil && (len(m.Worker) > RingFieldBytes || len(m.Model) > RingFieldBytes || len(m.Lock) > RingFieldBytes) {
		return false
	}
	return true
}

// recordBytes estimates the memory a ring record holds: its structs plus
// the bytes of its strings and slices (config strings counted too, so the
// estimate is an upper bound).
func recordBytes(rec *Record) int {
	in := &rec.Inputs
	n := int(unsafe.Sizeof(*rec)) + len(rec.ID) + len(rec.Session) +
		len(in.Logical) + len(in.Text) + len(in.ToolResultID) + len(in.ToolOwner) + len(in.ToolOwnerSource) +
		len(in.PreviousResponseID) + len(in.StateModel) + len(in.StateWorker) + len(in.StateSource) + len(in.ReasoningEffort)
	for i := range in.Headers {
		n += int(unsafe.Sizeof(in.Headers[i])) + len(in.Headers[i].Name) + len(in.Headers[i].Value)
	}
	for _, s := range in.ModelsDown {
		n += int(unsafe.Sizeof(s)) + len(s)
	}
	for _, s := range in.WorkersDown {
		n += int(unsafe.Sizeof(s)) + len(s)
	}
	if m := rec.Memory; m != nil {
		n += int(unsafe.Sizeof(*m)) + len(m.Model) + len(m.Worker) + len(m.Decision) + len(m.Phase) + len(m.Lock)
	}
	o := &rec.Outcome
	n += len(o.Model) + len(o.Decision) + len(o.Phase) + len(o.Action) + len(o.Reason) + len(o.PinnedWorker) +
		len(o.LockKind) + len(o.LockModel) + len(o.ComplexitySource)
	for i := range o.Scores {
		n += int(unsafe.Sizeof(o.Scores[i])) + len(o.Scores[i].Model)
	}
	return n
}
