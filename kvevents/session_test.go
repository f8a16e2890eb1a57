package kvevents

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/warmroute/warmroute/internal/testwait"
)

// recorder keeps what a Subscriber hands on.
type recorder struct {
	mu      sync.Mutex
	msgs    []Message
	resyncs []Resync
}

func (r *recorder) onBatch(m Message) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
}

func (r *recorder) onResync(x Resync) {
	r.mu.Lock()
	r.resyncs = append(r.resyncs, x)
	r.mu.Unlock()
}

func (r *recorder) seqs() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]uint64, len(r.msgs))
	for i, m := range r.msgs {
		out[i] = m.Seq
	}
	return out
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *recorder) resyncList() []Resync {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Resync(nil), r.resyncs...)
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%d batches, resyncs %+v", len(r.msgs), r.resyncs)
}

func newPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newSubscriber(t *testing.T, cfg SubscriberConfig, r *recorder) *Subscriber {
	t.Helper()
	cfg.OnBatch = r.onBatch
	cfg.OnResync = r.onResync
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 5 * time.Millisecond
		cfg.MaxBackoff = 50 * time.Millisecond
	}
	s, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// subscribed waits until p has n subscribers: PUB sends nothing to a
// subscriber before its subscription arrived.
func subscribed(t *testing.T, p *Publisher, n int) {
	t.Helper()
	testwait.Until(t, "the subscription", func() bool { return p.Subscribers() == n })
}

func publish(t *testing.T, p *Publisher, b Batch) uint64 {
	t.Helper()
	seq, err := p.Publish(b)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func cleared(ts float64) Batch { return Batch{TS: ts, Events: []Event{AllBlocksCleared{}}} }

// noLeaks fails unless every goroutine of this package's sockets ended.
func noLeaks(t *testing.T) {
	t.Helper()
	var stacks string
	testwait.Until(t, "the sockets' goroutines to end", func() bool {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "kvevents.(*Subscriber)") &&
			!strings.Contains(stacks, "kvevents.(*Publisher)") &&
			!strings.Contains(stacks, "go-zeromq/zmq4")
	}, func() string { return stacks })
}

func TestEveryEventTypeCrossesTheWire(t *testing.T) {
	for _, c := range []struct {
		name     string
		endpoint string
		enc      Encoding
	}{
		{"tcp, named fields", "tcp://127.0.0.1:0", EncodeMap},
		{"ipc, positional", "ipc://" + filepath.Join(t.TempDir(), "kv.sock"), EncodeArray},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPublisher(t, PublisherConfig{Endpoint: c.endpoint, Topic: "kv@pod-a@m", Encoding: c.enc, DPRank: -1})
			var r recorder
			s := newSubscriber(t, SubscriberConfig{Endpoint: p.Addr(), Topic: "kv@pod-a"}, &r)
			subscribed(t, p, 1)
			want := sampleBatch()
			for i := range 3 {
				want.TS = float64(i)
				publish(t, p, want)
			}
			testwait.Until(t, "three batches", func() bool { return r.count() == 3 }, r.String)
			for i, m := range r.msgs {
				want.TS = float64(i)
				if m.Topic != "kv@pod-a@m" || m.Seq != uint64(i) || m.Replayed || !reflect.DeepEqual(m.Batch, want) {
					t.Fatalf("message %d: %+v", i, m)
				}
			}
			if c := s.Counters(); c.Batches.Load() != 3 || c.Gaps.Load() != 0 || c.Resyncs.Load() != 0 || c.DecodeErrors.Load() != 0 || c.Connects.Load() != 1 {
				t.Fatalf("counters %+v", c)
			}
			s.Close()
			p.Close()
			noLeaks(t)
		})
	}
}

func TestTopicFilter(t *testing.T) {
	p := newPublisher(t, PublisherConfig{Topic: "kv@pod-b"})
	var r recorder
	newSubscriber(t, SubscriberConfig{Endpoint: p.Addr(), Topic: "kv@pod-a"}, &r)
	testwait.Until(t, "the kv@pod-a subscription at the kv@pod-b publisher", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for peer := range p.peers {
			if peer.wants("kv@pod-a") {
				return true
			}
		}
		return false
	})
	other := newPublisher(t, PublisherConfig{Topic: "kv@pod-a"})
	var r2 recorder
	newSubscriber(t, SubscriberConfig{Endpoint: other.Addr(), Topic: "kv@pod-a"}, &r2)
	subscribed(t, other, 1)
	publish(t, p, cleared(1))
	publish(t, other, cleared(2))
	testwait.Until(t, "the matching batch", func() bool { return r2.count() == 1 })
	if p.Subscribers() != 0 || r.count() != 0 {
		t.Fatalf("a subscriber to kv@pod-a took kv@pod-b: %d subscribers, %d batches", p.Subscribers(), r.count())
	}
}

func TestADroppedSequenceIsReplayed(t *testing.T) {
	p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	var r recorder
	s := newSubscriber(t, SubscriberConfig{Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr()}, &r)
	subscribed(t, p, 1)
	publish(t, p, cleared(0))
	for i := 1; i <= 2; i++ { // lost on the way
		if _, err := p.publish(cleared(float64(i)), false); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, p, cleared(3))
	testwait.Until(t, "four batches", func() bool { return r.count() == 4 }, r.String)
	if got := r.seqs(); !reflect.DeepEqual(got, []uint64{0, 1, 2, 3}) {
		t.Fatalf("sequence %v", got)
	}
	for i, m := range r.msgs {
		if m.Replayed != (i == 1 || i == 2) || m.Batch.TS != float64(i) {
			t.Fatalf("message %d: %+v", i, m)
		}
	}
	c := s.Counters()
	if c.Gaps.Load() != 1 || c.Replays.Load() != 1 || c.Resyncs.Load() != 0 || c.Batches.Load() != 4 {
		t.Fatalf("gaps %d replays %d resyncs %d batches %d", c.Gaps.Load(), c.Replays.Load(), c.Resyncs.Load(), c.Batches.Load())
	}
}

func TestAGapReplayCannotFillResyncs(t *testing.T) {
	cases := []struct {
		name   string
		replay bool
		detail string
	}{
		{"older than the replay buffer", true, "no longer kept"},
		{"no replay endpoint", false, "no replay endpoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pc := PublisherConfig{BufferSteps: 2}
			if c.replay {
				pc.ReplayEndpoint = "tcp://127.0.0.1:0"
			}
			p := newPublisher(t, pc)
			var r recorder
			s := newSubscriber(t, SubscriberConfig{Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr()}, &r)
			subscribed(t, p, 1)
			publish(t, p, cleared(0))
			for i := 1; i <= 3; i++ {
				if _, err := p.publish(cleared(float64(i)), false); err != nil {
					t.Fatal(err)
				}
			}
			publish(t, p, cleared(4))
			publish(t, p, cleared(5))
			testwait.Until(t, "batches 0, 4, 5", func() bool { return r.count() == 3 }, r.String)
			if got := r.seqs(); !reflect.DeepEqual(got, []uint64{0, 4, 5}) {
				t.Fatalf("sequence %v", got)
			}
			rs := r.resyncList()
			if len(rs) != 1 || rs[0].Reason != ResyncGap || rs[0].Want != 1 || rs[0].Got != 4 || !strings.Contains(rs[0].Detail, c.detail) {
				t.Fatalf("resyncs %+v", rs)
			}
			if s.Counters().Gaps.Load() != 1 || s.Counters().Replays.Load() != 0 {
				t.Fatalf("gaps %d replays %d", s.Counters().Gaps.Load(), s.Counters().Replays.Load())
			}
		})
	}
}

func TestARestartedPublisherResyncs(t *testing.T) {
	p1 := newPublisher(t, PublisherConfig{})
	addr := p1.Addr()
	var r recorder
	s := newSubscriber(t, SubscriberConfig{Endpoint: addr}, &r)
	subscribed(t, p1, 1)
	for i := range 3 {
		publish(t, p1, cleared(float64(i)))
	}
	testwait.Until(t, "three batches", func() bool { return r.count() == 3 })
	p1.Close()
	p2 := newPublisher(t, PublisherConfig{Endpoint: addr})
	subscribed(t, p2, 1) // the subscriber dialled again
	publish(t, p2, cleared(10))
	testwait.Until(t, "the new publisher's first batch", func() bool { return r.count() == 4 }, r.String)
	rs := r.resyncList()
	if len(rs) != 1 || rs[0].Reason != ResyncRestart || rs[0].Want != 3 || rs[0].Got != 0 {
		t.Fatalf("resyncs %+v", rs)
	}
	if got := r.seqs(); !reflect.DeepEqual(got, []uint64{0, 1, 2, 0}) {
		t.Fatalf("sequence %v", got)
	}
	if s.Counters().Connects.Load() != 2 {
		t.Fatalf("%d connections", s.Counters().Connects.Load())
	}
}

func TestConnectsOnceThePublisherAppears(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "tcp://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	var r recorder
	s := newSubscriber(t, SubscriberConfig{Endpoint: addr}, &r)
	p := newPublisher(t, PublisherConfig{Endpoint: addr})
	subscribed(t, p, 1)
	publish(t, p, cleared(1))
	testwait.Until(t, "the batch", func() bool { return r.count() == 1 })
	s.Close()
	p.Close()
	noLeaks(t)
}

// rawPub is a publisher this package did not write: a ZMTP PUB handshake,
// then whatever frames the test sends.
func rawPub(t *testing.T, endpoint string) (*zmq4.Conn, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	zc, err := zmq4.Open(c, null.Security(), zmq4.Pub, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := zc.RecvMsg() // the subscription
	if err != nil || len(msg.Frames) != 1 || msg.Frames[0][0] != 1 {
		t.Fatalf("subscription %v, %v", msg, err)
	}
	return zc, c
}

func TestGarbageIsCountedAndSkipped(t *testing.T) {
	var r recorder
	s := newSubscriber(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, Topic: "kv"}, &r)
	zc, _ := rawPub(t, s.Addr())
	good, err := Encode(cleared(1), EncodeMap)
	if err != nil {
		t.Fatal(err)
	}
	send := func(frames ...[]byte) {
		t.Helper()
		if err := zc.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	send([]byte("kv"), seqBytes(7), good)
	send([]byte("one frame"))
	send([]byte("kv"), []byte("short"), good)
	send([]byte("kv"), seqBytes(8), []byte("not msgpack"))
	send([]byte("kv"), seqBytes(8), good, []byte("a fourth frame"))
	send([]byte("kv"), seqBytes(8), good[:len(good)-1])
	send([]byte("other"), seqBytes(8), good) // not the topic: ignored
	send([]byte("kv"), seqBytes(8), good)
	testwait.Until(t, "the two good batches", func() bool { return r.count() == 2 }, r.String)
	if got := r.seqs(); !reflect.DeepEqual(got, []uint64{7, 8}) {
		t.Fatalf("sequence %v", got)
	}
	c := s.Counters()
	if c.DecodeErrors.Load() != 5 || c.Gaps.Load() != 0 || c.Resyncs.Load() != 0 {
		t.Fatalf("decode errors %d gaps %d resyncs %d", c.DecodeErrors.Load(), c.Gaps.Load(), c.Resyncs.Load())
	}
}

func TestAnOversizedFrameDropsTheConnectionNotTheSubscriber(t *testing.T) {
	var r recorder
	s := newSubscriber(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, Limits: Limits{MaxPayloadBytes: 1 << 10}}, &r)
	zc, c := rawPub(t, s.Addr())
	if err := zc.SendMsg(zmq4.NewMsgFrom(nil, seqBytes(0), make([]byte, 2<<10))); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(testwait.Timeout))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection stayed open: %v", err)
	}
	good, _ := Encode(cleared(1), EncodeMap)
	zc, _ = rawPub(t, s.Addr())
	if err := zc.SendMsg(zmq4.NewMsgFrom(nil, seqBytes(0), good)); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the good batch", func() bool { return r.count() == 1 })
	if s.Counters().DecodeErrors.Load() != 1 {
		t.Fatalf("%d decode errors", s.Counters().DecodeErrors.Load())
	}
}

func TestAnEndpointThatNeverAnswersDoesNotBlockClose(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never a byte written
		}
	}()
	defer func() {
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	}()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := "tcp://" + refused.Addr().String()
	refused.Close()
	silentAddr := "tcp://" + silent.Addr().String()

	// A live publisher whose replay endpoint never answers, a gap to fill.
	p := newPublisher(t, PublisherConfig{})
	var r recorder
	hour := time.Hour
	subs := []*Subscriber{
		newSubscriber(t, SubscriberConfig{Endpoint: silentAddr, HandshakeTimeout: hour}, &recorder{}),
		newSubscriber(t, SubscriberConfig{Endpoint: refusedAddr, MinBackoff: hour, MaxBackoff: hour}, &recorder{}),
		newSubscriber(t, SubscriberConfig{Endpoint: p.Addr(), ReplayEndpoint: silentAddr, ReplayTimeout: hour}, &r),
	}
	subscribed(t, p, 1)
	publish(t, p, cleared(0))
	if _, err := p.publish(cleared(1), false); err != nil {
		t.Fatal(err)
	}
	publish(t, p, cleared(2))
	testwait.Until(t, "the handshake and the replay to hang", func() bool { return len(accepted) == 2 && r.count() == 1 })
	for _, s := range subs {
		done := make(chan struct{})
		go func() { s.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(testwait.Timeout):
			t.Fatal("Close blocked")
		}
	}
	if len(r.resyncList()) != 0 || r.count() != 1 {
		t.Fatalf("a cut replay was reported: %v", r.String())
	}
	p.Close()
	noLeaks(t)
}

func TestPublisherCloseEndsItsGoroutines(t *testing.T) {
	p := newPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0"})
	var r recorder
	s := newSubscriber(t, SubscriberConfig{Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr()}, &r)
	subscribed(t, p, 1)
	publish(t, p, cleared(0))
	testwait.Until(t, "the batch", func() bool { return r.count() == 1 })
	p.Close()
	if _, err := p.Publish(cleared(1)); err == nil {
		t.Fatal("published after Close")
	}
	s.Close()
	noLeaks(t)
}
