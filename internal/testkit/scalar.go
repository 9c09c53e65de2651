//go:build go1.25

package testkit

import (
	"context"
	"database/sql"
	"testing"
)

// RowQueryer runs a query for one row: a *sql.DB, *sql.Conn or *sql.Tx.
type RowQueryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Scalar returns the one column of the one row query returns on q,
// failing the test, naming the query, if it cannot be read as a T.
func Scalar[T any](t testing.TB, ctx context.Context, q RowQueryer, query string, args ...any) T {
	t.Helper()
	var v T
	if err := q.QueryRowContext(ctx, query, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return v
}
