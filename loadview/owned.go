package loadview

import (
	"context"
	"errors"
	"sync"
)

// maxParallelAdds bounds the Adds (each probes and discovers models) that
// one round of a discovery runs at a time.
const maxParallelAdds = 8

// ownedWorkers is the set of workers a discovery added, by base URL, and
// the rules DNSDiscovery and K8sDiscovery share (docs/design.md §8.3).
// Each round is given its source's whole answer: a discovery whose source
// failed runs no round, so a failed round empties nothing. Workers of its
// own that the answer no longer lists, or lists in another role, are
// removed with Registry.Remove, which drains them; new ones join through
// Admit and AddRole, so that the allow-list and MaxWorkers apply, at most
// maxParallelAdds at a time. A URL registered by someone else is never its
// own; one of its own that someone else removed is forgotten, and added
// again while listed. Its discovery serializes the calls and reads owned
// under the same lock.
type ownedWorkers[W any] struct {
	reg     *Registry
	role    func(W) Role                   // the role w is added in
	gone    func(u string, w W)            // logs u's removal
	refused func(u string, w W, err error) // logs why u was not added
	owned   map[string]W
	logged  map[string]struct{} // URLs whose refusal was logged (once while listed)
}

func newOwnedWorkers[W any](r *Registry, role func(W) Role, gone func(string, W), refused func(string, W, error)) ownedWorkers[W] {
	return ownedWorkers[W]{reg: r, role: role, gone: gone, refused: refused,
		owned: map[string]W{}, logged: map[string]struct{}{}}
}

// sync makes the workers of its own follow want: forget those someone else
// removed, remove those want does not list in their role, add want's new
// ones. Refused or failed additions are logged once while want lists them.
func (o *ownedWorkers[W]) sync(ctx context.Context, want map[string]W) {
	present := map[string]struct{}{}
	for _, w := range o.reg.Workers() {
		present[w.base] = struct{}{}
	}
	for u, w := range o.owned {
		if _, ok := present[u]; !ok {
			delete(o.owned, u) // removed by someone else
		} else if nw, ok := want[u]; !ok || o.role(nw) != o.role(w) {
			o.reg.Remove(u) // drains: in-flight requests finish on the *Worker they hold
			delete(o.owned, u)
			delete(present, u) // in another role: added again below
			o.gone(u, w)
		} else {
			o.owned[u] = nw // what else the answer says of it may have changed
		}
	}
	for u := range o.logged {
		if _, ok := want[u]; !ok {
			delete(o.logged, u)
		}
	}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // guards owned and logged while adds run
		sem = make(chan struct{}, maxParallelAdds)
	)
	for u, w := range want {
		if _, ok := present[u]; ok {
			continue // ours already, or someone else's (never ours then)
		}
		if err := o.reg.Admit(u); err != nil {
			mu.Lock()
			o.refuse(u, w, err)
			mu.Unlock()
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := o.reg.AddRole(ctx, u, nil, o.role(w))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				o.refuse(u, w, err)
				return
			}
			o.owned[u] = w
			delete(o.logged, u)
		}()
	}
	wg.Wait()
}

// refuse logs, once while listed, why u was not added.
func (o *ownedWorkers[W]) refuse(u string, w W, err error) {
	if errors.Is(err, ErrDuplicate) {
		return // added meanwhile by someone else
	}
	if _, ok := o.logged[u]; !ok {
		o.logged[u] = struct{}{}
		o.refused(u, w, err)
	}
}
