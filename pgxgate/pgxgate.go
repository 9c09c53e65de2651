// Package pgxgate opens a bulkhead gate on PostgreSQL through pgx with the
// settings that make the gate's bound hold on the server, not only in the
// process.
//
// With pgx's default context handling a cancelled operation returns at
// once while PostgreSQL is still running it (pgx closes the connection in
// the background), so its permits come back early and the server can run
// more than B transactions for a moment (measured: up to 8 with B=2 under
// a storm of cancellations). pgxgate installs pgconn's
// CancelRequestContextWatcherHandler instead: a cancelled operation sends
// a cancel request and returns only once the server answered, and the
// connection stays usable. The cost: pgx waits 100ms after each cancel
// request before it reuses the connection, so a cancelled operation holds
// its permits that much longer.
package pgxgate

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
)

// DeadlineDelay is how long, after a context ends, pgx waits for the
// server to answer the cancel request before it closes the connection.
const DeadlineDelay = time.Second

// WaitForServer sets cfg's context handling so that a cancelled operation
// returns only after PostgreSQL stopped it (see the package doc). It
// replaces any BuildContextWatcherHandler already set.
func WaitForServer(cfg *pgx.ConnConfig) {
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: DeadlineDelay}
	}
}

// New returns a gate in front of pgx with cfg and policy p. Unless cfg
// already sets BuildContextWatcherHandler, it applies WaitForServer to a
// copy of cfg. Errors are bulkhead.New's.
func New(cfg *pgx.ConnConfig, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, error) {
	c := cfg.Copy()
	if c.BuildContextWatcherHandler == nil {
		WaitForServer(c)
	}
	return bulkhead.New(stdlib.GetConnector(*c), p, opts...)
}

// OpenDB parses dsn (a postgres:// URL or key=value string), gates it with
// p and opens a *sql.DB with the pool settings the gate relies on
// (Gate.OpenDB).
func OpenDB(dsn string, p bulkhead.Policy, opts ...bulkhead.Option) (*sql.DB, *bulkhead.Gate, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("bulkhead: DSN %q: want a postgres:// URL or key=value settings: %w", redact(dsn), err)
	}
	g, err := New(cfg, p, opts...)
	if err != nil {
		return nil, nil, err
	}
	return g.OpenDB(), g, nil
}

// redact hides a password in a URL-shaped DSN.
func redact(dsn string) string {
	at := strings.LastIndex(dsn, "@")
	scheme := strings.Index(dsn, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return dsn
	}
	userinfo := dsn[scheme+3 : at]
	if i := strings.Index(userinfo, ":"); i >= 0 {
		return dsn[:scheme+3] + userinfo[:i] + ":xxxxx" + dsn[at:]
	}
	return dsn
}
