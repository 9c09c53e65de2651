package bulkhead

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/adaptive"
	"github.com/dbbulkhead/bulkhead/internal/estimate"
)

// The permit protocol: in each of its budgets in turn, its workload's if any,
// then the global one, an operation takes an admission permit without
// waiting, then an execution permit in order within its queue wait and its
// deadline. So an operation queued in its workload's budget holds nothing of
// the global one. Only then does it get a server connection. Its permits come
// back once (Gate.release).

// budget is two semaphores under one mutex: B+Q admission permits tried
// without waiting, and B execution permits handed out by priority, then
// deadline (passage.before). It starts no goroutine and never waits
// without bound.
type budget struct {
	name string // the workload's; "" for the global budget

	mu         sync.Mutex
	b, q       int           // the limits in force
	wait       time.Duration // the queue wait
	dryRun     bool
	admitted   int // admission permits held
	running    int // execution permits held: above b after a shrink, or in dry-run
	waiting    int // waiters queued
	head, tail *waiter
	closed     bool
	done       chan struct{}  // closed by close
	drained    chan struct{}  // closed once running ≤ b; nil when nobody waits for it
	full       *RejectedError // admission full with b running and q waiting, made once per resize

	nAdmitted, nFull, nTimeout, nConnFailed, nCanceled, nWait, nWaitNanos, nWouldWait atomic.Int64

	// Off the fields every operation touches; guarded by mu.
	prio      int               // a workload's Priority: that of its operations in the global budget
	recent    estimate.HoldRing // its operations' last holds, all classes together
	granted   time.Time         // when a waiter was last granted its permit, the queue never empty since; zero: none
	gap       time.Duration     // the moving average (1/gapWeight) of the time between two such grants; 0: none
	peak      int               // the highest b in force lately, whose sessions the pool keeps (keepPeak)
	peakAt    time.Time         // when b fell below peak
	adapt     *adaptive.Limit   // moves b within its ceiling; nil: b is the limit set
	onMove    func(Move)        // Events.OnLimit, for the global budget; set by New
	nDeadline atomic.Int64
	nLease    atomic.Int64
	lease     time.Time   // when set, the instant b stops holding (Gate.CapUntil); then b ≤ leaseB
	leaseB    int         // the lease's fallback
	leaseEnd  *time.Timer // applies the fallback as the lease runs out
	lapsed    bool        // a lease ran out and lowered b: rejections are ErrLeaseExpired until the next setLease
}

// waiter is one operation queued for an execution permit, by priority, then
// deadline. ready is closed under mu, once it is unlinked and granted, or sent
// away with cause: late (ErrWouldMissDeadline), shed for a higher priority
// (its admission permit passes to that one), or dropped as b fell to 0.
type waiter struct {
	ready      chan struct{}
	next, prev *waiter
	deadline   time.Time // its context's; zero: none
	prio       int
	granted    bool
	lease      time.Time    // the lease it was granted under
	under      int          // the b it was granted under
	cause      error        // why it was sent away; nil: it was not
	shed       bool         // its admission permit passed on
	class      estimate.Ref // its class, whose estimate judges its deadline
	probe      bool         // it goes whatever its deadline (estimate.Ref.Judge)
	late       lateness     // ErrWouldMissDeadline: what it was judged on
}

func newBudget(name string) *budget {
	return &budget{name: name, done: make(chan struct{})}
}

// resize puts new limits in force; running work keeps its permits. With
// floor above 0 (Policy.Adaptive), b is a ceiling: the limit in force moves
// between floor and b.
func (l *budget) resize(b, q int, wait time.Duration, dryRun bool, floor int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q, l.wait, l.dryRun = q, wait, dryRun
	switch {
	case floor <= 0:
		l.adapt = nil
	case l.adapt == nil:
		l.adapt = adaptive.New()
		l.b = floor // start low: never above what the database showed it can take
	}
	if l.adapt != nil {
		floor = min(floor, b)
		l.adapt.Floor, l.adapt.Ceil = floor, b
		b = min(max(l.b, floor), b)
	}
	l.setLimitLocked(b)
}

// setLimitLocked puts b in force and serves the waiters it makes room for;
// with b at 0 nothing can be served, and the waiters are sent away.
func (l *budget) setLimitLocked(b int) {
	l.b, l.peak = b, b
	q := l.qLocked()
	l.full = &RejectedError{Cause: l.causeLocked(ErrAdmissionFull), Workload: l.name, MaxConcurrent: b, MaxQueue: q, Running: b, Waiting: q}
	for b == 0 && l.head != nil {
		w := l.head
		l.unlinkLocked(w)
		w.sendAway(l.causeLocked(ErrAdmissionFull))
	}
	l.grantLocked()
}

// qLocked is Q in force: none while b is 0, for nothing could leave the queue.
func (l *budget) qLocked() int {
	if l.b == 0 {
		return 0
	}
	return l.q
}

// causeLocked is the cause of a rejection for want of permits: cause, or
// ErrLeaseExpired while a lease that ran out keeps b low.
func (l *budget) causeLocked(cause error) error {
	if l.lapsed && (cause == ErrAdmissionFull || cause == ErrQueueTimeout) {
		return ErrLeaseExpired
	}
	return cause
}

// setLease makes b hold until until (zero: for good), then fall to at most
// after; lapsed says that a lease that ran out already lowered b.
func (l *budget) setLease(until time.Time, after int, lapsed bool) {
	l.mu.Lock()
	l.lease, l.leaseB = until, after
	if l.leaseEnd != nil {
		l.leaseEnd.Stop()
		l.leaseEnd = nil
	}
	if d := time.Until(until); !until.IsZero() && d > 0 {
		l.leaseEnd = time.AfterFunc(d, func() {
			l.mu.Lock()
			l.leaseLocked()
			l.mu.Unlock()
		})
	}
	if l.lapsed != lapsed {
		l.lapsed = lapsed
		l.setLimitLocked(l.b) // the rejection made once per resize names its cause anew
	}
	l.leaseLocked()
	l.mu.Unlock()
}

// leaseLocked lowers b to the lease's fallback once the lease has run out.
func (l *budget) leaseLocked() {
	if l.lease.IsZero() || !leaseOver(l.lease) {
		return
	}
	l.lease = time.Time{}
	if a := l.adapt; a != nil {
		a.Ceil, a.Floor = min(a.Ceil, l.leaseB), min(a.Floor, l.leaseB)
	}
	l.lapsed = l.lapsed || l.leaseB < l.b
	l.setLimitLocked(min(l.b, l.leaseB))
}

// leaseOver reports whether the lease until has run out by the monotonic or
// by the wall clock: a paused virtual machine's monotonic clock stalls.
func leaseOver(until time.Time) bool {
	now := time.Now()
	return !now.Before(until) || !now.Round(0).Before(until.Round(0))
}

// limits is pool.limit: the highest b in force within keepPeak, so that a B
// moving up and down (Policy.Adaptive) keeps its sessions, and whether it is
// enforced (not in dry-run, not closed).
func (l *budget) limits() (b int, enforced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peak > l.b && time.Since(l.peakAt) > keepPeak {
		l.peak = l.b
	}
	return max(l.b, l.peak), !l.dryRun && !l.closed
}

const (
	// keepPeak is how long the sessions of a B that came down stay open for
	// it: longer than adaptive B's moves down and up again take.
	keepPeak = 10 * time.Second
	// gapWeight is the gap average's memory, in grants: a few holds of each
	// of a few permits, so that one long hold does not set it.
	gapWeight = 8
	// waitSpare is the holds of its class a waiter must still have before
	// its deadline: one to run in, one for a hold longer than the median
	// or a turn later than expected (the README's rule for QueueWait).
	waitSpare = 2
)

// ceilingLocked is the most b may be: the limit set, which Policy.Adaptive moves b below.
func (l *budget) ceilingLocked() int {
	if l.adapt != nil {
		return l.adapt.Ceil
	}
	return l.b
}

// tryAcquire takes both permits if both are free and nobody waits, reporting
// whether it did, under which lease and b, and whether to measure the hold:
// the budget is adaptive, or this took the last permit of one that measured before.
func (l *budget) tryAcquire() (ok, measure bool, lease time.Time, under int) {
	l.mu.Lock()
	l.leaseLocked()
	ok = !l.closed && l.waiting == 0 && l.running < l.b && l.admitted < l.b+l.q
	if ok {
		l.admitted++
		l.running++
		measure = l.adapt != nil || l.running == l.b && l.recent.Len() > 0
		lease, under = l.lease, l.b
	}
	l.mu.Unlock()
	return ok, measure, lease, under
}

// wantLocked tells the adaptive limit, if any, that callers wanted more than b.
func (l *budget) wantLocked() {
	if l.adapt != nil {
		l.adapt.Want()
	}
}

// release gives back both permits, the execution one first, so that those
// running or waiting are always among the admitted. held is the operation's
// hold if measured, else 0; negative if it was cut off at its deadline (it
// needed at least -held). Its class's base hold is taken to be |held|, and
// it is taken to have started under the b in force.
func (l *budget) release(held time.Duration) {
	l.releaseHold(held, max(held, -held), -1)
}

// releaseHold is release of an operation whose class's base hold is base,
// granted its execution permit under b under (-1: the b in force).
func (l *budget) releaseHold(held, base time.Duration, under int) {
	l.mu.Lock()
	l.running--
	l.admitted--
	if l.running < 0 || l.admitted < 0 {
		l.mu.Unlock()
		panic("bulkhead: bug: permits released more than held")
	}
	moved := false
	if held != 0 {
		if under < 0 {
			under = l.b
		}
		moved = l.observeLocked(held, base, under)
	}
	l.grantLocked()
	var m Move
	if moved {
		m = Move(l.adapt.Last())
	}
	l.mu.Unlock()
	if moved && l.onMove != nil {
		emitMove(l.onMove, m)
	}
}

// observeLocked adds a hold to the recent ones, and to adapt: one cut off
// at its deadline (negative) held its permit for no work done. under is the
// b the operation was granted its permit under. It reports whether adapt
// moved b.
func (l *budget) observeLocked(held, base time.Duration, under int) (moved bool) {
	if held < 0 { // a lower bound, often short (it started late): no measure of the holds ahead
		held, base = -held, 0
	} else {
		l.recent.Add(held)
	}
	if l.adapt != nil {
		if b, ok := l.adapt.Observe(held, base, under, l.b, l.running+1 >= l.b, l.waiting > 0); ok {
			peak, peakAt := max(l.peak, b), l.peakAt
			if b < l.peak && l.b == l.peak {
				peakAt = time.Now() // b leaves its peak
			}
			l.setLimitLocked(b)
			l.peak, l.peakAt = peak, peakAt
			return true
		}
	}
	return false
}

// lateness is what an operation refused with ErrWouldMissDeadline was
// judged on: its class's hold, the wait expected ahead, the time left.
type lateness struct{ hold, ahead, left time.Duration }

// refused confirms, with its class, the refusal ps's plan at now makes for
// its deadline; false makes ps its class's probe.
func (late lateness) refused(ps *passage, now time.Time) bool {
	refuse, _ := ps.class.Judge(now, ps.deadline, late.ahead)
	return refuse
}

// grantLocked serves waiters while there is room (in dry-run, all), sending
// away those now late, and closes drained once running is within the ceiling.
func (l *budget) grantLocked() {
	var now time.Time
	if l.head != nil {
		l.leaseLocked()
	}
	for l.head != nil && (l.running < l.b || l.dryRun) {
		w := l.head
		l.unlinkLocked(w)
		if !w.deadline.IsZero() && !w.probe && !l.dryRun {
			if now.IsZero() {
				now = time.Now()
			}
			if late, e := w.class.Judge(now, w.deadline, 0); late {
				w.late = lateness{hold: e, left: w.deadline.Sub(now)}
				w.sendAway(ErrWouldMissDeadline)
				continue
			} else if e > 0 && now.Add(e).After(w.deadline) {
				w.probe = true // its class's: it goes, measured
			}
		}
		if now.IsZero() {
			now = time.Now()
		}
		if d := now.Sub(l.granted); !l.granted.IsZero() {
			l.gap += (d - l.gap) / gapWeight
			if l.gap == 0 {
				l.gap = d
			}
		}
		l.granted = now
		if l.head == nil {
			l.granted = time.Time{} // the queue ran dry: the next gap would count idle time
		}
		l.running++
		w.granted, w.lease, w.under = true, l.lease, l.b
		close(w.ready)
	}
	if l.drained != nil && (l.running <= l.ceilingLocked() || l.dryRun) {
		close(l.drained)
		l.drained = nil
	}
}

// waitDrained returns nil once running is within the ceiling (at once in dry-run), or ctx's error.
func (l *budget) waitDrained(ctx context.Context) error {
	l.mu.Lock()
	if l.running <= l.ceilingLocked() || l.dryRun {
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

// sendAway tells w, unlinked, that it is refused with cause.
func (w *waiter) sendAway(cause error) {
	w.cause = cause
	close(w.ready)
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

// close makes waiters and later operations return ErrClosed.
func (l *budget) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.done)
		if l.leaseEnd != nil {
			l.leaseEnd.Stop()
		}
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
	l.leaseLocked() // a lapsed lease shows as the B in force
	s.MaxConcurrent, s.MaxQueue, s.QueueWait, s.DryRun = l.b, l.qLocked(), l.wait, l.dryRun
	s.Running, s.Waiting, s.Hold = l.running, l.waiting, l.recent.Median()
	if l.adapt != nil {
		s.LastMove = Move(l.adapt.Last())
	}
	l.mu.Unlock()
	s.Admitted, s.RejectedFull, s.RejectedTimeout = l.nAdmitted.Load(), l.nFull.Load(), l.nTimeout.Load()
	s.RejectedDeadline, s.RejectedLease = l.nDeadline.Load(), l.nLease.Load()
	s.ConnectFailed, s.Canceled = l.nConnFailed.Load(), l.nCanceled.Load()
	s.WaitCount, s.WaitDuration, s.WouldWait = l.nWait.Load(), time.Duration(l.nWaitNanos.Load()), l.nWouldWait.Load()
}

// passage is one operation's way through its budgets: one wait limit and one timer serve them all.
type passage struct {
	limit       time.Duration // the longest wait in all
	deadline    time.Time     // the context's; zero: none
	prio        int           // its workload's Priority
	start       time.Time     // set when it first has to wait
	timer       *time.Timer
	timerEnd    time.Time    // when timer fires
	lease       time.Time    // the lease its last execution permit was granted under
	under       int          // the b its last execution permit was granted under
	class       estimate.Ref // its class, whose estimate judges its deadline
	probe       bool         // it goes whatever its deadline (estimate.Ref.Judge)
	late        lateness     // ErrWouldMissDeadline: what it was judged on
	over        bool         // dry-run: the last budget taken had its admission full
	wouldReject bool         // dry-run: admission was full, the rejection not made
}

// before reports whether ps goes before waiter w: of a higher priority, or
// of the same with an earlier deadline (none is the latest); else after it.
func (ps *passage) before(w *waiter) bool {
	if w.prio != ps.prio {
		return w.prio < ps.prio
	}
	return !ps.deadline.IsZero() && (w.deadline.IsZero() || ps.deadline.Before(w.deadline))
}

func (ps *passage) waited() time.Duration {
	if ps.start.IsZero() {
		return 0
	}
	return time.Since(ps.start)
}

// acquire takes the permits of each of ls in order. On failure it holds
// none and returns a *RejectedError, ErrClosed or ctx's error, counted in
// every budget of ls; the caller counts success.
func (ps *passage) acquire(ctx context.Context, ls []*budget) error {
	if err := ctx.Err(); err != nil {
		count(ls, func(l *budget) { l.nCanceled.Add(1) })
		return err
	}
	for i, l := range ls {
		err := l.take(ctx, ps)
		if ps.over && !ps.wouldReject {
			ps.wouldReject = true
			count(ls, func(l *budget) { l.nFull.Add(1) })
		}
		if err == nil {
			continue
		}
		for _, prev := range ls[:i] {
			prev.release(0)
		}
		ps.stop(ls)
		re, _ := err.(*RejectedError) // take returns it as it is
		switch {
		case re == nil:
			count(ls, func(l *budget) { l.nCanceled.Add(1) })
		case re.Cause == ErrQueueTimeout:
			count(ls, func(l *budget) { l.nTimeout.Add(1) })
		case re.Cause == ErrWouldMissDeadline:
			count(ls, func(l *budget) { l.nDeadline.Add(1) })
		case re.Cause == ErrLeaseExpired:
			count(ls, func(l *budget) { l.nLease.Add(1) })
		default:
			count(ls, func(l *budget) { l.nFull.Add(1) })
		}
		return err
	}
	ps.stop(ls)
	return nil
}

func count(ls []*budget, inc func(*budget)) {
	for _, l := range ls {
		inc(l)
	}
}

// stop stops the timer and counts the time waited, if any, in each of ls.
func (ps *passage) stop(ls []*budget) {
	if ps.timer != nil {
		ps.timer.Stop()
	}
	if !ps.start.IsZero() {
		d := int64(ps.waited())
		count(ls, func(l *budget) { l.nWait.Add(1); l.nWaitNanos.Add(d) })
	}
}

// take takes an admission permit of l without waiting, then an execution
// permit in order, waiting until ps's limit, ctx's end or l's close, and no
// longer than the deadline less twice the hold (at once refused if the wait
// expected makes it late). With admission full, it sheds the last waiter
// in line (of the lowest priority, due last) if of a priority below its
// own, only if it would then wait.
// In dry-run it always takes both, setting ps.over if admission was full.
// On failure it holds nothing of l; a permit granted as the wait ends is
// handed on, never kept by a caller that fails.
func (l *budget) take(ctx context.Context, ps *passage) error {
	l.mu.Lock()
	l.leaseLocked()
	ps.over = false
	var now time.Time
	full := l.admitted >= l.b+l.qLocked() && !l.dryRun
	if full { // shed the waiter if that makes room for a wait, not a refusal
		shed := !l.closed && l.tail != nil && l.tail.prio < ps.prio
		if shed {
			now = time.Now()
			_, left := l.planLocked(ps, now)
			shed = left > 0
		}
		if !shed {
			l.wantLocked()
			err := l.fullLocked()
			l.mu.Unlock()
			return err
		}
	}
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	switch {
	case full:
		w := l.tail
		l.unlinkLocked(w)
		w.shed = true // its admission permit is this operation's now
		w.sendAway(l.causeLocked(ErrAdmissionFull))
	case l.admitted >= l.b+l.qLocked():
		ps.over = true
		l.admitted++
	default:
		l.admitted++
	}
	switch {
	case l.waiting == 0 && l.running < l.b:
		l.running++
		ps.lease, ps.under = l.lease, l.b
		l.mu.Unlock()
		return nil
	case l.dryRun:
		l.running++
		l.wantLocked()
		l.mu.Unlock()
		if !ps.over && !ps.wouldReject { // one refused at admission would never have waited
			l.nWouldWait.Add(1)
		}
		return nil
	}
	if now.IsZero() {
		now = time.Now()
	}
	end, left := l.planLocked(ps, now)
	if left <= 0 && end.cause == ErrWouldMissDeadline && !ps.late.refused(ps, now) {
		ps.probe = true // it goes, to measure its class again
		end, left = l.planLocked(ps, now)
	}
	if left <= 0 {
		l.admitted--
		l.wantLocked() // refused for want of a permit: demand beyond b
		err := l.rejectLocked(ps, end.cause, 0)
		l.mu.Unlock()
		return err
	}
	if ps.start.IsZero() {
		ps.start = now
	}
	after := l.tail
	for after != nil && ps.before(after) {
		after = after.prev
	}
	w := &waiter{ready: make(chan struct{}), prev: after, deadline: ps.deadline, prio: ps.prio, class: ps.class, probe: ps.probe}
	if after != nil {
		w.next, after.next = after.next, w
	} else {
		w.next, l.head = l.head, w
	}
	if w.next != nil {
		w.next.prev = w
	} else {
		l.tail = w
	}
	l.waiting++
	l.mu.Unlock()

	switch {
	case ps.timer == nil:
		ps.timer = time.NewTimer(left)
	case !end.at.Equal(ps.timerEnd): // the earlier wait ended with a grant
		if !ps.timer.Stop() {
			select {
			case <-ps.timer.C:
			default:
			}
		}
		ps.timer.Reset(left)
	}
	ps.timerEnd = end.at
	var err error
	select {
	case <-w.ready:
		if w.granted {
			ps.lease, ps.under, ps.probe = w.lease, w.under, w.probe
			return nil
		}
	case <-ps.timer.C:
	case <-ctx.Done():
		err = ctx.Err()
	case <-l.done:
		err = ErrClosed
	}
	l.mu.Lock()
	l.leaseLocked()
	queued, cause := 1, end.cause
	switch {
	case w.granted:
		l.running-- // granted as the wait ended: hand it on
		l.grantLocked()
	case w.cause != nil:
		queued, cause, ps.late = 0, w.cause, w.late
	default:
		l.unlinkLocked(w)
	}
	if !w.shed {
		l.admitted--
	}
	if err == nil || w.shed {
		l.wantLocked()
		err = l.rejectLocked(ps, cause, queued)
	}
	l.mu.Unlock()
	return err
}

// waitEnd is when a wait for an execution permit ends, and the rejection's cause then.
type waitEnd struct {
	at    time.Time
	cause error
}

// planLocked returns when ps's wait in l, starting at now, must end, and
// the time left until then; none left means it is refused at once (for its
// deadline, ps.late says why). A deadline bounds the wait by the class's
// hold: those ahead and this one are served after about (ahead+1) times
// the gap between two grants the queue measured (before any, h/b with h
// the budget's median hold), and it must then hold its permits in time;
// it waits until waitSpare holds before its deadline at most.
func (l *budget) planLocked(ps *passage, now time.Time) (waitEnd, time.Duration) {
	start := ps.start
	if start.IsZero() {
		start = now
	}
	end := waitEnd{start.Add(ps.limit), ErrQueueTimeout}
	if ps.deadline.IsZero() || ps.probe {
		return end, end.at.Sub(now)
	}
	if e, ok := ps.class.Estimate(now); ok {
		behind := 0
		for w := l.tail; w != nil && ps.before(w); w = w.prev {
			behind++
		}
		per := l.gap
		if per == 0 {
			per = l.recent.Median() / time.Duration(max(l.b, 1))
		}
		ahead := time.Duration(l.waiting-behind+1) * per
		if now.Add(ahead + e).After(ps.deadline) {
			ps.late = lateness{hold: e, ahead: ahead, left: ps.deadline.Sub(now)}
			end = waitEnd{now, ErrWouldMissDeadline} // refused at once
		} else if last := ps.deadline.Add(-waitSpare * e); last.Before(end.at) {
			ps.late = lateness{hold: e, left: waitSpare * e}
			end = waitEnd{last, ErrWouldMissDeadline}
		}
	}
	return end, end.at.Sub(now)
}

// fullLocked is the rejection of an operation that finds admission full.
func (l *budget) fullLocked() error {
	if l.running == l.b && l.waiting == l.q {
		return l.full
	}
	e := *l.full
	e.Running, e.Waiting = l.running, l.waiting
	return &e
}

// rejection is a rejection for cause, with what l holds now.
func (l *budget) rejection(cause error, late lateness) *RejectedError {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaseLocked()
	return &RejectedError{Cause: cause, Workload: l.name, MaxConcurrent: l.b, MaxQueue: l.qLocked(),
		Running: l.running, Waiting: l.waiting, Hold: late.hold, Ahead: late.ahead, Left: late.left}
}

// rejectLocked is ps's rejection for cause; queued is 1 if it counts as waiting.
func (l *budget) rejectLocked(ps *passage, cause error, queued int) error {
	e := &RejectedError{Cause: l.causeLocked(cause), Workload: l.name, MaxConcurrent: l.b, MaxQueue: l.qLocked(),
		Running: l.running, Waiting: l.waiting + queued, Waited: ps.waited()}
	if cause == ErrWouldMissDeadline {
		e.Hold, e.Ahead, e.Left = ps.late.hold, ps.late.ahead, ps.late.left
	}
	return e
}

// permit is the state of one gated operation while it holds its permits.
type permit struct {
	kind     Kind
	measure  bool    // its hold time is measured (see tryAcquire); beside kind, so that it takes no room of its own
	probe    bool    // it went as its class's probe, whatever its deadline
	within   uint8   // a transaction's class by the time its caller left it (estimate.LeftClass); 0: not worked out yet
	wl       *budget // the workload's budget, nil for none
	waited   time.Duration
	start    time.Time       // set when the hold time is measured or OnRelease needs it
	lease    time.Time       // the lease (Gate.CapUntil) its permits were granted under; zero: none
	under    int             // the global B in force when it was granted its permits
	deadline time.Time       // its context's; zero: none
	ctx      context.Context // its context: a hold cut off by the caller tells nothing of the work
	text     string          // its statement's text; "" for a transaction
	first    string          // a transaction's first statement's text, once it ran
	class    estimate.Ref    // its class, once looked up
	timer    *time.Timer     // the hold warning, if set
}

// key is p's class: the statement's text, or the transaction's workload
// and the time left it as it arrived (after p.start is set, if not before).
func (p *permit) key() estimate.Key {
	if p.kind == KindTx {
		if p.within == 0 && !p.deadline.IsZero() {
			p.within = estimate.LeftClass(p.deadline.Sub(p.start) + p.waited)
		}
		return estimate.Key{Kind: uint8(KindTx), Workload: p.workloadName(), Within: p.within}
	}
	return estimate.Key{Kind: uint8(p.kind), Text: p.text}
}

// acquire takes the permits of an operation of kind k running text ("" for
// a transaction), its workload's then the global ones. Rejections are
// counted and reported here, admissions by admitted.
func (g *Gate) acquire(ctx context.Context, k Kind, text string, p *permit) error {
	o := fromContext(ctx)
	wl := g.workload(o.workload)
	if wl == nil && o.workload != "" {
		g.unknownWorkload(o.workload)
	}
	p.kind, p.wl, p.waited, p.ctx, p.text, p.first, p.class, p.probe, p.within = k, wl, 0, ctx, text, "", estimate.Ref{}, false, 0
	dl, _ := ctx.Deadline()
	p.deadline = dl
	if wl == nil && o.wait < 0 && ctx.Err() == nil {
		if ok, measure, lease, under := g.global.tryAcquire(); ok {
			p.measure, p.lease, p.under = measure, lease, under
			return nil
		}
	}
	// The slow path may wait: deadlines are judged by the holds measured on it.
	p.measure = true
	ls := []*budget{wl, g.global}
	if wl == nil {
		ls = ls[1:]
	}
	ps := passage{limit: o.wait, deadline: dl}
	if !dl.IsZero() {
		if k == KindTx {
			p.within = estimate.LeftClass(time.Until(dl))
		}
		p.class = g.est.Ref(p.key(), false)
		ps.class = p.class
	}
	if ps.limit < 0 || wl != nil {
		ls[0].mu.Lock()
		if ps.limit < 0 {
			ps.limit = ls[0].wait
		}
		if wl != nil {
			ps.prio = wl.prio
		}
		ls[0].mu.Unlock()
	}
	err := ps.acquire(ctx, ls)
	p.waited, p.lease, p.under, p.probe = ps.waited(), ps.lease, ps.under, ps.probe
	if g.opt.events.OnReject != nil && (ps.wouldReject || errors.Is(err, ErrRejected)) {
		g.reportReject(p, err)
	}
	return err
}

// reportReject calls OnReject for a refusal with err, or for dry-run's (nil).
func (g *Gate) reportReject(p *permit, err error) {
	e := Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Reason: ErrAdmissionFull, DryRun: err == nil}
	var re *RejectedError
	if errors.As(err, &re) {
		e.Reason = re.Cause
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

// admitted counts p's operation, which has its permits and server connection,
// as admitted; or gives its permits back and returns a rejection, nothing of
// it sent, if its lease ran out meanwhile or it would now miss its deadline.
func (g *Gate) admitted(p *permit) error {
	dl, top := p.deadline, g.est.Top()
	if p.measure || g.opt.events.OnRelease != nil || top > 0 && !dl.IsZero() {
		p.start = time.Now()
	}
	var re *RejectedError
	inc := func(l *budget) { l.nLease.Add(1) }
	if !p.lease.IsZero() && leaseOver(p.lease) {
		re = g.global.rejection(ErrLeaseExpired, lateness{})
	} else if top > 0 && !dl.IsZero() && p.start.Add(top).After(dl) {
		if !p.class.Found() { // no class holds longer than top: only then is it looked up
			p.class = g.est.Ref(p.key(), false)
		}
		if late, e := p.class.Judge(p.start, dl, 0); late {
			re = g.global.rejection(ErrWouldMissDeadline, lateness{hold: e, left: dl.Sub(p.start)})
			inc = func(l *budget) { l.nDeadline.Add(1) }
		} else if e > 0 && p.start.Add(e).After(dl) {
			p.measure, p.probe = true, true // its class's probe
		}
	}
	if re != nil {
		g.unused(p, inc)
		re.Waited = p.waited
		if g.opt.events.OnReject != nil {
			g.reportReject(p, re)
		}
		return re
	}
	g.pool.InOps.Add(1)
	g.global.nAdmitted.Add(1)
	if p.wl != nil {
		p.wl.nAdmitted.Add(1)
	}
	if g.opt.holdLimit > 0 {
		e, report := Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Held: g.opt.holdLimit}, g.opt.onHold
		p.timer = time.AfterFunc(e.Held, func() { emit(report, e) })
	}
	if g.opt.events.OnAdmit != nil {
		emit(g.opt.events.OnAdmit, Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited})
	}
	return nil
}

// abort gives back the permits of an operation that got no server connection:
// Canceled if the context ended or the gate closed, else ConnectFailed.
func (g *Gate) abort(p *permit, err error) {
	inc := func(l *budget) { l.nConnFailed.Add(1) }
	if err == ErrClosed || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		inc = func(l *budget) { l.nCanceled.Add(1) }
	}
	g.unused(p, inc)
}

// unused gives back the permits of p, which did not run, counting it with inc.
func (g *Gate) unused(p *permit, inc func(*budget)) {
	g.global.release(0)
	inc(g.global)
	if p.wl != nil {
		p.wl.release(0)
		inc(p.wl)
	}
}

// release gives back p's permits; OnRelease is called first, while they are
// held, so that admissions minus releases never exceed B. A measured hold
// goes to its class and its budgets: one cut off at its deadline counts up
// to it (it needed at least that; the cancel after tells nothing), one cut
// off by its caller not at all.
func (g *Gate) release(p *permit) {
	g.pool.InOps.Add(-1)
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	var held, base time.Duration
	if p.measure || g.opt.events.OnRelease != nil {
		end := time.Now()
		held = end.Sub(p.start)
		if g.opt.events.OnRelease != nil {
			emit(g.opt.events.OnRelease, Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Held: held})
		}
		cut := !p.deadline.IsZero() && !end.Before(p.deadline)
		switch {
		case cut:
			held = max(p.deadline.Sub(p.start), 0)
		case p.ctx.Err() != nil:
			held = 0 // its caller gave up: the hold tells nothing of the work
		}
		if p.measure && held > 0 {
			if !p.class.Found() {
				p.class = g.est.Ref(p.key(), true)
			}
			base = g.est.Observe(p.class, held, cut, p.probe, p.start, end)
			if p.first != "" { // a transaction of its workload, and of its first statement: that one's base tells its work
				first := g.est.Ref(estimate.Key{Kind: uint8(KindTx), Workload: p.workloadName(), Text: p.first}, true)
				base = g.est.Observe(first, held, cut, false, p.start, end)
			}
		}
		if cut {
			held = -held
		}
	}
	if !p.measure {
		held = 0
	}
	// The global permit first: while the workload's is held, no operation of
	// the workload takes it, so none holds more than its B of the global ones.
	g.global.releaseHold(held, base, p.under)
	if p.wl != nil {
		p.wl.releaseHold(held, base, -1)
	}
	p.ctx, p.class = nil, estimate.Ref{}
}
