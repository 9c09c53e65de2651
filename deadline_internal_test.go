//go:build go1.25

package bulkhead

// The deadline-aware queue: an operation that can no longer make its
// deadline, by its class's recent holds, is refused at once, waits no
// longer than its deadline less twice that hold, or is sent away at its turn.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/estimate"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// dlEstimated returns a new estimator and its class "work", whose last
// holds were all d, measured now.
func dlEstimated(d time.Duration) (*estimate.Estimator, estimate.Ref) {
	e := estimate.New()
	r := e.Ref(estimate.Key{Kind: uint8(KindExec), Text: "work"}, true)
	now := time.Now()
	for range estimate.HoldSamples {
		e.Observe(r, d, false, false, now, now)
	}
	return e, r
}

// dlClass is the class of dlEstimated(d).
func dlClass(d time.Duration) estimate.Ref {
	_, r := dlEstimated(d)
	return r
}

// dlPassage is a gate's passage of class c with ctx's deadline.
func dlPassage(ctx context.Context, c estimate.Ref) passage {
	ps := passage{class: c}
	ps.deadline, _ = ctx.Deadline()
	return ps
}

// dlAcquire takes both permits of l for dlPassage(ctx, c) (admPass).
func dlAcquire(ctx context.Context, l *budget, c estimate.Ref) (waited time.Duration, err error) {
	return admPass(ctx, l, dlPassage(ctx, c))
}

// dlGo starts dlAcquire in a goroutine; its result arrives on the channel.
func dlGo(ctx context.Context, l *budget, c estimate.Ref) <-chan admResult {
	return admGoPass(ctx, l, dlPassage(ctx, c))
}

// dlQueue starts dlAcquire and returns once it is the nth waiter of l.
func dlQueue(t *testing.T, ctx context.Context, l *budget, c estimate.Ref, n int) <-chan admResult {
	t.Helper()
	return admQueue(t, ctx, l, dlPassage(ctx, c), n)
}

// dlNone fails if a result is on ch.
func dlNone(t *testing.T, what string, ch <-chan admResult) {
	t.Helper()
	if r, ok := admPoll(ch); ok {
		t.Fatalf("%s returned %v, want it still waiting", what, r.err)
	}
}

// dlSetRecent makes d the median of l's recent holds: the wait one
// operation ahead adds, per execution permit.
func dlSetRecent(l *budget, d time.Duration) {
	l.mu.Lock()
	for range estimate.HoldSamples {
		l.recent.Add(d)
	}
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

// ---- the budget's queue, judged by a class's estimate ----

// Refused at once: a rejection counted apart, saying what it was judged on.
func TestADeadlineCloserThanItsClassesHoldIsRefusedAtOnce(t *testing.T) {
	l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 4, QueueWait: time.Hour})
	admMustAcquire(t, l)
	c := dlClass(time.Hour)
	dlSetRecent(l, time.Hour)
	waited, err := dlAcquire(dlDeadline(t, time.Minute), l, c)
	re := dlMissed(t, "an operation due in a minute, its class holding an hour", err)
	if waited != 0 || re.Waited != 0 || re.Hold != time.Hour || re.Ahead != time.Hour || re.Left <= 0 || re.Left > time.Minute {
		t.Fatalf("rejection %+v (waited %v), want no wait, Hold 1h, Ahead 1h, Left at most 1m", *re, waited)
	}
	for _, part := range []string{"would miss its deadline", "holds its permits 1h0m0s", "1 running + 0 waiting of B=1, Q=4"} {
		if !strings.Contains(re.Error(), part) {
			t.Fatalf("%q does not say %q", re.Error(), part)
		}
	}
	admCheck(t, l, 1, 0)
	if s := admStats(l); s.RejectedDeadline != 1 || s.RejectedTimeout != 0 || s.RejectedFull != 0 || s.WaitCount != 0 {
		t.Fatalf("stats %+v, want one deadline rejection and nothing else", s)
	}
	l.release(0)
}

// Nothing is refused without evidence; one with a deadline goes first.
func TestWithoutADeadlineOrAnEstimateAnOperationWaitsItsTurn(t *testing.T) {
	l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 4, QueueWait: time.Hour})
	admMustAcquire(t, l)
	dlSetRecent(l, time.Hour)
	none := dlQueue(t, context.Background(), l, dlClass(time.Hour), 1)
	unmeasured := dlQueue(t, dlDeadline(t, time.Minute), l, estimate.Ref{}, 2)
	for _, ch := range []<-chan admResult{unmeasured, none} {
		l.release(0)
		if r := testkit.Recv(t, "waiter", ch); r.err != nil {
			t.Fatalf("a waiter without a deadline or an estimate: %v, want its turn", r.err)
		}
	}
	l.release(0)
}

// Ahead: those queued before it, at the budget's median hold per permit.
func TestTheWaitExpectedAheadCountsTheWaitersQueued(t *testing.T) {
	l := admBudget("", Policy{MaxConcurrent: 2, MaxQueue: 8, QueueWait: time.Hour})
	admMustAcquire(t, l)
	admMustAcquire(t, l)
	dlSetRecent(l, 10*time.Minute)
	c := dlClass(time.Minute)
	var queued []<-chan admResult
	for i := range 3 {
		queued = append(queued, dlQueue(t, dlDeadline(t, 14*time.Minute), l, estimate.Ref{}, i+1))
	}
	// Four to be served at 10m per permit, 2 permits: 20m, then its minute.
	ch := dlGo(dlDeadline(t, 15*time.Minute), l, c)
	re := dlMissed(t, "an operation with 3 queued ahead", testkit.Recv(t, "it", ch).err)
	if re.Ahead != 20*time.Minute || re.Hold != time.Minute {
		t.Fatalf("rejection %+v, want Ahead 20m, Hold 1m", *re)
	}
	ok := dlQueue(t, dlDeadline(t, 30*time.Minute), l, c, 4)
	for i := range 4 {
		l.release(0)
		q := ok
		if i < 3 {
			q = queued[i]
		}
		if r := testkit.Recv(t, "waiter", q); r.err != nil {
			t.Fatal(r.err)
		}
	}
	l.release(0)
	l.release(0)
}

// The hold grew while it waited: it is sent away, the permit goes on.
func TestAWaiterThatCanNoLongerMakeItsDeadlineIsSentAwayAtItsTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 4, QueueWait: time.Hour})
		admMustAcquire(t, l)
		e, c := dlEstimated(10 * time.Second)
		w1 := dlGo(dlDeadline(t, 90*time.Second), l, c) // room for 10s now
		synctest.Wait()
		w2 := dlGo(context.Background(), l, c)
		synctest.Wait()
		time.Sleep(45 * time.Second)
		now := time.Now()
		for range estimate.HoldSamples { // its class's work now holds a minute
			e.Observe(c, time.Minute, false, false, now, now)
		}
		dlNone(t, "w1", w1)
		l.release(0) // w1's turn: 45s left for a hold of 1m
		re := dlMissed(t, "w1 at its turn", testkit.Recv(t, "w1", w1).err)
		if re.Hold != time.Minute || re.Left != 45*time.Second || re.Running != 1 || re.Waiting != 0 {
			t.Fatalf("w1's rejection %+v, want Hold 1m, Left 45s, 1 running (w2)", *re)
		}
		if r := testkit.Recv(t, "w2", w2); r.err != nil || time.Since(now) != 0 {
			t.Fatalf("w2: %v after %v, want the permit w1 could not use, at once", r.err, time.Since(now))
		}
		l.release(0)
		if s := admStats(l); s.RejectedDeadline != 1 || s.Admitted != 2 {
			t.Fatalf("stats %+v, want 1 deadline rejection, 2 admitted", s)
		}
	})
}

// Refused, saying so, when that bound comes before the queue wait's end.
func TestTheWaitIsBoundedByTheDeadlineLessTwiceItsClassesHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			wait, deadline time.Duration
			cause          error
			waited         time.Duration
		}{
			{time.Second, 100 * time.Millisecond, ErrWouldMissDeadline, 40 * time.Millisecond},
			{30 * time.Millisecond, 100 * time.Millisecond, ErrQueueTimeout, 30 * time.Millisecond},
		} {
			l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: c.wait})
			admMustAcquire(t, l)
			waited, err := dlAcquire(dlDeadline(t, c.deadline), l, dlClass(30*time.Millisecond))
			var re *RejectedError
			if !errors.As(err, &re) || re.Cause != c.cause || waited != c.waited || re.Waited != c.waited {
				t.Fatalf("wait %v, deadline %v: %v after %v, want %v after %v", c.wait, c.deadline, err, waited, c.cause, c.waited)
			}
			if want := "bulkhead: would miss its deadline: still waiting after 40ms with 60ms left, twice what its kind of work holds its permits: 1 running + 1 waiting of B=1, Q=1"; c.cause == ErrWouldMissDeadline && err.Error() != want {
				t.Fatalf("%v, want %s", err, want)
			}
			l.release(0)
		}
	})
}

// Dry-run never refuses for a deadline.
func TestDryRunNeverRejectsForADeadline(t *testing.T) {
	l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour, DryRun: true})
	admMustAcquire(t, l)
	dlSetRecent(l, time.Hour)
	if _, err := dlAcquire(dlDeadline(t, time.Minute), l, dlClass(time.Hour)); err != nil {
		t.Fatalf("dry-run: %v, want it let through", err)
	}
	if s := admStats(l); s.RejectedDeadline != 0 || s.WouldWait != 1 {
		t.Fatalf("stats %+v, want no rejection, one would-wait", s)
	}
}

// A rejection for its deadline in the global budget gives back what the
// operation held in its workload's.
func TestADeadlineRejectionInTheSecondBudgetGivesBackTheFirstsPermits(t *testing.T) {
	wl := admBudget("batch", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
	gl := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
	admMustAcquire(t, gl)
	dlSetRecent(gl, time.Hour)
	ps := passage{limit: time.Hour, class: dlClass(time.Hour)}
	ctx := dlDeadline(t, time.Minute)
	ps.deadline, _ = ctx.Deadline()
	dlMissed(t, "in the global budget", ps.acquire(ctx, []*budget{wl, gl}))
	if s := admRead(wl); s.admitted != 0 || s.free != 1 {
		t.Fatalf("workload budget %+v after the rejection, want nothing held", s)
	}
	gl.release(0)
}

// ---- through a gate on the fake driver ----

// dlGate opens a gate on a new fake driver and its *sql.DB, closed (and
// the gate with it) at the end of the test.
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

// dlWork holds each Exec of "sleep D" for D, or its context's end then
// cancel (pgx's cancel request); while the lock is held every statement
// waits for it first; with outlier set, the next one whose deadline is
// over a second away holds 1000 × D.
type dlWork struct {
	cancel  time.Duration
	outlier atomic.Bool
	mu      sync.Mutex
	lock    chan struct{} // nil: not held
}

// dlWorkGate is dlGate with its driver's work run by a new dlWork.
func dlWorkGate(t *testing.T, p Policy, opts ...Option) (*dlWork, *Gate, *sql.DB, *fakedb.Connector) {
	t.Helper()
	w := new(dlWork)
	g, db, fc := dlGate(t, p, opts...)
	fc.SetHook(w.hook)
	return w, g, db, fc
}

func (w *dlWork) hook(ctx context.Context, op fakedb.Op, query string) error {
	d, ok := strings.CutPrefix(query, "sleep ")
	if !ok || op != fakedb.OpExec {
		return nil
	}
	hold, err := time.ParseDuration(d)
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) > time.Second && w.outlier.CompareAndSwap(true, false) {
		hold *= 1000
	}
	w.mu.Lock()
	lock := w.lock
	w.mu.Unlock()
	t := time.NewTimer(hold)
	defer t.Stop()
	if lock != nil {
		select {
		case <-lock:
		case <-ctx.Done():
			time.Sleep(w.cancel)
			return ctx.Err()
		}
		t.Reset(hold)
	}
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		time.Sleep(w.cancel)
		return ctx.Err()
	}
}

func (w *dlWork) hold() {
	w.mu.Lock()
	w.lock = make(chan struct{})
	w.mu.Unlock()
}

func (w *dlWork) release() {
	w.mu.Lock()
	close(w.lock)
	w.lock = nil
	w.mu.Unlock()
}

// dlLoad counts the outcomes of the statements run.
type dlLoad struct {
	ok, late, other atomic.Int64
}

// run runs n callers, each running statements from next back to back
// with a deadline of its own, until halt is called.
func (l *dlLoad) run(db *sql.DB, n int, next func(i int) (query string, deadline time.Duration)) (halt func()) {
	return testkit.Repeat(n, func(i int) bool {
		q, d := next(i)
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_, err := db.ExecContext(ctx, q)
		cancel()
		switch {
		case err == nil:
			l.ok.Add(1)
			return true
		case errors.Is(err, ErrWouldMissDeadline):
			l.late.Add(1)
		default:
			l.other.Add(1)
		}
		time.Sleep(time.Millisecond) // a refused caller backs off a little
		return true
	})
}

// A statement and a transaction (judged by those of its workload given
// about as long) are refused and reported; another class's statement runs.
func TestTheGateRefusesAnOperationThatWouldMissItsDeadlineWithoutReachingTheDriver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ev testkit.Log[Event]
		_, g, db, fc := dlWorkGate(t, dlEveryOneMeasured(1), WithEvents(Events{OnReject: ev.Add}))
		// Measured: a statement that holds a minute, and a transaction
		// given 65s that holds a minute.
		testkit.Exec(t, context.Background(), db, "sleep 1m")
		tx := testkit.Begin(t, dlDeadline(t, 65*time.Second), db)
		time.Sleep(time.Minute)
		testkit.Commit(t, tx)
		before, execs, begins := g.Stats(), fc.Count(fakedb.OpExec), fc.Count(fakedb.OpBegin)

		ctx := dlDeadline(t, 30*time.Second)
		_, err := db.ExecContext(ctx, "sleep 1m")
		if re := dlMissed(t, "exec", err); re.Hold != time.Minute || re.Left != 30*time.Second {
			t.Fatalf("rejection %+v, want Hold 1m, Left 30s", *re)
		}
		if got := ReasonLabel(err); got != "would_miss_deadline" {
			t.Fatalf("ReasonLabel(%v) = %q, want would_miss_deadline", err, got)
		}
		tx2, err := db.BeginTx(dlDeadline(t, 40*time.Second), nil)
		if err == nil {
			tx2.Rollback()
		}
		dlMissed(t, "begin", err)
		if _, err := db.ExecContext(ctx, "sleep 1s"); err != nil {
			t.Fatalf("a statement of another class, never measured, same deadline: %v, want it run", err)
		}
		s := g.Stats()
		if s.RejectedDeadline != 2 || s.Dials != before.Dials || s.Admitted != before.Admitted+1 {
			t.Fatalf("stats %+v (before %+v), want 2 deadline rejections, no dial, one more admitted", s, before)
		}
		if fc.Count(fakedb.OpExec) != execs+1 || fc.Count(fakedb.OpBegin) != begins {
			t.Fatalf("the driver saw %d execs and %d begins, want the one run", fc.Count(fakedb.OpExec)-execs, fc.Count(fakedb.OpBegin)-begins)
		}
		evs := ev.List()
		if len(evs) != 2 || evs[0].Kind != KindExec || evs[1].Kind != KindTx {
			t.Fatalf("OnReject events %+v, want a statement's and a transaction's", evs)
		}
		for _, e := range evs {
			if e.Reason != ErrWouldMissDeadline || e.DryRun || e.Waited != 0 {
				t.Fatalf("OnReject event %+v, want Reason ErrWouldMissDeadline, not dry-run, no wait", e)
			}
		}
	})
}

// dlEveryOneMeasured is a policy of b permits under which every hold is
// measured (Adaptive) and b stays.
func dlEveryOneMeasured(b int) Policy {
	return Policy{MaxConcurrent: b, MaxQueue: 4 * b, QueueWait: time.Second, Adaptive: true, MinConcurrent: b}
}

// Each judged by its own class: slow reports refuse no fast statement.
func TestInAMixNoCallIsRefusedWhoseDeadlineIsTenTimesItsOwnHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, g, db, _ := dlWorkGate(t, dlEveryOneMeasured(4))
		var load dlLoad
		halt := load.run(db, 4, func(i int) (string, time.Duration) {
			if i%10 == 9 {
				return "sleep 30ms", 300 * time.Millisecond
			}
			return "sleep 1ms", 10 * time.Millisecond
		})
		time.Sleep(10 * time.Second)
		halt()
		if load.late.Load() != 0 || load.other.Load() != 0 || load.ok.Load() < 1000 {
			t.Fatalf("%d ran, %d refused as late, %d failed; want none refused, none failed (stats %+v)", load.ok.Load(), load.late.Load(), load.other.Load(), g.Stats())
		}
	})
}

// Overload: 9 in 10 given 100ms for 5ms, 1 given 3s for 150ms; the long
// ones alone get through, but the short ones are judged by their own.
func TestAShortTransactionIsJudgedByTheShortOnesNotByTheLongOnesThatGetThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, g, db, _ := dlWorkGate(t, Policy{MaxConcurrent: 2, MaxQueue: 16, QueueWait: 100 * time.Millisecond})
		var shortOK, shortLate, judgedLong atomic.Int64
		var wg sync.WaitGroup
		for i := range 2500 {
			q, d := "sleep 5ms", 100*time.Millisecond
			if i%10 == 9 {
				q, d = "sleep 150ms", 3*time.Second
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), d)
				defer cancel()
				tx, err := db.BeginTx(ctx, nil)
				if err == nil {
					if _, err = tx.ExecContext(ctx, q); err == nil {
						err = tx.Commit()
					} else {
						tx.Rollback()
					}
				}
				var re *RejectedError
				switch {
				case q != "sleep 5ms":
				case err == nil:
					shortOK.Add(1)
				case errors.As(err, &re) && re.Cause == ErrWouldMissDeadline:
					shortLate.Add(1)
					if re.Hold >= 150*time.Millisecond {
						judgedLong.Add(1)
					}
				}
			})
			time.Sleep(4 * time.Millisecond)
		}
		wg.Wait()
		if shortLate.Load() == 0 || shortOK.Load() == 0 {
			t.Fatalf("%d short transactions served, %d refused as late: want both, the scenario did not happen (stats %+v)", shortOK.Load(), shortLate.Load(), g.Stats())
		}
		if judgedLong.Load() != 0 {
			t.Fatalf("%d of %d short transactions refused as late on a hold of 150ms or more, want none (%d served; stats %+v)", judgedLong.Load(), shortLate.Load(), shortOK.Load(), g.Stats())
		}
	})
}

// The slow one of their own text or another; each caller has a permit.
func TestAfterOneStatementAThousandTimesSlowerNoCallWithTenTimesItsHoldIsRefused(t *testing.T) {
	for _, slow := range []string{"sleep 1s", "sleep 1ms"} { // another text, then the same one
		t.Run(slow, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, g, db, _ := dlWorkGate(t, dlEveryOneMeasured(2))
				var load dlLoad
				halt := load.run(db, 2, func(i int) (string, time.Duration) {
					if i == 100 {
						w.outlier.Store(slow == "sleep 1ms")
						return slow, 2 * time.Second
					}
					return "sleep 1ms", 10 * time.Millisecond
				})
				time.Sleep(5 * time.Second)
				halt()
				if load.late.Load() != 0 || load.other.Load() != 0 {
					t.Fatalf("%d ran, %d refused as late, %d failed; want none refused (stats %+v)", load.ok.Load(), load.late.Load(), load.other.Load(), g.Stats())
				}
			})
		})
	}
}

// A lock held 3s: 2s deadlines are cut off, then refused; not for long.
func TestAfterALockCallsRunAgainWithinASecondOfItsRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := dlWork{cancel: 100 * time.Millisecond}
		g, db, fc := dlGate(t, Policy{MaxConcurrent: 4, MaxQueue: 16, QueueWait: 2 * time.Second})
		fc.SetHook(w.hook)
		var (
			mu        sync.Mutex
			lastFail  time.Time
			firstOK   time.Time
			released  time.Time
			refusedIn atomic.Int64
		)
		halt := testkit.Repeat(8, func(int) bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := db.ExecContext(ctx, "sleep 5ms")
			cancel()
			now := time.Now()
			mu.Lock()
			if !released.IsZero() {
				if err == nil && firstOK.IsZero() {
					firstOK = now
				}
				if err != nil {
					lastFail = now
				}
			}
			mu.Unlock()
			if errors.Is(err, ErrWouldMissDeadline) {
				refusedIn.Add(1)
			}
			if err != nil {
				time.Sleep(10 * time.Millisecond) // a caller backs off a little
			}
			return true
		})
		time.Sleep(time.Second)
		w.hold()
		time.Sleep(3 * time.Second)
		mu.Lock()
		released = time.Now()
		mu.Unlock()
		w.release()
		time.Sleep(3 * time.Second)
		halt()
		if refusedIn.Load() == 0 {
			t.Fatalf("no call refused as late during the lock: the scenario did not happen (stats %+v)", g.Stats())
		}
		if firstOK.IsZero() || firstOK.Sub(released) > time.Second {
			t.Fatalf("first call run %v after the lock's release, want within 1s (stats %+v)", firstOK.Sub(released), g.Stats())
		}
		if lastFail.Sub(released) > time.Second+100*time.Millisecond {
			t.Fatalf("a call failed %v after the lock's release, want none after the first second", lastFail.Sub(released))
		}
	})
}

// Cancelled, they hold their permits while the driver stops them (100ms).
func TestACallCancelledByItsCallerDoesNotRaiseItsClassesEstimate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := dlWork{cancel: 100 * time.Millisecond}
		g, db, fc := dlGate(t, Policy{MaxConcurrent: 1, MaxQueue: 8, QueueWait: time.Second})
		fc.SetHook(w.hook)
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if i%2 == 0 {
					time.AfterFunc(5*time.Millisecond, cancel) // given up on mid-statement
				}
				db.ExecContext(ctx, "sleep 9ms")
			})
		}
		wg.Wait()
		r := g.est.Ref(estimate.Key{Kind: uint8(KindExec), Text: "sleep 9ms"}, false)
		if d, ok := r.Estimate(time.Now()); !ok || d > 9*time.Millisecond {
			t.Fatalf("estimate %v (%v) after statements of 9ms, half cancelled by their callers; want 9ms at most", d, ok)
		}
	})
}

func TestTheGateMeasuresHoldTimesOffTheFastPathOrAllWhenAdaptive(t *testing.T) {
	bg := context.Background()
	t.Run("fixed", func(t *testing.T) {
		g, db, _ := dlGate(t, Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
		for range 3 {
			testkit.Exec(t, bg, db, "UPDATE t SET v = 1")
		}
		if s := g.Stats(); s.Hold != 0 {
			t.Fatalf("Hold %v after operations that found a permit free, want 0", s.Hold)
		}
		tx := testkit.Begin(t, bg, db)
		done := testkit.GoExec(bg, db, "UPDATE t SET v = 2")
		admWaitFor(t, func() bool { return g.Stats().Waiting == 1 })
		testkit.Rollback(t, tx)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if s := g.Stats(); s.Hold <= 0 {
			t.Fatalf("Hold %v after an operation that waited, want it measured", s.Hold)
		}
	})
	t.Run("adaptive", func(t *testing.T) {
		g, db, _ := dlGate(t, Policy{MaxConcurrent: 4, Adaptive: true})
		testkit.Exec(t, bg, db, "UPDATE t SET v = 1")
		if s := g.Stats(); s.Hold <= 0 {
			t.Fatalf("Hold %v after an operation under Adaptive, want it measured", s.Hold)
		}
	})
}

// So that estimates that got too long come down while nobody waits.
func TestTheFastPathMeasuresTheOperationThatTakesTheLastPermit(t *testing.T) {
	l := newBudget("")
	l.resize(2, 0, 0, false, 0)
	if ok, measure, _, _ := l.tryAcquire(); !ok || measure {
		t.Fatalf("first permit, no hold measured: ok %v measure %v, want true, false", ok, measure)
	}
	l.release(0)
	dlSetRecent(l, time.Hour)
	if ok, measure, _, _ := l.tryAcquire(); !ok || measure {
		t.Fatalf("first of two permits: ok %v measure %v, want true, false", ok, measure)
	}
	if ok, measure, _, _ := l.tryAcquire(); !ok || !measure {
		t.Fatalf("last permit with a hold measured: ok %v measure %v, want true, true", ok, measure)
	}
	l.release(0)
	l.release(0)
}

// Refused before the driver sees it; after estimate.ProbeGap one goes as
// a probe, and its fast hold restarts the estimate.
func TestALateOperationIsRefusedWithAPermitFreeUntilAProbeFindsTheWorkFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ev testkit.Log[Event]
		_, g, db, fc := dlWorkGate(t, Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Hour}, WithEvents(Events{OnReject: ev.Add}))
		r := g.est.Ref(estimate.Key{Kind: uint8(KindExec), Text: "sleep 1ms"}, true)
		now := time.Now()
		for range estimate.HoldSamples {
			g.est.Observe(r, time.Minute, false, false, now, now) // its class held a minute
		}
		execs := fc.Count(fakedb.OpExec)
		ctx := dlDeadline(t, time.Second)
		_, err := db.ExecContext(ctx, "sleep 1ms")
		if re := dlMissed(t, "exec, a permit free", err); re.Waited != 0 || re.Hold != time.Minute {
			t.Fatalf("rejection %+v, want no wait and the hold of 1m", re)
		}
		if n := fc.Count(fakedb.OpExec) - execs; n != 0 {
			t.Fatalf("the driver saw %d execs of refused operations, want 0", n)
		}
		time.Sleep(estimate.ProbeGap)
		if _, err := db.ExecContext(ctx, "sleep 1ms"); err != nil {
			t.Fatalf("after estimate.ProbeGap of refusals: %v, want it run as a probe", err)
		}
		if d, _ := r.Estimate(time.Now()); d != time.Millisecond {
			t.Fatalf("estimate %v after the probe's 1ms, want it restarted from it", d)
		}
		if _, err := db.ExecContext(ctx, "sleep 1ms"); err != nil {
			t.Fatalf("once the probe was measured: %v, want it run", err)
		}
		if s := g.Stats(); s.RejectedDeadline != 1 || s.Admitted != 2 || len(ev.List()) != 1 {
			t.Fatalf("stats %+v, want 1 deadline rejection, 2 admitted", s)
		}
	})
}

// Refusals rest on fresh evidence: once a class's last hold is older than
// estimate.StaleAfter, or StaleHolds times its estimate if longer, its work
// is let through however slow it was, and measured anew.
func TestAClassesEstimateRefusesNothingOnceItsLastHoldIsStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, g, db, fc := dlWorkGate(t, Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Hour})
		t0 := time.Now()
		seed := func(text string, held time.Duration) {
			r := g.est.Ref(estimate.Key{Kind: uint8(KindExec), Text: text}, true)
			for range estimate.HoldSamples {
				g.est.Observe(r, held, false, false, t0, t0)
			}
		}
		// Two classes each: one asked while its evidence is fresh, the
		// other once it is stale (a refusal keeps a class's evidence fresh
		// until a probe, so each is asked once).
		seed("sleep 1ms", 10*time.Millisecond)
		seed("sleep 2ms", 10*time.Millisecond)
		seed("sleep 3ms", time.Minute)
		seed("sleep 4ms", time.Minute)
		for _, c := range []struct {
			text    string
			at, dl  time.Duration // since the last hold; the caller's deadline
			refused bool
		}{
			{"sleep 1ms", estimate.StaleAfter - time.Millisecond, 8 * time.Millisecond, true},
			{"sleep 2ms", estimate.StaleAfter + time.Millisecond, 8 * time.Millisecond, false},
			{"sleep 3ms", estimate.StaleHolds*time.Minute - time.Millisecond, time.Second, true},
			{"sleep 4ms", estimate.StaleHolds*time.Minute + time.Millisecond, time.Second, false},
		} {
			time.Sleep(time.Until(t0.Add(c.at)))
			execs := fc.Count(fakedb.OpExec)
			_, err := db.ExecContext(dlDeadline(t, c.dl), c.text)
			if c.refused {
				dlMissed(t, fmt.Sprintf("%s %v after its last hold", c.text, c.at), err)
			} else if err != nil || fc.Count(fakedb.OpExec) != execs+1 {
				t.Fatalf("%s %v after its last hold, deadline %v: %v, %d execs; want it run on stale evidence", c.text, c.at, c.dl, err, fc.Count(fakedb.OpExec)-execs)
			}
		}
	})
}

// Waiters are served by deadline, the earliest first, those given the same
// time in arrival order, those without a deadline last.
func TestWaitersAreServedEarliestDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, db, _ := dlWorkGate(t, Policy{MaxConcurrent: 1, MaxQueue: 8, QueueWait: time.Hour})
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := db.ExecContext(context.Background(), "sleep 1s"); err != nil {
				t.Error(err)
			}
		})
		synctest.Wait()
		var order testkit.Log[string]
		for _, c := range []struct {
			name string
			left time.Duration // 0: no deadline
		}{{"none", 0}, {"60s", time.Minute}, {"30s", 30 * time.Second}, {"60s, later", time.Minute}, {"none, later", 0}} {
			wg.Go(func() {
				ctx := context.Background()
				if c.left > 0 {
					ctx = dlDeadline(t, c.left)
				}
				if _, err := db.ExecContext(ctx, "sleep 1ms"); err != nil {
					t.Errorf("%s: %v", c.name, err)
				}
				order.Add(c.name)
			})
			synctest.Wait()
		}
		wg.Wait()
		if want := []string{"30s", "60s", "60s, later", "none", "none, later"}; !slices.Equal(order.List(), want) {
			t.Fatalf("served in the order %q, want %q", order.List(), want)
		}
	})
}
