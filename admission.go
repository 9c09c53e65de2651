package bulkhead

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// The permit protocol, whole: an operation takes an admission permit
// without waiting (refused: ErrAdmissionFull), then an execution permit in
// FIFO order for a bounded time (timed out: ErrQueueTimeout), first in its
// workload's budget if it names one, then in the global budget. Only then
// does it get a server connection (pool.go), so a refused or waiting
// operation holds none. Its permits come back, exactly once, when the
// driver has finished the operation: Gate.release.

// limiter is one budget: a pair of semaphores. Admission is a counter
// tried without waiting; execution is a FIFO semaphore waited on for a
// bounded time. The gate has one for its global budget and one per
// workload. It starts no goroutine and never waits without bound.
type limiter struct {
	workload string

	admitted atomic.Int64 // admission permits held
	maxAdmit atomic.Int64 // B+Q
	dryRun   atomic.Bool
	waitNs   atomic.Int64 // wait, readable without mu
	// fullErr is the admission-full rejection for the usual case, B
	// running and Q waiting, preallocated so that rejecting under steady
	// overload allocates nothing.
	fullErr  atomic.Pointer[RejectedError]
	maxConcA atomic.Int64 // maxConc, readable without mu
	closedA  atomic.Bool

	// exec is the execution semaphore's state in one word (see
	// execState): the free permits and the number of queued waiters.
	// With no waiter, a permit is taken and given back by compare-and-swap
	// alone; with waiters, only under mu, so that the FIFO queue and the
	// word change together and no permit is ever free while an operation
	// waits.
	exec atomic.Uint64

	mu       sync.Mutex
	maxConc  int
	maxQueue int
	wait     time.Duration
	head     *waiter
	tail     *waiter
	closed   bool
	done     chan struct{} // closed by close
	paid     chan struct{} // closed when running work is back within B (see drained)

	nAdmitted, nFull, nTimeout, nNoConn, nConnFailed, nCanceled, nWait, waitNanos, nWouldWait atomic.Int64
}

// execState packs the execution semaphore: free, B minus the permits held,
// in the low 32 bits as a signed number (it goes below zero when the
// budget shrinks under running work, or in dry-run: releases then pay the
// debt before any waiter is woken), and the waiters queued in the high 32.
type execState uint64

func packExec(free int64, waiting int64) uint64 {
	return uint64(waiting)<<32 | uint64(uint32(int32(free)))
}

func (s execState) free() int64    { return int64(int32(uint32(s))) }
func (s execState) waiting() int64 { return int64(s >> 32) }

// counts returns the free execution permits and the queued waiters, from
// one atomic read.
func (l *limiter) counts() (free, waiting int) {
	s := execState(l.exec.Load())
	return int(s.free()), int(s.waiting())
}

// addExecLocked adds dFree to the free permits and dWaiting to the
// waiters. mu is held, but the fast paths may take or give back a permit
// meanwhile (while nobody waits): compare-and-swap.
func (l *limiter) addExecLocked(dFree, dWaiting int64) {
	for {
		old := l.exec.Load()
		s := execState(old)
		if l.exec.CompareAndSwap(old, packExec(s.free()+dFree, s.waiting()+dWaiting)) {
			return
		}
	}
}

// waiter is one operation in the FIFO queue for an execution permit.
// ready is closed, under mu, when the permit is handed to it.
type waiter struct {
	ready      chan struct{}
	next, prev *waiter
	granted    bool
}

func newLimiter(workload string, p Policy) *limiter {
	l := &limiter{workload: workload, done: make(chan struct{})}
	l.resize(p)
	return l
}

// resize sets new limits. Running work keeps its permits: when B shrinks,
// releases pay for the excess before new work starts; when it grows,
// waiters are woken in FIFO order. When B+Q shrinks below the admitted
// count, admission refuses until enough operations ended.
func (l *limiter) resize(p Policy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addExecLocked(int64(p.MaxConcurrent-l.maxConc), 0)
	l.maxConc, l.maxQueue, l.wait = p.MaxConcurrent, p.MaxQueue, p.QueueWait
	l.maxConcA.Store(int64(p.MaxConcurrent))
	l.waitNs.Store(int64(p.QueueWait))
	l.maxAdmit.Store(int64(p.MaxConcurrent) + int64(p.MaxQueue))
	l.fullErr.Store(&RejectedError{Cause: ErrAdmissionFull, Workload: l.workload, MaxConcurrent: p.MaxConcurrent, MaxQueue: p.MaxQueue, Running: p.MaxConcurrent, Waiting: p.MaxQueue})
	l.dryRun.Store(p.DryRun)
	for l.head != nil {
		if free, _ := l.counts(); free <= 0 && !p.DryRun { // nobody waits in dry-run: let current waiters run
			break
		}
		l.grantLocked(true)
	}
	l.paidLocked()
}

// drained returns a channel closed once the operations holding execution
// permits are no more than B: at once if they are, else when releases
// have paid the debt a shrinking resize left. A fleet gives back its
// slots only then (fleet.go).
func (l *limiter) drained() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.paid == nil {
		l.paid = make(chan struct{})
	}
	ch := l.paid
	l.paidLocked()
	return ch
}

// paidLocked closes paid if running work is within B.
func (l *limiter) paidLocked() {
	if l.paid == nil {
		return
	}
	if free, _ := l.counts(); free >= 0 {
		close(l.paid)
		l.paid = nil
	}
}

// acquire takes both permits of this budget alone, with its own queue
// wait: the whole protocol for a gate without workloads, and counts the
// operation as admitted. On success both permits are held and must be
// given back with release; waited is the time spent waiting (0 when a
// permit was free). On failure nothing is held: the error is an
// admission-full or queue-timeout *RejectedError, ErrClosed, or ctx.Err().
func (l *limiter) acquire(ctx context.Context) (waited time.Duration, err error) {
	if ctx.Err() == nil && l.tryNow() { // as Gate.acquire
		l.nAdmitted.Add(1)
		return 0, nil
	}
	var q queueing
	err = q.acquire(ctx, []*limiter{l}, -1, 0)
	if err == nil {
		l.nAdmitted.Add(1)
	}
	return q.waited(), err
}

// release gives back both permits of a successful acquire. The execution
// permit goes to the first waiter, if any; the admission permit after it,
// so that the operations holding an execution permit or waiting for one
// are always among those admitted (as the article's Java gate releases).
func (l *limiter) release() {
	l.releaseExec()
	l.unadmit()
}

// admit takes an admission permit if one is free, without waiting. In
// dry-run it always does, and reports the rejection it would have made.
func (l *limiter) admit() (ok, over bool) {
	max := l.maxAdmit.Load()
	for {
		n := l.admitted.Load()
		if n >= max && !l.dryRun.Load() {
			return false, true
		}
		if l.admitted.CompareAndSwap(n, n+1) {
			return true, n >= max
		}
	}
}

func (l *limiter) unadmit() {
	if l.admitted.Add(-1) < 0 {
		panic("bulkhead: bug: admission permit released more than held")
	}
}

// tryNow takes both permits if both are free and nobody waits, and
// reports whether it did; if not, it holds nothing and the caller takes
// the general path (queueing.acquire), which waits, rejects or, in
// dry-run, lets the operation through. It is the whole protocol of an
// operation of a budget with room: two compare-and-swaps.
func (l *limiter) tryNow() bool {
	if l.closedA.Load() {
		return false
	}
	max := l.maxAdmit.Load()
	for {
		n := l.admitted.Load()
		if n >= max {
			return false
		}
		if l.admitted.CompareAndSwap(n, n+1) {
			break
		}
	}
	for {
		old := l.exec.Load()
		if s := execState(old); s.waiting() != 0 || s.free() <= 0 {
			l.unadmit()
			return false
		}
		if l.exec.CompareAndSwap(old, old-1) { // free-1 (free > 0: no borrow)
			return true
		}
	}
}

// full returns the admission-full rejection with what the budget holds
// now: the preallocated value when that is B running and Q waiting.
func (l *limiter) full() error {
	e := l.fullErr.Load()
	free, w := l.counts()
	r := e.MaxConcurrent - free
	if r == e.Running && w == e.Waiting {
		return e
	}
	c := *e
	c.Running, c.Waiting = r, w
	return &c
}

// queueing is one operation's passage through one or more budgets
// (a workload's, then the global one): a single wait deadline and timer
// serve them all.
type queueing struct {
	start time.Time     // set when the operation first has to wait
	timer *time.Timer   // created when it first has to wait
	wait  time.Duration // the longest wait in all
	// deadline: the wait was cut short by the caller's deadline minus the reserve.
	deadline bool
	// wouldReject: in dry-run, admission was full and the rejection not made.
	wouldReject bool
	// running and waiting: what the budget held when the wait failed,
	// the operation itself included among the waiting.
	running, waiting int
}

func (q *queueing) waited() time.Duration {
	if q.start.IsZero() {
		return 0
	}
	return time.Since(q.start)
}

// acquire takes the admission permits of ls in order, then their
// execution permits in order, waiting at most wait in all (a negative wait
// means the first budget's own QueueWait), and never past the caller's
// deadline minus reserve when reserve > 0. On failure nothing is held.
// Failures are counted in every budget passed (see count); success is
// counted by the caller, once the operation has what else it needs.
func (q *queueing) acquire(ctx context.Context, ls []*limiter, wait time.Duration, reserve time.Duration) error {
	if err := ctx.Err(); err != nil {
		count(ls, func(l *limiter) { l.nCanceled.Add(1) })
		return err
	}
	for i, l := range ls {
		ok, over := l.admit()
		if !ok {
			for _, prev := range ls[:i] {
				prev.unadmit()
			}
			count(ls, func(l *limiter) { l.nFull.Add(1) })
			return l.full()
		}
		if over && !q.wouldReject {
			q.wouldReject = true
			count(ls, func(l *limiter) { l.nFull.Add(1) })
		}
	}
	if wait < 0 {
		wait = time.Duration(ls[0].waitNs.Load())
	}
	q.wait = wait
	if reserve > 0 {
		if d, ok := ctx.Deadline(); ok {
			if left := time.Until(d) - reserve; left < q.wait {
				q.wait, q.deadline = max(left, 0), true
				if left <= 0 && !ls[0].dryRun.Load() {
					// It could not finish in time: not started, even with
					// a permit free.
					for _, l := range ls {
						l.unadmit()
					}
					return q.fail(ls, len(ls)-1, ErrQueueTimeout)
				}
			}
		}
	}
	for i, l := range ls {
		if err := l.execute(ctx, q); err != nil {
			for _, prev := range ls[:i] {
				prev.releaseExec()
			}
			for _, l := range ls {
				l.unadmit()
			}
			return q.fail(ls, i, err)
		}
	}
	q.stop(ls)
	return nil
}

// count applies inc to every budget the operation passes: the global one
// counts every operation, a workload's every operation of the workload,
// whichever budget decided.
func count(ls []*limiter, inc func(*limiter)) {
	for _, l := range ls {
		inc(l)
	}
}

// stop ends the wait: the timer is stopped and the time waited counted in
// every budget passed.
func (q *queueing) stop(ls []*limiter) {
	if q.timer != nil {
		q.timer.Stop()
	}
	if !q.start.IsZero() {
		d := int64(q.waited())
		for _, l := range ls {
			l.nWait.Add(1)
			l.waitNanos.Add(d)
		}
	}
}

// fail turns a failed wait at ls[i] into the caller's error and counts it.
func (q *queueing) fail(ls []*limiter, i int, err error) error {
	q.stop(ls)
	if err != ErrQueueTimeout {
		count(ls, func(l *limiter) { l.nCanceled.Add(1) })
		return err
	}
	count(ls, func(l *limiter) { l.nTimeout.Add(1) })
	l := ls[i]
	l.mu.Lock()
	e := &RejectedError{Cause: ErrQueueTimeout, Workload: l.workload, MaxConcurrent: l.maxConc, MaxQueue: l.maxQueue,
		Running: q.running, Waiting: q.waiting, Waited: q.waited(), Deadline: q.deadline}
	l.mu.Unlock()
	return e
}

// execute takes an execution permit of l, waiting in FIFO order until q's
// wait ends, ctx ends or l closes. A permit granted at the instant the wait
// ends is handed on, never kept by a caller that reports failure.
func (l *limiter) execute(ctx context.Context, q *queueing) error {
	// The fast path: a free permit and nobody queued.
	if old := l.exec.Load(); execState(old).waiting() == 0 && execState(old).free() > 0 && !l.closedA.Load() {
		if l.exec.CompareAndSwap(old, old-1) { // free-1 (free > 0: no borrow)
			return nil
		}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	dry := l.dryRun.Load()
	for {
		old := l.exec.Load()
		s := execState(old)
		if s.waiting() == 0 && (s.free() > 0 || dry) {
			// Free (or, in dry-run, running anyway: its release pays
			// the debt), and nobody ahead.
			if l.exec.CompareAndSwap(old, packExec(s.free()-1, 0)) {
				l.mu.Unlock()
				if s.free() <= 0 && !q.wouldReject { // one refused at admission would never have waited
					l.nWouldWait.Add(1)
				}
				return nil
			}
			continue
		}
		if dry { // waiters left by a switch to dry-run are being let go: do not queue behind them
			if l.exec.CompareAndSwap(old, packExec(s.free()-1, s.waiting())) {
				l.mu.Unlock()
				if !q.wouldReject {
					l.nWouldWait.Add(1)
				}
				return nil
			}
			continue
		}
		q.running, q.waiting = l.maxConc-int(s.free()), int(s.waiting())
		left := q.wait
		if !q.start.IsZero() {
			left -= time.Since(q.start)
		}
		if left <= 0 {
			l.mu.Unlock()
			return ErrQueueTimeout
		}
		if !l.exec.CompareAndSwap(old, packExec(s.free(), s.waiting()+1)) {
			continue
		}
		break
	}
	if q.start.IsZero() {
		q.start = time.Now()
	}
	w := &waiter{ready: make(chan struct{})}
	l.pushLocked(w)
	l.mu.Unlock()

	if q.timer == nil {
		left := q.wait - time.Since(q.start)
		q.timer = time.NewTimer(max(left, 0))
	}
	var err error
	select {
	case <-w.ready:
		return nil
	case <-q.timer.C:
		err = ErrQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	case <-l.done:
		err = ErrClosed
	}
	l.mu.Lock()
	free, waiting := l.counts()
	q.running, q.waiting = l.maxConc-free, waiting
	if w.granted {
		l.releaseLocked() // granted as the wait ended: hand it on
		q.running--       // its permit counted among the running
		q.waiting++
	} else {
		l.removeLocked(w)
	}
	l.mu.Unlock()
	return err
}

// releaseExec gives back an execution permit: to pay a debt, to the first
// waiter, or to the free count.
func (l *limiter) releaseExec() {
	// The fast path: nobody queued, no debt.
	if old := l.exec.Load(); execState(old).waiting() == 0 && execState(old).free() >= 0 && execState(old).free() < l.maxConcA.Load() {
		if l.exec.CompareAndSwap(old, old+1) {
			return
		}
	}
	l.mu.Lock()
	l.releaseLocked()
	l.mu.Unlock()
}

func (l *limiter) releaseLocked() {
	free, _ := l.counts()
	if free < 0 || l.head == nil {
		if free >= l.maxConc {
			panic("bulkhead: bug: execution permit released more than held")
		}
		l.addExecLocked(1, 0)
		if free == -1 {
			l.paidLocked()
		}
		return
	}
	l.grantLocked(false)
}

// grantLocked hands an execution permit to the first waiter: one taken
// from the free count (fromFree, when resize wakes waiters), or one being
// released, handed on directly.
func (l *limiter) grantLocked(fromFree bool) {
	w := l.head
	l.unlinkLocked(w)
	d := int64(0)
	if fromFree {
		d = -1
	}
	l.addExecLocked(d, -1)
	w.granted = true
	close(w.ready)
}

// pushLocked queues w, already counted among the waiters.
func (l *limiter) pushLocked(w *waiter) {
	w.prev = l.tail
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
}

// removeLocked takes w, which gives up, out of the queue.
func (l *limiter) removeLocked(w *waiter) {
	l.unlinkLocked(w)
	l.addExecLocked(0, -1)
}

func (l *limiter) unlinkLocked(w *waiter) {
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
}

// close makes current and future waiters return ErrClosed. Operations
// already running keep their permits until they release them.
func (l *limiter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		l.closedA.Store(true)
		close(l.done)
	}
}

func (l *limiter) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// stats fills the limiter's part of s.
func (l *limiter) stats(s *Stats) {
	l.mu.Lock()
	free, waiting := l.counts()
	s.Running = l.maxConc - free
	s.Waiting = waiting
	s.MaxConcurrent = l.maxConc
	s.MaxQueue = l.maxQueue
	s.QueueWait = l.wait
	l.mu.Unlock()
	s.DryRun = l.dryRun.Load()
	s.Admitted = l.nAdmitted.Load()
	s.RejectedFull = l.nFull.Load()
	s.RejectedTimeout = l.nTimeout.Load()
	s.RejectedNoConn = l.nNoConn.Load()
	s.ConnectFailed = l.nConnFailed.Load()
	s.Canceled = l.nCanceled.Load()
	s.WaitCount = l.nWait.Load()
	s.WaitDuration = time.Duration(l.waitNanos.Load())
	s.WouldWait = l.nWouldWait.Load()
}

// permit is the state of one gated operation while it holds its permits.
type permit struct {
	kind   Kind
	wl     *limiter // the workload's budget, nil for none
	waited time.Duration
	start  time.Time   // set only when something needs the hold time
	timer  *time.Timer // the hold warning, if set
}

// acquire takes the permits of ctx's workload (if any) and the global
// ones for an operation of kind k, recording in p what release needs.
// Rejections are counted and reported here; an admission is counted by
// admitted, once the operation has its server connection too.
//
// conn.start calls its two halves itself: a waiting operation's goroutine
// stack is most of what it costs, and each frame between database/sql and
// the wait counts (BenchmarkWaitingOperation).
func (g *Gate) acquire(ctx context.Context, k Kind, p *permit) error {
	if g.acquireNow(ctx, k, p) {
		return nil
	}
	return g.acquireSlow(ctx, k, p)
}

// acquireNow takes the global permits of an operation that names no
// workload and has no deadline reserve to respect, if both are free and
// nobody waits, and reports whether it did.
func (g *Gate) acquireNow(ctx context.Context, k Kind, p *permit) bool {
	if fromContext(ctx).workload != "" || g.opt.reserve != 0 || ctx.Err() != nil || !g.lim.tryNow() {
		return false
	}
	p.kind, p.wl, p.waited = k, nil, 0
	return true
}

// acquireSlow is acquire's general case: workloads, a deadline reserve, a
// wait, a rejection, a cancelled context.
func (g *Gate) acquireSlow(ctx context.Context, k Kind, p *permit) error {
	o := fromContext(ctx)
	var budgets [2]*limiter
	ls := budgets[:0]
	wl := g.workload(o.workload)
	if wl != nil {
		ls = append(ls, wl)
	}
	ls = append(ls, g.lim)
	var q queueing
	err := q.acquire(ctx, ls, o.wait, g.opt.reserve)
	p.kind, p.wl, p.waited = k, wl, q.waited()
	if g.opt.events.OnReject != nil && (err != nil || q.wouldReject) {
		g.reportReject(p, err)
	}
	return err
}

// reportReject calls OnReject for an operation refused with err, or, if
// err is nil, let through by dry-run where admission was full. It is a
// function of its own to keep its Event off the stack of operations that
// wait.
//
//go:noinline
func (g *Gate) reportReject(p *permit, err error) {
	switch {
	case err == nil:
		emit(g.opt.events.OnReject, Event{Kind: p.kind, Workload: p.workloadName(), Reason: ErrAdmissionFull, DryRun: true})
	case errors.Is(err, ErrRejected):
		emit(g.opt.events.OnReject, Event{Kind: p.kind, Workload: p.workloadName(), Reason: rejectReason(err), Waited: p.waited})
	}
}

// workloadName is the workload whose budget the operation passes: never a
// name the policy does not list.
func (p *permit) workloadName() string {
	if p.wl == nil {
		return ""
	}
	return p.wl.workload
}

// budgets calls f for each budget p passes.
func (g *Gate) budgets(p *permit, f func(*limiter)) {
	if p.wl != nil {
		f(p.wl)
	}
	f(g.lim)
}

// admitted counts p's operation as admitted, now that it has its permits
// and a server connection, and starts what watches it.
func (g *Gate) admitted(p *permit) {
	g.lim.nAdmitted.Add(1)
	if p.wl != nil {
		p.wl.nAdmitted.Add(1)
	}
	if g.opt.events.OnRelease != nil {
		p.start = time.Now()
	}
	if g.opt.holdLimit > 0 {
		k, name, waited, limit, report := p.kind, p.workloadName(), p.waited, g.opt.holdLimit, g.opt.onHold
		p.timer = time.AfterFunc(limit, func() { emit(report, Event{Kind: k, Workload: name, Waited: waited, Held: limit}) })
	}
	if g.opt.events.OnAdmit != nil {
		emit(g.opt.events.OnAdmit, Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited})
	}
}

// abort gives back the permits of an operation that got them but no
// server connection, and counts and reports why: err is a *RejectedError
// for ErrNoConnection, the context's error or ErrClosed, or the dial's
// error.
func (g *Gate) abort(p *permit, err error) {
	g.lim.release()
	if p.wl != nil {
		p.wl.release()
	}
	switch {
	case errors.Is(err, ErrNoConnection):
		g.budgets(p, func(l *limiter) { l.nNoConn.Add(1) })
		if g.opt.events.OnReject != nil {
			emit(g.opt.events.OnReject, Event{Kind: p.kind, Workload: p.workloadName(), Reason: ErrNoConnection, Waited: p.waited})
		}
	case err == ErrClosed || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		g.budgets(p, func(l *limiter) { l.nCanceled.Add(1) })
	default:
		g.budgets(p, func(l *limiter) { l.nConnFailed.Add(1) })
	}
}

// release gives back the permits of p, acquired by acquire and counted by
// admitted. OnRelease is called first, while the permits are still held:
// an admission they make possible is reported after the release, so that
// counting admissions minus releases never exceeds B.
func (g *Gate) release(p *permit) {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if g.opt.events.OnRelease != nil {
		emit(g.opt.events.OnRelease, Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Held: time.Since(p.start)})
	}
	// The reverse of acquire's order: while the workload's permit is
	// still held, no other operation of the workload can take the global
	// permit given back, so the workload never holds more than its B of
	// global permits.
	g.lim.release()
	if p.wl != nil {
		p.wl.release()
	}
}

// rejectReason is the sentinel behind a rejection.
func rejectReason(err error) error {
	switch {
	case errors.Is(err, ErrQueueTimeout):
		return ErrQueueTimeout
	case errors.Is(err, ErrNoConnection):
		return ErrNoConnection
	}
	return ErrAdmissionFull
}
