package loadview

import "fmt"

// Role is what a worker does in a disaggregated fleet (docs/design.md §9,
// "Disaggregated fleets"): a Regular worker serves whole requests, a
// Prefill worker computes a prompt's KV cache and hands it to a Decode
// worker, which generates the answer. A Regular or Prefill worker is an
// entry worker: the worker step's policy chooses among them, and the
// choice of a Prefill worker adds a decode leg.
type Role uint8

const (
	Regular Role = iota
	Prefill
	Decode
)

// String is the role's name in flags, admin bodies, listings and metrics:
// the vLLM router's worker types.
func (r Role) String() string {
	switch r {
	case Prefill:
		return "prefill"
	case Decode:
		return "decode"
	}
	return "regular"
}

// ParseRole reads a role's name; "" is Regular.
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "regular":
		return Regular, nil
	case "prefill":
		return Prefill, nil
	case "decode":
		return Decode, nil
	}
	return Regular, fmt.Errorf("role %q: want regular, prefill or decode", s)
}

// Role is the worker's role, fixed when it was added.
func (w *Worker) Role() Role { return w.role }
