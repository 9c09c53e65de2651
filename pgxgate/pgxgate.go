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
// a cancel request and returns only once the server answered (at most
// DeadlineDelay: then pgx closes the connection, and the server may still
// be running the statement), and the connection stays usable. The cost: pgx waits 100ms after each cancel
// request before it reuses the connection, so a cancelled operation holds
// its permits that much longer.
package pgxgate

import (
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
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
	if !ownHandler(c) {
		WaitForServer(c)
	}
	return bulkhead.New(stdlib.GetConnector(*c), p, opts...)
}

// pgxDefaultHandler is the code of the BuildContextWatcherHandler that
// pgx.ParseConfig sets on every config it returns (pgx's default handling),
// or 0 if it cannot be known.
var pgxDefaultHandler = sync.OnceValue(func() uintptr {
	c, err := pgconn.ParseConfig("host=127.0.0.1 port=5432 user=u dbname=d sslmode=disable")
	if err != nil || c.BuildContextWatcherHandler == nil {
		return 0
	}
	return reflect.ValueOf(c.BuildContextWatcherHandler).Pointer()
})

// ownHandler reports whether cfg sets a context handler of its own, not
// pgx's default.
func ownHandler(cfg *pgx.ConnConfig) bool {
	f := cfg.BuildContextWatcherHandler
	return f != nil && reflect.ValueOf(f).Pointer() != pgxDefaultHandler()
}

// OpenDB parses dsn (a postgres:// URL or key=value string), gates it with
// p and opens a *sql.DB with the pool settings the gate relies on
// (Gate.OpenDB).
func OpenDB(dsn string, p bulkhead.Policy, opts ...bulkhead.Option) (*sql.DB, *bulkhead.Gate, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, nil, &dsnError{dsn: redact(dsn), err: err}
	}
	g, err := New(cfg, p, opts...)
	if err != nil {
		return nil, nil, err
	}
	return g.OpenDB(), g, nil
}

// dsnError is OpenDB's error for a DSN pgx cannot parse. pgx's own
// message repeats the DSN, masked on a best-effort basis: only what follows
// it is shown; errors.As still reaches pgx's *pgconn.ParseConfigError.
type dsnError struct {
	dsn string // redacted
	err error
}

func (e *dsnError) Error() string {
	detail := e.err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(e.err, &pce) {
		if i := strings.LastIndex(detail, "`: "); i >= 0 {
			detail = detail[i+len("`: "):]
		} else {
			detail = "cannot parse it"
		}
	}
	detail = strings.NewReplacer("\n", " ", "\r", " ").Replace(detail)
	return fmt.Sprintf("bulkhead: DSN %q: want a postgres:// URL or key=value settings: %s", e.dsn, detail)
}

func (e *dsnError) Unwrap() error { return e.err }

var (
	// password=... in key=value settings, quoted or not, and in a URL's query.
	kvPassword = regexp.MustCompile(`((?:^|[\s&?])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)`)
)

// redact hides the passwords of a DSN: a URL's userinfo password, and
// password= or sslpassword= settings in key=value form or a URL's query.
func redact(dsn string) string {
	dsn = kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
	return redactUserinfo(dsn)
}

// redactUserinfo hides the password of a URL's userinfo.
func redactUserinfo(dsn string) string {
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
