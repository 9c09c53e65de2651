//go:build go1.25

package bulkhead_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

// The examples run on an in-process fake driver; in a service the inner
// connector is the driver's, e.g. stdlib.GetConnector(cfg) with pgx.

func ExampleNew() {
	inner := fakedb.New() // any driver.Connector
	policy := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: 50 * time.Millisecond}
	gate, err := bulkhead.New(inner, policy)
	if err != nil {
		log.Fatal(err)
	}
	db := gate.OpenDB() // pool settings that fit the policy
	defer db.Close()

	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil) // takes the permits
	if err != nil {
		log.Fatal(err)
	}
	var answer int
	if err := tx.QueryRowContext(ctx, "SELECT 42").Scan(&answer); err != nil {
		log.Fatal(err)
	}
	fmt.Println("answer:", answer, "running:", gate.Stats().Running)
	if err := tx.Commit(); err != nil { // gives them back
		log.Fatal(err)
	}
	s := gate.Stats()
	fmt.Printf("running: %d, admitted: %d, server connections: %d\n", s.Running, s.Admitted, s.OpenConns)
	// Output:
	// answer: 42 running: 1
	// running: 0, admitted: 1, server connections: 1
}

func ExampleConnector() {
	policy := bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: 100 * time.Millisecond}
	db := sql.OpenDB(bulkhead.Connector(fakedb.New(), policy))
	db.SetMaxIdleConns(policy.MaxConcurrent + policy.MaxQueue) // keep MaxOpenConns at 0
	defer db.Close()
	if _, err := db.Exec("UPDATE accounts SET balance = 0"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("exec ok")

	// An invalid policy never runs silently: the first call reports it.
	bad := sql.OpenDB(bulkhead.Connector(fakedb.New(), bulkhead.Policy{MaxConcurrent: 0}))
	defer bad.Close()
	err := bad.Ping()
	fmt.Println(errors.Is(err, bulkhead.ErrInvalidPolicy), err)
	// Output:
	// exec ok
	// true bulkhead: MaxConcurrent is 0, want at least 1
}

func ExampleUnwrap() {
	inner := fakedb.New()
	gate, err := bulkhead.New(inner, bulkhead.Policy{MaxConcurrent: 1})
	if err != nil {
		log.Fatal(err)
	}
	db := gate.OpenDB()
	defer db.Close()

	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		// dc is the gate's wrapper; Unwrap peels it off. With pgx,
		// c.(*stdlib.Conn).Conn() is the *pgx.Conn.
		fmt.Println("wrapper is the driver's conn:", inner.ConnOf(dc) != nil)
		c, err := bulkhead.Unwrap(dc)
		if err != nil {
			return err
		}
		fmt.Println("unwrapped is the driver's conn:", inner.ConnOf(c) != nil)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// wrapper is the driver's conn: false
	// unwrapped is the driver's conn: true
}

func ExampleRejectedError() {
	gate, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0})
	if err != nil {
		log.Fatal(err)
	}
	db := gate.OpenDB()
	defer db.Close()

	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil) // holds the only permit
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()

	_, err = db.ExecContext(ctx, "UPDATE accounts SET balance = 0")
	switch {
	case errors.Is(err, bulkhead.ErrRejected): // busy: answer 503 with Retry-After
		var re *bulkhead.RejectedError
		errors.As(err, &re)
		fmt.Println("rejected:", err)
		fmt.Println("full:", errors.Is(err, bulkhead.ErrAdmissionFull), "timeout:", errors.Is(err, bulkhead.ErrQueueTimeout), "B:", re.MaxConcurrent)
	case err != nil:
		fmt.Println("failed:", err)
	}
	// Output:
	// rejected: bulkhead: admission full: 1 running + 0 waiting of B=1, Q=0
	// full: true timeout: false B: 1
}

func ExampleWithEvents() {
	events := bulkhead.Events{
		OnAdmit:   func(e bulkhead.Event) { fmt.Println("admit", e.Kind) },
		OnReject:  func(e bulkhead.Event) { fmt.Println("reject", e.Kind, "-", e.Reason) },
		OnRelease: func(e bulkhead.Event) { fmt.Println("release", e.Kind) },
	}
	gate, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1}, bulkhead.WithEvents(events))
	if err != nil {
		log.Fatal(err)
	}
	db := gate.OpenDB()
	defer db.Close()

	ctx := context.Background()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&n); err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	db.ExecContext(ctx, "UPDATE accounts SET balance = 0") // refused: the transaction holds the one permit
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// admit query
	// release query
	// admit transaction
	// reject statement - bulkhead: admission full
	// release transaction
}
