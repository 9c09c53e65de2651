//go:build go1.25

package bulkhead

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// Tests of the unexported budget. Those that need time to pass run in a
// synctest bubble: waits take exactly their length of fake time.

// admState is the budget's state, read under its lock.
type admState struct {
	free, waiting int
	admitted      int64
	listLen       int
}

func admRead(l *budget) admState {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for w := l.head; w != nil; w = w.next {
		n++
	}
	return admState{free: l.b - l.running, waiting: l.waiting, admitted: int64(l.admitted), listLen: n}
}

// admCheck fails the test unless the budget holds exactly running
// execution permits and waiting queued operations, and its invariants hold.
func admCheck(t *testing.T, l *budget, running, waiting int) {
	t.Helper()
	s := admRead(l)
	if s.free != l.b-running || s.waiting != waiting || s.admitted != int64(running+waiting) || s.listLen != waiting {
		t.Fatalf("budget state %+v, want free=%d waiting=%d admitted=%d (B=%d Q=%d)",
			s, l.b-running, waiting, running+waiting, l.b, l.q)
	}
	admInvariants(t, l, s)
}

func admInvariants(t *testing.T, l *budget, s admState) {
	t.Helper()
	switch {
	case s.free < 0 || s.free > l.b:
		t.Fatalf("free=%d, want 0..%d", s.free, l.b)
	case s.admitted < 0 || s.admitted > int64(l.b+l.q):
		t.Fatalf("admitted=%d, want 0..%d", s.admitted, int64(l.b+l.q))
	case s.waiting < 0 || s.waiting > l.q:
		t.Fatalf("waiting=%d, want 0..%d", s.waiting, l.q)
	case s.waiting != s.listLen:
		t.Fatalf("waiting=%d but %d waiters linked", s.waiting, s.listLen)
	case s.waiting > 0 && s.free > 0:
		t.Fatalf("%d execution permits idle while %d operations wait", s.free, s.waiting)
	case s.admitted != int64(l.b-s.free+s.waiting):
		t.Fatalf("admitted=%d, want running+waiting=%d", s.admitted, l.b-s.free+s.waiting)
	}
}

// admStats returns the budget's Stats.
func admStats(l *budget) Stats {
	var s Stats
	l.stats(&s)
	return s
}

// admResult is what a goroutine's acquire returned.
type admResult struct {
	waited time.Duration
	err    error
}

// admGo starts acquire in a goroutine; its result arrives on the channel.
func admGo(ctx context.Context, l *budget) <-chan admResult { return admGoPass(ctx, l, passage{}) }

// admGoPass starts admPass(ctx, l, ps) in a goroutine; its result arrives
// on the channel.
func admGoPass(ctx context.Context, l *budget, ps passage) <-chan admResult {
	ch := make(chan admResult, 1)
	go func() {
		w, err := admPass(ctx, l, ps)
		ch <- admResult{w, err}
	}()
	return ch
}

// admQueue starts admGoPass and returns once it is the nth waiter of l,
// failing the test if it returned before.
func admQueue(t *testing.T, ctx context.Context, l *budget, ps passage, n int) <-chan admResult {
	t.Helper()
	ch := admGoPass(ctx, l, ps)
	admWaitFor(t, func() bool {
		if r, ok := admPoll(ch); ok {
			t.Fatalf("waiter %d returned %v before it was queued", n, r.err)
		}
		return admRead(l).waiting == n
	})
	return ch
}

// admQueued starts admGo in a synctest bubble and returns once every
// goroutine of the bubble is blocked: the operation queued, or done.
func admQueued(ctx context.Context, l *budget) <-chan admResult {
	ch := admGo(ctx, l)
	synctest.Wait()
	return ch
}

// admPoll receives from ch if a result is there.
func admPoll(ch <-chan admResult) (admResult, bool) {
	select {
	case r := <-ch:
		return r, true
	default:
		return admResult{}, false
	}
}

// admWaitFor polls cond, with real time, until it holds (testkit.Await).
func admWaitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testkit.Await(t, "the condition held", cond)
}

// admBubbleBudget returns a budget for a synctest bubble, closed at the
// end of the test: a failing test leaves no goroutine queued.
func admBubbleBudget(t *testing.T, p Policy) *budget {
	l := admBudget("", p)
	t.Cleanup(l.close)
	return l
}

// admBudget returns a budget named name with p's limits, as a gate
// without workloads holds it.
func admBudget(name string, p Policy) *budget {
	l := newBudget(name)
	l.resize(p.MaxConcurrent, p.MaxQueue, p.QueueWait, p.DryRun, 0)
	return l
}

// admAcquire takes both permits of l with l's queue wait, as a gate
// without workloads does, counting the operation as admitted.
func admAcquire(ctx context.Context, l *budget) (waited time.Duration, err error) {
	return admPass(ctx, l, passage{})
}

// admPass takes both permits of l for ps with l's queue wait, counting
// the operation as admitted; waited is the time it spent waiting.
func admPass(ctx context.Context, l *budget, ps passage) (waited time.Duration, err error) {
	l.mu.Lock()
	ps.limit = l.wait
	l.mu.Unlock()
	err = ps.acquire(ctx, []*budget{l})
	if err == nil {
		l.nAdmitted.Add(1)
	}
	return ps.waited(), err
}

// admBubbleHeld is admBubbleBudget with n operations admitted and
// running.
func admBubbleHeld(t *testing.T, p Policy, n int) *budget {
	t.Helper()
	l := admBubbleBudget(t, p)
	for range n {
		admMustAcquire(t, l)
	}
	return l
}

func admMustAcquire(t *testing.T, l *budget) {
	t.Helper()
	if w, err := admAcquire(context.Background(), l); err != nil || w != 0 {
		t.Fatalf("acquire = %v, %v; want 0, nil", w, err)
	}
}

func TestLimiterAcquiresAndReleasesPermitsWithoutWaiting(t *testing.T) {
	l := admBudget("", Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Second})
	admCheck(t, l, 0, 0)
	admMustAcquire(t, l)
	admCheck(t, l, 1, 0)
	admMustAcquire(t, l)
	admCheck(t, l, 2, 0)
	if s := admStats(l); s.Running != 2 || s.Waiting != 0 || s.Admitted != 2 || s.WaitCount != 0 || s.WaitDuration != 0 {
		t.Fatalf("stats %+v, want 2 running, 2 admitted, no wait", s)
	}
	l.release(0)
	admCheck(t, l, 1, 0)
	admMustAcquire(t, l)
	l.release(0)
	l.release(0)
	admCheck(t, l, 0, 0)
	s := admStats(l)
	want := Stats{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Second, Admitted: 3}
	if s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
}

func TestAdmissionFullRejectsAtOnceWithThePreallocatedError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := admBubbleHeld(t, Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Hour}, 2)
		ctx, cancel := context.WithCancel(context.Background())
		queued := admQueued(ctx, l)
		admCheck(t, l, 2, 1)

		start := time.Now()
		waited, err := admAcquire(context.Background(), l)
		if err == nil {
			t.Fatal("acquire with admission full succeeded")
		}
		if err != error(l.full) {
			t.Fatalf("err = %#v, want the preallocated error(l.full)", err)
		}
		if waited != 0 || time.Since(start) != 0 {
			t.Fatalf("rejection waited %v (fake clock moved %v), want at once", waited, time.Since(start))
		}
		for _, target := range []error{ErrRejected, ErrAdmissionFull} {
			if !errors.Is(err, target) {
				t.Errorf("errors.Is(err, %v) = false, want true", target)
			}
		}
		for _, target := range []error{ErrQueueTimeout, ErrClosed, driver.ErrBadConn, context.Canceled} {
			if errors.Is(err, target) {
				t.Errorf("errors.Is(err, %v) = true, want false", target)
			}
		}
		var re *RejectedError
		if !errors.As(err, &re) || re.Cause != ErrAdmissionFull || re.MaxConcurrent != 2 || re.MaxQueue != 1 || re.Waited != 0 {
			t.Fatalf("errors.As = %#v, want Cause ErrAdmissionFull, limits 2/1, Waited 0", re)
		}
		if got, want := err.Error(), "bulkhead: admission full: 2 running + 1 waiting of B=2, Q=1"; got != want {
			t.Fatalf("message %q, want %q", got, want)
		}
		admCheck(t, l, 2, 1) // nothing taken
		if allocs := testing.AllocsPerRun(100, func() { _, _ = admAcquire(context.Background(), l) }); allocs != 0 {
			t.Errorf("a rejection at admission allocates %v times, want 0", allocs)
		}
		if s := admStats(l); s.RejectedFull != 102 || s.Admitted != 2 || s.Waiting != 1 {
			t.Fatalf("stats %+v, want 102 rejected full, 2 admitted, 1 waiting", s)
		}

		cancel()
		if r := <-queued; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("queued acquire = %v, want context.Canceled", r.err)
		}
		l.release(0)
		l.release(0)
		admCheck(t, l, 0, 0)
	})
}

func TestWaitersAreGrantedPermitsInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 6
		l := admBubbleHeld(t, Policy{MaxConcurrent: 1, MaxQueue: n, QueueWait: time.Hour}, 1)
		granted := make(chan int, n)
		finish := make([]chan struct{}, n)
		errs := make(chan error, n)
		stop := make(chan struct{}) // closed at the end, in case of failure
		t.Cleanup(func() { close(stop) })
		for i := range n {
			finish[i] = make(chan struct{})
			go func() {
				if _, err := admAcquire(context.Background(), l); err != nil {
					errs <- err
					return
				}
				granted <- i
				select {
				case <-finish[i]:
				case <-stop:
				}
				l.release(0)
			}()
			// Start the next waiter only once this one is queued.
			synctest.Wait()
			if s := admStats(l); s.Waiting != i+1 || s.Running != 1 {
				t.Fatalf("after waiter %d: %d waiting, %d running; want %d, 1", i, s.Waiting, s.Running, i+1)
			}
		}
		l.release(0) // the holder's permit goes to waiter 0
		for want := range n {
			synctest.Wait()
			select {
			case err := <-errs:
				t.Fatalf("a waiter failed: %v", err)
			case got := <-granted:
				if got != want {
					t.Fatalf("permit %d went to waiter %d, want waiter %d", want, got, want)
				}
			default:
				t.Fatalf("no waiter was granted the permit; want waiter %d", want)
			}
			select {
			case got := <-granted:
				t.Fatalf("waiter %d was granted a permit while waiter %d held the only one", got, want)
			default:
			}
			admCheck(t, l, 1, n-want-1)
			close(finish[want])
		}
		synctest.Wait()
		admCheck(t, l, 0, 0)
		if s := admStats(l); s.Admitted != n+1 || s.WaitCount != n {
			t.Fatalf("stats %+v, want %d admitted and %d waits", s, n+1, n)
		}
	})
}

// A queue timeout comes after exactly the queue wait (0: none) and takes
// nothing; a free permit is still taken at once.
func TestQueueTimeoutRejectsAndGivesBackOnlyTheAdmissionPermit(t *testing.T) {
	for _, c := range []struct {
		wait      time.Duration
		waitCount int64
		msg       string
	}{
		{100 * time.Millisecond, 1, "bulkhead: queue wait timed out after 100ms: 1 running + 1 waiting of B=1, Q=1"},
		{0, 0, "bulkhead: queue wait timed out after 0s: 1 running + 0 waiting of B=1, Q=1"},
	} {
		t.Run(c.wait.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := admBubbleHeld(t, Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: c.wait}, 1)
				waited, err := admAcquire(context.Background(), l) // fake time passes while it waits
				var re *RejectedError
				if !errors.As(err, &re) {
					t.Fatalf("err = %v, want a *RejectedError", err)
				}
				if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrQueueTimeout) || errors.Is(err, ErrAdmissionFull) || errors.Is(err, driver.ErrBadConn) {
					t.Fatalf("err %v matches the wrong sentinels", err)
				}
				if waited != c.wait || re.Waited != waited {
					t.Fatalf("waited %v, Waited %v; want %v each", waited, re.Waited, c.wait)
				}
				if got := err.Error(); got != c.msg {
					t.Fatalf("message %q, want %q", got, c.msg)
				}
				admCheck(t, l, 1, 0) // the holder keeps its permits; the waiter took none
				s := admStats(l)
				if s.RejectedTimeout != 1 || s.WaitCount != c.waitCount || s.WaitDuration != c.wait || s.Admitted != 1 || s.Canceled != 0 {
					t.Fatalf("stats %+v, want 1 timeout, %d wait of %v, 1 admitted", s, c.waitCount, c.wait)
				}
				l.release(0)
				admMustAcquire(t, l) // a free permit is taken at once, whatever the queue wait
				l.release(0)
				admCheck(t, l, 0, 0)
			})
		})
	}
}

// A context cancelled, or whose deadline comes before the queue wait,
// ends the wait with its own error, not a rejection, and takes nothing.
func TestAContextEndingWhileQueuedReturnsTheContextError(t *testing.T) {
	for _, c := range []struct {
		want     error
		p        Policy
		after    time.Duration // when the context ends
		deadline bool          // it ends by its deadline, else by its cancel
	}{
		{context.Canceled, Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour}, 10 * time.Millisecond, false},
		{context.DeadlineExceeded, Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 100 * time.Millisecond}, 30 * time.Millisecond, true},
	} {
		t.Run(c.want.Error(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := admBubbleHeld(t, c.p, 1)
				ctx, cancel := context.WithCancel(context.Background())
				if c.deadline {
					ctx, cancel = context.WithTimeout(context.Background(), c.after)
				}
				defer cancel()
				res := admQueued(ctx, l)
				admCheck(t, l, 1, 1)
				if !c.deadline {
					time.Sleep(c.after) // advance the fake clock
					cancel()
				}
				r := <-res
				if r.err != c.want {
					t.Fatalf("err = %v, want %v itself", r.err, c.want)
				}
				if errors.Is(r.err, ErrRejected) {
					t.Fatalf("%v matches ErrRejected", r.err)
				}
				if r.waited != c.after {
					t.Fatalf("waited %v of fake time, want %v", r.waited, c.after)
				}
				admCheck(t, l, 1, 0)
				if s := admStats(l); s.Canceled != 1 || s.RejectedTimeout != 0 || s.WaitCount != 1 || s.WaitDuration != c.after {
					t.Fatalf("stats %+v, want 1 canceled after a wait of %v", s, c.after)
				}
				l.release(0)
				admCheck(t, l, 0, 0)
			})
		})
	}
}

func TestAlreadyCanceledContextTakesNothing(t *testing.T) {
	l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 0, QueueWait: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := admAcquire(ctx, l); err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	admCheck(t, l, 0, 0)
	// Also when admission is full: the context is looked at first.
	admMustAcquire(t, l)
	if _, err := admAcquire(ctx, l); err != context.Canceled {
		t.Fatalf("err with admission full = %v, want context.Canceled", err)
	}
	admCheck(t, l, 1, 0)
	if s := admStats(l); s.Canceled != 2 || s.RejectedFull != 0 || s.Admitted != 1 {
		t.Fatalf("stats %+v, want 2 canceled, 1 admitted", s)
	}
	l.release(0)
	admCheck(t, l, 0, 0)
}

func TestCloseMakesWaitersAndNewOperationsReturnErrClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := admBubbleHeld(t, Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Hour}, 2)
		w1 := admGo(context.Background(), l)
		w2 := admQueued(context.Background(), l)
		admCheck(t, l, 2, 2)
		start := time.Now()
		l.close()
		l.close() // idempotent
		for i, ch := range []<-chan admResult{w1, w2} {
			r := <-ch
			if r.err != ErrClosed || errors.Is(r.err, ErrRejected) {
				t.Fatalf("waiter %d: err = %v, want ErrClosed, not a rejection", i, r.err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("waiters took %v of fake time to see the close, want none", d)
		}
		admCheck(t, l, 2, 0)
		if _, err := admAcquire(context.Background(), l); err != ErrClosed {
			t.Fatalf("acquire after close with admission free = %v, want ErrClosed", err)
		}
		l.release(0) // running operations still give their permits back
		if _, err := admAcquire(context.Background(), l); err != ErrClosed {
			t.Fatalf("acquire after close with a permit free = %v, want ErrClosed", err)
		}
		l.release(0)
		admCheck(t, l, 0, 0)
		if !l.isClosed() {
			t.Fatal("isClosed = false after close")
		}
		if s := admStats(l); s.Canceled != 4 || s.Admitted != 2 || s.WaitCount != 2 {
			t.Fatalf("stats %+v, want 4 canceled (2 waiters, 2 new), 2 admitted, 2 waits", s)
		}
	})
}

// A waiter queued at close gets ErrClosed even if a permit is released
// before it is scheduled: after db.Close no operation starts.
func TestWaiterQueuedAtCloseGetsErrClosedEvenIfAPermitIsReleasedRightAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for i := range 200 {
			l := admBubbleHeld(t, Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour}, 1)
			res := admQueued(context.Background(), l)
			l.close()
			l.release(0)
			r := <-res
			if r.err == nil {
				l.release(0)
			}
			admCheck(t, l, 0, 0)
			if r.err != ErrClosed {
				t.Fatalf("iteration %d: waiter queued at close got %v, want ErrClosed", i, r.err)
			}
		}
	})
}

// A permit granted as the waiter's context ended is handed to the next
// waiter, or given back; the waiter reports its context's error.
func TestPermitGrantedAsTheWaitEndsIsHandedOn(t *testing.T) {
	for _, next := range []bool{true, false} {
		t.Run(fmt.Sprint("next waiter ", next), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := admBubbleHeld(t, Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour}, 1)
				ctx, cancel := context.WithCancel(context.Background())
				first := admQueued(ctx, l)
				var second <-chan admResult
				if next {
					second = admGo(context.Background(), l)
					synctest.Wait()
				}
				// What release does, with cancel slipped in under the lock:
				// the first waiter's select has chosen ctx.Done when the
				// permit is granted to it.
				l.mu.Lock()
				cancel()
				l.running--
				l.admitted--
				l.grantLocked()
				l.mu.Unlock()

				if r := <-first; r.err != context.Canceled {
					t.Fatalf("first waiter = %v, want context.Canceled", r.err)
				}
				if next {
					if r := <-second; r.err != nil {
						t.Fatalf("second waiter = %v, want the handed-on permit", r.err)
					}
					admCheck(t, l, 1, 0)
					l.release(0)
				}
				admCheck(t, l, 0, 0)
				wantAdmitted := int64(1)
				if next {
					wantAdmitted = 2
				}
				if s := admStats(l); s.Admitted != wantAdmitted || s.Canceled != 1 {
					t.Fatalf("stats %+v, want %d admitted, 1 canceled", s, wantAdmitted)
				}
			})
		})
	}
}

func TestReleasingMoreThanHeldPanicsAsABug(t *testing.T) {
	l := admBudget("", Policy{MaxConcurrent: 2, MaxQueue: 0, QueueWait: 0})
	admMustAcquire(t, l)
	l.release(0)
	defer func() {
		r := recover()
		msg, _ := r.(string)
		if !strings.HasPrefix(msg, "bulkhead: bug:") {
			t.Fatalf("double release recovered %v, want a panic starting with \"bulkhead: bug:\"", r)
		}
	}()
	l.release(0)
	t.Fatal("double release did not panic")
}

func TestStatsCountersAddUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const wait = 100 * time.Millisecond
		l := admBubbleHeld(t, Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: wait}, 1) // admitted 1

		// Two waiters time out together after 100ms; a third is refused.
		t1, t2 := admGo(context.Background(), l), admGo(context.Background(), l)
		synctest.Wait()
		if _, err := admAcquire(context.Background(), l); !errors.Is(err, ErrAdmissionFull) {
			t.Fatalf("third acquire = %v, want admission full", err)
		}
		for _, ch := range []<-chan admResult{t1, t2} {
			if r := <-ch; !errors.Is(r.err, ErrQueueTimeout) || r.waited != wait {
				t.Fatalf("waiter = %v after %v, want a queue timeout after %v", r.err, r.waited, wait)
			}
		}

		// A waiter granted after 30ms, and one canceled after 10ms.
		g := admGo(context.Background(), l)
		ctx, cancel := context.WithCancel(context.Background())
		c := admQueued(ctx, l)
		time.Sleep(10 * time.Millisecond)
		cancel()
		if r := <-c; r.err != context.Canceled || r.waited != 10*time.Millisecond {
			t.Fatalf("canceled waiter = %v after %v, want context.Canceled after 10ms", r.err, r.waited)
		}
		time.Sleep(20 * time.Millisecond)
		l.release(0)
		if r := <-g; r.err != nil || r.waited != 30*time.Millisecond {
			t.Fatalf("granted waiter = %v after %v, want nil after 30ms", r.err, r.waited)
		}
		admCheck(t, l, 1, 0)

		// An already canceled context counts as canceled too.
		if _, err := admAcquire(ctx, l); err != context.Canceled {
			t.Fatalf("acquire with canceled ctx = %v", err)
		}
		l.release(0)
		admCheck(t, l, 0, 0)

		want := Stats{
			MaxConcurrent: 1, MaxQueue: 2, QueueWait: wait,
			Admitted:        2,
			RejectedFull:    1,
			RejectedTimeout: 2,
			Canceled:        2,
			WaitCount:       4,
			WaitDuration:    2*wait + 10*time.Millisecond + 30*time.Millisecond,
		}
		if s := admStats(l); s != want {
			t.Fatalf("stats\n got %+v\nwant %+v", s, want)
		}
	})
}

// admRaceCounts counts the outcomes of a race, for the log.
type admRaceCounts map[string]int

func (c admRaceCounts) add(err error) {
	if err == nil {
		c["granted"]++
		return
	}
	c[err.Error()]++
}

// settle counts the outcome on ch, the permit (given back at once, and
// reported true) or the error want, failing on anything else.
func (c admRaceCounts) settle(t *testing.T, l *budget, what string, ch <-chan admResult, want error) (granted bool) {
	t.Helper()
	r := <-ch
	c.add(r.err)
	switch r.err {
	case nil:
		l.release(0)
		return true
	case want:
		return false
	}
	t.Fatalf("%s = %v, want nil or %v", what, r.err, want)
	return false
}

// admRace runs a and b at once, on two goroutines let go together, and
// returns once both returned.
func admRace(a, b func()) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, f := range []func(){a, b} {
		wg.Go(func() { <-start; f() })
	}
	close(start)
	wg.Wait()
}

// A waiter's cancellation races the holder's release: the permit ends
// with the second waiter or is handed on, and every permit comes back.
func TestCancellationRacingAGrantLeavesEveryPermitBack(t *testing.T) {
	const iterations = 2000
	counts := admRaceCounts{}
	synctest.Test(t, func(t *testing.T) {
		l := admBubbleBudget(t, Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour})
		acquires, releases := 0, 0
		for i := range iterations {
			admMustAcquire(t, l)
			acquires++
			ctx, cancel := context.WithCancel(context.Background())
			first := admQueued(ctx, l)
			second := admQueued(context.Background(), l)
			admCheck(t, l, 1, 2)

			admRace(cancel, func() { l.release(0) })
			releases++

			if counts.settle(t, l, fmt.Sprintf("iteration %d: first waiter", i), first, context.Canceled) {
				acquires++
				releases++
			}
			r2 := <-second
			if r2.err != nil {
				t.Fatalf("iteration %d: second waiter = %v, want the permit", i, r2.err)
			}
			acquires++
			l.release(0)
			releases++
			admCheck(t, l, 0, 0)
		}
		if acquires != releases {
			t.Fatalf("%d acquires, %d releases", acquires, releases)
		}
		s := admStats(l)
		if s.Admitted != int64(acquires) || s.Canceled != int64(counts["context canceled"]) || s.Admitted+s.Canceled != 3*iterations {
			t.Fatalf("stats %+v; %d acquires, outcomes %v", s, acquires, counts)
		}
	})
	t.Logf("first waiter outcomes over %d races: %v", iterations, counts)
}

// A release races a queue wait running out, in real time (a fake clock
// never fires mid-release); waits of 1 to 64µs make both outcomes happen.
func TestQueueTimeoutRacingAGrantLeavesEveryPermitBack(t *testing.T) {
	const iterations = 2000
	counts := admRaceCounts{}
	total := Stats{}
	for i := range iterations {
		l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Duration(1+i%64) * time.Microsecond})
		admMustAcquire(t, l)
		res := admGo(context.Background(), l)
		// Release once the waiter is queued, or has already timed out.
		admWaitFor(t, func() bool { return admRead(l).waiting == 1 || l.nTimeout.Load() == 1 })
		l.release(0)
		r := <-res
		counts.add(r.err)
		switch {
		case r.err == nil:
			l.release(0)
		case errors.Is(r.err, ErrQueueTimeout):
			if r.waited <= 0 {
				t.Fatalf("iteration %d: timed out after %v, want > 0", i, r.waited)
			}
		default:
			t.Fatalf("iteration %d: waiter = %v, want nil or a queue timeout", i, r.err)
		}
		admCheck(t, l, 0, 0)
		s := admStats(l)
		if s.Admitted+s.RejectedTimeout != 2 || s.WaitCount != 1 {
			t.Fatalf("iteration %d: stats %+v, want 2 outcomes and 1 wait", i, s)
		}
		total.Admitted += s.Admitted
		total.RejectedTimeout += s.RejectedTimeout
	}
	t.Logf("waiter outcomes over %d races: %d granted, %d timed out", iterations, total.Admitted-iterations, total.RejectedTimeout)
}

// Close races a release: waiters get the permit or ErrClosed, and every
// permit comes back.
func TestCloseRacingAGrantLeavesEveryPermitBack(t *testing.T) {
	const iterations = 2000
	counts := admRaceCounts{}
	synctest.Test(t, func(t *testing.T) {
		for i := range iterations {
			l := admBubbleHeld(t, Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour}, 1)
			first := admQueued(context.Background(), l)
			second := admQueued(context.Background(), l)

			admRace(l.close, func() { l.release(0) })

			granted := 0
			for _, ch := range []<-chan admResult{first, second} {
				if counts.settle(t, l, fmt.Sprintf("iteration %d: waiter", i), ch, ErrClosed) {
					granted++
				}
			}
			admCheck(t, l, 0, 0)
			s := admStats(l)
			if s.Admitted != int64(1+granted) || s.Canceled != int64(2-granted) {
				t.Fatalf("iteration %d: stats %+v with %d granted", i, s, granted)
			}
			if _, err := admAcquire(context.Background(), l); err != ErrClosed {
				t.Fatalf("iteration %d: acquire after close = %v", i, err)
			}
		}
	})
	t.Logf("waiter outcomes over %d races: %v", iterations, counts)
}

// admModel is a reference model of the budget for the random test.
type admModel struct {
	b, q    int
	wait    time.Duration
	holders int
	queue   []*admModelWaiter
	closed  bool
	want    Stats
}

type admModelWaiter struct {
	id     int
	since  time.Time
	cancel context.CancelFunc
	res    <-chan admResult
}

// Random acquires, releases, cancels, clock advances and closes: after
// each step, outcomes, state and Stats match a model and invariants hold.
func TestLimiterMatchesAModelUnderRandomOperations(t *testing.T) {
	seeds, steps := 40, 300
	if testing.Short() {
		seeds = 10
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { admRunModel(t, int64(seed), steps) })
		})
	}
}

func admRunModel(t *testing.T, seed int64, steps int) {
	rng := rand.New(rand.NewSource(seed))
	waits := []time.Duration{0, 20 * time.Millisecond, 50 * time.Millisecond}
	m := &admModel{b: 1 + rng.Intn(3), q: rng.Intn(4), wait: waits[rng.Intn(len(waits))]}
	m.want = Stats{MaxConcurrent: m.b, MaxQueue: m.q, QueueWait: m.wait}
	l := admBubbleBudget(t, Policy{MaxConcurrent: m.b, MaxQueue: m.q, QueueWait: m.wait})
	t.Logf("B=%d Q=%d wait=%v", m.b, m.q, m.wait)

	expect := func(step int, w *admModelWaiter, what string, match func(admResult) bool, waited time.Duration) {
		t.Helper()
		r, ok := admPoll(w.res)
		if !ok {
			t.Fatalf("step %d: operation %d has not returned, want %s", step, w.id, what)
		}
		if !match(r) || r.waited != waited {
			t.Fatalf("step %d: operation %d returned %v after %v, want %s after %v", step, w.id, r.err, r.waited, what, waited)
		}
	}
	isErr := func(target error) func(admResult) bool {
		return func(r admResult) bool { return r.err == target }
	}
	isTimeout := func(r admResult) bool {
		var re *RejectedError
		return errors.As(r.err, &re) && re.Cause == ErrQueueTimeout && re.Waited == r.waited
	}
	// waitEnd records the end of a queued operation's wait in the model.
	waitEnd := func(w *admModelWaiter) time.Duration {
		d := time.Since(w.since)
		m.want.WaitCount++
		m.want.WaitDuration += d
		return d
	}
	drop := func(i int) { m.queue = append(m.queue[:i], m.queue[i+1:]...) }

	for step := range steps {
		op := rng.Intn(100)
		switch {
		case op < 40: // acquire
			ctx, cancel := context.WithCancel(context.Background())
			preCanceled := rng.Intn(10) == 0
			if preCanceled {
				cancel()
			}
			w := &admModelWaiter{id: step, since: time.Now(), cancel: cancel, res: admGo(ctx, l)}
			synctest.Wait()
			switch {
			case preCanceled:
				m.want.Canceled++
				expect(step, w, "context.Canceled", isErr(context.Canceled), 0)
			case m.holders+len(m.queue) >= m.b+m.q:
				m.want.RejectedFull++
				expect(step, w, "admission full", isErr(error(l.full)), 0)
			case m.closed:
				m.want.Canceled++
				expect(step, w, "ErrClosed", isErr(ErrClosed), 0)
			case m.holders < m.b && len(m.queue) == 0:
				m.holders++
				m.want.Admitted++
				expect(step, w, "a permit", isErr(nil), 0)
			case m.wait == 0:
				m.want.RejectedTimeout++
				expect(step, w, "a queue timeout", isTimeout, 0)
			default:
				if _, ok := admPoll(w.res); ok {
					t.Fatalf("step %d: operation %d returned, want it queued", step, w.id)
				}
				m.queue = append(m.queue, w)
			}
			if !preCanceled && rng.Intn(2) == 0 {
				// Cancel half of them at once: a queued one leaves at once.
				cancel()
				synctest.Wait()
				if len(m.queue) > 0 && m.queue[len(m.queue)-1] == w {
					drop(len(m.queue) - 1)
					m.want.Canceled++
					expect(step, w, "context.Canceled", isErr(context.Canceled), waitEnd(w))
				}
			}
		case op < 70: // release a running operation
			if m.holders == 0 {
				continue
			}
			l.release(0)
			synctest.Wait()
			if len(m.queue) > 0 {
				w := m.queue[0]
				drop(0)
				m.want.Admitted++
				expect(step, w, "the released permit", isErr(nil), waitEnd(w))
			} else {
				m.holders--
			}
		case op < 80: // cancel a queued operation
			if len(m.queue) == 0 {
				continue
			}
			i := rng.Intn(len(m.queue))
			w := m.queue[i]
			w.cancel()
			synctest.Wait()
			drop(i)
			m.want.Canceled++
			expect(step, w, "context.Canceled", isErr(context.Canceled), waitEnd(w))
		case op < 98: // let fake time pass
			time.Sleep(time.Duration(1+rng.Intn(30)) * time.Millisecond)
			synctest.Wait()
			kept := m.queue[:0]
			var expired []*admModelWaiter
			for _, w := range m.queue {
				if m.wait > 0 && time.Since(w.since) >= m.wait {
					expired = append(expired, w)
				} else {
					kept = append(kept, w)
				}
			}
			m.queue = kept
			for _, w := range expired {
				m.want.RejectedTimeout++
				m.want.WaitCount++
				m.want.WaitDuration += m.wait
				expect(step, w, "a queue timeout", isTimeout, m.wait)
			}
		default: // close
			l.close()
			synctest.Wait()
			m.closed = true
			for _, w := range m.queue {
				m.want.Canceled++
				expect(step, w, "ErrClosed", isErr(ErrClosed), waitEnd(w))
			}
			m.queue = nil
		}

		admCheck(t, l, m.holders, len(m.queue))
		got := admStats(l)
		want := m.want
		want.Running, want.Waiting = m.holders, len(m.queue)
		if got != want {
			t.Fatalf("step %d: stats\n got %+v\nwant %+v", step, got, want)
		}
	}

	// Wind down: close, then let every running operation finish.
	l.close()
	synctest.Wait()
	for _, w := range m.queue {
		if r, ok := admPoll(w.res); !ok || r.err != ErrClosed {
			t.Fatalf("operation %d at close: %v, %v; want ErrClosed", w.id, r.err, ok)
		}
	}
	for range m.holders {
		l.release(0)
	}
	admCheck(t, l, 0, 0)
}
