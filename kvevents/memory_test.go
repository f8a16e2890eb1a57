//go:build !race

package kvevents

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/warmroute/warmroute/internal/testwait"
)

// A flood of frames announcing terabytes, and of garbage just under the
// bound, costs the subscriber what the bound allows, not what was announced.
func TestMemoryBoundedUnderAFloodOfHugeFrames(t *testing.T) {
	const limit = 1 << 20
	var r recorder
	s := newSubscriber(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, Limits: Limits{MaxPayloadBytes: limit}}, &r)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	const conns = 50
	var announced uint64
	for i := range conns {
		_, c := rawPub(t, s.Addr())
		size := uint64(1) << (30 + i%12) // 1 GiB to 2 TiB
		announced += size
		hdr := [9]byte{0x02} // a long frame, the last of its message
		binary.BigEndian.PutUint64(hdr[1:], size)
		if _, err := c.Write(hdr[:]); err != nil {
			t.Fatal(err)
		}
		c.Write(make([]byte, 4<<10)) // a start on the body; the subscriber may have hung up
		// The subscriber hangs up (or resets) rather than wait for the body.
		c.SetReadDeadline(time.Now().Add(testwait.Timeout))
		if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the subscriber waits for a frame announced at %d bytes", size)
		}
		c.Close()
	}
	zc, _ := rawPub(t, s.Addr())
	junk := make([]byte, limit-1)
	for i := range junk {
		junk[i] = 0xdd // array32 headers: four billion elements announced, again and again
	}
	for range 20 {
		if err := zc.SendMsg(zmq4.NewMsgFrom(nil, seqBytes(0), junk)); err != nil {
			t.Fatal(err)
		}
	}
	good, _ := Encode(cleared(1), EncodeMap)
	if err := zc.SendMsg(zmq4.NewMsgFrom(nil, seqBytes(0), good)); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the good batch after the flood", func() bool { return r.count() == 1 }, r.String)
	runtime.ReadMemStats(&after)

	if got := s.Counters().DecodeErrors.Load(); got != conns+20 {
		t.Fatalf("%d decode errors, want %d", got, conns+20)
	}
	// The junk frames themselves are read (20 MiB, 40 with the test's own
	// copies); nothing is sized from the announcements.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 96<<20 {
		t.Fatalf("%d MiB allocated for %d TiB announced", alloc>>20, announced>>40)
	}
}
