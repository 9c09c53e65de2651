//go:build go1.25

package testkit

import (
	"context"
	"database/sql"
	"testing"
)

// Execer runs a statement: a *sql.DB, *sql.Conn or *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Beginner begins a transaction: a *sql.DB or *sql.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Begin begins a transaction on db, failing the test if it cannot.
func Begin(t testing.TB, ctx context.Context, db Beginner) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// Tx runs query in a transaction of its own on db, committed, or rolled
// back if the statement fails.
func Tx(ctx context.Context, db Beginner, query string, args ...any) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Commit commits tx, failing the test if the commit fails.
func Commit(t testing.TB, tx *sql.Tx) {
	t.Helper()
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// Rollback rolls tx back, failing the test if the rollback fails.
func Rollback(t testing.TB, tx *sql.Tx) {
	t.Helper()
	if err := tx.Rollback(); err != nil {
		t.Fatalf("rollback: %v", err)
	}
}

// Conn takes a connection of db, failing the test if it cannot; the
// caller closes it.
func Conn(t testing.TB, ctx context.Context, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Exec runs query on x, failing the test on an error.
func Exec(t testing.TB, ctx context.Context, x Execer, query string, args ...any) {
	t.Helper()
	if _, err := x.ExecContext(ctx, query, args...); err != nil {
		t.Fatal(err)
	}
}

// GoExec runs x.ExecContext(ctx, query, args...) in a goroutine of its
// own and sends its error on the returned channel.
func GoExec(ctx context.Context, x Execer, query string, args ...any) chan error {
	done := make(chan error, 1)
	go func() {
		_, err := x.ExecContext(ctx, query, args...)
		done <- err
	}()
	return done
}
