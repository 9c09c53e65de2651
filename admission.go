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
	// came within the queue wait.
	ErrQueueTimeout = errors.New("bulkhead: queue wait timed out")
	// ErrClosed: the gate was closed (by db.Close) before or while the
	// operation waited. It is not a rejection.
	ErrClosed = errors.New("bulkhead: closed")
)

// RejectedError is the error of a rejection. It names the limits and, for a
// queue timeout, how long the operation waited. errors.Is matches it with
// ErrRejected and with its Cause.
type RejectedError struct {
	Cause         error         // ErrAdmissionFull or ErrQueueTimeout
	MaxConcurrent int           // B
	MaxQueue      int           // Q
	Waited        time.Duration // time spent waiting for an execution permit; 0 for ErrAdmissionFull
}

func (e *RejectedError) Error() string {
	if e.Cause == ErrQueueTimeout {
		return fmt.Sprintf("bulkhead: queue wait timed out after %v (%d running, %d queued)", e.Waited, e.MaxConcurrent, e.MaxQueue)
	}
	return fmt.Sprintf("bulkhead: admission full (%d running, %d queued)", e.MaxConcurrent, e.MaxQueue)
}

// Is reports whether target is ErrRejected or the error's Cause.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected || target == e.Cause }

// Stats is a snapshot of a gate, shaped like sql.DBStats: the limits, then
// gauges, then cumulative counters.
type Stats struct {
	MaxConcurrent int           // B: execution permits
	MaxQueue      int           // Q: admission permits beyond B
	QueueWait     time.Duration // longest wait for an execution permit
	MaxConns      int           // most physical connections the connector keeps open (B+Q)

	// Gauges.
	Running   int // operations holding an execution permit
	Waiting   int // admitted operations waiting for an execution permit
	OpenConns int // physical connections open through the connector

	// Counters.
	Admitted        int64         // operations that got an execution permit and ran
	RejectedFull    int64         // refused at once: admission full
	RejectedTimeout int64         // admitted, then rejected: no execution permit within QueueWait
	Canceled        int64         // context ended (or gate closed) before an execution permit came
	WaitCount       int64         // operations that had to wait for an execution permit
	WaitDuration    time.Duration // total time spent waiting for execution permits
	ConnectRefused  int64         // dials refused because B+Q connections were open or admission was full
}

// limiter is the pair of semaphores. Admission is a counter tried without
// waiting; execution is a FIFO semaphore waited on for a bounded time.
// It starts no goroutine. The zero value is not usable; see newLimiter.
type limiter struct {
	maxConc  int
	maxQueue int
	wait     time.Duration
	maxAdmit int64
	fullErr  error // preallocated: a rejection at admission allocates nothing

	admitted atomic.Int64 // admission permits held

	mu      sync.Mutex
	free    int // execution permits not held
	head    *waiter
	tail    *waiter
	waiting int
	closed  bool
	done    chan struct{} // closed by close

	nAdmitted, nFull, nTimeout, nCanceled, nWait, waitNanos atomic.Int64
}

// waiter is one operation in the FIFO queue for an execution permit.
// ready is closed, under mu, when the permit is handed to it.
type waiter struct {
	ready      chan struct{}
	next, prev *waiter
	granted    bool
}

func newLimiter(p Policy) *limiter {
	return &limiter{
		maxConc:  p.MaxConcurrent,
		maxQueue: p.MaxQueue,
		wait:     p.QueueWait,
		maxAdmit: int64(p.MaxConcurrent) + int64(p.MaxQueue),
		fullErr:  &RejectedError{Cause: ErrAdmissionFull, MaxConcurrent: p.MaxConcurrent, MaxQueue: p.MaxQueue},
		free:     p.MaxConcurrent,
		done:     make(chan struct{}),
	}
}

// acquire takes an admission permit without waiting, then waits in FIFO
// order for an execution permit, at most l.wait and never past ctx.
// On success both permits are held and must be given back with release;
// waited is the time spent waiting (0 when a permit was free).
// On failure nothing is held: the error is l.fullErr, a *RejectedError for
// a queue timeout, ErrClosed, or ctx.Err().
func (l *limiter) acquire(ctx context.Context) (waited time.Duration, err error) {
	if err := ctx.Err(); err != nil {
		l.nCanceled.Add(1)
		return 0, err
	}
	if !l.tryAdmit() {
		l.nFull.Add(1)
		return 0, l.fullErr
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.admitted.Add(-1)
		l.nCanceled.Add(1)
		return 0, ErrClosed
	}
	if l.free > 0 && l.head == nil {
		l.free--
		l.mu.Unlock()
		l.nAdmitted.Add(1)
		return 0, nil
	}
	if l.wait <= 0 {
		l.mu.Unlock()
		l.admitted.Add(-1)
		l.nTimeout.Add(1)
		return 0, &RejectedError{Cause: ErrQueueTimeout, MaxConcurrent: l.maxConc, MaxQueue: l.maxQueue}
	}
	w := &waiter{ready: make(chan struct{})}
	l.pushLocked(w)
	l.mu.Unlock()
	return l.await(ctx, w)
}

// await waits for w's permit. A permit granted at the instant the wait
// ends is handed on (or returned), never kept by a caller that reports
// failure.
func (l *limiter) await(ctx context.Context, w *waiter) (time.Duration, error) {
	start := time.Now()
	timer := time.NewTimer(l.wait)
	defer timer.Stop()
	var err error
	select {
	case <-w.ready:
		waited := l.waited(start)
		l.nAdmitted.Add(1)
		return waited, nil
	case <-timer.C:
		err = ErrQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	case <-l.done:
		err = ErrClosed
	}
	l.mu.Lock()
	if w.granted {
		// The permit came as the wait ended: hand it on as if it had been held.
		l.releaseLocked()
	} else {
		l.removeLocked(w)
	}
	l.mu.Unlock()
	l.admitted.Add(-1)
	waited := l.waited(start)
	if err == ErrQueueTimeout {
		l.nTimeout.Add(1)
		return waited, &RejectedError{Cause: ErrQueueTimeout, MaxConcurrent: l.maxConc, MaxQueue: l.maxQueue, Waited: waited}
	}
	l.nCanceled.Add(1)
	return waited, err
}

func (l *limiter) waited(start time.Time) time.Duration {
	d := time.Since(start)
	l.nWait.Add(1)
	l.waitNanos.Add(int64(d))
	return d
}

// tryAdmit takes an admission permit if one is free, without waiting.
func (l *limiter) tryAdmit() bool {
	for {
		n := l.admitted.Load()
		if n >= l.maxAdmit {
			return false
		}
		if l.admitted.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// admissionFull reports whether every admission permit is held now.
func (l *limiter) admissionFull() bool { return l.admitted.Load() >= l.maxAdmit }

// release gives back both permits of a successful acquire. The execution
// permit goes to the first waiter, if any.
func (l *limiter) release() {
	l.mu.Lock()
	l.releaseLocked()
	l.mu.Unlock()
	if l.admitted.Add(-1) < 0 {
		panic("bulkhead: bug: admission permit released more than held")
	}
}

func (l *limiter) releaseLocked() {
	if w := l.head; w != nil {
		l.removeLocked(w)
		w.granted = true
		close(w.ready)
		return
	}
	if l.free++; l.free > l.maxConc {
		panic("bulkhead: bug: execution permit released more than held")
	}
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
	l.mu.Unlock()
	s.MaxConcurrent = l.maxConc
	s.MaxQueue = l.maxQueue
	s.QueueWait = l.wait
	s.Admitted = l.nAdmitted.Load()
	s.RejectedFull = l.nFull.Load()
	s.RejectedTimeout = l.nTimeout.Load()
	s.Canceled = l.nCanceled.Load()
	s.WaitCount = l.nWait.Load()
	s.WaitDuration = time.Duration(l.waitNanos.Load())
}
