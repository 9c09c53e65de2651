// Package bulkhead protects a database from the services that use it.
//
// It is a driver.Connector decorator: every operation of a *sql.DB opened
// on it, and of ORMs or generated code on top (GORM, sqlc), passes two
// semaphores before it reaches the database:
//
//   - admission: B+Q permits, tried without waiting. None free means an
//     immediate rejection matching ErrAdmissionFull (and ErrRejected).
//   - execution: B permits, waited for in FIFO order for at most the
//     policy's QueueWait and never past the caller's context. A timeout is a
//     rejection matching ErrQueueTimeout (and ErrRejected); a context that
//     ends returns the context's error.
//
// An operation is a transaction (from BeginTx until the driver's Commit or
// Rollback returned), an autocommit Exec (until it returned) or an
// autocommit Query (until the driver's Rows.Close returned, also when
// database/sql closes the rows itself), including a prepared statement's
// Exec and Query outside a transaction. Statements inside a transaction take
// no further permit. Permits are never released because a caller gave up
// while the database still works: after a cancellation, database/sql's own
// rollback releases them.
//
// Quick start, with pgx:
//
//	cfg, err := pgx.ParseConfig(os.Getenv("DATABASE_URL"))
//	// ...
//	policy, err := bulkhead.PolicyFromEnv()
//	// ...
//	gate, err := bulkhead.New(stdlib.GetConnector(*cfg), policy)
//	// ...
//	db := gate.OpenDB() // pool settings that fit the policy
//
// The one-line form sql.OpenDB(bulkhead.Connector(inner, policy)) works
// too; then keep db.SetMaxOpenConns at 0 and call db.SetMaxIdleConns(B+Q).
//
// Reaching the driver's own connection (for pgx's CopyFrom or LISTEN):
//
//	err := sqlConn.Raw(func(dc any) error {
//		pgxConn := bulkhead.Unwrap(dc).(*stdlib.Conn).Conn()
//		_, err := pgxConn.CopyFrom(ctx, table, columns, source)
//		return err
//	})
//
// Work done through Raw on the driver's connection is not gated.
package bulkhead
