// Package pgxgate opens a bulkhead gate on PostgreSQL through pgx with the
// settings that make the gate's bound hold on the server, not only in the
// process: when an operation's permits come back, the server no longer
// runs it.
//
// Two things of pgx's database/sql driver break that bound, and pgxgate
// changes both:
//
//   - A cancelled statement: with pgx's default context handling it returns
//     at once while PostgreSQL is still running it (pgx closes the
//     connection in the background), so its permits come back early and
//     the server can run more than B transactions for a moment (measured:
//     up to 8 with B=2 under a storm of cancellations). pgxgate installs
//     its own context handling instead: a cancelled statement sends a
//     cancel request and returns only once the server answered the
//     statement (within DeadlineDelay) and acknowledged the cancel request
//     (within CancelGrace; else the connection is closed), and the
//     connection stays usable. A cancel request the server takes after
//     the statement ended would stop the connection's next statement, so
//     the wait for its acknowledgement is not cut short (pgx's own handler
//     stops waiting when the statement ends and sleeps 100 ms: under load,
//     the next caller's statement failed with 57014). A cancelled
//     operation holds its permits until then.
//   - The end of a transaction: pgx's Commit and Rollback run with the
//     context BeginTx was given. When that context ended (database/sql
//     then rolls the transaction back from its own goroutine), pgx sends
//     no ROLLBACK: it closes the connection, the permits come back at
//     once, and PostgreSQL still holds the transaction and its locks until
//     its backend notices the closed socket. A Commit interrupted by the
//     caller's context reports the context's error although the server
//     may have committed. pgxgate's connections send COMMIT and ROLLBACK
//     with a context of their own, which keeps the caller's values but
//     not its cancellation, bounded by EndGrace: the transaction has ended
//     on the server when Commit or Rollback returns, and Commit reports
//     what the server did. A COMMIT still running at EndGrace gets a
//     cancel request: when the server stops it, nothing was committed,
//     Commit returns the server's error (57014) and the connection stays.
//     A COMMIT or ROLLBACK that gets no answer within EndGrace plus
//     DeadlineDelay closes the connection; then, and only then, the
//     outcome is unknown (Commit's error matches
//     bulkhead.ErrOutcomeUnknown) and the server may keep the transaction
//     until it notices the closed socket.
//
// Everything else is pgx's: the connections are *stdlib.Conn values
// (bulkhead.Unwrap reaches them in (*sql.Conn).Raw), with the same optional
// driver interfaces, plus driver.Validator (a connection is valid when it
// is open and not in a transaction).
package pgxgate

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
)

// DeadlineDelay is how long, after a context ends, the server has to answer
// the statement before the connection is closed.
const DeadlineDelay = time.Second

// CancelGrace bounds the wait for the server to acknowledge a cancel
// request: one not acknowledged by then closes the connection. Under load,
// PostgreSQL took up to 1.4 s to take some.
const CancelGrace = 5 * time.Second

// EndGrace bounds a COMMIT or ROLLBACK sent by pgxgate's connections: past
// it, pgx sends a cancel request and, DeadlineDelay later, closes the
// connection.
const EndGrace = 5 * time.Second

// WaitForServer sets cfg's context handling so that a cancelled operation
// returns only after PostgreSQL stopped it (see the package doc). It
// replaces any BuildContextWatcherHandler already set.
func WaitForServer(cfg *pgx.ConnConfig) {
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &cancelHandler{conn: pc}
	}
}

// cancelHandler sends a cancel request once an operation's context ended,
// and lets the operation return only once the server acknowledged it (it
// closed the cancel connection, having signalled the backend; libpq's
// PQcancel waits the same way), however soon the statement ended: a cancel
// request the server takes later would stop the connection's next
// statement. pgx's CancelRequestContextWatcherHandler stops waiting when
// the statement ends, then sleeps 100 ms. Within DeadlineDelay the server
// answers the statement (else pgx closes the connection), and within
// CancelGrace the cancel request; one not acknowledged by then closes the
// connection, whose next use fails before it sends anything.
type cancelHandler struct {
	conn  *pgconn.PgConn
	acked chan bool
}

func (h *cancelHandler) HandleCancel(context.Context) {
	h.conn.Conn().SetDeadline(time.Now().Add(DeadlineDelay))
	h.acked = make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), CancelGrace)
		defer cancel()
		err := h.conn.CancelRequest(ctx) // nil also when its wait was cut off
		h.acked <- err == nil && ctx.Err() == nil
	}()
}

func (h *cancelHandler) HandleUnwatchAfterCancel() {
	if !<-h.acked {
		h.conn.Conn().Close()
		return
	}
	h.conn.Conn().SetDeadline(time.Time{})
}

// New returns a gate in front of Connector(cfg) with policy p. Errors are
// bulkhead.New's.
func New(cfg *pgx.ConnConfig, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, error) {
	return bulkhead.New(Connector(cfg), p, opts...)
}

// Connector returns pgx's database/sql connector for cfg
// (stdlib.GetConnector, with stdlibOpts) with the two changes of the
// package doc: unless cfg already sets BuildContextWatcherHandler, it
// applies WaitForServer to a copy of cfg; and its connections end
// transactions on the server whatever happened to the caller's context.
// Pass it to bulkhead.New with options of your own, or use New.
func Connector(cfg *pgx.ConnConfig, stdlibOpts ...stdlib.OptionOpenDB) driver.Connector {
	c := cfg.Copy()
	if !ownHandler(c) {
		WaitForServer(c)
	}
	return connector{stdlib.GetConnector(*c, stdlibOpts...)}
}

type connector struct{ inner driver.Connector }

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	ci, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, oneLine(err)
	}
	sc, ok := ci.(*stdlib.Conn)
	if !ok {
		ci.Close()
		return nil, fmt.Errorf("bulkhead: pgxgate: pgx's connector returned a %T, want *stdlib.Conn", ci)
	}
	return &conn{Conn: sc}, nil
}

func (c connector) Driver() driver.Driver { return c.inner.Driver() }

// conn is pgx's connection with transactions that end on the server. It
// embeds *stdlib.Conn, so it has exactly its methods, and adds Unwrap,
// IsValid, and BeginTx.
type conn struct{ *stdlib.Conn }

var (
	_ driver.Validator   = (*conn)(nil)
	_ driver.ConnBeginTx = (*conn)(nil)
)

// Unwrap returns pgx's own connection, for bulkhead.Unwrap.
func (c *conn) Unwrap() driver.Conn { return c.Conn }

// IsValid reports whether the connection can serve another checkout: open
// and not in a transaction.
func (c *conn) IsValid() bool {
	pc := c.Conn.Conn()
	return !pc.IsClosed() && pc.PgConn().TxStatus() == 'I'
}

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx begins as pgx does, and returns a transaction whose Commit and
// Rollback reach the server whatever happened to ctx.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if _, err := c.Conn.BeginTx(ctx, opts); err != nil {
		return nil, err
	}
	// pgx's own transaction value holds nothing but the connection and
	// ctx: it is dropped, and the transaction ended here.
	return &tx{c: c.Conn.Conn(), ctx: ctx}, nil
}

type tx struct {
	c   *pgx.Conn
	ctx context.Context // BeginTx's: its values, not its cancellation
}

// endContext is the context of a COMMIT or ROLLBACK: the values of the
// transaction's context, not its cancellation, and EndGrace.
func (t *tx) endContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(t.ctx), EndGrace)
}

// Commit sends COMMIT and reports what the server did: nil, or
// pgx.ErrTxCommitRollback when the transaction had failed and the server
// rolled it back, or the server's *pgconn.PgError when the COMMIT failed
// and nothing was committed (wrapped, for errors.As, when it came after
// EndGrace: its cancel request stops the COMMIT with 57014). Only a COMMIT
// that got no answer within EndGrace returns an error matching
// bulkhead.ErrOutcomeUnknown; any other error is pgx's. The connection is
// closed only if it is still in a transaction, as pgx does.
func (t *tx) Commit() error {
	ctx, cancel := t.endContext()
	defer cancel()
	tag, err := t.c.Exec(ctx, "commit")
	if err != nil {
		if t.c.PgConn().TxStatus() != 'I' {
			closeNow(t.c)
		}
		if ctx.Err() == nil {
			return err
		}
		if serverFailed(err) {
			return fmt.Errorf("bulkhead: pgxgate: COMMIT failed after pgxgate.EndGrace (%v); nothing was committed: %w", EndGrace, err)
		}
		// pgx's error holds the end context's deadline, which is not the
		// caller's: it is reported as text, outside the chain.
		return fmt.Errorf("%w: COMMIT got no answer within pgxgate.EndGrace (%v); the server may have committed: %v", bulkhead.ErrOutcomeUnknown, EndGrace, err)
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// serverFailed reports whether err is the server's answer that a COMMIT
// failed, so that nothing was committed: any *pgconn.PgError but a PANIC,
// after which crash recovery may still replay the commit.
func serverFailed(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	severity := pe.SeverityUnlocalized
	if severity == "" {
		severity = pe.Severity
	}
	return severity != "PANIC"
}

// Rollback sends ROLLBACK; if it fails, the connection is closed, as pgx
// does (its state is unknown).
func (t *tx) Rollback() error {
	ctx, cancel := t.endContext()
	defer cancel()
	if _, err := t.c.Exec(ctx, "rollback"); err != nil {
		closeNow(t.c)
		return err
	}
	return nil
}

// closeNow closes c at once, without a goodbye to the server.
func closeNow(c *pgx.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.Close(ctx)
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

// OpenDB parses dsn (a postgres:// URL or key=value string), gates
// Connector(cfg) with p and opens the gate's *sql.DB (Gate.OpenDB). An
// empty dsn is an error: pgx would read it as libpq's defaults (the local
// server, the user's name as database), which is rarely what an unset
// DATABASE_URL meant.
func OpenDB(dsn string, p bulkhead.Policy, opts ...bulkhead.Option) (*sql.DB, *bulkhead.Gate, error) {
	if strings.TrimSpace(dsn) == "" {
		return nil, nil, fmt.Errorf("bulkhead: pgxgate: DSN %q is empty (an unset DATABASE_URL?), want a postgres:// URL or key=value settings", dsn)
	}
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

// connectError is pgx's connection failure in one line: pgx lists each
// attempt on a line of its own, the first often the refused TLS attempt
// of sslmode=prefer, which says nothing about the failure. errors.As
// still reaches pgx's *pgconn.ConnectError and the server's
// *pgconn.PgError.
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

// oneLine turns pgx's *pgconn.ConnectError into a connectError: the user
// and database, and the attempts that failed for a reason other than the
// server refusing TLS (all of them if each did).
func oneLine(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Config == nil {
		return err
	}
	var attempts []error
	if j, ok := errors.Unwrap(ce).(interface{ Unwrap() []error }); ok {
		attempts = j.Unwrap()
	} else if u := errors.Unwrap(ce); u != nil {
		attempts = []error{u}
	}
	var kept []string
	for _, a := range attempts {
		if s := a.Error(); !strings.Contains(s, "server refused TLS connection") && !slices.Contains(kept, s) {
			kept = append(kept, s)
		}
	}
	if len(kept) == 0 {
		for _, a := range attempts {
			if s := a.Error(); !slices.Contains(kept, s) {
				kept = append(kept, s)
			}
		}
	}
	msg := strings.NewReplacer("\n", " ", "\r", " ", "\t", " ").Replace(strings.Join(kept, "; "))
	return &connectError{
		msg: fmt.Sprintf("bulkhead: pgxgate: cannot connect as user=%s database=%s: %s", ce.Config.User, ce.Config.Database, msg),
		err: err,
	}
}

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
