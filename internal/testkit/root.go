//go:build go1.25

package testkit

import (
	"context"
	"database/sql"
	"sync"
	"testing"
)

// Preparer prepares statements: a *sql.DB, *sql.Conn or *sql.Tx.
type Preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// Queryer runs queries: a *sql.DB, *sql.Conn or *sql.Tx.
type Queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Prepare prepares query on p, failing the test if it cannot; the caller
// closes the statement.
func Prepare(t testing.TB, ctx context.Context, p Preparer, query string) *sql.Stmt {
	t.Helper()
	st, err := p.PrepareContext(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Query runs query on q, failing the test on an error; the caller closes
// the rows.
func Query(t testing.TB, ctx context.Context, q Queryer, query string, args ...any) *sql.Rows {
	t.Helper()
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// Log collects values added from any goroutine, such as the events a
// gate reports. Its zero value is empty and ready to use.
type Log[T any] struct {
	mu  sync.Mutex
	got []T
}

// Add appends v.
func (l *Log[T]) Add(v T) {
	l.mu.Lock()
	l.got = append(l.got, v)
	l.mu.Unlock()
}

// List returns a copy of the values added so far, in order.
func (l *Log[T]) List() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.got...)
}
