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
// workload's budget if it names one, then in the global budget. An
// operation whose context has a deadline it can no longer make, given the
// hold time its budget measures, is refused or leaves the queue
// (ErrWouldMissDeadline). Only then does it get a server connection
// (pool.go), so a refused or waiting operation holds none. Its permits
// come back, exactly once, when the driver has finished the operation
// (Gate.release).

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

	// prio, hold and adapt are guarded by mu, shedOther is set once by
	// New: all kept off the fields every operation touches.
	prio  int           // a workload's Priority: that of its operations in the global budget
	hold  time.Duration // the hold time of its operations, a moving average; 0: none measured yet
	adapt *adaptive     // moves b within its ceiling; nil: b is the limit set
	// shedOther, for the global budget, sheds a waiter queued in a
	// workload's budget, called with mu held (see Gate.shedQueued).
	shedOther func(prio int) bool
	nDeadline atomic.Int64
	// lease, when set, is the instant b stops holding (Gate.CapUntil):
	// from then on b is at most leaseB.
	lease  time.Time
	leaseB int
}

// waiter is one operation queued for an execution permit. The queue is
// ordered by priority, highest first, then FIFO. ready is closed, under
// mu, when the permit is handed to it (granted), or when it is sent away
// (late: it can no longer make its deadline; shed: its admission permit
// went to an operation of higher priority), already unlinked.
type waiter struct {
	ready      chan struct{}
	next, prev *waiter
	deadline   time.Time // its context's; zero: none
	prio       int
	granted    bool
	lease      time.Time // the lease it was granted under
	late, shed bool
	gave       *budget // shed: the budget whose admission permit it gave up
}

func newBudget(name string) *budget {
	return &budget{name: name, done: make(chan struct{})}
}

// resize puts new limits in force. Running work keeps its permits: when b
// shrinks below the permits held, releases pay the excess before a waiter
// is served; when it grows, waiters are served in FIFO order. When b+q
// shrinks below the admitted, admission refuses until enough ended.
//
// With a floor above 0 (Policy.Adaptive), b is a ceiling: the limit in
// force moves between floor and b from the hold times measured.
func (l *budget) resize(b, q int, wait time.Duration, dryRun bool, floor int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q, l.wait, l.dryRun = q, wait, dryRun
	switch {
	case floor <= 0:
		l.adapt = nil
	case l.adapt == nil:
		l.adapt = &adaptive{}
		l.b = floor // start low: never above what the database showed it can take
	}
	if l.adapt != nil {
		floor = min(floor, b)
		l.adapt.floor, l.adapt.ceil = floor, b
		b = min(max(l.b, floor), b)
	}
	l.setLimitLocked(b)
}

// setLimitLocked puts b in force and serves the waiters it makes room for.
func (l *budget) setLimitLocked(b int) {
	l.b = b
	l.full = &RejectedError{Cause: ErrAdmissionFull, Workload: l.name, MaxConcurrent: b, MaxQueue: l.q, Running: b, Waiting: l.q}
	l.grantLocked()
}

// setLease makes b hold only until until (zero: for good); then b falls
// to at most after.
func (l *budget) setLease(until time.Time, after int) {
	l.mu.Lock()
	l.lease, l.leaseB = until, after
	l.leaseLocked()
	l.mu.Unlock()
}

// leaseLocked lowers b to the lease's fallback once the lease has run out
// by the monotonic or by the wall clock, whichever says so first (a
// process whose monotonic clock stalled, in a paused virtual machine,
// still sees the wall clock jump).
func (l *budget) leaseLocked() {
	if l.lease.IsZero() {
		return
	}
	if !leaseOver(l.lease) {
		return
	}
	l.lease = time.Time{}
	if l.adapt != nil {
		l.adapt.ceil = min(l.adapt.ceil, l.leaseB)
		l.adapt.floor = min(l.adapt.floor, l.leaseB)
	}
	l.setLimitLocked(min(l.b, l.leaseB))
}

// leaseOver reports whether the lease until has run out, by the monotonic
// or by the wall clock.
func leaseOver(until time.Time) bool {
	now := time.Now()
	return !now.Before(until) || !now.Round(0).Before(until.Round(0))
}

// ceiling is the most b may be: the limit set, which Policy.Adaptive
// moves b below.
func (l *budget) ceilingLocked() int {
	if l.adapt != nil {
		return l.adapt.ceil
	}
	return l.b
}

// tryAcquire takes both permits if both are free and nobody waits, and
// reports whether it did, and under which lease (Gate.CapUntil): the
// whole protocol of an operation of a budget with room. measure reports that its hold is to be measured: the budget
// is adaptive, or the operation took the last execution permit of a
// budget that has measured holds before (so that the estimate follows the
// database while nobody waits).
func (l *budget) tryAcquire() (ok, measure bool, lease time.Time) {
	l.mu.Lock()
	l.leaseLocked()
	ok = !l.closed && l.waiting == 0 && l.running < l.b && l.admitted < l.b+l.q
	if ok {
		l.admitted++
		l.running++
		measure = l.adapt != nil || l.running == l.b && l.hold > 0
		lease = l.lease
	}
	l.mu.Unlock()
	return ok, measure, lease
}

// admit takes an admission permit without waiting for an operation of
// priority prio. When none is free, the youngest waiter of the lowest
// priority below prio is shed: its permit goes to this operation. In
// dry-run it always admits, and reports the rejection it would have made
// (over).
func (l *budget) admit(prio int) (over bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.admitted < l.b+l.q:
	case l.dryRun:
		over = true
		l.wantLocked()
	case l.tail != nil && l.tail.prio < prio:
		l.shedLocked(l.tail, l)
		return false, nil // the admission permit passes from the waiter to this one
	case l.shedOther != nil && l.shedOther(prio):
		return false, nil
	case l.running == l.b && l.waiting == l.q:
		l.wantLocked()
		return false, l.full
	default:
		l.wantLocked()
		e := *l.full
		e.Running, e.Waiting = l.running, l.waiting
		return false, &e
	}
	l.admitted++
	return over, nil
}

// shedLocked sends w, queued in l, away: its admission permit in gave
// passes to another operation.
func (l *budget) shedLocked(w *waiter, gave *budget) {
	l.unlinkLocked(w)
	w.shed, w.gave = true, gave
	close(w.ready)
}

// wantLocked tells the adaptive limit, if any, that a caller wanted more
// than the budget let run.
func (l *budget) wantLocked() {
	if l.adapt != nil {
		l.adapt.wanted = true
	}
}

func (l *budget) unadmit() {
	l.mu.Lock()
	l.admitted--
	l.mu.Unlock()
}

// release gives back both permits: the execution permit to the first
// waiter if there is room, then the admission permit, so that the
// operations running or waiting are always among those admitted. held is
// how long the operation held them, 0 if it was not measured.
func (l *budget) release(held time.Duration) {
	l.mu.Lock()
	l.running--
	l.admitted--
	if l.running < 0 || l.admitted < 0 {
		l.mu.Unlock()
		panic("bulkhead: bug: permits released more than held")
	}
	if held > 0 {
		l.observeLocked(held)
	}
	l.grantLocked()
	l.mu.Unlock()
}

// observeLocked adds the hold time of one operation to the budget's
// average (weight 1/8) and to what its adaptive limit follows.
func (l *budget) observeLocked(held time.Duration) {
	if l.hold == 0 {
		l.hold = held
	} else {
		l.hold += (held - l.hold) / 8
	}
	if l.adapt != nil {
		if b, ok := l.adapt.observe(held, l.b, l.waiting > 0); ok {
			l.setLimitLocked(b)
		}
	}
}

// lateLocked reports whether an operation with deadline dl that started
// now would end after it, by the budget's hold time. A zero deadline or
// no hold measured yet is never late.
func (l *budget) lateLocked(now, dl time.Time) bool {
	return !dl.IsZero() && l.hold > 0 && now.Add(l.hold).After(dl)
}

// releaseExec gives back an execution permit alone.
func (l *budget) releaseExec() {
	l.mu.Lock()
	l.running--
	l.grantLocked()
	l.mu.Unlock()
}

// grantLocked hands execution permits to the waiters at the head of the
// queue while there is room (in dry-run, to all), sending away instead
// those that could no longer make their deadline, and closes drained once
// running work is within the ceiling.
func (l *budget) grantLocked() {
	var now time.Time
	if l.head != nil {
		l.leaseLocked()
	}
	for l.head != nil && (l.running < l.b || l.dryRun) {
		w := l.head
		l.unlinkLocked(w)
		if !w.deadline.IsZero() && !l.dryRun {
			if now.IsZero() {
				now = time.Now()
			}
			if l.lateLocked(now, w.deadline) {
				w.late = true
				close(w.ready)
				continue
			}
		}
		l.running++
		w.granted, w.lease = true, l.lease
		close(w.ready)
	}
	if l.drained != nil && (l.running <= l.ceilingLocked() || l.dryRun) {
		close(l.drained)
		l.drained = nil
	}
}

// waitDrained returns once the operations holding execution permits are
// within the ceiling (at once in dry-run, where nothing is enforced), or ctx
// ends: then it returns ctx's error.
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
	s.Running, s.Waiting, s.Hold = l.running, l.waiting, l.hold
	l.mu.Unlock()
	s.Admitted = l.nAdmitted.Load()
	s.RejectedFull = l.nFull.Load()
	s.RejectedTimeout = l.nTimeout.Load()
	s.RejectedDeadline = l.nDeadline.Load()
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
	deadline    time.Time     // the context's; zero: none
	prio        int           // its workload's Priority
	shed        *budget       // the budget that shed it: its admission permit there was passed on
	start       time.Time     // set when it first has to wait
	timer       *time.Timer
	timerEnd    time.Time // when timer fires
	lease       time.Time // the lease its last execution permit was granted under
	wouldReject bool      // dry-run: admission was full, the rejection not made
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
		over, err := l.admit(ps.prio)
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
				if l != ps.shed {
					l.unadmit()
				}
			}
			ps.stop(ls)
			switch {
			case ps.shed != nil:
				count(ls, func(l *budget) { l.nFull.Add(1) })
			case errors.Is(err, ErrQueueTimeout):
				count(ls, func(l *budget) { l.nTimeout.Add(1) })
			case errors.Is(err, ErrWouldMissDeadline):
				count(ls, func(l *budget) { l.nDeadline.Add(1) })
			default:
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
// passage's limit, ctx's end or l's close. With a deadline and a hold
// time measured, it refuses at once an operation that the wait expected
// ahead of it would make late, and waits no longer than the deadline less
// the hold time. A permit granted at the instant the wait ends is handed
// on, never kept by a caller that reports failure.
func (l *budget) execute(ctx context.Context, ps *passage) error {
	l.mu.Lock()
	l.leaseLocked()
	switch {
	case l.closed:
		l.mu.Unlock()
		return ErrClosed
	case l.waiting == 0 && l.running < l.b:
		l.running++
		ps.lease = l.lease
		l.mu.Unlock()
		return nil
	case l.dryRun:
		l.running++
		l.wantLocked()
		l.mu.Unlock()
		if !ps.wouldReject { // one refused at admission would never have waited
			l.nWouldWait.Add(1)
		}
		return nil
	}
	now := time.Now()
	start := ps.start
	if start.IsZero() {
		start = now
	}
	end, cause := start.Add(ps.limit), ErrQueueTimeout
	// It goes after the last waiter of its priority or higher.
	after, behind := l.tail, 0
	for after != nil && after.prio < ps.prio {
		after = after.prev
		behind++
	}
	if !ps.deadline.IsZero() && l.hold > 0 {
		// Each permit given back serves the next waiter: those ahead and
		// this one are served after about (ahead+1)·hold/b.
		ahead := time.Duration(l.waiting-behind+1) * l.hold / time.Duration(max(l.b, 1))
		if l.lateLocked(now.Add(ahead), ps.deadline) {
			err := l.rejectLocked(ps, ErrWouldMissDeadline, 0)
			l.mu.Unlock()
			return err
		}
		if last := ps.deadline.Add(-l.hold); last.Before(end) {
			end, cause = last, ErrWouldMissDeadline
		}
	}
	left := end.Sub(now)
	if left <= 0 {
		err := l.rejectLocked(ps, cause, 0)
		l.mu.Unlock()
		return err
	}
	ps.start = start
	w := &waiter{ready: make(chan struct{}), deadline: ps.deadline, prio: ps.prio}
	w.prev = after
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
	case !end.Equal(ps.timerEnd): // the earlier wait ended with a grant
		if !ps.timer.Stop() {
			select {
			case <-ps.timer.C:
			default:
			}
		}
		ps.timer.Reset(left)
	}
	ps.timerEnd = end
	var err error
	select {
	case <-w.ready:
		if w.granted {
			ps.lease = w.lease
			return nil
		}
	case <-ps.timer.C:
	case <-ctx.Done():
		err = ctx.Err()
	case <-l.done:
		err = ErrClosed
	}
	l.mu.Lock()
	queued := 1
	switch {
	case w.granted:
		l.running-- // granted as the wait ended: hand it on
		l.grantLocked()
	case w.shed:
		ps.shed, queued, err = w.gave, 0, nil
		cause = ErrAdmissionFull
	case w.late:
		queued = 0
		if err == nil {
			cause = ErrWouldMissDeadline
		}
	default:
		l.unlinkLocked(w)
	}
	if err == nil {
		err = l.rejectLocked(ps, cause, queued)
	}
	l.mu.Unlock()
	return err
}

// rejectLocked is the rejection, for cause, of an admitted operation of
// ps; queued is 1 if it was queued (it counts among the waiting), else 0.
func (l *budget) rejectLocked(ps *passage, cause error, queued int) error {
	return &RejectedError{Cause: cause, Workload: l.name, MaxConcurrent: l.b, MaxQueue: l.q,
		Running: l.running, Waiting: l.waiting + queued, Waited: ps.waited(), Hold: l.hold}
}

// permit is the state of one gated operation while it holds its permits.
type permit struct {
	kind    Kind
	measure bool    // its hold time is measured (see tryAcquire); beside kind, so that it takes no room of its own
	wl      *budget // the workload's budget, nil for none
	waited  time.Duration
	start   time.Time   // set when the hold time is measured or OnRelease needs it
	lease   time.Time   // the lease (Gate.CapUntil) its permits were granted under; zero: none
	timer   *time.Timer // the hold warning, if set
}

// acquire takes the permits of an operation of kind k: ctx's workload's
// (if the policy lists it) and the global ones. Rejections are counted and
// reported here; an admission is counted by admitted, once the operation
// has its server connection too.
func (g *Gate) acquire(ctx context.Context, k Kind, p *permit) error {
	o := fromContext(ctx)
	wl := g.workload(o.workload)
	p.kind, p.wl, p.waited = k, wl, 0
	if wl == nil && o.wait < 0 && ctx.Err() == nil {
		if ok, measure, lease := g.global.tryAcquire(); ok {
			p.measure, p.lease = measure, lease
			return nil
		}
	}
	// The slow path: it may wait, so the hold times that decide who still
	// can make a deadline are measured on it.
	p.measure = true
	var ls [2]*budget
	n := 0
	if wl != nil {
		ls[n] = wl
		n++
	}
	ls[n] = g.global
	n++
	ps := passage{limit: o.wait}
	ps.deadline, _ = ctx.Deadline()
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
	err := ps.acquire(ctx, ls[:n])
	p.waited, p.lease = ps.waited(), ps.lease
	if g.opt.events.OnReject != nil && (ps.wouldReject || errors.Is(err, ErrRejected)) {
		g.reportReject(p, err)
	}
	return err
}

// reportReject calls OnReject for an operation refused with err, or, with
// err nil, let through by dry-run where admission was full.
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

// admitted counts p's operation as admitted, now that it has its permits
// and a server connection, and starts what watches it; or, if the lease it
// was let in under ran out meanwhile (the process was paused), gives its
// permits back and returns the rejection (ErrLeaseExpired): nothing of it
// reached the driver.
func (g *Gate) admitted(p *permit) error {
	if !p.lease.IsZero() && leaseOver(p.lease) {
		g.global.release(0)
		g.global.nFull.Add(1)
		if p.wl != nil {
			p.wl.release(0)
			p.wl.nFull.Add(1)
		}
		err := &RejectedError{Cause: ErrLeaseExpired, Workload: p.workloadName(), Waited: p.waited}
		if g.opt.events.OnReject != nil {
			g.reportReject(p, err)
		}
		return err
	}
	g.global.nAdmitted.Add(1)
	if p.wl != nil {
		p.wl.nAdmitted.Add(1)
	}
	if p.measure || g.opt.events.OnRelease != nil {
		p.start = time.Now()
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

// abort gives back the permits of an operation that got them but no
// server connection, and counts why: the context ended or the gate closed
// (Canceled), else the dial or the driver failed (ConnectFailed).
func (g *Gate) abort(p *permit, err error) {
	g.global.release(0)
	if p.wl != nil {
		p.wl.release(0)
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
	var held time.Duration
	if g.opt.events.OnRelease != nil {
		held = time.Since(p.start)
		emit(g.opt.events.OnRelease, Event{Kind: p.kind, Workload: p.workloadName(), Waited: p.waited, Held: held})
	}
	if !p.measure {
		held = 0
	} else if held == 0 {
		held = time.Since(p.start)
	}
	// The global permit first: while the workload's is still held, no
	// other operation of the workload can take the one given back, so a
	// workload never holds more than its B of the global permits.
	g.global.release(held)
	if p.wl != nil {
		p.wl.release(held)
	}
}

// shedQueued sheds, for an operation of priority prio that found the
// global admission full with no waiter of lower priority in the global
// queue, the youngest waiter of the lowest-priority workload below prio
// still queued in its workload's budget: it holds a global admission
// permit, which passes to the operation. It reports whether it shed one.
// Called with g.global.mu held (the lock order is global, then workload).
func (g *Gate) shedQueued(prio int) bool {
	wls := g.workloads.Load()
	if wls == nil {
		return false
	}
	var low *budget
	lowPrio := prio
	for _, l := range *wls {
		l.mu.Lock()
		if l.tail != nil && l.prio < lowPrio {
			low, lowPrio = l, l.prio
		}
		l.mu.Unlock()
	}
	if low == nil {
		return false
	}
	low.mu.Lock()
	defer low.mu.Unlock()
	if low.tail == nil || low.prio >= prio {
		return false
	}
	low.shedLocked(low.tail, g.global)
	return true
}
