package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/jackc/pgx/v5/stdlib"
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
			plain, gated := openBenchDBs(b, newPG, p, workers)
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

// Benchmarks through database/sql, plain and gated side by side in the
// same run. Sub-benchmarks end in db=plain and db=gated, so that
//
//	benchstat -col /db bench.txt
//
// shows the gate's cost as a delta. BENCHMARKS.md has the figures and the
// commands.

// benchGatePolicy never waits or rejects in these benchmarks: B and Q are
// above the goroutines that run.
var benchGatePolicy = bulkhead.Policy{MaxConcurrent: 64, MaxQueue: 64, QueueWait: time.Second}

// openBenchDBs returns a plain *sql.DB and a gated one (g.OpenDB()) on
// connectors made by inner, each with idle connections for workers.
func openBenchDBs(b *testing.B, inner func() driver.Connector, p bulkhead.Policy, workers int) (plain, gated *sql.DB) {
	b.Helper()
	plain = sql.OpenDB(inner())
	plain.SetMaxIdleConns(max(workers, 2))
	g, err := bulkhead.New(inner(), p)
	if err != nil {
		b.Fatal(err)
	}
	gated = g.OpenDB()
	b.Cleanup(func() {
		plain.Close()
		gated.Close()
	})
	return plain, gated
}

// dbOps are the operations measured, each a function of one *sql.DB.
var dbOps = []struct {
	name string
	run  func(ctx context.Context, db *sql.DB) error
}{
	{"op=exec", func(ctx context.Context, db *sql.DB) error {
		_, err := db.ExecContext(ctx, "UPDATE t SET x = 1")
		return err
	}},
	{"op=queryrow", func(ctx context.Context, db *sql.DB) error {
		var v int64
		return db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
	}},
	{"op=tx", func(ctx context.Context, db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE t SET x = 1"); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	}},
}

// BenchmarkFakeDB measures ExecContext, QueryRowContext+Scan and
// BeginTx+Exec+Commit through database/sql on the in-process fake driver,
// whose own calls cost a few atomic operations: what is left is
// database/sql's cost, and the gate's for db=gated. path=serial runs one
// goroutine; path=parallel runs b.RunParallel (GOMAXPROCS goroutines).
func BenchmarkFakeDB(b *testing.B) {
	newFake := func() driver.Connector { return fakedb.New() }
	for _, op := range dbOps {
		for _, path := range []string{"path=serial", "path=parallel"} {
			plain, gated := openBenchDBs(b, newFake, benchGatePolicy, runtime.GOMAXPROCS(0))
			for _, db := range []struct {
				name string
				db   *sql.DB
			}{{"db=plain", plain}, {"db=gated", gated}} {
				b.Run(op.name+"/"+path+"/"+db.name, func(b *testing.B) {
					ctx := context.Background()
					if err := op.run(ctx, db.db); err != nil { // warm: dial outside the timing
						b.Fatal(err)
					}
					b.ReportAllocs()
					if path == "path=serial" {
						for b.Loop() {
							if err := op.run(ctx, db.db); err != nil {
								b.Fatal(err)
							}
						}
						return
					}
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := op.run(ctx, db.db); err != nil {
								panic(err)
							}
						}
					})
				})
			}
		}
	}
}

// BenchmarkGateCost measures what the gate adds to each operation of
// dbOps through database/sql on the fake driver, with plain and gated
// interleaved in one loop: each iteration runs a chunk of operations on
// the plain *sql.DB and a chunk on the gated one, in alternating order,
// timing each chunk. Drift on a shared machine (another process, the
// CPU's clock) then hits both alike, where BenchmarkFakeDB's separate
// runs of a second each differ by more than the gate costs. It reports
// plain-ns/op, gated-ns/op and their difference, gate-ns/op; ns/op is
// for one iteration (2×64 operations) and means nothing by itself.
//
//	go test -run '^$' -bench GateCost -count 10 ./tests > cost.txt
//	benchstat cost.txt
func BenchmarkGateCost(b *testing.B) {
	const chunk = 64
	for _, op := range dbOps {
		b.Run(op.name, func(b *testing.B) {
			plain, gated := openBenchDBs(b, func() driver.Connector { return fakedb.New() }, benchGatePolicy, 1)
			ctx := context.Background()
			run := func(db *sql.DB) time.Duration {
				start := time.Now()
				for range chunk {
					if err := op.run(ctx, db); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(start)
			}
			run(plain) // warm: dial outside the timing
			run(gated)
			var tPlain, tGated time.Duration
			n := 0
			for b.Loop() {
				if n%2 == 0 {
					tPlain += run(plain)
					tGated += run(gated)
				} else {
					tGated += run(gated)
					tPlain += run(plain)
				}
				n++
			}
			ops := float64(n * chunk)
			b.ReportMetric(float64(tPlain)/ops, "plain-ns/op")
			b.ReportMetric(float64(tGated)/ops, "gated-ns/op")
			b.ReportMetric(float64(tGated-tPlain)/ops, "gate-ns/op")
		})
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
// each after a GC. Through database/sql a waiting operation also holds one
// of its pooled logical connections (but no server connection), so this
// is the whole cost of a queued operation, not the limiter's alone (see
// BenchmarkWaiterMemory for that).
func BenchmarkWaitingOperation(b *testing.B) {
	const waiters = 1000
	fc := fakedb.New()
	g, err := bulkhead.New(fc, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: waiters, QueueWait: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()
	ctx := context.Background()
	// Open the logical connections once: the measure is of waiting
	// operations, not of connections being created.
	warmConns(b, db, waiters+1)
	b.ReportAllocs()
	var total float64
	runs := 0
	for b.Loop() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		before := memInUse()
		var wg sync.WaitGroup
		errs := make(chan error, waiters)
		for range waiters {
			wg.Go(func() {
				if _, err := db.ExecContext(ctx, "UPDATE t SET x = 1"); err != nil {
					errs <- err
				}
			})
		}
		for limit := time.Now().Add(time.Minute); g.Stats().Waiting < waiters; runtime.Gosched() {
			if time.Now().After(limit) {
				b.Fatalf("%d of %d operations waiting after a minute", g.Stats().Waiting, waiters)
			}
		}
		total += float64(memInUse()-before) / waiters
		runs++
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(total/float64(runs), "bytes/waiter")
}

// warmConns opens n logical connections in db's pool and leaves them
// idle (they hold no server connection).
func warmConns(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	ctx := context.Background()
	conns := make([]*sql.Conn, 0, n)
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	if open := db.Stats().OpenConnections; open != n {
		b.Fatalf("%d connections open after warming, want %d", open, n)
	}
}

// memInUse is the heap and stack memory in use, after a GC.
func memInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
