package bulkhead

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// The permit protocol, whole. An operation takes an admission permit
// without waiting (refused: ErrAdmissionFull), then an execution permit in
// FIFO order for a bounded time (timed out: ErrQueueTimeout): first in its
// workload's budget if it names one, then in the global budget. Only then
// does it get a server connection (pool.go), so a refused or waiting
// operation holds none. Its permits come back, exactly once, when the
// driver has finished the operation (Gate.release).

// budget is one pair of semaphores under one mutex: admission, B+Q
// permits tried without waiting, and execution, B permits handed out in
// FIFO order. A gate has one for its global budget and one per workload.
// It starts no goroutine and never waits without bound.
type budget struct {
	name string // the workload's; "" for the global budget

	mu       sync.Mutex
	b, q     int           // the limits in force
	wait     time.Duration // the queue wait
	dryRun   bool
	admitted int // admission permits held
	running  int // execution permits held: above b after a shrink, or in dry-run
	waiting  int // waiters queued
	head     *waiter
	tail     *waiter
	closed   bool
	done     chan struct{}  // closed by close
	drained  chan struct{}  // closed once running ≤ b; nil when nobody waits for it
	full     *RejectedError // admission full with b running and q waiting, made once per resize

	nAdmitted, nFull, nTimeout, nConnFailed, nCanceled, nWait, nWaitNanos, nWouldWait atomic.Int64
}

// waiter is one operation queued for an execution permit. ready is closed,
// under mu, when the permit is handed to it.
type waiter struct {
	ready      chan struct{}
	next, prev *waiter
	granted    bool
}

func newBudget(name string) *budget {
	return &budget{name: name, done: make(chan struct{})}
}

// resize puts new limits in force. Running work keeps its permits: when b
// shrinks below the permits held, releases pay the excess before a waiter
// is served; when it grows, waiters are served in FIFO order. When b+q
// shrinks below the admitted, admission refuses until enough ended.
func (l *budget) resize(b, q int, wait time.Duration, dryRun bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b, l.q, l.wait, l.dryRun = b, q, wait, dryRun
	l.full = &RejectedError{Cause: ErrAdmissionFull, Workload: l.name, MaxConcurrent: b, MaxQueue: q, Running: b, Waiting: q}
	l.grantLocked()
}

// tryAcquire takes both permits if both are free and nobody waits, and
// reports whether it did: the whole protocol of an operation of a budget
// with room.
func (l *budget) tryAcquire() bool {
	l.mu.Lock()
	ok := !l.closed && l.waiting == 0 && l.running < l.b && l.admitted < l.b+l.q
	if ok {
		l.admitted++
		l.running++
	}
	l.mu.Unlock()
	return ok
}

// admit takes an admission permit without waiting. In dry-run it always
// does, and reports the rejection it would have made (over).
func (l *budget) admit() (over bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.admitted < l.b+l.q:
	case l.dryRun:
		over = true
	case l.running == l.b && l.waiting == l.q:
		return false, l.full
	default:
		e := *l.full
		e.Running, e.Waiting = l.running, l.waiting
		return false, &e
	}
	l.admitted++
	return over, nil
}

func (l *budget) unadmit() {
	l.mu.Lock()
	l.admitted--
	l.mu.Unlock()
}

// release gives back both permits: the execution permit to the first
// waiter if there is room, then the admission permit, so that the
// operations running or waiting are always among those admitted.
func (l *budget) release() {
	l.mu.Lock()
	l.running--
	l.admitted--
	if l.running < 0 || l.admitted < 0 {
		l.mu.Unlock()
		panic("bulkhead: bug: permits released more than held")
	}
	l.grantLocked()
	l.mu.Unlock()
}

// releaseExec gives back an execution permit alone.
func (l *budget) releaseExec() {
	l.mu.Lock()
	l.running--
	l.grantLocked()
	l.mu.Unlock()
}

// grantLocked hands execution permits to the waiters at the head of the
// queue while there is room (in dry-run, to all), and closes drained once
// running work is within b.
func (l *budget) grantLocked() {
	for l.head != nil && (l.running < l.b || l.dryRun) {
		w := l.head
		l.unlinkLocked(w)
		l.running++
		w.granted = true
		close(w.ready)
	}
	if l.drained != nil && (l.running <= l.b || l.dryRun) {
		close(l.drained)
		l.drained = nil
	}
}

// waitDrained returns once the operations holding execution permits are
// no more than b (at once in dry-run, where nothing is enforced), or ctx
// ends: then it returns ctx's error.
func (l *budget) waitDrained(ctx context.Context) error {
	l.mu.Lock()
	if l.running <= l.b || l.dryRun {
		l.mu.Unlock()
		return nil
	}
	if l.drained == nil {
		l.drained = make(chan struct{})
	}
	ch := l.drained
	l.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *budget) unlinkLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.next, w.prev = nil, nil
	l.waiting--
}

// close makes waiters, and later operations, return ErrClosed. Operations
// running keep their permits until they release them.
func (l *budget) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
}

func (l *budget) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// stats fills the budget's part of s.
func (l *budget) stats(s *Stats) {
	l.mu.Lock()
	s.MaxConcurrent, s.MaxQueue, s.QueueWait, s.DryRun = l.b, l.q, l.wait, l.dryRun
	s.Running, s.Waiting = l.running, l.waiting
	l.mu.Unlock()
	s.Admitted = l.nAdmitted.Load()
	s.RejectedFull = l.nFull.Load()
	s.RejectedTimeout = l.nTimeout.Load()
	s.ConnectFailed = l.nConnFailed.Load()
	s.Canceled = l.nCanceled.Load()
	s.WaitCount = l.nWait.Load()
	s.WaitDuration = time.Duration(l.nWaitNanos.Load())
	s.WouldWait = l.nWouldWait.Load()
}

// passage is one operation's way through its budgets (its workload's,
// then the global one): one wait limit and one timer serve them all.
type passage struct {
	limit       time.Duration // the longest wait in all
	start       time.Time     // set when it first has to wait
	timer       *time.Timer
	wouldReject bool // dry-run: admission was full, the rejection not made
}

func (ps *passage) waited() time.Duration {
	if ps.start.IsZero() {
		return 0
	}
	return time.Since(ps.start)
}

// acquire takes the admission permits of ls in order, then their execution
// permits in order. On failure nothing is held, and the error is a
// *RejectedError, ErrClosed or ctx's error, counted in every budget of ls.
// Success is counted by the caller once the operation has its server
// connection too.
func (ps *passage) acquire(ctx context.Context, ls []*budget) error {
	if err := ctx.Err(); err != nil {
		count(ls, func(l *budget) { l.nCanceled.Add(1) })
		return err
	}
	for i, l := range ls {
		over, err := l.admit()
		if err != nil {
			for _, prev := range ls[:i] {
				prev.unadmit()
			}
			if err == ErrClosed {
				count(ls, func(l *budget) { l.nCanceled.Add(1) })
			} else {
				count(ls, func(l *budget) { l.nFull.Add(1) })
			}
			return err
		}
		if over && !ps.wouldReject {
			ps.wouldReject = true
			count(ls, func(l *budget) { l.nFull.Add(1) })
		}
	}
	for i, l := range ls {
		if err := l.execute(ctx, ps); err != nil {
			for _, prev := range ls[:i] {
				prev.releaseExec()
			}
			for _, l := range ls {
				l.unadmit()
			}
			ps.stop(ls)
			if errors.Is(err, ErrQueueTimeout) {
				count(ls, func(l *budget) { l.nTimeout.Add(1) })
			} else {
				count(ls, func(l *budget) { l.nCanceled.Add(1) })
			}
			return err
		}
	}
	ps.stop(ls)
	return nil
}

func count(ls []*budget, inc func(*budget)) {
	for _, l := range ls {
		inc(l)
	}
}

// stop ends the passage's wait: the timer is stopped and the time waited
// counted in every budget of ls.
func (ps *passage) stop(ls []*budget) {
	if ps.timer != nil {
		ps.timer.Stop()
	}
	if !ps.start.IsZero() {
		d := int64(ps.waited())
		for _, l := range ls {
			l.nWait.Add(1)
			l.nWaitNanos.Add(d)
		}
	}
}

// execute takes an execution permit of l, waiting in FIFO order until the
// passage's limit, ctx's end or l's close. A permit granted at the instant
// the wait ends is handed on, never kept by a caller that reports failure.
func (l *budget) execute(ctx context.Context, ps *passage) error {
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return ErrClosed
	case l.waiting == 0 && l.running < l.b:
		l.running++
		l.mu.Unlock()
		return nil
	case l.dryRun:
		l.running++
		l.mu.Unlock()
		if !ps.wouldReject { // one refused at admission would never have waited
			l.nWouldWait.Add(1)
		}
		return nil
	}
	left := ps.limit
	if !ps.start.IsZero() {
		left -= time.Since(ps.start)
	}
	if left <= 0 {
		err := l.timeoutLocked(ps, 0)
		l.mu.Unlock()
		return err
	}
	if ps.start.IsZero() {
		ps.start = time.Now()
	}
	w := &waiter{ready: make(chan struct{})}
	w.prev = l.tail
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.waiting++
	l.mu.Unlock()

	if ps.timer == nil {
		ps.timer = time.NewTimer(left)
	}
	var err error
	select {
	case <-w.ready:
		return nil
	case <-ps.timer.C:
	case <-ctx.Done():
		err = ctx.Err()
	case <-l.done:
		err = ErrClosed
	}
	l.mu.Lock()
	if w.granted {
		l.running-- // granted as the wait ended: hand it on
		l.grantLocked()
	} else {
		l.unlinkLocked(w)
	}
	if err == nil {
		err = l.timeoutLocked(ps, 1)
	}
	l.mu.Unlock()
	return err
}

// timeoutLocked is the queue-timeout rejection of an operation of ps;
// queued is 1 if it was queued (it counts among the waiting), else 0.
func (l *budget) timeoutLocked(ps *passage, queued int) error {
	return &RejectedError{Cause: ErrQueueTimeout, Workload: l.name, MaxConcurrent: l.b, MaxQueue: l.q,
		Running: l.running, Waiting: l.waiting + queued, Waited: ps.waited()}
}

// permit is the state of one gated operation while it holds its permits.
type permit struct {
	kind   Kind
	wl     *budget // the workload's budget, nil for none
	waited time.Duration
	start  time.Time   // set only when OnRelease needs the hold time
	timer  *time.Timer // the hold warning, if set
}

// acquire takes the permits of an operation of kind k: ctx's workload's
// (if the policy lists it) and the global ones. Rejections are counted and
// reported here; an admission is counted by admitted, once the operation
// has its server connection too.
func (g *Gate) acquire(ctx context.Context, k Kind, p *permit) error {
	o := fromContext(ctx)
	wl := g.workload(o.workload)
	p.kind, p.wl, p.waited = k, wl, 0
	if wl == nil && o.wait < 0 && ctx.Err() == nil && g.global.tryAcquire() {
		return nil
	}
	var ls [2]*budget
	n := 0
	if wl != nil {
		ls[n] = wl
		n++
	}
	ls[n] = g.global
	n++
	ps := passage{limit: o.wait}
	if ps.limit < 0 {
		ls[0].mu.Lock()
		ps.limit = ls[0].wait
		ls[0].mu.Unlock()
	}
	err := ps.acquire(ctx, ls[:n])
	p.waited = ps.waited()
	if g.opt.events.OnReject != nil && (ps.wouldReject || errors.Is(err, ErrRejected)) {
		g.reportReject(p, err)
	}
	return err
}

// reportReject calls OnReject for an operation refused with err, or, with
// err nil, let through by dry-run where admission was full.
func (g *Gate) reportReject(p *permit, err error) {
	e := Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Reason: ErrAdmissionFull, DryRun: err == nil}
	if errors.Is(err, ErrQueueTimeout) {
		e.Reason = ErrQueueTimeout
	}
	emit(g.opt.events.OnReject, e)
}

// workloadName is the name of the workload budget p passes, "" for none.
func (p *permit) workloadName() string {
	if p.wl == nil {
		return ""
	}
	return p.wl.name
}

// admitted counts p's operation as admitted, now that it has its permits
// and a server connection, and starts what watches it.
func (g *Gate) admitted(p *permit) {
	g.global.nAdmitted.Add(1)
	if p.wl != nil {
		p.wl.nAdmitted.Add(1)
	}
	if g.opt.events.OnRelease != nil {
		p.start = time.Now()
	}
	if g.opt.holdLimit > 0 {
		e, report := Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Held: g.opt.holdLimit}, g.opt.onHold
		p.timer = time.AfterFunc(e.Held, func() { emit(report, e) })
	}
	if g.opt.events.OnAdmit != nil {
		emit(g.opt.events.OnAdmit, Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited})
	}
}

// abort gives back the permits of an operation that got them but no
// server connection, and counts why: the context ended or the gate closed
// (Canceled), else the dial or the driver failed (ConnectFailed).
func (g *Gate) abort(p *permit, err error) {
	g.global.release()
	if p.wl != nil {
		p.wl.release()
	}
	c := func(l *budget) { l.nConnFailed.Add(1) }
	if err == ErrClosed || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		c = func(l *budget) { l.nCanceled.Add(1) }
	}
	c(g.global)
	if p.wl != nil {
		c(p.wl)
	}
}

// release gives back the permits of p, acquired by acquire and counted by
// admitted. OnRelease is called first, while the permits are still held,
// so that counting admissions minus releases never exceeds B.
func (g *Gate) release(p *permit) {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if g.opt.events.OnRelease != nil {
		emit(g.opt.events.OnRelease, Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Held: time.Since(p.start)})
	}
	// The global permit first: while the workload's is still held, no
	// other operation of the workload can take the one given back, so a
	// workload never holds more than its B of the global permits.
	g.global.release()
	if p.wl != nil {
		p.wl.release()
	}
}
