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

// Open opens a gate on inner under p with opts, failing the test if it
// cannot, and its *sql.DB (Gate.OpenDB), closed, and the gate with it, at
// the end of the test.
func Open(t testing.TB, inner driver.Connector, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	g, err := bulkhead.New(inner, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	t.Cleanup(func() { db.Close() })
	return g, db
}
