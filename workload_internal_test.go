//go:build go1.25

package bulkhead

// A stress of workloads, checked inside the gated work against the budgets'
// own state.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// wliCheckBudget returns an error if l holds more than B+Q or B, or idles
// a permit while operations wait.
func wliCheckBudget(l *budget) error {
	l.mu.Lock()
	adm, maxAdm := int64(l.admitted), int64(l.b+l.q)
	free, waiting := l.b-l.running, l.waiting
	b := l.b
	l.mu.Unlock()
	switch {
	case adm > maxAdm:
		return fmt.Errorf("budget %q: %d admission permits held, limit %d", l.name, adm, maxAdm)
	case free < 0 || free > b:
		return fmt.Errorf("budget %q: free=%d, want 0..%d", l.name, free, b)
	case waiting > 0 && free > 0:
		return fmt.Errorf("budget %q: %d permits idle while %d operations wait", l.name, free, waiting)
	}
	return nil
}

func TestConcurrentWorkloadsNeverExceedTheGlobalOrTheirOwnLimits(t *testing.T) {
	const (
		workers = 10 // > B+Q: some dials are refused too
		ops     = 80
	)
	p := Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: 2 * time.Millisecond,
		Workloads: map[string]Workload{
			"a": {MaxConcurrent: 2, MaxQueue: 2, QueueWait: 2 * time.Millisecond},
			"b": {MaxConcurrent: 1, MaxQueue: 3, QueueWait: 2 * time.Millisecond},
		}}
	g, db, fc := dlGate(t, p)
	fc.Define("work", fakedb.ResultSet{Columns: []fakedb.Column{{Name: "n"}}, Rows: [][]driver.Value{{int64(1)}}})
	wls := *g.workloads.Load()

	var inDriver atomic.Int64
	perWl := map[string]*atomic.Int64{"a": {}, "b": {}}
	var firstErr atomic.Pointer[error]
	fail := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	var checks atomic.Int64
	fc.SetHook(func(ctx context.Context, op fakedb.Op, query string) error {
		if query != "work" {
			return nil
		}
		checks.Add(1)
		if n := inDriver.Add(1); n > int64(p.MaxConcurrent) {
			fail(fmt.Errorf("%d operations in the driver at once, global B=%d", n, p.MaxConcurrent))
		}
		defer inDriver.Add(-1)
		name, _ := WorkloadFromContext(ctx)
		if c := perWl[name]; c != nil {
			if n := c.Add(1); n > int64(p.Workloads[name].MaxConcurrent) {
				fail(fmt.Errorf("%d operations of %q in the driver at once, its B=%d", n, name, p.Workloads[name].MaxConcurrent))
			}
			defer c.Add(-1)
		}
		for _, l := range []*budget{g.global, wls["a"], wls["b"]} {
			if err := wliCheckBudget(l); err != nil {
				fail(err)
			}
		}
		runtime.Gosched() // widen the window in which others act
		return nil
	})

	type tally struct{ ok, rejected, ctxErr int }
	tallies := make([]map[string]*tally, workers)
	var wg sync.WaitGroup
	for w := range workers {
		tallies[w] = map[string]*tally{"a": {}, "b": {}, "": {}, "ghost": {}}
		wg.Go(func() {
			rng := rand.New(rand.NewSource(int64(w)))
			for range ops {
				name := []string{"a", "b", "", "ghost"}[rng.Intn(4)]
				ctx := context.Background()
				if name != "" {
					ctx = WithWorkload(ctx, name)
				}
				if rng.Intn(4) == 0 {
					ctx = WithQueueWait(ctx, 0)
				}
				var cancel context.CancelFunc = func() {}
				if rng.Intn(8) == 0 {
					ctx, cancel = context.WithCancel(ctx)
					go cancel() // races the operation: any outcome is fine
				}
				err := wliRun(ctx, db, rng.Intn(3))
				cancel()
				tl := tallies[w][name]
				var re *RejectedError
				switch {
				case err == nil:
					tl.ok++
				case errors.As(err, &re):
					tl.rejected++
					if re.Workload != "" && re.Workload != name {
						fail(fmt.Errorf("an op of %q rejected by the budget of %q", name, re.Workload))
					}
					if name == "ghost" && re.Workload != "" {
						fail(fmt.Errorf("an op of an unknown workload rejected by %q", re.Workload))
					}
				case errors.Is(err, context.Canceled) || errors.Is(err, sql.ErrTxDone):
					tl.ctxErr++
				default:
					fail(fmt.Errorf("op of %q: unexpected error %v", name, err))
				}
			}
		})
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Fatal(*e)
	}

	sum := map[string]tally{}
	var all tally
	for _, m := range tallies {
		for name, tl := range m {
			s := sum[name]
			s.ok, s.rejected, s.ctxErr = s.ok+tl.ok, s.rejected+tl.rejected, s.ctxErr+tl.ctxErr
			sum[name] = s
			all.ok, all.rejected, all.ctxErr = all.ok+tl.ok, all.rejected+tl.rejected, all.ctxErr+tl.ctxErr
		}
	}
	// database/sql's own goroutine may still be rolling back a cancelled
	// transaction (or closing rows): a permit that never comes back fails here.
	testkit.Await(t, "every budget's permits are back", func() bool {
		idle := wliAdmitted(g.global) == 0
		for _, l := range *g.workloads.Load() {
			idle = idle && wliAdmitted(l) == 0
		}
		return idle
	})
	s := g.Stats()
	t.Logf("%d checks inside gated work; outcomes %+v; global %+v", checks.Load(), sum, s)
	for _, l := range []*budget{g.global, wls["a"], wls["b"]} {
		if st := admRead(l); st.free != l.b || st.waiting != 0 || st.admitted != 0 || st.listLen != 0 {
			t.Fatalf("budget %q after the end: %+v, want every permit back (free=%d)", l.name, st, l.b)
		}
	}
	if s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("global stats after the end %+v", s)
	}
	if int(s.RejectedFull+s.RejectedTimeout+s.RejectedDeadline) != all.rejected {
		t.Fatalf("%d rejections returned, stats count %d+%d+%d", all.rejected, s.RejectedFull, s.RejectedTimeout, s.RejectedDeadline)
	}
	if int(s.Admitted) < all.ok || int(s.Admitted) > all.ok+all.ctxErr {
		t.Fatalf("Admitted=%d with %d successes and %d cancellations", s.Admitted, all.ok, all.ctxErr)
	}
	if all.ok == 0 || all.rejected == 0 {
		t.Fatalf("outcomes %+v: the stress admitted or rejected nothing", all)
	}
	var refusedByWorkloads int64
	for _, name := range []string{"a", "b"} {
		ws, _ := g.WorkloadStats(name)
		if ws.Running != 0 || ws.Waiting != 0 || int(ws.Admitted) < sum[name].ok || int(ws.Admitted) > sum[name].ok+sum[name].ctxErr {
			t.Fatalf("workload %q stats %+v, outcomes %+v", name, ws, sum[name])
		}
		refusedByWorkloads += ws.RejectedFull + ws.RejectedTimeout
	}
	if refusedByWorkloads == 0 {
		t.Fatal("the workloads' budgets never refused anything: the stress did not reach them")
	}
}

// wliAdmitted returns the admission permits l holds.
func wliAdmitted(l *budget) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.admitted
}

// wliRun runs one gated operation of the given kind: an autocommit
// statement, a query read to the end, or a transaction.
func wliRun(ctx context.Context, db *sql.DB, kind int) error {
	switch kind {
	case 0:
		_, err := db.ExecContext(ctx, "work")
		return err
	case 1:
		rows, err := db.QueryContext(ctx, "work")
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		return rows.Close()
	default:
		return testkit.Tx(ctx, db, "work")
	}
}
