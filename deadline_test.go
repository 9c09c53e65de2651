//go:build go1.25

package bulkhead_test

// Deadline-aware waiting (WithDeadlineReserve, WithQueueWait) on the fake
// driver in synctest bubbles, where time is fake and exact; and the
// server-side deadline (WithPostgresDeadline) on the fake driver (the SQL
// it sends) and on PostgreSQL (what the server does with it).

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

// dlRig: a gate with B=1, Q=1 whose only permit is held by "hold h1".
func dlRig(t *testing.T, wait time.Duration, opts ...bulkhead.Option) (*wlRig, <-chan error) {
	t.Helper()
	r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: wait}, opts...)
	h1 := r.exec(context.Background(), "h1")
	synctest.Wait()
	if !r.hasEntered("h1") {
		t.Fatal("h1 does not hold the permit")
	}
	return r, h1
}

// dlExec runs an Exec with a context that ends after timeout, and returns
// the fake time it took and its error.
func dlExec(r *wlRig, ctx context.Context, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	_, err := r.db.ExecContext(ctx, "quick")
	return time.Since(start), err
}

func TestAnOperationWhoseDeadlineIsNearerThanTheReserveIsRejectedWithoutWaitingOrReachingTheDriver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, h1 := dlRig(t, time.Second, bulkhead.WithDeadlineReserve(50*time.Millisecond))
		execs := r.fc.Count(fakedb.OpExec)
		took, err := dlExec(r, context.Background(), 30*time.Millisecond)
		re := wlRejected(t, "op with 30ms left and a 50ms reserve", err, bulkhead.ErrQueueTimeout, "", 1, 1)
		if !re.Deadline || re.Waited != 0 || took != 0 {
			t.Fatalf("%+v after %v: want Deadline set, no wait", re, took)
		}
		if !strings.Contains(re.Error(), "too close to the deadline") {
			t.Fatalf("%q does not say why", re.Error())
		}
		if n := r.fc.Count(fakedb.OpExec); n != execs {
			t.Fatalf("the rejected op reached the driver: %d execs, want %d", n, execs)
		}
		if s := r.g.Stats(); s.RejectedTimeout != 1 || s.Canceled != 0 || s.WaitCount != 0 {
			t.Fatalf("stats %+v: want one queue-timeout rejection, no wait", s)
		}
		r.finish("h1")
		wlOK(t, "h1", h1)
		r.balanced(t)
	})
}

// WithDeadlineReserve's doc: "work that could not finish in time is
// rejected ... instead of being started". With a permit free, an
// operation whose deadline is nearer than the reserve is still started.
func TestAnOperationWhoseDeadlineIsNearerThanTheReserveIsRejectedEvenWithAPermitFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 1, QueueWait: time.Second}, bulkhead.WithDeadlineReserve(50*time.Millisecond))
		execs := r.fc.Count(fakedb.OpExec)
		_, err := dlExec(r, context.Background(), 30*time.Millisecond)
		re := wlRejected(t, "op with 30ms left, a 50ms reserve and a permit free", err, bulkhead.ErrQueueTimeout, "", 1, 0)
		if !re.Deadline {
			t.Fatalf("%+v: want Deadline set", re)
		}
		if n := r.fc.Count(fakedb.OpExec); n != execs {
			t.Fatalf("the rejected op reached the driver: %d execs, want %d", n, execs)
		}
	})
}

func TestTheWaitEndsAtTheDeadlineMinusTheReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, h1 := dlRig(t, time.Second, bulkhead.WithDeadlineReserve(50*time.Millisecond))
		took, err := dlExec(r, context.Background(), 200*time.Millisecond)
		re := wlRejected(t, "queued op with 200ms left", err, bulkhead.ErrQueueTimeout, "", 1, 1)
		if !re.Deadline || re.Waited != 150*time.Millisecond || took != 150*time.Millisecond {
			t.Fatalf("%+v after %v: want the wait cut at 200ms-50ms, Deadline set", re, took)
		}
		r.finish("h1")
		wlOK(t, "h1", h1)
		r.balanced(t)
	})
}

func TestAPermitFreedBeforeTheDeadlineMinusTheReserveIsTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, h1 := dlRig(t, time.Second, bulkhead.WithDeadlineReserve(50*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		op := r.exec(ctx, "op")
		synctest.Wait()
		time.Sleep(100 * time.Millisecond) // fake time: the holder ends at 100ms
		r.finish("h1")
		wlOK(t, "h1", h1)
		synctest.Wait()
		if !r.hasEntered("op") {
			t.Fatal("the queued op did not get the permit freed within its deadline minus the reserve")
		}
		r.finish("op")
		wlOK(t, "op", op)
		if s := r.g.Stats(); s.WaitCount != 1 || s.WaitDuration != 100*time.Millisecond || s.RejectedTimeout != 0 {
			t.Fatalf("stats %+v: want one 100ms wait, no rejection", s)
		}
		r.balanced(t)
	})
}

func TestADeadlineFartherThanTheQueueWaitLeavesTheOrdinaryTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, h1 := dlRig(t, 100*time.Millisecond, bulkhead.WithDeadlineReserve(50*time.Millisecond))
		took, err := dlExec(r, context.Background(), 2*time.Second)
		re := wlRejected(t, "queued op with 2s left", err, bulkhead.ErrQueueTimeout, "", 1, 1)
		if re.Deadline || re.Waited != 100*time.Millisecond || took != 100*time.Millisecond {
			t.Fatalf("%+v after %v: want the policy's 100ms wait, Deadline not set", re, took)
		}
		r.finish("h1")
		wlOK(t, "h1", h1)
	})
}

func TestWithoutAReserveTheWaitRunsToTheDeadlineAndEndsAsACancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, h1 := dlRig(t, time.Second)
		took, err := dlExec(r, context.Background(), 200*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, bulkhead.ErrRejected) || took != 200*time.Millisecond {
			t.Fatalf("queued op with 200ms left, no reserve: %v after %v; want DeadlineExceeded at 200ms, not a rejection", err, took)
		}
		if s := r.g.Stats(); s.Canceled != 1 || s.RejectedTimeout != 0 {
			t.Fatalf("stats %+v: want a cancellation, not a rejection", s)
		}
		r.finish("h1")
		wlOK(t, "h1", h1)
	})
}

func TestWithQueueWaitOverridesThePolicysAndTheWorkloadsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: 70 * time.Millisecond,
			Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour}}}
		r := wlOpen(t, p, bulkhead.WithDeadlineReserve(10*time.Millisecond))
		bg := context.Background()
		h1, h2 := r.exec(bg, "h1"), r.exec(bulkhead.WithWorkload(bg, "batch"), "h2")
		synctest.Wait()
		batch := bulkhead.WithWorkload(bg, "batch")
		for _, c := range []struct {
			name     string
			ctx      context.Context
			want     time.Duration
			workload string // the budget that refuses
			deadline bool
		}{
			{"WithQueueWait(30ms)", bulkhead.WithQueueWait(bg, 30*time.Millisecond), 30 * time.Millisecond, "", false},
			{"WithQueueWait(0)", bulkhead.WithQueueWait(bg, 0), 0, "", false},
			{"WithQueueWait(-1) restores the policy's", bulkhead.WithQueueWait(bulkhead.WithQueueWait(bg, time.Millisecond), -1), 70 * time.Millisecond, "", false},
			{"WithQueueWait(2h) is capped at MaxQueueWait", bulkhead.WithQueueWait(bg, 2*time.Hour), bulkhead.MaxQueueWait, "", false},
			{"batch with WithQueueWait(20ms)", bulkhead.WithQueueWait(batch, 20*time.Millisecond), 20 * time.Millisecond, "batch", false},
			{"batch without: the workload's hour", batch, time.Hour, "batch", false},
		} {
			start := time.Now()
			_, err := r.db.ExecContext(c.ctx, "quick")
			var re *bulkhead.RejectedError
			if !errors.As(err, &re) || !errors.Is(err, bulkhead.ErrQueueTimeout) {
				t.Fatalf("%s: %v, want a queue timeout", c.name, err)
			}
			if re.Waited != c.want || time.Since(start) != c.want || re.Workload != c.workload || re.Deadline != c.deadline {
				t.Fatalf("%s: %+v after %v, want %v waited by %q", c.name, re, time.Since(start), c.want, c.workload)
			}
		}
		// With a deadline too, the nearer bound wins.
		ctx, cancel := context.WithTimeout(bulkhead.WithQueueWait(bg, time.Second), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := r.db.ExecContext(ctx, "quick")
		var re *bulkhead.RejectedError
		if !errors.As(err, &re) || !re.Deadline || re.Waited != 90*time.Millisecond || time.Since(start) != 90*time.Millisecond {
			t.Fatalf("WithQueueWait(1s) and 100ms left with a 10ms reserve: %v (%+v) after %v, want the deadline's 90ms", err, re, time.Since(start))
		}
		r.finish("h1")
		r.finish("h2")
		wlOK(t, "h1", h1)
		wlOK(t, "h2", h2)
		r.balanced(t)
	})
}

// ---- WithPostgresDeadline on the fake driver: the SQL sent ----

// dlQueries returns a gate on the fake driver with opts, and a function
// returning the statements that reached the driver's Exec so far.
func dlQueries(t *testing.T, opts ...bulkhead.Option) (*fkEnv, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	fc := fakedb.New()
	fc.SetHook(func(_ context.Context, op fakedb.Op, q string) error {
		if op == fakedb.OpExec {
			mu.Lock()
			seen = append(seen, q)
			mu.Unlock()
		}
		return nil
	})
	e := fkOpen(t, fc, bulkhead.Policy{MaxConcurrent: 2}, opts...)
	return e, func() []string {
		mu.Lock()
		defer mu.Unlock()
		s := seen
		seen = nil
		return s
	}
}

func TestPostgresDeadlineStartsEachTransactionWithTheTimeLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			name    string
			dl      bulkhead.PostgresDeadline
			timeout time.Duration // 0: no deadline
			want    []string
		}{
			{"200ms left", bulkhead.PostgresDeadline{}, 200 * time.Millisecond, []string{"SET LOCAL statement_timeout = 200"}},
			{"200ms left, 50ms reserve", bulkhead.PostgresDeadline{Reserve: 50 * time.Millisecond}, 200 * time.Millisecond, []string{"SET LOCAL statement_timeout = 150"}},
			{"lock timeout too", bulkhead.PostgresDeadline{LockTimeout: true}, 1500 * time.Millisecond, []string{"SET LOCAL statement_timeout = 1500; SET LOCAL lock_timeout = 1500"}},
			{"less left than the reserve: 1ms", bulkhead.PostgresDeadline{Reserve: time.Second}, 200 * time.Millisecond, []string{"SET LOCAL statement_timeout = 1"}},
			{"no deadline: nothing", bulkhead.PostgresDeadline{LockTimeout: true}, 0, nil},
			{"30 days left: PostgreSQL's largest timeout", bulkhead.PostgresDeadline{LockTimeout: true}, 30 * 24 * time.Hour,
				[]string{"SET LOCAL statement_timeout = 2147483647; SET LOCAL lock_timeout = 2147483647"}},
		} {
			e, queries := dlQueries(t, bulkhead.WithPostgresDeadline(c.dl))
			ctx := context.Background()
			if c.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.timeout)
				defer cancel()
			}
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if got := queries(); !equalStrings(got, c.want) {
				t.Fatalf("%s: BeginTx sent %q, want %q", c.name, got, c.want)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			// Autocommit statements are not affected.
			if _, err := e.db.ExecContext(ctx, "UPDATE t"); err != nil {
				t.Fatal(err)
			}
			if got := queries(); !equalStrings(got, []string{"UPDATE t"}) {
				t.Fatalf("%s: an autocommit Exec sent %q, want only the statement", c.name, got)
			}
			e.balanced(t)
		}
	})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAFailedServerDeadlineSetupFailsBeginTxRollsBackAndGivesThePermitsBack(t *testing.T) {
	e, _ := dlQueries(t, bulkhead.WithPostgresDeadline(bulkhead.PostgresDeadline{}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	boom := errors.New("boom")
	e.fc.FailNext(fakedb.OpExec, 1, boom)
	rollbacks := e.fc.Count(fakedb.OpRollback)
	_, err := e.db.BeginTx(ctx, nil)
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "bulkhead: setting the server-side deadline") {
		t.Fatalf("BeginTx: %v, want the setup's error, wrapped", err)
	}
	if n := e.fc.Count(fakedb.OpRollback); n != rollbacks+1 {
		t.Fatalf("%d rollbacks after the failed setup, want 1", n-rollbacks)
	}
	e.balanced(t)
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("BeginTx after the failed one: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	e.balanced(t)
}

// ---- WithPostgresDeadline on PostgreSQL ----
