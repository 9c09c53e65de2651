// Package gatetest opens gates for the tests of every module that test
// the gate from outside its package (testkit holds what its own internal
// tests share too).
package gatetest

import (
	"database/sql"
	"database/sql/driver"
	"testing"

	"github.com/dbbulkhead/bulkhead"
)

// Open opens a gate on inner under p with opts (bulkhead.New) and its
// *sql.DB (DB).
func Open(t testing.TB, inner driver.Connector, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	g, err := bulkhead.New(inner, p, opts...)
	return DB(t, g, err)
}

// DB fails the test on err, the error of the constructor that returned g,
// else returns g and its *sql.DB (Gate.OpenDB), closed, and the gate with
// it, at the end of the test.
func DB(t testing.TB, g *bulkhead.Gate, err error) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	t.Cleanup(func() { db.Close() })
	return g, db
}
