// Package bulkhead protects a database from the services that use it.
//
// A Gate is a driver.Connector decorator: every operation of the *sql.DB
// opened on it passes two semaphores before it reaches the database:
//
//   - admission: B+Q permits, tried without waiting. None free is an
//     immediate rejection matching ErrAdmissionFull.
//   - execution: B permits, handed out earliest deadline first within the
//     policy's QueueWait (else ErrQueueTimeout) and the caller's deadline
//     (else ErrWouldMissDeadline, or the context's error once it ends).
//
// Every rejection matches ErrRejected. An operation is a transaction (until
// the driver's Commit or Rollback returned), an autocommit Exec, or an
// autocommit Query (until its rows are closed); statements inside a
// transaction take no further permit. Only an operation that holds its
// permits gets a server connection: a rejected or waiting one sends
// nothing. Permits are not released while the database still works on a
// cancelled operation.
//
//	gate, err := bulkhead.New(inner, policy) // inner: the driver's Connector
//	if err != nil {
//		return err
//	}
//	_, err = gate.OpenDB().ExecContext(ctx, "UPDATE ...")
//	if errors.Is(err, bulkhead.ErrRejected) {
//		// the database is at its budget: answer 503, retry later
//	}
//
// On PostgreSQL, use the module github.com/dbbulkhead/bulkhead/pgxgate.
// Unwrap reaches the driver's own connection; work done on it is not gated.
package bulkhead
