package sharedstate

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/internal/testwait"
)

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func open(tb testing.TB, cfg Config) (*Store, *logBuf) {
	tb.Helper()
	lb := &logBuf{}
	cfg.Logger = slog.New(slog.NewTextHandler(lb, nil))
	// Generous bounds: the tests run under -race on shared cores.
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = 2 * time.Second
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 2 * time.Second
	}
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = 2 * time.Second
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = 20 * time.Millisecond
	}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s, lb
}

func metricText(s *Store) string {
	var b bytes.Buffer
	s.Metrics().WritePrometheus(&b)
	return b.String()
}

func rawClient(tb testing.TB, r *redistest.Server) rueidis.Client {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr()}, DisableCache: true, TLSConfig: r.TLSConfig()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

func TestKeysAndCodecs(t *testing.T) {
	ns := keyPrefix("wr", 1)
	k := string(scopedKey(nil, ns, KindBinding, []byte("llama3:8b"), []byte("sess:1")))
	if k != "wr:v1:b:9:llama3:8b:sess:1" {
		t.Fatal(k)
	}
	if kind, m, s, ok := parseKey(ns, k); !ok || kind != KindBinding || m != "llama3:8b" || s != "sess:1" {
		t.Fatal(kind, m, s, ok)
	}
	if kind, m, id, ok := parseKey(ns, string(lockKey(nil, ns, KindToolCall, []byte("call_1")))); !ok || kind != KindToolCall || m != "" || id != "call_1" {
		t.Fatal(kind, m, id, ok)
	}
	for _, bad := range []string{"wr:v2:b:1:m:s", "wr:v1:b:9:m:s", "wr:v1:x:1:m:s", "wr:v1:b", "other"} {
		if _, _, _, ok := parseKey(ns, bad); ok {
			t.Fatal("parsed", bad)
		}
	}
	l := Lock{Model: "m:1", Worker: "http://w:8000"}
	if got, err := decodeLock(encodeLock(nil, l)); err != nil || got != l {
		t.Fatal(got, err)
	}
	if _, err := decodeLock([]byte{9, 1, 'a'}); err == nil {
		t.Fatal("bad lock decoded")
	}
	r := MemoryRecord{Model: "big", Worker: "http://w", Phase: "tool_loop", Turns: 7, LastEnd: -5, LastAccess: time.Now().UnixNano(), Demand: 0.25}
	enc := r.AppendEncode(nil)
	if string(enc[:len(memoryHeader)]) != memoryHeader || binary.LittleEndian.Uint64(enc[len(memoryHeader):]) != uint64(r.LastAccess) {
		t.Fatalf("record does not lead with its version: % x", enc)
	}
	got, err := DecodeMemoryRecord(enc)
	if err != nil || got != r {
		t.Fatal(got, err)
	}
	// A record from a later release with fields this one does not know.
	future := append(append([]byte{}, enc...), 30, 2, 'x', 'y', 60, 3, 90, 0, 0, 0, 0, 0, 0, 0, 0)
	if got, err := DecodeMemoryRecord(future); err != nil || got != r {
		t.Fatal(got, err)
	}
	if _, err := DecodeMemoryRecord(enc[:len(enc)-3]); err == nil {
		t.Fatal("truncated record decoded")
	}
}

// Two stores on one Redis are two replicas.
func TestBindingsAcrossReplicas(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	a, _ := open(t, Config{URL: r.URL()})
	b, _ := open(t, Config{URL: r.URL()})
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[string]int{}
	note := func(who string) func(Kind, string, string) {
		return func(k Kind, m, s string) { mu.Lock(); seen[fmt.Sprintf("%s %v %s %s", who, k, m, s)]++; mu.Unlock() }
	}
	a.OnInvalidate(note("a"))
	b.OnInvalidate(note("b"))
	got := func(who string) int { mu.Lock(); defer mu.Unlock(); return seen[who+" binding m:1 s1"] }
	model, sess := []byte("m:1"), []byte("s1")

	if !a.PublishBinding(model, sess, "http://w1", time.Hour) || a.Flush(ctx) != nil {
		t.Fatal("publish")
	}
	if w, ok, err := b.LookupBinding(ctx, model, sess); err != nil || !ok || w != "http://w1" {
		t.Fatal(w, ok, err)
	}
	if w, ok, err := b.LookupBinding(ctx, model, sess); err != nil || !ok || w != "http://w1" {
		t.Fatal(w, ok, err)
	}
	if !strings.Contains(metricText(b), `warmroute_redis_reads_total{cache="hit"} 1`) {
		t.Fatal("second lookup not served from the local cache:\n", metricText(b))
	}
	// a rebinds: b, which read the key, is told.
	a.PublishBinding(model, sess, "http://w2", time.Hour)
	testwait.Until(t, "b to be invalidated", func() bool { return got("b") >= 1 })
	if w, _, _ := b.LookupBinding(ctx, model, sess); w != "http://w2" {
		t.Fatal(w)
	}
	// Replicas as the router runs them: a local map, dropped on
	// invalidation, refilled through LookupBinding on a miss. Whoever
	// rebinds last, every replica converges on it.
	ra, rb := newReplica(a), newReplica(b)
	for i, w := range []string{"http://w3", "http://w4", "http://w5", "http://w6"} {
		writer, other := ra, rb
		if i%2 == 1 {
			writer, other = rb, ra
		}
		other.route(t, model, sess) // the other replica holds a local copy
		writer.bind(model, sess, w)
		testwait.Until(t, "the replicas to converge on "+w, func() bool {
			return ra.route(t, model, sess) == w && rb.route(t, model, sess) == w
		})
	}
	// TTL applied.
	raw := rawClient(t, r)
	if pttl, err := raw.Do(ctx, raw.B().Pttl().Key(a.Namespace()+"b:3:m:1:s1").Build()).AsInt64(); err != nil || pttl <= 0 || pttl > int64(time.Hour/time.Millisecond) {
		t.Fatal(pttl, err)
	}
	// Memory records.
	rec := (&MemoryRecord{Model: "big", Turns: 3}).AppendEncode(nil)
	a.PutMemory([]byte("auto"), sess, rec, time.Minute)
	a.Flush(ctx)
	if v, ok, err := b.GetMemory(ctx, []byte("auto"), sess); err != nil || !ok || !bytes.Equal(v, rec) {
		t.Fatal(v, ok, err)
	}
}

// A lock is visible to another replica as soon as PutLock returns, also
// when that replica looked the id up (and cached the miss) before.
func TestLocksVisibleImmediately(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	a, _ := open(t, Config{URL: r.URL()})
	b, _ := open(t, Config{URL: r.URL()})
	ctx := context.Background()
	ids := [][]byte{[]byte("call_1"), []byte("call_2"), []byte("call_3")}
	for i := 0; i < 50; i++ {
		id := []byte(fmt.Sprintf("resp_%d", i))
		if _, ok, err := b.GetLock(ctx, KindResponse, id); ok || err != nil {
			t.Fatal("lock before write", ok, err)
		}
		if err := a.PutLock(ctx, KindResponse, id, Lock{Model: "big", Worker: "http://w1"}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if l, ok, err := b.GetLock(ctx, KindResponse, id); !ok || err != nil || l != (Lock{Model: "big", Worker: "http://w1"}) {
			t.Fatal("lock not visible after PutLock returned", i, l, ok, err)
		}
	}
	ws := []LockWrite{{Kind: KindResponse, ID: []byte("resp_x"), Lock: Lock{Model: "small", Worker: "http://w2"}}}
	for _, id := range ids {
		ws = append(ws, LockWrite{Kind: KindToolCall, ID: id, Lock: Lock{Model: "small"}})
	}
	if err := a.PutLocks(ctx, ws, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if l, ok, err := b.GetLock(ctx, KindToolCall, id); !ok || err != nil || l.Model != "small" {
			t.Fatal(string(id), l, ok, err)
		}
		if _, ok, _ := b.GetLock(ctx, KindReasoning, id); ok {
			t.Fatal("kinds share keys")
		}
	}
	if l, ok, err := b.GetLock(ctx, KindResponse, []byte("resp_x")); !ok || err != nil || l.Worker != "http://w2" {
		t.Fatal(l, ok, err)
	}
	raw := rawClient(t, r)
	if pttl, err := raw.Do(ctx, raw.B().Pttl().Key(a.Namespace()+"t:call_1").Build()).AsInt64(); err != nil || pttl <= 0 || pttl > 1500 {
		t.Fatal("lock TTL", pttl, err)
	}
	// The cached copy expires with the key.
	testwait.Until(t, "the lock to expire", func() bool {
		_, ok, err := b.GetLock(ctx, KindToolCall, ids[0])
		return err == nil && !ok
	})
	if err := a.DeleteLock(ctx, KindResponse, []byte("resp_0")); err != nil {
		t.Fatal(err)
	}
	// b's cached copy goes when the invalidation arrives.
	testwait.Until(t, "the deleted lock to go on b", func() bool {
		_, ok, err := b.GetLock(ctx, KindResponse, []byte("resp_0"))
		return err == nil && !ok
	})
}

func TestSchemaVersionIsolation(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	v1, _ := open(t, Config{URL: r.URL()})
	v2, _ := open(t, Config{URL: r.URL(), SchemaVersion: 2})
	ctx := context.Background()
	id := []byte("call_x")
	if err := v1.PutLock(ctx, KindToolCall, id, Lock{Model: "a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := v2.GetLock(ctx, KindToolCall, id); ok || err != nil {
		t.Fatal("v2 sees v1's lock", ok, err)
	}
	if err := v2.PutLock(ctx, KindToolCall, id, Lock{Model: "b"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if l, _, _ := v1.GetLock(ctx, KindToolCall, id); l.Model != "a" {
		t.Fatal("v1 lock overwritten by v2", l)
	}
	v1.PublishBinding([]byte("m"), []byte("s"), "http://w1", time.Hour)
	v1.Flush(ctx)
	if _, ok, _ := v2.LookupBinding(ctx, []byte("m"), []byte("s")); ok {
		t.Fatal("v2 sees v1's binding")
	}
}

func TestAuthAndTLS(t *testing.T) {
	ctx := context.Background()
	t.Run("auth", func(t *testing.T) {
		r := redistest.Start(t, redistest.Options{Args: []string{"--requirepass", "s3cret"}})
		s, _ := open(t, Config{URL: "redis://:s3cret@" + r.Addr() + "/0"})
		if !s.Up() {
			t.Fatal("not up with the password in the URL")
		}
		if err := s.PutLock(ctx, KindToolCall, []byte("c"), Lock{Model: "m"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		bad, lb := open(t, Config{URL: "redis://:wrong@" + r.Addr()})
		if bad.Up() || lb.count("redis unreachable at start") != 1 {
			t.Fatal("wrong password: up or not logged")
		}
		if err := bad.PutLock(ctx, KindToolCall, []byte("c"), Lock{Model: "m"}, time.Minute); !errors.Is(err, ErrDown) {
			t.Fatal(err)
		}
	})
	t.Run("tls", func(t *testing.T) {
		r := redistest.Start(t, redistest.Options{TLS: true, Args: []string{"--requirepass", "pw"}})
		s, _ := open(t, Config{URL: "rediss://default:pw@" + r.Addr(), TLSConfig: r.TLSConfig()})
		if !s.Up() {
			t.Fatal("not up over TLS")
		}
		if err := s.PutLock(ctx, KindResponse, []byte("r"), Lock{Model: "m", Worker: "w"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if l, ok, err := s.GetLock(ctx, KindResponse, []byte("r")); !ok || err != nil || l.Worker != "w" {
			t.Fatal(l, ok, err)
		}
		plain, _ := open(t, Config{URL: "redis://:pw@" + r.Addr()})
		if plain.Up() {
			t.Fatal("plain TCP to a TLS port reported up")
		}
	})
}

// Redis killed mid-run: calls fail fast, Up false, metric and one log line;
// restarted on the same AOF: acknowledged locks are there, locks written
// during the outage are replayed, the reconnect hook runs.
func TestOutageAndRecovery(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	s, lb := open(t, Config{URL: r.URL()})
	var reconnects atomic.Int32
	s.OnReconnect(func() { reconnects.Add(1) })
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if err := s.PutLock(ctx, KindToolCall, []byte(fmt.Sprintf("acked_%d", i)), Lock{Model: "m"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	r.Kill() // a crash right after the acknowledgements
	for i := 0; i < 10; i++ {
		t0 := time.Now()
		_, _, err := s.GetLock(ctx, KindToolCall, []byte("acked_0_other"))
		perr := s.PutLock(ctx, KindToolCall, []byte(fmt.Sprintf("down_%d", i)), Lock{Model: "m"}, time.Hour)
		s.PublishBinding([]byte("m"), []byte(fmt.Sprintf("s%d", i)), "http://w", time.Hour)
		if d := time.Since(t0); d > 500*time.Millisecond || err == nil || perr == nil {
			t.Fatalf("call %d during outage: %v, get err %v, put err %v", i, d, err, perr)
		}
	}
	testwait.Until(t, "the store to be down", func() bool { return !s.Up() })
	if m := metricText(s); !strings.Contains(m, "warmroute_redis_up 0") || !strings.Contains(m, "warmroute_redis_outages_total 1") {
		t.Fatal(m)
	}
	testwait.Until(t, "the outage to be logged", func() bool { return lb.count("redis down") >= 1 }) // logged after Up turns false
	if n := lb.count("redis down"); n != 1 {
		t.Fatalf("%d down log lines", n)
	}
	r.Start()
	testwait.Until(t, "the store to be up again", func() bool { return s.Up() })
	testwait.Until(t, "the reconnect hook and log", func() bool {
		return reconnects.Load() == 1 && lb.count("redis up again") == 1
	})
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fresh, _ := open(t, Config{URL: r.URL()}) // no local cache
	for i := 0; i < 20; i++ {
		if _, ok, err := fresh.GetLock(ctx, KindToolCall, []byte(fmt.Sprintf("acked_%d", i))); !ok || err != nil {
			t.Fatal("acknowledged lock lost in the crash", i, err)
		}
	}
	for i := 0; i < 10; i++ {
		if _, ok, err := fresh.GetLock(ctx, KindToolCall, []byte(fmt.Sprintf("down_%d", i))); !ok || err != nil {
			t.Fatal("lock kept during the outage not replayed", i, err)
		}
		if w, ok, err := fresh.LookupBinding(ctx, []byte("m"), []byte(fmt.Sprintf("s%d", i))); w != "http://w" || !ok || err != nil {
			t.Fatal("binding kept during the outage not replayed", i, err)
		}
	}
}

// Redis absent at start: Open succeeds, the store serves ErrDown, and
// connects (replaying kept locks) once Redis is there.
func TestUnreachableAtStart(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	r.Stop()
	s, lb := open(t, Config{URL: r.URL()})
	ctx := context.Background()
	if s.Up() || lb.count("redis unreachable at start") != 1 {
		t.Fatal("up without redis, or not logged")
	}
	if err := s.PutLock(ctx, KindResponse, []byte("early"), Lock{Model: "m", Worker: "w"}, time.Hour); !errors.Is(err, ErrDown) {
		t.Fatal(err)
	}
	if _, _, err := s.LookupBinding(ctx, []byte("m"), []byte("s")); !errors.Is(err, ErrDown) {
		t.Fatal(err)
	}
	r.Start()
	testwait.Until(t, "the store to connect", func() bool { return s.Up() })
	if l, ok, err := s.GetLock(ctx, KindResponse, []byte("early")); !ok || err != nil || l.Worker != "w" {
		t.Fatal(l, ok, err)
	}
}

// replica mimics the router's use of the store: a local session map that
// OnInvalidate drops from and LookupBinding refills.
type replica struct {
	s     *Store
	mu    sync.Mutex
	local map[string]string
}

func newReplica(s *Store) *replica {
	r := &replica{s: s, local: map[string]string{}}
	s.OnInvalidate(func(k Kind, m, key string) {
		if k == KindBinding {
			r.mu.Lock()
			delete(r.local, m+"\x00"+key)
			r.mu.Unlock()
		}
	})
	return r
}

func (r *replica) route(tb testing.TB, model, sess []byte) string {
	k := string(model) + "\x00" + string(sess)
	r.mu.Lock()
	w, ok := r.local[k]
	r.mu.Unlock()
	if ok {
		return w
	}
	w, ok, err := r.s.LookupBinding(context.Background(), model, sess)
	if err != nil {
		tb.Fatal(err)
	}
	if ok {
		r.mu.Lock()
		r.local[k] = w
		r.mu.Unlock()
	}
	return w
}

func (r *replica) bind(model, sess []byte, w string) {
	r.mu.Lock()
	r.local[string(model)+"\x00"+string(sess)] = w
	r.mu.Unlock()
	r.s.PublishBinding(model, sess, w, time.Hour)
}

// memOf reads the memory record of ("auto", sess) straight from Redis.
func memOf(tb testing.TB, raw rueidis.Client, ns, sess string) MemoryRecord {
	tb.Helper()
	v, err := raw.Do(context.Background(), raw.B().Get().Key(string(scopedKey(nil, ns, KindMemory, []byte("auto"), []byte(sess)))).Build()).AsBytes()
	if err != nil {
		tb.Fatal(err)
	}
	r, err := DecodeMemoryRecord(v)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// A binding or memory write older than the stored one is refused by Redis
// (docs/design.md §8.3): the newer stays whatever order writes arrive in;
// a tie is written; values of a release before are read and written over.
func TestNewerWriteWins(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	a, _ := open(t, Config{URL: r.URL()})
	raw := rawClient(t, r)
	ctx := context.Background()
	sess, auto, model := []byte("s1"), []byte("auto"), []byte("m")
	put := func(rec MemoryRecord) {
		t.Helper()
		if !a.PutMemory(auto, sess, rec.AppendEncode(nil), time.Hour) || a.Flush(ctx) != nil {
			t.Fatal("put")
		}
	}
	t0 := time.Now().UnixNano()
	put(MemoryRecord{Model: "medium", Turns: 5, LastAccess: t0 + 2})
	put(MemoryRecord{Model: "small", Turns: 4, LastAccess: t0 + 1}) // late write of an older turn
	if got := memOf(t, raw, a.Namespace(), "s1"); got.Model != "medium" || got.Turns != 5 {
		t.Fatalf("older record overwrote the newer one: %+v", got)
	}
	if !strings.Contains(metricText(a), `warmroute_redis_older_writes_total{kind="memory"} 1`) {
		t.Fatal(metricText(a))
	}
	put(MemoryRecord{Model: "medium", Turns: 5, LastAccess: t0 + 2, LastEnd: t0 + 2}) // same turn, later fields
	if got := memOf(t, raw, a.Namespace(), "s1"); got.LastEnd != t0+2 {
		t.Fatalf("tie not written: %+v", got)
	}
	// Versions that differ only in a high byte, then only in the lowest.
	put(MemoryRecord{Model: "large", LastAccess: t0 + 1<<40})
	put(MemoryRecord{Model: "small", LastAccess: t0 + 1<<40 - 1})
	if got := memOf(t, raw, a.Namespace(), "s1"); got.Model != "large" {
		t.Fatalf("%+v", got)
	}
	put(MemoryRecord{Model: "small", LastAccess: t0 + 1<<40 + 1})
	if got := memOf(t, raw, a.Namespace(), "s1"); got.Model != "small" {
		t.Fatalf("%+v", got)
	}

	// Bindings: the later use stays; the TTL counts from it.
	bind := func(w string, at int64) {
		t.Helper()
		if !a.PublishBindingAt(model, sess, w, at, time.Hour) || a.Flush(ctx) != nil {
			t.Fatal("publish")
		}
	}
	bind("http://w2", t0+20e6)
	bind("http://w1", t0+10e6)
	bk := string(scopedKey(nil, a.Namespace(), KindBinding, model, sess))
	if w, err := raw.Do(ctx, raw.B().Get().Key(bk).Build()).ToString(); w != "http://w2" || err != nil {
		t.Fatal("older binding won:", w, err)
	}
	pttl := func(k string) time.Duration {
		t.Helper()
		ms, err := raw.Do(ctx, raw.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(ms) * time.Millisecond
	}
	if d, want := pttl(bk), time.Hour-time.Since(time.Unix(0, t0+20e6)); d > want+5*time.Millisecond || d < want-time.Second {
		t.Fatalf("binding TTL %v, want about %v (from its use)", d, want)
	}
	a.PublishBindingAt(model, []byte("gone"), "http://w1", t0-int64(2*time.Hour), time.Hour) // replayed after its TTL
	a.Flush(ctx)
	if _, ok, _ := a.LookupBinding(ctx, model, []byte("gone")); ok {
		t.Fatal("a binding past its TTL was written")
	}

	// Redis forgot the script (restart, SCRIPT FLUSH): the batch is sent
	// again with EVAL.
	if err := raw.Do(ctx, raw.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	bind("http://w3", t0+30e6)
	if w, err := raw.Do(ctx, raw.B().Get().Key(bk).Build()).ToString(); w != "http://w3" {
		t.Fatal("write after SCRIPT FLUSH lost:", w, err)
	}
	if !strings.Contains(metricText(a), "warmroute_redis_errors_total 0") {
		t.Fatal("NOSCRIPT counted as an error:\n", metricText(a))
	}

	// A release before versions: its bindings (SET without or with a TTL
	// from their arrival) are read as before and compared by expiry; its
	// memory records are read and written over whatever their age.
	bk = string(scopedKey(nil, a.Namespace(), KindBinding, model, []byte("old")))
	if err := raw.Do(ctx, raw.B().Set().Key(bk).Value("http://w9").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if w, ok, _ := a.LookupBinding(ctx, model, []byte("old")); w != "http://w9" || !ok {
		t.Fatal("bare binding not read:", w)
	}
	a.PublishBinding(model, []byte("old"), "http://w8", time.Hour)
	a.Flush(ctx)
	testwait.Until(t, "the bare binding to be written over", func() bool {
		w, _, _ := a.LookupBinding(ctx, model, []byte("old"))
		return w == "http://w8"
	})
	mk := string(scopedKey(nil, a.Namespace(), KindMemory, auto, []byte("old")))
	legacy := []byte{memoryFormat, 1, 5, 'l', 'a', 'r', 'g', 'e', 35, 0xfe, 0xff, 0xff, 0xff, 0x0f} // Model, LastAccess (no version)
	if err := raw.Do(ctx, raw.B().Set().Key(mk).Value(string(legacy)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if v, _, err := a.GetMemory(ctx, auto, []byte("old")); err != nil {
		t.Fatal(err)
	} else if rec, err := DecodeMemoryRecord(v); err != nil || rec.Model != "large" || rec.LastAccess == 0 {
		t.Fatal("legacy record not read:", rec, err)
	}
	a.PutMemory(auto, []byte("old"), (&MemoryRecord{Model: "small", LastAccess: 1}).AppendEncode(nil), time.Hour)
	a.Flush(ctx)
	if got := memOf(t, raw, a.Namespace(), "old"); got.Model != "small" {
		t.Fatalf("legacy record not written over: %+v", got)
	}
}

// Two replicas keep memory records and bindings of one session while Redis
// is down; on recovery each replays its own, in an order neither controls.
// The newest record and binding stay either way (an older record replayed
// last would make a replica switch model).
func TestOutageReplayNewestWins(t *testing.T) {
	for _, newerFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("newer_replayed_first=%v", newerFirst), func(t *testing.T) {
			r := redistest.Start(t, redistest.Options{})
			// first reconnects at once, second a second later: the replay order.
			first, _ := open(t, Config{URL: r.URL()})
			second, _ := open(t, Config{URL: r.URL(), HealthInterval: time.Second})
			raw := rawClient(t, r)
			ctx := context.Background()
			auto, model, sess := []byte("auto"), []byte("m"), []byte("s")
			t0 := time.Now().UnixNano()
			// Before the outage: turn 1 on first.
			first.PutMemory(auto, sess, (&MemoryRecord{Model: "small", Turns: 1, LastAccess: t0}).AppendEncode(nil), time.Hour)
			first.PublishBindingAt(model, sess, "http://w0", t0, time.Hour)
			if err := first.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			r.Kill()
			testwait.Until(t, "both stores to be down", func() bool {
				first.PutLock(ctx, KindToolCall, []byte("probe"), Lock{Model: "x"}, time.Hour)
				second.PutLock(ctx, KindToolCall, []byte("probe"), Lock{Model: "x"}, time.Hour)
				return !first.Up() && !second.Up()
			})
			// During the outage: turns 2 and 3 on old, turn 4 (a switch) on new.
			old, nw := first, second
			if newerFirst {
				old, nw = second, first
			}
			for i, at := range []int64{t0 + 10e6, t0 + 20e6} {
				old.PutMemory(auto, sess, (&MemoryRecord{Model: "small", Turns: int64(2 + i), LastAccess: at}).AppendEncode(nil), time.Hour)
				old.PublishBindingAt(model, sess, "http://w1", at, time.Hour)
			}
			nw.PutMemory(auto, sess, (&MemoryRecord{Model: "medium", Turns: 4, Switches: 1, LastAccess: t0 + 30e6}).AppendEncode(nil), time.Hour)
			nw.PublishBindingAt(model, sess, "http://w2", t0+30e6, time.Hour)
			for _, s := range []*Store{old, nw} {
				if err := s.Flush(ctx); !errors.Is(err, ErrDown) {
					t.Fatal("write not kept for replay:", err)
				}
			}
			r.Start()
			testwait.Until(t, "the first store to be up", first.Up)
			if second.Up() {
				t.Fatal("second replayed with first: the order is not tested")
			}
			got := memOf(t, raw, first.Namespace(), "s")
			if want := map[bool]int64{true: 4, false: 3}[newerFirst]; got.Turns != want {
				t.Fatalf("after first's replay: turns %d, want %d", got.Turns, want)
			}
			testwait.Until(t, "the second store to be up", second.Up)
			if got := memOf(t, raw, first.Namespace(), "s"); got.Model != "medium" || got.Turns != 4 {
				t.Fatalf("after both replays: %+v, want turn 4 on medium", got)
			}
			fresh, _ := open(t, Config{URL: r.URL()})
			if w, ok, err := fresh.LookupBinding(ctx, model, sess); w != "http://w2" || !ok || err != nil {
				t.Fatal("binding after both replays:", w, ok, err)
			}
			if n := strings.Count(metricText(old)+metricText(nw), "_older_writes_total{kind=\"memory\"} 0"); newerFirst && n != 1 || !newerFirst && n != 2 {
				t.Fatalf("refused writes:\nold %s\nnew %s", metricText(old), metricText(nw))
			}
		})
	}
}

// Republishing a binding with the same use time is a tie, and written:
// Redis's millisecond clock must not make it look older (bindingLua).
func TestBindingTiesWritten(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	a, _ := open(t, Config{URL: r.URL()})
	at := time.Now().UnixNano()
	for i := 0; i < 2000; i++ {
		a.PublishBindingAt([]byte("m"), []byte(fmt.Sprint(i%50)), "http://w", at, time.Hour)
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m := metricText(a); !strings.Contains(m, `warmroute_redis_older_writes_total{kind="binding"} 0`) {
		t.Fatal(m)
	}
}

// bindingLua's path for Redis before 7.0 (no PEXPIRETIME), run on this
// Redis with the command renamed: older refused, newer and ties written,
// an expiry already past refused.
func TestBindingLuaBefore70(t *testing.T) {
	r := redistest.Start(t, redistest.Options{})
	raw := rawClient(t, r)
	ctx := context.Background()
	script := strings.Replace(bindingLua, "'PEXPIRETIME'", "'NOSUCHCOMMAND'", 1)
	now := time.Now().UnixMilli()
	set := func(w string, exp int64) int64 {
		t.Helper()
		n, err := raw.Do(ctx, raw.B().Eval().Script(script).Numkeys(1).Key("k").Arg(w, fmt.Sprint(exp)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	get := func() string { v, _ := raw.Do(ctx, raw.B().Get().Key("k").Build()).ToString(); return v }
	for _, c := range []struct {
		w    string
		exp  int64
		want int64
		then string
	}{
		{"w1", now + 60_000, 1, "w1"},
		{"w0", now + 50_000, 0, "w1"}, // older
		{"w2", now + 70_000, 1, "w2"}, // newer
		{"w3", now + 70_000, 1, "w3"}, // tie
		{"w4", now - 1, 0, "w3"},      // past
	} {
		if n := set(c.w, c.exp); n != c.want || get() != c.then {
			t.Fatalf("%s at %d: returned %d, stored %s; want %d, %s", c.w, c.exp-now, n, get(), c.want, c.then)
		}
	}
	if pttl, _ := raw.Do(ctx, raw.B().Pttl().Key("k").Build()).AsInt64(); pttl < 60_000 || pttl > 70_000 {
		t.Fatal("TTL", pttl)
	}
}
