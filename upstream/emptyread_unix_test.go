//go:build unix

package upstream

import (
	"net"
	"syscall"
	"testing"
)

// BenchmarkEmptyRead: one read(2) that finds nothing on a loopback TCP
// connection (EAGAIN), the read the exchange's yield saves under load
// (docs/design.md §7), against getpid(2), the cheapest system call: what
// this machine charges for a system call, which on a paravirtualised guest
// can exceed the rest of the routing.
func BenchmarkEmptyRead(b *testing.B) {
	ln := listen(b)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if peer, ok := <-accepted; ok {
		defer peer.Close() // open and silent: every read finds nothing
	}
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	var buf [512]byte
	b.Run("read-EAGAIN", func(b *testing.B) {
		for b.Loop() {
			var rerr error
			_ = rc.Control(func(fd uintptr) { _, rerr = syscall.Read(int(fd), buf[:]) })
			if rerr != syscall.EAGAIN {
				b.Fatalf("read: %v, want EAGAIN", rerr)
			}
		}
	})
	b.Run("getpid", func(b *testing.B) {
		for b.Loop() {
			syscall.Getpid()
		}
	})
}
