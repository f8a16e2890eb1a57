package loadview

import "sort"

// Imbalanced reports whether routing to w would overload it relative to the
// least-loaded healthy worker among ws: load(w) - min > abs AND
// load(w) > min × rel, on fleet-wide loads (FleetLoad: with one replica, or
// without load reports, the local in-flight count; docs/design.md §8.3). Unhealthy workers never count towards min (a dead
// worker at load 0 must not disable every affinity).
//
// The scan over ws happens only when load(w) > abs, since min ≥ 0 makes the
// first gate false otherwise; the common case is O(1) in the fleet size.
func Imbalanced(ws []*Worker, w *Worker, abs int64, rel float64) bool {
	lw := w.FleetLoad()
	if lw <= abs {
		return false
	}
	min := int64(-1)
	for _, o := range ws {
		if !o.Healthy() {
			continue
		}
		if l := o.FleetLoad(); min < 0 || l < min {
			min = l
		}
	}
	if min < 0 {
		return false
	}
	return lw-min > abs && float64(lw) > float64(min)*rel
}

func sortStrings(s []string) { sort.Strings(s) }
