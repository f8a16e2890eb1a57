package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB address, dialed and dialed again after
	// a failure, with backoff. With Bind, it is the address to listen on
	// for a publisher that dials out (llm-d-inference-sim does).
	Endpoint string
	Bind     bool
	// ReplayEndpoint is the engine's replay ROUTER; "" for none.
	ReplayEndpoint string
	// Topic is the prefix of the topics taken; "" takes all.
	Topic string
	// Limits bound every message (and every frame a peer sends).
	Limits Limits

	// OnBatch gets every batch, in sequence order, one at a time, on one
	// goroutine. It must not call Close.
	OnBatch func(Message)
	// OnResync, when set, is told when the batches handed on stop being
	// the engine's whole history since the last resync: what the caller
	// built from them may be wrong and should be rebuilt from what follows.
	// It is called on OnBatch's goroutine, before the batch after the break.
	OnResync func(Resync)

	// ReplayTimeout bounds one replay, dial to last batch; 2s when 0.
	ReplayTimeout time.Duration
	// MaxReplay is the largest gap replay is asked to fill, in batches;
	// larger ones resync at once. 10000 (vLLM's buffer) when 0.
	MaxReplay uint64
	// HandshakeTimeout bounds connecting and the ZMTP handshake; 5s when 0.
	HandshakeTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts, doubled after each failure; 100ms and 5s when 0.
	MinBackoff, MaxBackoff time.Duration
	// MaxPeers bounds the publishers connected at once with Bind; 4 when 0.
	MaxPeers int
}

// queueLen bounds the messages read and waiting for OnBatch: with
// Limits.MaxPayloadBytes, what a busy consumer can make a peer's stream
// hold (8 × 4 MiB by default); past it the reader waits, and the
// publisher's own queue drops (a gap, replayed or resynced).
const queueLen = 8

// Message is one batch as the publisher numbered it.
type Message struct {
	Topic string
	Seq   uint64
	Batch Batch
	// Replayed says it came from the replay socket, after a gap.
	Replayed bool
}

// ResyncReason says why the history broke.
type ResyncReason uint8

const (
	// ResyncGap: batches were missed and replay could not send them (no
	// replay endpoint, a gap larger than MaxReplay, older than the
	// publisher keeps, a replay that failed or timed out).
	ResyncGap ResyncReason = iota + 1
	// ResyncRestart: the sequence went backwards, a restarted publisher.
	ResyncRestart
)

func (r ResyncReason) String() string {
	switch r {
	case ResyncGap:
		return "gap"
	case ResyncRestart:
		return "restart"
	}
	return "unknown"
}

// Resync is one break in the history: the sequence expected and the one
// that came instead.
type Resync struct {
	Reason    ResyncReason
	Want, Got uint64
	Detail    string
}

// Counters are a Subscriber's running totals.
type Counters struct {
	Batches      atomic.Uint64 // handed to OnBatch, replayed ones included
	Gaps         atomic.Uint64 // sequence gaps seen
	Replays      atomic.Uint64 // gaps replay filled
	Resyncs      atomic.Uint64 // OnResync calls, whether set or not
	DecodeErrors atomic.Uint64 // messages dropped: frames, sequence or payload malformed or over the limits
	Connects     atomic.Uint64 // ZMTP connections to a publisher established
}

// Subscriber follows one publisher's stream (one engine, one data-parallel
// rank): it hands batches on in sequence order, asks the replay socket for
// the ones a gap skipped, and says when the history broke. A message that
// cannot be read is dropped and counted, the sequence it claims ignored;
// the gap it leaves is found when the next message arrives.
type Subscriber struct {
	cfg      SubscriberConfig
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	in       chan [][]byte
	counters Counters

	mu       sync.Mutex
	closed   bool
	listener net.Listener
	conns    map[net.Conn]struct{}

	// The session's, on its goroutine only.
	started bool
	next    uint64
}

// NewSubscriber starts following cfg.Endpoint. It returns once a Bind
// listener is bound; connecting is in the background.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.OnBatch == nil {
		return nil, errors.New("kvevents: OnBatch is required")
	}
	network, addr, err := splitEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if _, _, err := splitEndpoint(cfg.ReplayEndpoint); err != nil {
			return nil, err
		}
	}
	cfg.Limits = cfg.Limits.withDefaults()
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.ReplayTimeout, 2*time.Second)
	def(&cfg.HandshakeTimeout, handshakeTimeout)
	def(&cfg.MinBackoff, 100*time.Millisecond)
	def(&cfg.MaxBackoff, 5*time.Second)
	if cfg.MaxReplay == 0 {
		cfg.MaxReplay = defaultBufferSteps
	}
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = 4
	}
	s := &Subscriber{cfg: cfg, in: make(chan [][]byte, queueLen), conns: make(map[net.Conn]struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if cfg.Bind {
		if s.listener, err = net.Listen(network, addr); err != nil {
			return nil, err
		}
		s.wg.Add(1)
		go s.acceptLoop()
	} else {
		s.wg.Add(1)
		go s.dialLoop(network, addr)
	}
	s.wg.Add(1)
	go s.session()
	return s, nil
}

// Counters are the running totals; read them with Load.
func (s *Subscriber) Counters() *Counters { return &s.counters }

// Addr is the endpoint listened on with Bind, its port resolved; "" without.
func (s *Subscriber) Addr() string {
	if s.listener == nil {
		return ""
	}
	return endpointOf(s.listener.Addr())
}

// Close stops everything, waits for its goroutines and returns. A batch
// being handed on is finished first.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	if s.listener != nil {
		s.listener.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Subscriber) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Subscriber) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

// dial connects within deadline and tracks the connection for Close.
func (s *Subscriber) dial(network, addr string, deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(s.ctx, deadline)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if !s.track(c) {
		c.Close()
		return nil, errClosed
	}
	return c, nil
}

func (s *Subscriber) dialLoop(network, addr string) {
	defer s.wg.Done()
	backoff := s.cfg.MinBackoff
	for s.ctx.Err() == nil {
		deadline := time.Now().Add(s.cfg.HandshakeTimeout)
		if c, err := s.dial(network, addr, deadline); err == nil {
			if s.serve(c, deadline) {
				backoff = s.cfg.MinBackoff
			}
			s.untrack(c)
		}
		if !sleepCtx(s.ctx, backoff) {
			return
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

func (s *Subscriber) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.listener.Accept()
		if err != nil {
			if s.ctx.Err() != nil || !sleepCtx(s.ctx, 10*time.Millisecond) {
				return
			}
			continue
		}
		s.mu.Lock()
		full := len(s.conns) >= s.cfg.MaxPeers
		s.mu.Unlock()
		if full || !s.track(c) {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c, time.Now().Add(s.cfg.HandshakeTimeout))
			s.untrack(c)
		}()
	}
}

// serve runs the SUB side of one connection until it fails; it says
// whether the handshake succeeded.
func (s *Subscriber) serve(c net.Conn, deadline time.Time) bool {
	maxFrame, maxMsg := frameBounds(s.cfg.Limits)
	zc, err := handshake(c, zmq4.Sub, s.cfg.Bind, maxFrame, maxMsg, deadline)
	if err != nil {
		return false
	}
	s.counters.Connects.Add(1)
	if zc.SendMsg(zmq4.NewMsg(append([]byte{1}, s.cfg.Topic...))) != nil {
		return true
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			if errors.Is(err, errFrame) {
				s.counters.DecodeErrors.Add(1)
			}
			return true
		}
		if msg.Type != zmq4.UsrMsg {
			continue
		}
		select {
		case s.in <- msg.Frames:
		case <-s.ctx.Done():
			return true
		}
	}
}

// session hands messages on in order, one at a time.
func (s *Subscriber) session() {
	defer s.wg.Done()
	for {
		select {
		case f := <-s.in:
			s.handle(f)
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *Subscriber) handle(f [][]byte) {
	if len(f) != 3 || len(f[1]) != 8 {
		s.counters.DecodeErrors.Add(1)
		return
	}
	topic := string(f[0])
	if !strings.HasPrefix(topic, s.cfg.Topic) {
		return // a publisher that does not filter
	}
	seq := binary.BigEndian.Uint64(f[1])
	b, err := Decode(f[2], s.cfg.Limits)
	if err != nil {
		s.counters.DecodeErrors.Add(1)
		return
	}
	switch {
	case !s.started:
		s.started = true
	case seq < s.next:
		s.resync(Resync{Reason: ResyncRestart, Want: s.next, Got: seq})
	case seq > s.next:
		s.counters.Gaps.Add(1)
		if err := s.fill(topic, seq); err != nil {
			if s.ctx.Err() != nil {
				return // closing: the replay was cut, not the history
			}
			s.resync(Resync{Reason: ResyncGap, Want: s.next, Got: seq, Detail: err.Error()})
		} else {
			s.counters.Replays.Add(1)
		}
	}
	s.apply(Message{Topic: topic, Seq: seq, Batch: b})
}

func (s *Subscriber) apply(m Message) {
	s.next = m.Seq + 1
	s.counters.Batches.Add(1)
	s.cfg.OnBatch(m)
}

func (s *Subscriber) resync(r Resync) {
	s.counters.Resyncs.Add(1)
	if s.cfg.OnResync != nil {
		s.cfg.OnResync(r)
	}
}

// fill asks the replay socket for the batches from s.next up to upTo
// (excluded) and hands them on as they come; an error means it could not
// bring s.next to upTo.
func (s *Subscriber) fill(topic string, upTo uint64) error {
	switch {
	case s.cfg.ReplayEndpoint == "":
		return errors.New("no replay endpoint")
	case upTo-s.next > s.cfg.MaxReplay:
		return fmt.Errorf("%d batches missed, more than %d", upTo-s.next, s.cfg.MaxReplay)
	}
	network, addr, _ := splitEndpoint(s.cfg.ReplayEndpoint)
	deadline := time.Now().Add(s.cfg.ReplayTimeout)
	c, err := s.dial(network, addr, deadline)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	defer s.untrack(c)
	maxFrame, maxMsg := frameBounds(s.cfg.Limits)
	zc, err := handshake(c, zmq4.Dealer, false, maxFrame, maxMsg, deadline)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seqBytes(s.next))); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	for s.next < upTo {
		msg, err := zc.RecvMsg()
		if err != nil {
			if errors.Is(err, errFrame) {
				s.counters.DecodeErrors.Add(1)
			}
			return fmt.Errorf("replay: %w", err)
		}
		f := msg.Frames
		if len(f) == 3 && len(f[0]) == 0 {
			f = f[1:]
		}
		if msg.Type != zmq4.UsrMsg || len(f) != 2 || len(f[0]) != 8 {
			s.counters.DecodeErrors.Add(1)
			return errors.New("replay: malformed answer")
		}
		seq := binary.BigEndian.Uint64(f[0])
		switch {
		case seq == endSeq:
			return fmt.Errorf("replay ended at %d of %d", s.next, upTo)
		case seq < s.next:
			continue
		case seq > s.next:
			return fmt.Errorf("replay starts at %d, %d is no longer kept", seq, s.next)
		}
		b, err := Decode(f[1], s.cfg.Limits)
		if err != nil {
			s.counters.DecodeErrors.Add(1)
			return fmt.Errorf("replay of %d: %w", seq, err)
		}
		s.apply(Message{Topic: topic, Seq: seq, Batch: b, Replayed: true})
	}
	return nil
}
