package main

import "testing"

// TestNthEndpoint: --count workers take consecutive ports (or suffixed
// paths) from the KV events endpoints; port 0 stays any free port.
func TestNthEndpoint(t *testing.T) {
	for _, c := range []struct {
		ep   string
		i    int
		want string
		err  bool
	}{
		{"", 3, "", false},
		{"tcp://*:5557", 0, "tcp://*:5557", false},
		{"tcp://*:5557", 2, "tcp://*:5559", false},
		{"tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0", false},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", false},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv-1", false},
		{"tcp://*:65535", 1, "", true},
		{"udp://x:1", 1, "", true},
		{"tcp://nohost", 1, "", true},
	} {
		got, err := nthEndpoint(c.ep, c.i)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("nthEndpoint(%q, %d) = %q, %v; want %q, error %v", c.ep, c.i, got, err, c.want, c.err)
		}
	}
}
