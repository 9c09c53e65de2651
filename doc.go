// Package bulkhead protects a database from the services that use it.
//
// It is a driver.Connector decorator: every operation of a *sql.DB opened
// on it, and of ORMs or generated code on top (GORM, sqlc), passes two
// semaphores before it reaches the database:
//
//   - admission: B+Q permits, tried without waiting. None free means an
//     immediate rejection matching ErrAdmissionFull (and ErrRejected).
//   - execution: B permits, handed out in FIFO order within the policy's
//     QueueWait and never past the caller's context. A timeout is a
//     rejection matching ErrQueueTimeout (and ErrRejected); a context
//     that ends returns the context's error. An operation that could no
//     longer finish within its context's deadline, given the hold times
//     the gate measures, is refused with ErrWouldMissDeadline instead of
//     waiting for a permit it could not use.
//
// Policy.Adaptive lets the gate find B below MaxConcurrent, and
// Workload.Priority orders the queue (docs/design.md).
//
// An operation is a transaction (from BeginTx until the driver's Commit or
// Rollback returned), an autocommit Exec (until it returned) or an
// autocommit Query (until the driver's Rows.Close returned), including a
// prepared statement's. Statements inside a transaction take no further
// permit. Permits are never released because a caller gave up while the
// database still works: after a cancellation, database/sql's own
// rollback releases them. Only an operation that holds its permits gets a
// server connection: a rejected or waiting one holds none and sends
// nothing.
//
//	gate, err := bulkhead.New(inner, policy) // inner: the driver's driver.Connector
//	if err != nil {
//		return err
//	}
//	db := gate.OpenDB() // the gate's one *sql.DB
//	defer db.Close()
//	if err := db.PingContext(ctx); err != nil { // the database answers
//		return err
//	}
//	_, err = db.ExecContext(ctx, "UPDATE ...")
//	if errors.Is(err, bulkhead.ErrRejected) {
//		// the database is at its budget: answer 503, retry later
//	}
//
// On PostgreSQL, use the module github.com/dbbulkhead/bulkhead/pgxgate:
// pgx with the settings that keep the bound true on the server.
//
// Reaching the driver's own connection (pgx's CopyFrom, LISTEN):
//
//	err := sqlConn.Raw(func(dc any) error {
//		c, err := bulkhead.Unwrap(dc)
//		if err != nil {
//			return err
//		}
//		_, err = c.(*stdlib.Conn).Conn().CopyFrom(ctx, table, columns, source)
//		return err
//	})
//
// Work done on the driver's own connection is not gated.
package bulkhead
