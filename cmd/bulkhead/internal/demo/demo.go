// Package demo is the article's demonstration, shared by `bulkhead demo`
// and the light first command `go run ./cmd/bulkhead/demo`: a pool of 2
// behind a gate with B=1, Q=0; a first transaction holds the only permit,
// a second operation is rejected at once, then the first runs SELECT 42
// and commits. It imports the gate and the embedded SQLite engine alone,
// so that the light command builds without pgx or the MySQL driver.
package demo

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	sqlite "github.com/ncruces/go-sqlite3/driver"
	_ "github.com/ncruces/go-sqlite3/embed" // the SQLite build, WebAssembly run by wazero

	"github.com/dbbulkhead/bulkhead"
)

// SQLite returns a connector to an embedded SQLite database; each
// connection opens its own in-memory database, which is all statements
// that read no table need.
func SQLite() (driver.Connector, error) {
	return (&sqlite.SQLite{}).OpenConnector(":memory:")
}

// Run runs the demonstration through a gate in front of inner and returns
// its three lines:
//
//	overload=rejected
//	query=42
//	available=1
func Run(ctx context.Context, inner driver.Connector) ([]string, error) {
	g, err := bulkhead.New(inner, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0})
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(g)
	defer db.Close()
	// A pool of 2: the second operation gets past database/sql's pool
	// and reaches the gate, which has no permit left for it.
	db.SetMaxOpenConns(2)
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("cannot connect: %w", err)
	}

	// The first transaction: takes the permit, reports that it holds it,
	// and waits for the latch before its query and commit.
	began := make(chan error, 1)
	latch := make(chan struct{})
	type result struct {
		v   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		tx, err := db.BeginTx(ctx, nil)
		began <- err
		if err != nil {
			return
		}
		select {
		case <-latch:
		case <-ctx.Done():
			tx.Rollback()
			done <- result{err: ctx.Err()}
			return
		}
		var v int
		if err := tx.QueryRowContext(ctx, "SELECT 42").Scan(&v); err != nil {
			tx.Rollback()
			done <- result{err: fmt.Errorf("SELECT 42 in the held transaction: %w", err)}
			return
		}
		done <- result{v: v, err: tx.Commit()}
	}()
	if err := <-began; err != nil {
		return nil, fmt.Errorf("first transaction: %w", err)
	}

	// The overload: a second operation while the permit is held.
	_, err = db.ExecContext(ctx, "SELECT 1")
	close(latch)
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("first transaction: %w", r.err)
	}
	if !errors.Is(err, bulkhead.ErrRejected) {
		return nil, fmt.Errorf("the second operation was not rejected while the permit was held (error: %v)", err)
	}
	st := g.Stats()
	return []string{
		"overload=rejected",
		fmt.Sprintf("query=%d", r.v),
		fmt.Sprintf("available=%d", st.MaxConcurrent-st.Running),
	}, nil
}
