package admission

import "time"

// returns keeps a model's urgent sessions expected back at their workers
// (docs/design.md §9, "Slots for returning sessions"): an urgent turn
// that waited and ended on a worker leaves a promise there, the next
// urgent turn whose history that worker holds takes one, and a promise
// older than Config.ReturnWindow lapses. A worker's live promises are
// slots background work leaves free: the session's next turn, an agent's
// tool result or a user's reply, finds one at once on the worker that
// holds its history instead of waiting there for a batch to end. Owned
// by its modelQueue, under the Controller's lock.
type returns map[uint32]*promises

// maxPromises bounds the promises one worker keeps: past it the oldest
// is dropped.
const maxPromises = 64

// promises is one worker's, oldest first: a ring of arrival times.
type promises struct {
	at   [maxPromises]time.Time
	head int
	n    int
}

// promise records an urgent turn that ended on worker at now.
func (r returns) promise(worker uint32, now time.Time) {
	p := r[worker]
	if p == nil {
		p = &promises{}
		r[worker] = p
	}
	if p.n == maxPromises {
		p.head = (p.head + 1) % maxPromises
		p.n--
	}
	p.at[(p.head+p.n)%maxPromises] = now
	p.n++
}

// keep takes the oldest live promise of worker: an urgent turn of a
// session it holds came back.
func (r returns) keep(worker uint32, now time.Time, window time.Duration) {
	p := r[worker]
	if p == nil {
		return
	}
	p.lapse(now, window)
	if p.n > 0 {
		p.head = (p.head + 1) % maxPromises
		p.n--
	}
	if p.n == 0 {
		delete(r, worker)
	}
}

// live is how many promises of worker have not lapsed.
func (r returns) live(worker uint32, now time.Time, window time.Duration) int {
	p := r[worker]
	if p == nil {
		return 0
	}
	p.lapse(now, window)
	if p.n == 0 {
		delete(r, worker)
	}
	return p.n
}

// total is the live promises of every worker.
func (r returns) total(now time.Time, window time.Duration) int {
	n := 0
	for w := range r {
		n += r.live(w, now, window)
	}
	return n
}

// lapse drops the promises older than window.
func (p *promises) lapse(now time.Time, window time.Duration) {
	for p.n > 0 && now.Sub(p.at[p.head]) > window {
		p.head = (p.head + 1) % maxPromises
		p.n--
	}
}
