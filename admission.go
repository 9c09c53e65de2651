package bulkhead

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Sentinel errors. A rejection matches ErrRejected and exactly one of
// ErrAdmissionFull or ErrQueueTimeout. None of them matches
// driver.ErrBadConn, so database/sql never retries a rejection.
var (
	// ErrRejected is matched by every rejection: the database is busy,
	// try later (HTTP 503 with Retry-After).
	ErrRejected = errors.New("bulkhead: rejected")
	// ErrAdmissionFull: all B+Q admission permits were taken; the operation
	// was refused at once, before any wait, dial or SQL.
	ErrAdmissionFull = errors.New("bulkhead: admission full")
	// ErrQueueTimeout: the operation was admitted but no execution permit
	// came within the queue wait (or before its deadline minus the reserve
	// set by WithDeadlineReserve).
	ErrQueueTimeout = errors.New("bulkhead: queue wait timed out")
	// ErrClosed: the gate was closed (by db.Close) before or while the
	// operation waited. It is not a rejection.
	ErrClosed = errors.New("bulkhead: closed")
)

// RejectedError is the error of a rejection. It names the limits that
// refused the operation and, for a queue timeout, how long it waited.
// errors.Is matches it with ErrRejected and with its Cause. Treat it as
// read-only: an admission-full rejection is one value shared by every
// caller, so that rejecting allocates nothing.
type RejectedError struct {
	Cause         error         // ErrAdmissionFull or ErrQueueTimeout
	Workload      string        // the workload whose budget refused it; "" for the global budget
	MaxConcurrent int           // B of that budget
	MaxQueue      int           // Q of that budget
	Waited        time.Duration // time spent waiting for an execution permit; 0 for ErrAdmissionFull
	Deadline      bool          // ErrQueueTimeout only: the wait ended at the caller's deadline minus the reserve
}

func (e *RejectedError) Error() string {
	budget := ""
	if e.Workload != "" {
		budget = fmt.Sprintf(" for workload %q", e.Workload)
	}
	switch {
	case e.Cause != ErrQueueTimeout:
		return fmt.Sprintf("bulkhead: admission full%s (%d running, %d queued)", budget, e.MaxConcurrent, e.MaxQueue)
	case e.Deadline:
		return fmt.Sprintf("bulkhead: queue wait timed out%s after %v: too close to the deadline (%d running, %d queued)", budget, e.Waited, e.MaxConcurrent, e.MaxQueue)
	default:
		return fmt.Sprintf("bulkhead: queue wait timed out%s after %v (%d running, %d queued)", budget, e.Waited, e.MaxConcurrent, e.MaxQueue)
	}
}

// Is reports whether target is ErrRejected or the error's Cause.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected || target == e.Cause }

// Stats is a snapshot of a gate (or of one workload's budget), shaped like
// sql.DBStats: the limits, then gauges, then cumulative counters.
type Stats struct {
	MaxConcurrent int           // B: execution permits
	MaxQueue      int           // Q: admission permits beyond B
	QueueWait     time.Duration // longest wait for an execution permit
	MaxConns      int           // most physical connections the connector keeps open (B+Q); 0 for a workload
	DryRun        bool          // rejections are counted and reported, not enforced

	// Gauges.
	Running   int // operations holding an execution permit (in dry-run, also those that would have waited)
	Waiting   int // admitted operations waiting for an execution permit
	OpenConns int // physical connections open through the connector; 0 for a workload

	// Counters.
	Admitted        int64         // operations that got an execution permit and ran
	RejectedFull    int64         // refused at once: admission full (dry-run: would have been)
	RejectedTimeout int64         // admitted, then rejected: no execution permit within the wait
	Canceled        int64         // context ended (or gate closed) before an execution permit came
	WaitCount       int64         // operations that had to wait for an execution permit
	WaitDuration    time.Duration // total time spent waiting for execution permits
	WouldWait       int64         // dry-run: operations that found no execution permit free and ran anyway
	ConnectRefused  int64         // dials refused because B+Q connections were open or admission was full; 0 for a workload
}

// limiter is one budget: a pair of semaphores. Admission is a counter
// tried without waiting; execution is a FIFO semaphore waited on for a
// bounded time. The gate has one for its global budget and one per
// workload. It starts no goroutine and never waits without bound.
type limiter struct {
	workload string

	admitted atomic.Int64 // admission permits held
	maxAdmit atomic.Int64 // B+Q
	dryRun   atomic.Bool
	waitNs   atomic.Int64                  // wait, readable without mu
	fullErr  atomic.Pointer[RejectedError] // preallocated: a rejection at admission allocates nothing

	mu       sync.Mutex
	maxConc  int
	maxQueue int
	wait     time.Duration
	// free is B minus the execution permits held. It goes below zero when
	// the budget shrinks under running work, or in dry-run: releases then
	// pay the debt before any waiter is woken.
	free    int
	head    *waiter
	tail    *waiter
	waiting int
	closed  bool
	done    chan struct{} // closed by close

	nAdmitted, nFull, nTimeout, nCanceled, nWait, waitNanos, nWouldWait atomic.Int64
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
	l.free += p.MaxConcurrent - l.maxConc
	l.maxConc, l.maxQueue, l.wait = p.MaxConcurrent, p.MaxQueue, p.QueueWait
	l.waitNs.Store(int64(p.QueueWait))
	l.maxAdmit.Store(int64(p.MaxConcurrent) + int64(p.MaxQueue))
	l.fullErr.Store(&RejectedError{Cause: ErrAdmissionFull, Workload: l.workload, MaxConcurrent: p.MaxConcurrent, MaxQueue: p.MaxQueue})
	l.dryRun.Store(p.DryRun)
	if p.DryRun {
		// Nobody waits in dry-run: let current waiters run.
		for l.head != nil {
			l.free--
			l.grantLocked()
		}
	}
	for l.free > 0 && l.head != nil {
		l.free--
		l.grantLocked()
	}
}

// acquire takes both permits of this budget alone, with its own queue
// wait: the whole protocol for a gate without workloads.
// On success both permits are held and must be given back with release;
// waited is the time spent waiting (0 when a permit was free).
// On failure nothing is held: the error is the preallocated admission-full
// rejection, a *RejectedError for a queue timeout, ErrClosed, or ctx.Err().
func (l *limiter) acquire(ctx context.Context) (waited time.Duration, err error) {
	var q queueing
	err = q.acquire(ctx, []*limiter{l}, -1, 0)
	return q.waited(), err
}

// release gives back both permits of a successful acquire. The execution
// permit goes to the first waiter, if any.
func (l *limiter) release() {
	l.releaseExec()
	l.unadmit()
}

// admit takes an admission permit if one is free, without waiting. In
// dry-run it always does, and counts the rejection it would have made.
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

// admissionFull reports whether every admission permit is held now.
func (l *limiter) admissionFull() bool { return l.admitted.Load() >= l.maxAdmit.Load() }

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
// Outcomes are counted in every budget passed (see count).
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
			return l.fullErr.Load()
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
	for _, l := range ls {
		l.nAdmitted.Add(1)
	}
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
	e := &RejectedError{Cause: ErrQueueTimeout, Workload: l.workload, MaxConcurrent: l.maxConc, MaxQueue: l.maxQueue, Waited: q.waited(), Deadline: q.deadline}
	l.mu.Unlock()
	return e
}

// execute takes an execution permit of l, waiting in FIFO order until q's
// wait ends, ctx ends or l closes. A permit granted at the instant the wait
// ends is handed on, never kept by a caller that reports failure.
func (l *limiter) execute(ctx context.Context, q *queueing) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.free > 0 && l.head == nil {
		l.free--
		l.mu.Unlock()
		return nil
	}
	if l.dryRun.Load() {
		l.free-- // runs anyway; its release pays the debt
		l.mu.Unlock()
		if !q.wouldReject { // one refused at admission would never have waited
			l.nWouldWait.Add(1)
		}
		return nil
	}
	left := q.wait
	if !q.start.IsZero() {
		left -= time.Since(q.start)
	}
	if left <= 0 {
		l.mu.Unlock()
		return ErrQueueTimeout
	}
	if q.start.IsZero() {
		q.start = time.Now()
	}
	w := &waiter{ready: make(chan struct{})}
	l.pushLocked(w)
	l.mu.Unlock()

	if q.timer == nil {
		q.timer = time.NewTimer(left)
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
	if w.granted {
		l.releaseLocked() // granted as the wait ended: hand it on
	} else {
		l.removeLocked(w)
	}
	l.mu.Unlock()
	return err
}

// releaseExec gives back an execution permit: to pay a debt, to the first
// waiter, or to the free count.
func (l *limiter) releaseExec() {
	l.mu.Lock()
	l.releaseLocked()
	l.mu.Unlock()
}

func (l *limiter) releaseLocked() {
	if l.free < 0 || l.head == nil {
		if l.free++; l.free > l.maxConc {
			panic("bulkhead: bug: execution permit released more than held")
		}
		return
	}
	l.grantLocked()
}

// grantLocked hands an execution permit to the first waiter.
func (l *limiter) grantLocked() {
	w := l.head
	l.removeLocked(w)
	w.granted = true
	close(w.ready)
}

func (l *limiter) pushLocked(w *waiter) {
	w.prev = l.tail
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.waiting++
}

func (l *limiter) removeLocked(w *waiter) {
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

// close makes current and future waiters return ErrClosed. Operations
// already running keep their permits until they release them.
func (l *limiter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
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
	s.Running = l.maxConc - l.free
	s.Waiting = l.waiting
	s.MaxConcurrent = l.maxConc
	s.MaxQueue = l.maxQueue
	s.QueueWait = l.wait
	l.mu.Unlock()
	s.DryRun = l.dryRun.Load()
	s.Admitted = l.nAdmitted.Load()
	s.RejectedFull = l.nFull.Load()
	s.RejectedTimeout = l.nTimeout.Load()
	s.Canceled = l.nCanceled.Load()
	s.WaitCount = l.nWait.Load()
	s.WaitDuration = time.Duration(l.waitNanos.Load())
	s.WouldWait = l.nWouldWait.Load()
}
