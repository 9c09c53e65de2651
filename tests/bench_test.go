package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// BenchmarkPostgres measures throughput on PostgreSQL over loopback
// through pgx's stdlib driver, plain and gated: op=tx is BEGIN; SELECT 1;
// COMMIT, op=select an autocommit SELECT 1, with 1 and 4 workers
// (goroutines sharing b.N). ns/op is wall time per operation, the
// inverse of throughput; ops/s is reported too. The gate's B is the
// number of workers, so nothing waits or is rejected. Run it several
// times in separate processes so that plain and gated alternate
// (BENCHMARKS.md). Skipped under -short.
func BenchmarkPostgres(b *testing.B) {
	postgresURL(b) // skips under -short
	ops := []struct {
		name string
		run  func(ctx context.Context, db *sql.DB) error
	}{
		{"op=tx", func(ctx context.Context, db *sql.DB) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			var v int
			if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&v); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit()
		}},
		{"op=select", func(ctx context.Context, db *sql.DB) error {
			var v int
			return db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
		}},
	}
	for _, op := range ops {
		for _, workers := range []int{1, 4} {
			cfg := pgConfig(b)
			newPG := func() driver.Connector { return stdlib.GetConnector(*cfg) }
			p := bulkhead.Policy{MaxConcurrent: workers, MaxQueue: workers, QueueWait: time.Second}
			plain := plainDB(b, newPG())
			plain.SetMaxIdleConns(max(workers, 2))
			_, gated := gateOn(b, newPG(), p)
			for _, db := range []struct {
				name string
				db   *sql.DB
			}{{"db=plain", plain}, {"db=gated", gated}} {
				b.Run(op.name+"/workers="+strconv.Itoa(workers)+"/"+db.name, func(b *testing.B) {
					runWorkers(b, workers, db.db, op.run)
				})
			}
		}
	}
}

// runWorkers runs op b.N times in all on workers goroutines, after one
// untimed round per worker that dials the connections.
func runWorkers(b *testing.B, workers int, db *sql.DB, op func(context.Context, *sql.DB) error) {
	b.Helper()
	ctx := context.Background()
	warm := func(n int) error {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for range n {
					if err := op(ctx, db); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	if err := warm(10); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var left atomic.Int64
	left.Store(int64(b.N))
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := op(ctx, db); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkWaitingOperation parks waiters operations, each a
// db.ExecContext in its own goroutine, in the gate's queue (the only
// execution permit is held by an open transaction) and reports what each
// takes, as bytes/waiter: (HeapInuse+StackInuse once all wait − before),
// each after a GC. A waiting operation holds its goroutine and a logical
// connection of database/sql's pool, opened for it (the gate keeps no
// more idle logical connections than it has server connections), but no
// server connection: this is the whole cost of a queued operation, not
// the limiter's alone (see BenchmarkWaiterMemory for that).
func BenchmarkWaitingOperation(b *testing.B) {
	const waiters = 1000
	g, db := gateOn(b, fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: waiters, QueueWait: time.Hour})
	ctx := context.Background()
	var tx *sql.Tx
	testkit.MeasureWaiters(b, waiters, testkit.Waiters{
		Hold: func() {
			var err error
			if tx, err = db.BeginTx(ctx, nil); err != nil {
				b.Fatal(err)
			}
		},
		Wait: func() {
			if _, err := db.ExecContext(ctx, "UPDATE t SET x = 1"); err != nil {
				b.Error(err)
			}
		},
		Parked: func() int { return g.Stats().Waiting },
		Free:   func() { txCommit(b, tx) },
	})
}

// BenchmarkSessionsInTurn: two workers run a CPU-bound transaction (about
// 10 ms here, as in the overload experiment) back to back on n server
// connections taken in turn, first given back first taken, so that every
// one of them serves: what keeping more sessions than run at once costs
// when a queue hands each operation to another connection. ns/op is wall
// time per transaction. Compare the counts side by side:
//
//	go test -run '^$' -bench SessionsInTurn -count 8 ./tests | benchstat -col /sessions -
//
// Skipped under -short.
func BenchmarkSessionsInTurn(b *testing.B) {
	postgresURL(b) // skips under -short
	for _, n := range []int{2, 3, 4} {
		b.Run("sessions="+strconv.Itoa(n), func(b *testing.B) {
			ctx := context.Background()
			db := plainDB(b, stdlib.GetConnector(*pgConfig(b)))
			turn := make(chan *sql.Conn, n)
			conns := takeConns(b, ctx, db, n)
			defer closeConns(conns)
			pingConns(b, ctx, conns)
			for _, c := range conns {
				turn <- c
			}
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ResetTimer()
			for range 2 {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						c := <-turn
						err := func() error {
							tx, err := c.BeginTx(ctx, nil)
							if err != nil {
								return err
							}
							defer tx.Rollback()
							var sum int64
							if err := tx.QueryRowContext(ctx, "SELECT sum(i) FROM generate_series(1, 60000) i").Scan(&sum); err != nil {
								return err
							}
							return tx.Commit()
						}()
						turn <- c
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
