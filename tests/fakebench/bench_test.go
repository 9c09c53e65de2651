// Package fakebench measures the gate through database/sql on the
// in-process fake driver, plain and gated side by side. It needs nothing
// but the root module, so that tests/fakebench/pair can build it against
// an earlier revision too.
package fakebench

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"runtime"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
)

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
	b.Cleanup(func() { plain.Close() })
	_, gated = gatetest.Open(b, inner(), p)
	return plain, gated
}

// dbOp is an operation measured, a function of one *sql.DB.
type dbOp struct {
	name string
	run  func(ctx context.Context, db *sql.DB) error
}

// dbOps are the operations measured, each a function of one *sql.DB.
var dbOps = []dbOp{
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
//	go test -run '^$' -bench GateCost -count 10 ./tests/fakebench > cost.txt
//	benchstat cost.txt
func BenchmarkGateCost(b *testing.B) {
	for _, op := range dbOps {
		benchGateCost(context.Background(), b, op, "")
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		benchGateCost(ctx, b, op, "/deadline")
		cancel()
	}
}

// benchGateCost is BenchmarkGateCost's run of op under ctx, named op's name
// and suffix: chunks of 64 operations, plain and gated in turn.
func benchGateCost(ctx context.Context, b *testing.B, op dbOp, suffix string) {
	const chunk = 64
	b.Run(op.name+suffix, func(b *testing.B) {
		plain, gated := openBenchDBs(b, func() driver.Connector { return fakedb.New() }, benchGatePolicy, 1)
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
