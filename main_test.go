//go:build go1.25

package bulkhead_test

import (
	"context"
	"database/sql"
	"os"
	"sync"
	"testing"

	"github.com/dbbulkhead/bulkhead/internal/leakcheck"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// The root module's tests run on the in-process fake driver alone; the
// real-server tests are in the tests module (tests/).

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// awaitState waits until cond holds, polling state without sleeping
// (testkit.Await).
func awaitState(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Await(t, what, cond)
}

// inParallel runs f each times on each of workers goroutines, a goroutine
// stopping at its first error, and fails the test on any error.
func inParallel(t *testing.T, workers, each int, f func() error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				if err := f(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// fkMustExec runs query on x (a *sql.DB, *sql.Conn or *sql.Tx), failing
// the test on an error.
func fkMustExec(t *testing.T, ctx context.Context, x interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, query string, args ...any) {
	t.Helper()
	if _, err := x.ExecContext(ctx, query, args...); err != nil {
		t.Fatal(err)
	}
}

// fkConn takes a connection of db, failing the test if it cannot.
func fkConn(t *testing.T, ctx context.Context, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fkBegin begins a transaction on db, failing the test if it cannot.
func fkBegin(t *testing.T, ctx context.Context, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}
