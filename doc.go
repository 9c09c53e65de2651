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
// Quick start, on PostgreSQL with pgx: the module
// github.com/dbbulkhead/bulkhead/pgxgate opens the gate with the settings
// that keep its bound true on the server (see its documentation), the
// module github.com/dbbulkhead/bulkhead/promgate exports its metrics, and
// the package httpgate answers rejections with 503 and Retry-After:
//
//	policy, err := bulkhead.PolicyFromEnv() // B, Q and the wait from BULKHEAD_*
//	// ...
//	metrics := promgate.New(promgate.Opts{})
//	db, gate, err := pgxgate.OpenDB(os.Getenv("DATABASE_URL"), policy,
//		bulkhead.WithEvents(metrics.Events()))
//	// ...
//	defer db.Close() // one *sql.DB for the service: GORM and sqlc use it too
//	metrics.Attach(gate)
//	prometheus.MustRegister(metrics)
//	rs := httpgate.Responder{RetryAfter: time.Second}
//	http.Handle("GET /answer", rs.Handler(func(w http.ResponseWriter, r *http.Request) error {
//		_, err := db.ExecContext(r.Context(), "SELECT 1")
//		return err // a rejection: 503 with Retry-After
//	}))
//
// Any other driver.Connector works the same: gate, err := bulkhead.New(inner,
// policy), then db := gate.OpenDB(), the one *sql.DB of the gate, with pool
// settings that fit the policy; it opens at most B+Q server connections
// (Stats().MaxConns). The one-line form
// sql.OpenDB(bulkhead.Connector(inner, policy)) works too; then keep
// db.SetMaxOpenConns at 0 and call db.SetMaxIdleConns(B+Q).
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
//
// Many instances of a service share one database's budget with a fleet
// budget: Policy.Fleet (or BULKHEAD_FLEET) names the fleet, MaxConcurrent
// and MaxQueue become the whole fleet's, and each process runs on its
// share, kept through PostgreSQL advisory locks so that the fleet never
// runs more than MaxConcurrent operations at once, through deploys,
// scale-outs and crashes (see fleet.go and the README's "Fleets").
package bulkhead
