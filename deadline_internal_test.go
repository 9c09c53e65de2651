//go:build go1.25

package bulkhead

// The deadline-aware queue: an operation whose context has a deadline it
// can no longer make, by the hold time its budget measures, is refused at
// once, waits no longer than its deadline less the hold, or is sent away
// when its turn comes. The hold estimate is set under the budget's mutex,
// so that no outcome depends on how long anything took; tests that need
// time to pass run in a synctest bubble, on its fake clock.

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

// dlAcquire takes both permits of l as a gate's passage does, with l's
// queue wait and ctx's deadline, counting the operation as admitted.
func dlAcquire(ctx context.Context, l *budget) (waited time.Duration, err error) {
	l.mu.Lock()
	ps := passage{limit: l.wait}
	l.mu.Unlock()
	ps.deadline, _ = ctx.Deadline()
	err = ps.acquire(ctx, []*budget{l})
	if err == nil {
		l.nAdmitted.Add(1)
	}
	return ps.waited(), err
}

// dlGo starts dlAcquire in a goroutine; its result arrives on the channel.
func dlGo(ctx context.Context, l *budget) <-chan admResult {
	ch := make(chan admResult, 1)
	go func() {
		w, err := dlAcquire(ctx, l)
		ch <- admResult{w, err}
	}()
	return ch
}

// dlQueue starts dlAcquire with ctx and returns once it waits, the
// (n)th waiter of l.
func dlQueue(t *testing.T, ctx context.Context, l *budget, n int) <-chan admResult {
	t.Helper()
	ch := dlGo(ctx, l)
	admWaitFor(t, func() bool {
		select {
		case r := <-ch:
			t.Fatalf("waiter %d returned %v before it was queued", n, r.err)
		default:
		}
		return admRead(l).waiting == n
	})
	return ch
}

// dlRecv returns the result on ch. The bound only turns a hang into a
// failure.
func dlRecv(t *testing.T, what string, ch <-chan admResult) admResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never returned", what)
		return admResult{}
	}
}

// dlNone fails if a result is on ch.
func dlNone(t *testing.T, what string, ch <-chan admResult) {
	t.Helper()
	if r, ok := admPoll(ch); ok {
		t.Fatalf("%s returned %v, want it still waiting", what, r.err)
	}
}

func dlSetHold(l *budget, d time.Duration) {
	l.mu.Lock()
	l.hold = d
	l.margin.Store(int64(l.marginLocked()))
	l.mu.Unlock()
}

// dlDeadline returns a context whose deadline is d away.
func dlDeadline(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dlMissed fails unless err is a would-miss-deadline rejection, and
// returns it.
func dlMissed(t *testing.T, what string, err error) *RejectedError {
	t.Helper()
	var re *RejectedError
	if !errors.As(err, &re) || re.Cause != ErrWouldMissDeadline {
		t.Fatalf("%s: %v, want a *RejectedError with Cause ErrWouldMissDeadline", what, err)
	}
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrWouldMissDeadline) {
		t.Fatalf("%s: %v does not match ErrRejected and ErrWouldMissDeadline", what, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrQueueTimeout) || errors.Is(err, ErrAdmissionFull) {
		t.Fatalf("%s: %v matches DeadlineExceeded, ErrQueueTimeout or ErrAdmissionFull", what, err)
	}
	return re
}

// A deadline closer than the hold time is refused at once: a rejection,
// not the context's error, counted apart, with no wait.
func TestDeadlineShorterThanTheHoldIsRefusedAtOnce(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
	admMustAcquire(t, l)
	dlSetHold(l, time.Hour)
	waited, err := dlAcquire(dlDeadline(t, time.Minute), l)
	re := dlMissed(t, "a minute's deadline with an hour's hold", err)
	if waited != 0 || re.Waited != 0 || re.Hold != time.Hour || re.Running != 1 || re.Waiting != 0 || re.MaxConcurrent != 1 || re.MaxQueue != 1 {
		t.Fatalf("rejection %+v after waiting %v, want Waited 0, Hold 1h, 1 running, 0 waiting, B=1, Q=1", *re, waited)
	}
	if !strings.Contains(err.Error(), "would miss its deadline") {
		t.Fatalf("message %q does not say it would miss its deadline", err)
	}
	if got, want := err.Error(), "bulkhead: would miss its deadline after a wait of 0s, with operations holding their permits 1h0m0s: 1 running + 0 waiting of B=1, Q=1"; got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	if got := ReasonLabel(err); got != "would_miss_deadline" {
		t.Fatalf("ReasonLabel = %q, want would_miss_deadline", got)
	}
	admCheck(t, l, 1, 0) // the refused operation holds nothing
	s := admStats(l)
	if s.RejectedDeadline != 1 || s.RejectedTimeout != 0 || s.RejectedFull != 0 || s.Canceled != 0 || s.WaitCount != 0 || s.Admitted != 1 || s.Hold != time.Hour {
		t.Fatalf("stats %+v, want 1 deadline rejection, no wait, 1 admitted, Hold 1h", s)
	}
	l.release(0)
	admCheck(t, l, 0, 0)
}

// A hold ended after its operation's deadline is a lower bound of the hold:
// below the average it changes nothing, above it counts as measured.
func TestAHoldCutOffByItsDeadlineOnlyRaisesTheAverage(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 0})
	dlSetHold(l, 80*time.Millisecond)
	for _, c := range []struct {
		held, want time.Duration
	}{
		{-10 * time.Millisecond, 80 * time.Millisecond},
		{-160 * time.Millisecond, 90 * time.Millisecond},
		{10 * time.Millisecond, 80 * time.Millisecond},
	} {
		admMustAcquire(t, l)
		l.release(c.held)
		if s := admStats(l); s.Hold != c.want {
			t.Fatalf("after a hold of %v (negative: cut off), the average is %v, want %v", c.held, s.Hold, c.want)
		}
	}
}

// Through database/sql: an operation still running at its deadline counts
// as a hold up to its deadline, not up to the end of the cancellation that
// followed; the release event still reports the whole hold.
func TestAnOperationCutOffByItsDeadlineIsMeasuredUpToItsDeadline(t *testing.T) {
	released := make(chan time.Duration, 1)
	g, db, fc := dlGate(t, Policy{MaxConcurrent: 2, Adaptive: true}, WithEvents(Events{OnRelease: func(e Event) {
		if e.Kind == KindExec {
			released <- e.Held // one exec runs
		}
	}}))
	entered, unblock := make(chan struct{}), make(chan struct{})
	fc.SetHook(func(ctx context.Context, op fakedb.Op, _ string) error {
		if op != fakedb.OpExec {
			return nil
		}
		close(entered)
		<-ctx.Done()
		<-unblock // the cancellation takes a while after the deadline
		return ctx.Err()
	})
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	dl, _ := ctx.Deadline()
	done := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(ctx, "UPDATE t SET v = 1")
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("exec returned %v before reaching the driver", err)
	}
	<-ctx.Done()
	admWaitFor(t, func() bool { return time.Since(dl) > 40*time.Millisecond })
	close(unblock)
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec past its deadline: %v, want context.DeadlineExceeded", err)
	}
	var whole time.Duration
	select {
	case whole = <-released: // sent before the exec returned
	default:
		t.Fatal("no release event for the exec")
	}
	if s := g.Stats(); s.Hold <= 0 || s.Hold > dl.Sub(t0) || s.Hold >= whole {
		t.Fatalf("Hold %v, want above 0, at most the %v to the deadline and below the whole hold %v", s.Hold, dl.Sub(t0), whole)
	}
}

// A hold cut off at its deadline is a lower bound of the work: it raises
// the average by an eighth of the gap. One such hold after completed ones
// is an outlier and leaves the deviation (counted there, one after steady
// 10 ms holds would lift the margin, hold plus four deviations, to 100 ms,
// and the gate would refuse every caller with a shorter deadline). A second
// in a row (a link slower than the deadlines) moves the deviation too, and
// a caller with 50 ms left is judged late.
func TestAHoldCutOffAtItsDeadlineMovesTheDeviationOnlyInARun(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Second})
	for range 8 {
		admMustAcquire(t, l)
		l.release(10 * time.Millisecond)
	}
	state := func() (hold, dev time.Duration, late bool) {
		now := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.hold, l.dev, l.lateLocked(now, now.Add(50*time.Millisecond))
	}
	admMustAcquire(t, l)
	l.release(-90 * time.Millisecond)
	if hold, dev, late := state(); hold != 20*time.Millisecond || dev != 0 || late {
		t.Fatalf("after eight holds of 10ms and one cut off at 90ms: hold %v, deviation %v, late with 50ms left %v; want 20ms, 0, false", hold, dev, late)
	}
	if m := time.Duration(l.margin.Load()); m != 20*time.Millisecond {
		t.Fatalf("margin %v, want 20ms", m)
	}
	admMustAcquire(t, l)
	l.release(-90 * time.Millisecond)
	if _, dev, late := state(); dev == 0 || !late {
		t.Fatalf("after a second hold cut off at 90ms: deviation %v, late with 50ms left %v; want above 0, true", dev, late)
	}
}

// The same operation without a deadline waits, as every operation did
// before hold times were measured, and gets the permit given back.
func TestWithoutADeadlineAnOperationWaitsWhateverTheHold(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
	admMustAcquire(t, l)
	dlSetHold(l, time.Hour)
	res := dlQueue(t, context.Background(), l, 1)
	l.release(0)
	if r := dlRecv(t, "the waiter", res); r.err != nil {
		t.Fatalf("waiter without a deadline: %v, want the permit", r.err)
	}
	admCheck(t, l, 1, 0)
	l.release(0)
	if s := admStats(l); s.RejectedDeadline != 0 || s.Admitted != 2 || s.WaitCount != 1 {
		t.Fatalf("stats %+v, want 2 admitted, 1 wait, no deadline rejection", s)
	}
}

// Before any hold time is measured, a deadline refuses nothing: the
// waiter with one waits and gets the permit.
func TestBeforeAnyHoldIsMeasuredADeadlineRefusesNothing(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour})
	admMustAcquire(t, l)
	ctx := dlDeadline(t, time.Minute)
	res := dlQueue(t, ctx, l, 1)
	if s := admStats(l); s.Hold != 0 || s.RejectedDeadline != 0 {
		t.Fatalf("stats %+v, want no hold measured and no deadline rejection", s)
	}
	l.release(0) // not measured: the hold stays 0 at the grant
	if r := dlRecv(t, "the waiter", res); r.err != nil {
		t.Fatalf("waiter with a deadline and no hold measured: %v, want the permit", r.err)
	}
	l.release(0)
	admCheck(t, l, 0, 0)
	if s := admStats(l); s.RejectedDeadline != 0 || s.Admitted != 2 {
		t.Fatalf("stats %+v, want 2 admitted, no deadline rejection", s)
	}
}

// The wait expected ahead, (waiting+1)·hold/B, counts the queue: with
// B=2, a 10-minute hold and a 24-minute deadline, the first two waiters
// can make it (15 and 20 minutes) and the third cannot (25).
func TestTheWaitExpectedAheadOfADeadlineCountsTheWaitersQueued(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 2, MaxQueue: 3, QueueWait: time.Hour})
	admMustAcquire(t, l)
	admMustAcquire(t, l)
	dlSetHold(l, 10*time.Minute)
	ctx := dlDeadline(t, 24*time.Minute)
	first := dlQueue(t, ctx, l, 1)
	second := dlQueue(t, ctx, l, 2)
	_, err := dlAcquire(ctx, l)
	re := dlMissed(t, "the third waiter", err)
	if re.Waited != 0 || re.Waiting != 2 || re.Running != 2 {
		t.Fatalf("rejection %+v, want Waited 0 with 2 running and 2 waiting", *re)
	}
	admCheck(t, l, 2, 2)
	l.release(0)
	l.release(0)
	for _, w := range []struct {
		name string
		ch   <-chan admResult
	}{{"first", first}, {"second", second}} {
		if r := dlRecv(t, w.name, w.ch); r.err != nil {
			t.Fatalf("%s waiter: %v, want the permit (10 minutes of hold left it 14)", w.name, r.err)
		}
	}
	l.release(0)
	l.release(0)
	admCheck(t, l, 0, 0)
	if s := admStats(l); s.RejectedDeadline != 1 || s.Admitted != 4 {
		t.Fatalf("stats %+v, want 1 deadline rejection, 4 admitted", s)
	}
}

// A waiter whose deadline has come within the hold time when its turn
// comes is sent away, and the permit goes to the next waiter that can
// still make its own: FIFO among those, whatever their deadlines.
func TestAWaiterThatCanNoLongerMakeItsDeadlineIsSentAwayAtItsTurn(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 4, QueueWait: time.Hour})
	admMustAcquire(t, l)
	// Queued with no hold measured: none is refused or bounded on entry.
	w1 := dlQueue(t, dlDeadline(t, time.Minute), l, 1) // late once the hold is an hour
	w2 := dlQueue(t, dlDeadline(t, 3*time.Hour), l, 2) // can make it
	w3 := dlQueue(t, context.Background(), l, 3)       // no deadline
	w4 := dlQueue(t, dlDeadline(t, time.Minute), l, 4) // late
	dlSetHold(l, time.Hour)

	l.release(0) // w1 is sent away, w2 gets the permit
	re := dlMissed(t, "w1 at its turn", dlRecv(t, "w1", w1).err)
	if re.Hold != time.Hour || re.Running != 1 || re.Waiting != 2 {
		t.Fatalf("w1's rejection %+v, want Hold 1h, 1 running (w2), 2 waiting (w3, w4)", *re)
	}
	if r := dlRecv(t, "w2", w2); r.err != nil {
		t.Fatalf("w2: %v, want the permit w1 could not use", r.err)
	}
	dlNone(t, "w3", w3)
	dlNone(t, "w4", w4)
	admCheck(t, l, 1, 2)

	l.release(0) // w2 ends: w3, without a deadline, is next
	if r := dlRecv(t, "w3", w3); r.err != nil {
		t.Fatalf("w3: %v, want the permit", r.err)
	}
	dlNone(t, "w4", w4)
	admCheck(t, l, 1, 1)

	l.release(0) // w3 ends: w4 is sent away, the permit stays free
	dlMissed(t, "w4 at its turn", dlRecv(t, "w4", w4).err)
	admCheck(t, l, 0, 0)
	s := admStats(l)
	if s.RejectedDeadline != 2 || s.Admitted != 3 || s.WaitCount != 4 || s.RejectedTimeout != 0 || s.Canceled != 0 {
		t.Fatalf("stats %+v, want 2 deadline rejections, 3 admitted, 4 waits", s)
	}
}

// A waiter waits no longer than its deadline less the hold time, and is
// then refused with ErrWouldMissDeadline; when the queue wait ends first,
// it is a queue timeout as before. On the fake clock the waits are exact.
func TestTheWaitIsBoundedByTheDeadlineLessTheHold(t *testing.T) {
	for _, c := range []struct {
		name   string
		wait   time.Duration
		want   error
		waited time.Duration
	}{
		{"deadline first", time.Second, ErrWouldMissDeadline, 70 * time.Millisecond},
		{"queue wait first", 50 * time.Millisecond, ErrQueueTimeout, 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := admBubbleLimiter(t, Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: c.wait})
				admMustAcquire(t, l)
				dlSetHold(l, 30*time.Millisecond)
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				// 30ms ahead plus 30ms of hold fit in 100ms: it queues.
				waited, err := dlAcquire(ctx, l)
				var re *RejectedError
				if !errors.As(err, &re) || re.Cause != c.want || errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("err = %v, want a rejection for %v", err, c.want)
				}
				if waited != c.waited || re.Waited != c.waited {
					t.Fatalf("waited %v (Waited %v) of fake time, want %v", waited, re.Waited, c.waited)
				}
				admCheck(t, l, 1, 0)
				s := admStats(l)
				wantDeadline, wantTimeout := int64(0), int64(0)
				if c.want == ErrWouldMissDeadline {
					wantDeadline = 1
				} else {
					wantTimeout = 1
				}
				if s.RejectedDeadline != wantDeadline || s.RejectedTimeout != wantTimeout || s.WaitCount != 1 || s.WaitDuration != c.waited {
					t.Fatalf("stats %+v, want %d deadline and %d timeout rejections, 1 wait of %v", s, wantDeadline, wantTimeout, c.waited)
				}
				l.release(0)
				admCheck(t, l, 0, 0)
			})
		})
	}
}

// Dry-run never refuses for a deadline: neither on entry nor, when it is
// switched on with a waiter that could no longer make its deadline, at
// the grant.
func TestDryRunNeverRejectsForADeadline(t *testing.T) {
	t.Run("on entry", func(t *testing.T) {
		l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour, DryRun: true})
		admMustAcquire(t, l)
		dlSetHold(l, time.Hour)
		if _, err := dlAcquire(dlDeadline(t, time.Minute), l); err != nil {
			t.Fatalf("dry-run with a deadline shorter than the hold: %v, want it let through", err)
		}
		if s := admStats(l); s.Running != 2 || s.RejectedDeadline != 0 || s.WouldWait != 1 || s.Admitted != 2 {
			t.Fatalf("stats %+v, want 2 running, 1 would-wait, no deadline rejection", s)
		}
		l.release(0)
		l.release(0)
	})
	t.Run("switched on", func(t *testing.T) {
		l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
		admMustAcquire(t, l)
		w := dlQueue(t, dlDeadline(t, time.Minute), l, 1)
		dlSetHold(l, time.Hour)
		l.resize(1, 1, time.Hour, true, 0)
		if r := dlRecv(t, "the waiter", w); r.err != nil {
			t.Fatalf("waiter when dry-run is switched on: %v, want it let through", r.err)
		}
		if s := admStats(l); s.Running != 2 || s.RejectedDeadline != 0 {
			t.Fatalf("stats %+v, want 2 running, no deadline rejection", s)
		}
		l.release(0)
		l.release(0)
	})
}

// Refused by the global budget after passing its workload's, an operation
// gives back the workload's permits, and both budgets count it.
func TestADeadlineRejectionInTheSecondBudgetGivesBackTheFirstsPermits(t *testing.T) {
	wl := newLimiter("batch", Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Hour})
	gl := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour})
	admMustAcquire(t, gl)
	dlSetHold(gl, time.Hour)
	ctx := dlDeadline(t, time.Minute)
	ps := passage{limit: time.Hour}
	ps.deadline, _ = ctx.Deadline()
	err := ps.acquire(ctx, []*budget{wl, gl})
	if re := dlMissed(t, "refused by the global budget", err); re.Workload != "" {
		t.Fatalf("rejection %+v, want it from the global budget (Workload \"\")", *re)
	}
	admCheck(t, wl, 0, 0)
	admCheck(t, gl, 1, 0)
	if w, g := admStats(wl), admStats(gl); w.RejectedDeadline != 1 || g.RejectedDeadline != 1 {
		t.Fatalf("RejectedDeadline workload %d, global %d; want 1 and 1", w.RejectedDeadline, g.RejectedDeadline)
	}
	gl.release(0)
}

// The hold estimate is the first hold measured, then a moving average of
// weight 1/8; a release that was not measured (0) leaves it.
func TestTheHoldDeadlinesAreWeighedAgainstIsAMovingAverage(t *testing.T) {
	l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Second})
	for i, c := range []struct {
		held, want time.Duration
	}{
		{0, 0},
		{80 * time.Millisecond, 80 * time.Millisecond},
		{0, 80 * time.Millisecond},
		{160 * time.Millisecond, 90 * time.Millisecond},
		{10 * time.Millisecond, 80 * time.Millisecond},
	} {
		admMustAcquire(t, l)
		l.release(c.held)
		if s := admStats(l); s.Hold != c.want {
			t.Fatalf("release %d of %v: Hold %v, want %v", i, c.held, s.Hold, c.want)
		}
	}
}

// An operation is late if it would end after its deadline by the mean
// hold plus four times the holds' mean deviation from it: with holds that vary,
// one that the mean alone would let start is refused.
func TestTheMarginAnOperationNeedsGrowsWithTheSpreadOfTheHolds(t *testing.T) {
	for _, c := range []struct {
		holds []time.Duration
		late  bool
	}{
		{[]time.Duration{80 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond}, false},
		{[]time.Duration{80 * time.Millisecond, 40 * time.Millisecond, 120 * time.Millisecond, 40 * time.Millisecond, 120 * time.Millisecond}, true},
	} {
		l := newLimiter("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Second})
		for _, h := range c.holds {
			admMustAcquire(t, l)
			l.release(h)
		}
		now := time.Now()
		l.mu.Lock()
		late, hold, dev := l.lateLocked(now, now.Add(90*time.Millisecond)), l.hold, l.dev
		l.mu.Unlock()
		if late != c.late || hold < 70*time.Millisecond || hold > 90*time.Millisecond {
			t.Fatalf("holds %v: hold %v, deviation %v; late for a deadline 90 ms away: %v, want %v", c.holds, hold, dev, late, c.late)
		}
	}
}

// ---- through a gate on the fake driver ----

// dlGate opens a gate on a fake driver, closed at the end of the test.
func dlGate(t *testing.T, p Policy, opts ...Option) (*Gate, *sql.DB, *fakedb.Connector) {
	t.Helper()
	fc := fakedb.New()
	g, err := New(fc, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	t.Cleanup(func() { db.Close() })
	return g, db, fc
}

// dlRejects records the OnReject events.
type dlRejects struct {
	mu  sync.Mutex
	got []Event
}

func (r *dlRejects) option() Option {
	return WithEvents(Events{OnReject: func(e Event) {
		r.mu.Lock()
		r.got = append(r.got, e)
		r.mu.Unlock()
	}})
}

func (r *dlRejects) list() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.got...)
}

// Through database/sql: a statement and a transaction whose deadline is
// closer than the hold are refused, reported to OnReject with the reason,
// and reach neither the driver nor a dial; one without a deadline waits
// and runs.
func TestTheGateRefusesAnOperationThatWouldMissItsDeadlineWithoutReachingTheDriver(t *testing.T) {
	var ev dlRejects
	g, db, fc := dlGate(t, Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour}, ev.option())
	bg := context.Background()
	tx, err := db.BeginTx(bg, nil) // holds the only permit
	if err != nil {
		t.Fatal(err)
	}
	dlSetHold(g.global, time.Hour)
	before, execs, begins := g.Stats(), fc.Count(fakedb.OpExec), fc.Count(fakedb.OpBegin)

	ctx := dlDeadline(t, time.Minute)
	_, err = db.ExecContext(ctx, "UPDATE t SET v = 1")
	dlMissed(t, "exec", err)
	if got := ReasonLabel(err); got != "would_miss_deadline" {
		t.Fatalf("ReasonLabel(%v) = %q, want would_miss_deadline", err, got)
	}
	tx2, err := db.BeginTx(ctx, nil)
	if err == nil {
		tx2.Rollback()
	}
	dlMissed(t, "begin", err)

	s := g.Stats()
	if s.RejectedDeadline != 2 || s.Dials != before.Dials || s.OpenConns != before.OpenConns || s.Admitted != before.Admitted || s.WaitCount != 0 {
		t.Fatalf("stats %+v (before %+v), want 2 deadline rejections, no dial, no admission, no wait", s, before)
	}
	if fc.Count(fakedb.OpExec) != execs || fc.Count(fakedb.OpBegin) != begins {
		t.Fatalf("the driver saw %d execs and %d begins, want none", fc.Count(fakedb.OpExec)-execs, fc.Count(fakedb.OpBegin)-begins)
	}
	evs := ev.list()
	if len(evs) != 2 || evs[0].Kind != KindExec || evs[1].Kind != KindTx {
		t.Fatalf("OnReject events %+v, want a statement's and a transaction's", evs)
	}
	for _, e := range evs {
		if e.Reason != ErrWouldMissDeadline || e.DryRun || e.Waited != 0 || ReasonLabel(e.Reason) != "would_miss_deadline" {
			t.Fatalf("OnReject event %+v, want Reason ErrWouldMissDeadline, not dry-run, no wait", e)
		}
	}

	done := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(bg, "UPDATE t SET v = 2")
		done <- err
	}()
	admWaitFor(t, func() bool { return g.Stats().Waiting == 1 })
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exec without a deadline: %v, want it run once the permit came back", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("exec without a deadline never returned")
	}
	if s := g.Stats(); s.RejectedDeadline != 2 || s.Running != 0 || s.Waiting != 0 || len(ev.list()) != 2 {
		t.Fatalf("stats %+v, want every permit back and still 2 deadline rejections", s)
	}
}

// Hold times are measured on operations that could not take their
// permits at once, not on those that could (unless the limit is
// adaptive, where every operation is measured).
func TestTheGateMeasuresHoldTimesOffTheFastPathOrAllWhenAdaptive(t *testing.T) {
	bg := context.Background()
	t.Run("fixed", func(t *testing.T) {
		g, db, _ := dlGate(t, Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
		for range 3 {
			if _, err := db.ExecContext(bg, "UPDATE t SET v = 1"); err != nil {
				t.Fatal(err)
			}
		}
		if s := g.Stats(); s.Hold != 0 {
			t.Fatalf("Hold %v after operations that found a permit free, want 0", s.Hold)
		}
		tx, err := db.BeginTx(bg, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := db.ExecContext(bg, "UPDATE t SET v = 2")
			done <- err
		}()
		admWaitFor(t, func() bool { return g.Stats().Waiting == 1 })
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if s := g.Stats(); s.Hold <= 0 {
			t.Fatalf("Hold %v after an operation that waited, want it measured", s.Hold)
		}
	})
	t.Run("adaptive", func(t *testing.T) {
		g, db, _ := dlGate(t, Policy{MaxConcurrent: 4, Adaptive: true})
		if _, err := db.ExecContext(bg, "UPDATE t SET v = 1"); err != nil {
			t.Fatal(err)
		}
		if s := g.Stats(); s.Hold <= 0 {
			t.Fatalf("Hold %v after an operation under Adaptive, want it measured", s.Hold)
		}
	})
}

// Once a budget has measured a hold, an operation that takes its last
// execution permit on the fast path is measured too, so that a hold
// estimate that got too long comes down while nobody waits.
func TestTheFastPathMeasuresTheOperationThatTakesTheLastPermit(t *testing.T) {
	l := newBudget("")
	l.resize(2, 0, 0, false, 0)
	if ok, measure, _ := l.tryAcquire(); !ok || measure {
		t.Fatalf("first permit, no hold measured: ok %v measure %v, want true, false", ok, measure)
	}
	l.release(0)
	dlSetHold(l, time.Hour)
	if ok, measure, _ := l.tryAcquire(); !ok || measure {
		t.Fatalf("first of two permits: ok %v measure %v, want true, false", ok, measure)
	}
	if ok, measure, _ := l.tryAcquire(); !ok || !measure {
		t.Fatalf("last permit with a hold measured: ok %v measure %v, want true, true", ok, measure)
	}
	l.release(time.Millisecond)
	l.release(0)
	if s := admStats(l); s.Hold >= time.Hour {
		t.Fatalf("Hold %v after a short hold measured, want it lowered", s.Hold)
	}
}

// Through database/sql: an operation that finds a permit free but whose
// deadline is closer than the hold is refused once it holds its server
// connection, before the driver sees it; once such refusals went on for
// four margins with no hold measured, one runs, and its hold, measured
// though it left a permit free, restarts the average.
func TestALateOperationIsRefusedWithAPermitFreeUntilTheHoldIsStale(t *testing.T) {
	var ev dlRejects
	g, db, fc := dlGate(t, Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Hour}, ev.option())
	bg := context.Background()
	if _, err := db.ExecContext(bg, "UPDATE t SET v = 0"); err != nil {
		t.Fatal(err)
	}
	dlSetHold(g.global, time.Hour)
	execs := fc.Count(fakedb.OpExec)
	ctx := dlDeadline(t, time.Minute)
	_, err := db.ExecContext(ctx, "UPDATE t SET v = 1")
	if re := dlMissed(t, "exec, a permit free", err); re.Waited != 0 || re.Hold != time.Hour {
		t.Fatalf("rejection %+v, want no wait and the hold of 1h", re)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err == nil {
		tx.Rollback()
	}
	dlMissed(t, "begin, a permit free", err)
	if n := fc.Count(fakedb.OpExec) - execs; n != 0 {
		t.Fatalf("the driver saw %d execs of refused operations, want 0", n)
	}
	if evs := ev.list(); len(evs) != 2 || evs[0].Reason != ErrWouldMissDeadline {
		t.Fatalf("OnReject events %+v, want 2 for ErrWouldMissDeadline", evs)
	}

	g.global.mu.Lock()
	g.global.refusing = time.Now().Add(-4*time.Hour - time.Minute) // four margins (dev 0) ago
	g.global.mu.Unlock()
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 2"); err != nil {
		t.Fatalf("after four margins of refusals: %v, want it run", err)
	}
	// It took no last permit, yet its hold is measured, and it restarts the average.
	if s := g.Stats(); s.Hold >= time.Minute {
		t.Fatalf("hold %v after the operation that ran, want the average restarted from it, far below 1h", s.Hold)
	}
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 3"); err != nil {
		t.Fatalf("once the hold was measured again: %v, want it run", err)
	}
	if s := g.Stats(); s.RejectedDeadline != 2 || s.Admitted != 3 || s.Running != 0 || fc.Count(fakedb.OpExec)-execs != 2 {
		t.Fatalf("stats %+v, %d execs; want 2 deadline rejections, 3 admitted, none running, 2 execs", s, fc.Count(fakedb.OpExec)-execs)
	}
}
