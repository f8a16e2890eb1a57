package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// PublisherConfig configures a Publisher. Both endpoints are bound.
type PublisherConfig struct {
	// Endpoint is the PUB address: tcp://*:5557, tcp://127.0.0.1:0 (any
	// free port; Addr says which), ipc:///path.
	Endpoint string
	// ReplayEndpoint is the replay ROUTER's address; "" for none.
	ReplayEndpoint string
	// Topic is the first frame of every message.
	Topic string
	// BufferSteps is how many of the latest batches replay can send again
	// (vLLM's buffer_steps); 10000 when 0.
	BufferSteps int
	// QueueLen is how many messages wait for one slow subscriber before it
	// misses some (and sees a gap); 10000 when 0.
	QueueLen int
	// DPRank is written on batches whose DPRank is < 0; -1 writes none.
	DPRank int
	// Encoding of the events.
	Encoding Encoding
}

// Publisher publishes batches as a vLLM engine does: a PUB socket for the
// stream, a ROUTER socket that replays the latest batches on request. A
// subscriber that connects late misses what was published before, as with
// ZMQ's PUB.
type Publisher struct {
	cfg      PublisherConfig
	ctx      context.Context
	cancel   context.CancelFunc
	pubLn    net.Listener
	replayLn net.Listener
	wg       sync.WaitGroup

	mu     sync.Mutex
	closed bool
	seq    uint64
	ring   []stored // the latest batches, oldest at ring[head] once full
	head   int
	peers  map[*pubPeer]struct{}
	conns  map[net.Conn]struct{}

	dropped atomic.Uint64
}

type stored struct {
	seq     uint64
	payload []byte
}

type pubPeer struct {
	zc   *zmq4.Conn
	out  chan [][]byte
	mu   sync.Mutex
	subs []string // topic prefixes subscribed to
}

const (
	defaultBufferSteps = 10000
	defaultQueueLen    = 10000
	handshakeTimeout   = 5 * time.Second
	// peerFrameLimit bounds what a subscriber or a replay client may send
	// a publisher: subscriptions and replay requests are small.
	peerFrameLimit = 64 << 10
)

// NewPublisher binds the endpoints and starts serving them.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = defaultBufferSteps
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = defaultQueueLen
	}
	p := &Publisher{
		cfg:   cfg,
		ring:  make([]stored, 0, min(cfg.BufferSteps, 1024)),
		peers: make(map[*pubPeer]struct{}),
		conns: make(map[net.Conn]struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	var err error
	if p.pubLn, err = listen(cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if p.replayLn, err = listen(cfg.ReplayEndpoint); err != nil {
			p.pubLn.Close()
			return nil, err
		}
		p.wg.Add(1)
		go p.accept(p.replayLn, zmq4.Router, p.serveReplay)
	}
	p.wg.Add(1)
	go p.accept(p.pubLn, zmq4.Pub, p.servePub)
	return p, nil
}

func listen(ep string) (net.Listener, error) {
	network, addr, err := splitEndpoint(ep)
	if err != nil {
		return nil, err
	}
	return net.Listen(network, addr)
}

// Addr is the PUB endpoint as bound, its port resolved.
func (p *Publisher) Addr() string { return endpointOf(p.pubLn.Addr()) }

// ReplayAddr is the replay endpoint as bound; "" without one.
func (p *Publisher) ReplayAddr() string {
	if p.replayLn == nil {
		return ""
	}
	return endpointOf(p.replayLn.Addr())
}

// Dropped counts the messages a slow subscriber's full queue did not take.
func (p *Publisher) Dropped() uint64 { return p.dropped.Load() }

// Subscribers counts the connected subscribers whose subscription takes
// this publisher's topic.
func (p *Publisher) Subscribers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for peer := range p.peers {
		if peer.wants(p.cfg.Topic) {
			n++
		}
	}
	return n
}

var errClosed = errors.New("kvevents: closed")

// Publish encodes b, stamps it with the next sequence number (the first is
// 0), keeps it for replay and queues it to every subscriber; it never waits
// for one. It returns the sequence number.
func (p *Publisher) Publish(b Batch) (uint64, error) {
	return p.publish(b, true)
}

// publish with send false keeps the batch for replay but sends it to no
// one: a message the network lost.
func (p *Publisher) publish(b Batch, send bool) (uint64, error) {
	if b.DPRank < 0 {
		b.DPRank = p.cfg.DPRank
	}
	payload, err := Encode(b, p.cfg.Encoding)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errClosed
	}
	seq := p.seq
	p.seq++
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, stored{seq, payload})
	} else {
		p.ring[p.head] = stored{seq, payload}
		p.head = (p.head + 1) % len(p.ring)
	}
	if !send {
		return seq, nil
	}
	frames := [][]byte{[]byte(p.cfg.Topic), seqBytes(seq), payload}
	for peer := range p.peers {
		if !peer.wants(p.cfg.Topic) {
			continue
		}
		select {
		case peer.out <- frames:
		default:
			p.dropped.Add(1)
		}
	}
	return seq, nil
}

// Close stops serving and closes every connection; it waits for its
// goroutines.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	p.pubLn.Close()
	if p.replayLn != nil {
		p.replayLn.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// track registers c to be closed by Close; false when closed already.
func (p *Publisher) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Publisher) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Publisher) accept(ln net.Listener, typ zmq4.SocketType, serve func(*zmq4.Conn)) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			if !sleepCtx(p.ctx, 10*time.Millisecond) { // out of descriptors, say
				return
			}
			continue
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			zc, err := handshake(c, typ, true, peerFrameLimit, peerFrameLimit, time.Now().Add(handshakeTimeout))
			if err != nil {
				return
			}
			serve(zc)
		}()
	}
}

// servePub reads a subscriber's subscriptions while a second goroutine
// writes its queue.
func (p *Publisher) servePub(zc *zmq4.Conn) {
	peer := &pubPeer{zc: zc, out: make(chan [][]byte, p.cfg.QueueLen)}
	p.mu.Lock()
	p.peers[peer] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			select {
			case frames := <-peer.out:
				if zc.SendMsg(zmq4.NewMsgFrom(frames...)) != nil {
					zc.Close()
					return
				}
			case <-done:
				return
			}
		}
	}()
	defer func() {
		p.mu.Lock()
		delete(p.peers, peer)
		p.mu.Unlock()
		close(done)
	}()
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type != zmq4.UsrMsg || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue
		}
		f := msg.Frames[0]
		peer.subscribe(f[0] == 1, string(f[1:]))
	}
}

func (peer *pubPeer) subscribe(on bool, prefix string) {
	peer.mu.Lock()
	defer peer.mu.Unlock()
	for i, s := range peer.subs {
		if s == prefix {
			if !on {
				peer.subs = append(peer.subs[:i], peer.subs[i+1:]...)
			}
			return
		}
	}
	if on && len(peer.subs) < 64 {
		peer.subs = append(peer.subs, prefix)
	}
}

func (peer *pubPeer) wants(topic string) bool {
	peer.mu.Lock()
	defer peer.mu.Unlock()
	for _, s := range peer.subs {
		if len(topic) >= len(s) && topic[:len(s)] == s {
			return true
		}
	}
	return false
}

// serveReplay answers replay requests as vLLM's publisher does: a request
// is [empty, start], the answer [empty, seq, payload] for every kept batch
// from start on, then [empty, endSeq, empty]. A request without the empty
// frame is answered without it; anything else is ignored.
func (p *Publisher) serveReplay(zc *zmq4.Conn) {
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		f := msg.Frames
		var delim [][]byte
		switch {
		case msg.Type != zmq4.UsrMsg:
			continue
		case len(f) == 2 && len(f[0]) == 0 && len(f[1]) == 8:
			delim, f = [][]byte{{}}, f[1:]
		case len(f) == 1 && len(f[0]) == 8:
		default:
			continue
		}
		start := binary.BigEndian.Uint64(f[0])
		for _, s := range p.since(start) {
			if zc.SendMsg(zmq4.NewMsgFrom(append(delim, seqBytes(s.seq), s.payload)...)) != nil {
				return
			}
		}
		if zc.SendMsg(zmq4.NewMsgFrom(append(delim, seqBytes(endSeq), nil)...)) != nil {
			return
		}
	}
}

// since copies out the kept batches numbered start or later, in order.
func (p *Publisher) since(start uint64) []stored {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []stored
	for i := range p.ring {
		s := p.ring[(p.head+i)%len(p.ring)]
		if s.seq >= start {
			out = append(out, s)
		}
	}
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
