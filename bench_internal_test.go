//go:build go1.25

package bulkhead

import (
	"context"
	"database/sql/driver"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// Benchmarks of the gate alone, with golang.org/x/sync/semaphore as the
// baseline in the same run. Sub-benchmarks are named path=.../sem=... so
// that benchstat puts the two side by side:
//
//	go test -run '^$' -bench 'Semaphore' -benchmem -count 6 . > sem.txt
//	benchstat -col /sem sem.txt
//
// BENCHMARKS.md has the figures.

// benchPolicy never makes the benchmarked path wait or reject.
var benchPolicy = Policy{MaxConcurrent: 1 << 16, MaxQueue: 1 << 16, QueueWait: MaxQueueWait}

// BenchmarkSemaphore measures one acquire and release of an execution
// slot: the budget's (admission + execution permits) against a
// semaphore.Weighted's Acquire(1)+Release(1).
//
//   - path=uncontended: one goroutine, permits free.
//   - path=parallel: b.RunParallel (GOMAXPROCS goroutines), permits free:
//     the cost of the shared state under contention.
//   - path=parallel-wait: b.RunParallel with a single permit: every
//     acquire but one waits its turn in the FIFO queue.
//   - path=rejected: admission full (TryAcquire failing for x/sync): the
//     price of saying no.
func BenchmarkSemaphore(b *testing.B) {
	ctx := context.Background()
	b.Run("path=uncontended/sem=xsync", func(b *testing.B) {
		s := semaphore.NewWeighted(int64(benchPolicy.MaxConcurrent))
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Acquire(ctx, 1); err != nil {
				b.Fatal(err)
			}
			s.Release(1)
		}
	})
	b.Run("path=uncontended/sem=bulkhead", func(b *testing.B) {
		l := admBudget("", benchPolicy)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := admAcquire(ctx, l); err != nil {
				b.Fatal(err)
			}
			l.release(0)
		}
	})
	for _, path := range []struct {
		name string
		p    Policy
	}{
		{"parallel", benchPolicy},
		{"parallel-wait", Policy{MaxConcurrent: 1, MaxQueue: 1 << 16, QueueWait: MaxQueueWait}},
	} {
		b.Run("path="+path.name+"/sem=xsync", func(b *testing.B) {
			s := semaphore.NewWeighted(int64(path.p.MaxConcurrent))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := s.Acquire(ctx, 1); err != nil {
						panic(err)
					}
					s.Release(1)
				}
			})
		})
		b.Run("path="+path.name+"/sem=bulkhead", func(b *testing.B) {
			l := admBudget("", path.p)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := admAcquire(ctx, l); err != nil {
						panic(err)
					}
					l.release(0)
				}
			})
		})
	}
	b.Run("path=rejected/sem=xsync", func(b *testing.B) {
		s := semaphore.NewWeighted(1)
		s.Acquire(ctx, 1)
		defer s.Release(1)
		b.ReportAllocs()
		for b.Loop() {
			if s.TryAcquire(1) {
				b.Fatal("TryAcquire succeeded on a full semaphore")
			}
		}
	})
	b.Run("path=rejected/sem=bulkhead", func(b *testing.B) {
		l := admBudget("", Policy{MaxConcurrent: 1, QueueWait: MaxQueueWait})
		if _, err := admAcquire(ctx, l); err != nil {
			b.Fatal(err)
		}
		defer l.release(0)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := admAcquire(ctx, l); err == nil {
				b.Fatal("acquire succeeded with admission full")
			}
		}
	})
}

// BenchmarkGatePermit measures Gate.acquire and Gate.release with a
// permit, no events and no hold warning: the path every wrapped
// BeginTx, Exec and Query takes. path=workload adds a workload budget
// (WithWorkload), path=rejected is admission full at the gate.
func BenchmarkGatePermit(b *testing.B) {
	newGate := func(b *testing.B, p Policy) *Gate {
		g, err := New(fakedb.New(), p)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { g.Close() })
		return g
	}
	withBatch := benchPolicy
	withBatch.Workloads = map[string]Workload{"batch": {MaxConcurrent: 1 << 10, MaxQueue: 1 << 10, QueueWait: time.Second}}
	for _, path := range []struct {
		name     string
		p        Policy
		workload string
	}{
		{"global", benchPolicy, ""},
		{"workload", withBatch, "batch"},
	} {
		b.Run("path="+path.name, func(b *testing.B) {
			g := newGate(b, path.p)
			ctx := context.Background()
			if path.workload != "" {
				ctx = WithWorkload(ctx, path.workload)
			}
			b.ReportAllocs()
			for b.Loop() {
				var p permit
				if err := g.acquire(ctx, KindExec, "", &p); err != nil {
					b.Fatal(err)
				}
				g.release(&p)
			}
		})
	}
	b.Run("path=parallel", func(b *testing.B) {
		g := newGate(b, benchPolicy)
		ctx := context.Background()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				var p permit
				if err := g.acquire(ctx, KindExec, "", &p); err != nil {
					panic(err)
				}
				g.release(&p)
			}
		})
	})
	b.Run("path=rejected", func(b *testing.B) {
		g := newGate(b, Policy{MaxConcurrent: 1, QueueWait: time.Second})
		ctx := context.Background()
		var held permit
		if err := g.acquire(ctx, KindExec, "", &held); err != nil {
			b.Fatal(err)
		}
		defer g.release(&held)
		b.ReportAllocs()
		for b.Loop() {
			var p permit
			if err := g.acquire(ctx, KindExec, "", &p); err == nil {
				b.Fatal("acquire succeeded with admission full")
			}
		}
	})
}

// BenchmarkWaiterMemory parks waiters goroutines in the queue for an
// execution permit (the only one, held by the benchmark) and reports the
// memory they take, goroutine stacks included, as bytes/waiter:
// (HeapInuse+StackInuse once they all wait − before they started) /
// waiters, each read after a GC. sem=goroutine parks the same number on a
// bare channel: the floor any design that blocks a goroutine per waiting
// operation pays.
func BenchmarkWaiterMemory(b *testing.B) {
	const waiters = 2000
	ctx := context.Background()
	b.Run("sem=goroutine", func(b *testing.B) {
		parked := make(chan struct{}, waiters)
		var release chan struct{}
		testkit.MeasureWaiters(b, waiters, testkit.Waiters{
			Hold:   func() { release = make(chan struct{}) },
			Wait:   func() { parked <- struct{}{}; <-release },
			Parked: func() int { return len(parked) },
			Free: func() {
				close(release)
				for range waiters {
					<-parked
				}
			},
		})
	})
	b.Run("sem=bulkhead", func(b *testing.B) {
		l := admBudget("", Policy{MaxConcurrent: 1, MaxQueue: waiters, QueueWait: MaxQueueWait})
		acquire := func() {
			if _, err := admAcquire(ctx, l); err != nil {
				panic(err)
			}
		}
		testkit.MeasureWaiters(b, waiters, testkit.Waiters{
			Hold: acquire,
			Wait: func() { acquire(); l.release(0) },
			Parked: func() int {
				l.mu.Lock()
				defer l.mu.Unlock()
				return l.waiting
			},
			Free: func() { l.release(0) },
		})
	})
}

// BenchmarkConnPath measures the calls database/sql makes on a driver
// connection for one operation, without database/sql: on=driver is the
// fake driver's connection, on=gate the gate's logical connection over it
// (permits, a server connection bound and given back). The difference is
// the gate's own cost per operation, with far less noise than through
// database/sql (BenchmarkFakeDB in tests/):
//
//		go test -run '^$' -bench ConnPath -benchmem -count 10 . > path.txt
//		benchstat -col /on path.txt
//
//	  - op=exec: ResetSession, ExecContext, IsValid.
//	  - op=query: ResetSession, QueryContext, Next, Close, IsValid.
//	  - op=tx: ResetSession, BeginTx, ExecContext, Commit, IsValid.
func BenchmarkConnPath(b *testing.B) {
	type driverConn interface {
		driver.Conn
		driver.ConnBeginTx
		driver.ExecerContext
		driver.QueryerContext
		driver.SessionResetter
		driver.Validator
	}
	// on: the driver alone, the gate, or the gate under a lease
	// (Gate.CapUntil, as a fleet member runs).
	open := func(b *testing.B, on string) driverConn {
		ctx := context.Background()
		var dc driver.Conn
		var err error
		if on != "driver" {
			g, gerr := New(fakedb.New(), benchPolicy)
			if gerr != nil {
				b.Fatal(gerr)
			}
			b.Cleanup(func() { g.Close() })
			if on == "leased" {
				if err := g.CapUntil(ctx, -1, -1, time.Now().Add(time.Hour), 0); err != nil {
					b.Fatal(err)
				}
			}
			dc, err = g.Connect(ctx)
		} else {
			dc, err = fakedb.New().Connect(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dc.Close() })
		c, ok := dc.(driverConn)
		if !ok {
			b.Fatalf("%T lacks an interface database/sql uses", dc)
		}
		return c
	}
	ops := []struct {
		name string
		run  func(context.Context, driverConn, []driver.Value) error
	}{
		{"exec", func(ctx context.Context, c driverConn, _ []driver.Value) error {
			_, err := c.ExecContext(ctx, "UPDATE t SET x = 1", nil)
			return err
		}},
		{"query", func(ctx context.Context, c driverConn, dest []driver.Value) error {
			r, err := c.QueryContext(ctx, "SELECT 1", nil)
			if err != nil {
				return err
			}
			if err := r.Next(dest); err != nil {
				return err
			}
			return r.Close()
		}},
		{"tx", func(ctx context.Context, c driverConn, _ []driver.Value) error {
			t, err := c.BeginTx(ctx, driver.TxOptions{})
			if err != nil {
				return err
			}
			if _, err := c.ExecContext(ctx, "UPDATE t SET x = 1", nil); err != nil {
				return err
			}
			return t.Commit()
		}},
	}
	for _, op := range ops {
		for _, on := range []string{"driver", "gate", "leased"} {
			b.Run("op="+op.name+"/on="+on, func(b *testing.B) {
				c := open(b, on)
				ctx := context.Background()
				dest := make([]driver.Value, 1)
				b.ReportAllocs()
				for b.Loop() {
					if err := c.ResetSession(ctx); err != nil {
						b.Fatal(err)
					}
					if err := op.run(ctx, c, dest); err != nil {
						b.Fatal(err)
					}
					if !c.IsValid() {
						b.Fatal("connection not valid")
					}
				}
			})
		}
	}
}
