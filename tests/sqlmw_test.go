package tests

// github.com/ngrok/sqlmw, the usual interceptor wrapper for database/sql,
// checked against pgx: the facts of shared/notes/database-sql.md that made
// bulkhead write its own wrapper, then the gate stacked with an sqlmw
// interceptor in both orders.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/ngrok/sqlmw"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// sqlmwDSN is the test server's DSN with the test's application_name:
// sqlmw opens connections from a DSN string only.
func sqlmwDSN(t *testing.T) string {
	t.Helper()
	dsn := postgresURL(t)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("parse %s: %v", EnvDatabaseURL, err)
		}
		q := u.Query()
		q.Set("application_name", appName(t))
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " application_name=" + appName(t)
}

// sqlmwOpen opens a *sql.DB on pgx wrapped by sqlmw with intr, the way
// sqlmw is meant to be used: a wrapped driver and a DSN.
func sqlmwOpen(t *testing.T, intr sqlmw.Interceptor) *sql.DB {
	t.Helper()
	c, err := sqlmw.Driver(stdlib.GetDefaultDriver(), intr).(driver.DriverContext).OpenConnector(sqlmwDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	return plainDB(t, c)
}

// sqlmwLog is an interceptor that logs every statement it sees, with its
// outcome.
type sqlmwLog struct {
	sqlmw.NullInterceptor
	mu   sync.Mutex
	seen []string
}

func (l *sqlmwLog) record(what string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		what += " -> " + pgKind(err)
	}
	l.seen = append(l.seen, what)
}

func (l *sqlmwLog) log() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

func (l *sqlmwLog) ConnBeginTx(ctx context.Context, c driver.ConnBeginTx, opts driver.TxOptions) (context.Context, driver.Tx, error) {
	tx, err := c.BeginTx(ctx, opts)
	l.record("begin", err)
	return ctx, tx, err
}

func (l *sqlmwLog) ConnExecContext(ctx context.Context, c driver.ExecerContext, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.ExecContext(ctx, q, args)
	l.record("exec "+q, err)
	return r, err
}

func (l *sqlmwLog) ConnQueryContext(ctx context.Context, c driver.QueryerContext, q string, args []driver.NamedValue) (context.Context, driver.Rows, error) {
	r, err := c.QueryContext(ctx, q, args)
	l.record("query "+q, err)
	return ctx, r, err
}

func (l *sqlmwLog) StmtExecContext(ctx context.Context, s driver.StmtExecContext, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := s.ExecContext(ctx, args)
	l.record("stmt exec "+q, err)
	return r, err
}

func (l *sqlmwLog) StmtQueryContext(ctx context.Context, s driver.StmtQueryContext, q string, args []driver.NamedValue) (context.Context, driver.Rows, error) {
	r, err := s.QueryContext(ctx, args)
	l.record("stmt query "+q, err)
	return ctx, r, err
}

// What sqlmw claims: its Conn implements driver.Validator whatever the
// driver does (IsValid true when the inner conn lacks it). database/sql keeps
// a connection after a transaction rolled back on cancellation only when
// the conn has SessionResetter and Validator: pgx has no Validator, so a
// cancelled transaction's (dead) pgx connection is discarded; behind sqlmw
// it is kept in the pool, dead, until its next use fails ResetSession.
// The gate claims Validator too (it must see connections come back), but
// keeps database/sql's rule for the driver's own connections: behind it,
// the logical connection is kept and the dead pgx connection closed.
func TestSqlmwClaimsValidatorSoDatabaseSQLKeepsACancelledTransactionsDeadConnection(t *testing.T) {
	cases := []struct {
		name          string
		open          func(t *testing.T) (*sql.DB, func() int) // the DB, and its server connections now
		validator     bool
		openAfterward int
	}{
		{"pgx", func(t *testing.T) (*sql.DB, func() int) {
			db := plainDB(t, stdlib.GetConnector(*pgConfig(t)))
			return db, func() int { return db.Stats().OpenConnections }
		}, false, 0},
		{"gate over pgx", func(t *testing.T) (*sql.DB, func() int) {
			g, db := openGated(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0})
			return db, func() int { return g.Stats().OpenConns }
		}, true, 0},
		{"sqlmw over pgx", func(t *testing.T) (*sql.DB, func() int) {
			db := sqlmwOpen(t, sqlmw.NullInterceptor{})
			return db, func() int { return db.Stats().OpenConnections }
		}, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := pgTestCtx(t)
			db, serverConns := c.open(t)
			conn := testkit.Conn(t, ctx, db)
			var validator bool
			must(t, conn.Raw(func(dc any) error { _, validator = dc.(driver.Validator); return nil }))
			conn.Close()
			if validator != c.validator {
				t.Errorf("the conn database/sql sees implements driver.Validator: %v, want %v", validator, c.validator)
			}

			// The transaction's context ends 50 ms into its statement, however
			// long BEGIN took on a busy machine.
			txCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			tx := testkit.Begin(t, txCtx, db)
			time.AfterFunc(50*time.Millisecond, cancel)
			if _, err := tx.ExecContext(txCtx, "SELECT pg_sleep(1)"); !errors.Is(err, context.Canceled) {
				t.Fatalf("statement whose transaction's context was cancelled: got %v, want context.Canceled", err)
			}
			// database/sql rolls back in its own goroutine; wait for it.
			awaitState(t, "the cancelled transaction's connection is released", func() bool { return db.Stats().InUse == 0 })
			if n := serverConns(); n != c.openAfterward {
				t.Errorf("server connections kept after the cancelled transaction: %d, want %d", n, c.openAfterward)
			}
			// A kept dead connection fails ResetSession at its next use and
			// is replaced: the caller does not see it.
			var v int
			if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&v); err != nil || v != 1 {
				t.Errorf("next operation: got %d, %v; want 1, nil", v, err)
			}
		})
	}
}

// What Raw yields behind sqlmw: its unexported wrapper, with no way to
// reach pgx (bulkhead.Unwrap cannot peel it either), so CopyFrom, LISTEN
// and the other pgx-only calls are out of reach.
func TestSqlmwRawYieldsItsOwnWrapperSoPgxIsUnreachable(t *testing.T) {
	ctx := pgTestCtx(t)
	db := sqlmwOpen(t, sqlmw.NullInterceptor{})
	conn := takeConn(t, ctx, db)
	err := conn.Raw(func(dc any) error {
		if got := fmt.Sprintf("%T", dc); got != "sqlmw.wrappedConn" {
			return fmt.Errorf("Raw handed %s, want sqlmw.wrappedConn", got)
		}
		u, err := bulkhead.Unwrap(dc)
		if err != nil {
			return fmt.Errorf("bulkhead.Unwrap(%T): %v, want the value back as it is", dc, err)
		}
		if got := fmt.Sprintf("%T", u); got != "sqlmw.wrappedConn" {
			return fmt.Errorf("bulkhead.Unwrap(%T) peeled sqlmw's wrapper to %s, want it back as it is", dc, got)
		}
		if _, ok := u.(*stdlib.Conn); ok {
			return errors.New("bulkhead.Unwrap reached *stdlib.Conn through sqlmw's wrapper")
		}
		if _, ok := dc.(interface{ Unwrap() driver.Conn }); ok {
			return errors.New("sqlmw's conn has an Unwrap method now: the note is out of date")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// What sqlmw wraps: a driver.Driver, opened with a DSN string. A
// driver.Connector value carrying settings that no DSN expresses (pgx's
// AfterConnect, a ConnConfig built in code) cannot be wrapped as it is:
// through sqlmw's driver the settings are lost. (bulkhead.New takes the
// connector itself.)
func TestSqlmwWrapsADriverAndADSNSoAConnectorsSettingsAreLost(t *testing.T) {
	ctx := pgTestCtx(t)
	var afterConnect atomic.Int64
	cfg := pgConfig(t)
	cfg.RuntimeParams["application_name"] = appName(t) + "_code"
	connector := stdlib.GetConnector(*cfg, stdlib.OptionAfterConnect(func(context.Context, *pgx.Conn) error {
		afterConnect.Add(1)
		return nil
	}))

	appNameOf := func(db *sql.DB) string {
		t.Helper()
		return queryOne[string](t, ctx, db, "SHOW application_name")
	}

	direct := sql.OpenDB(connector)
	defer direct.Close()
	if got := appNameOf(direct); got != appName(t)+"_code" || afterConnect.Load() != 1 {
		t.Fatalf("the connector itself: application_name %q and %d AfterConnect calls, want %q and 1", got, afterConnect.Load(), appName(t)+"_code")
	}

	// All sqlmw can wrap is the connector's driver (pgx's global one),
	// opened with a DSN.
	wrapped, err := sqlmw.Driver(connector.Driver(), sqlmw.NullInterceptor{}).(driver.DriverContext).OpenConnector(sqlmwDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	viaSqlmw := sql.OpenDB(wrapped)
	defer viaSqlmw.Close()
	if got := appNameOf(viaSqlmw); got != appName(t) || afterConnect.Load() != 1 {
		t.Errorf("through sqlmw: application_name %q and %d AfterConnect calls, want the DSN's %q and still 1: the connector's settings are not used", got, afterConnect.Load(), appName(t))
	}
}

// The order that works: the gate outside, sqlmw inside (db -> gate ->
// sqlmw -> pgx). The gate wraps a connector made of sqlmw's driver and a
// DSN; the interceptor sees every statement that ran, and nothing of an
// operation the gate rejected, neither a rejection at the connector (no
// server connection) nor one at the execution permit.
func TestTheGateOutsideSqlmwRejectsBeforeTheInterceptorSeesAnything(t *testing.T) {
	ctx := pgTestCtx(t)
	var l sqlmwLog
	// sqliteConnector adapts any driver and DSN to a driver.Connector.
	g, db := gateOn(t, sqliteConnector{sqlmw.Driver(stdlib.GetDefaultDriver(), &l), sqlmwDSN(t)},
		bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond})
	pgWarm(t, ctx, db, 2)

	queryOne[int](t, ctx, db, "SELECT 1")
	tx := pgBegin(t, ctx, db)
	testkit.Exec(t, ctx, tx, "SELECT 2")
	seen := len(l.log())

	// B is busy and the queue wait is 0: rejected by the gate's conn, on
	// the idle connection, before sqlmw is called.
	if _, err := db.ExecContext(ctx, "SELECT 'rejected at the permit'"); !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("operation while B is busy: got %v, want ErrQueueTimeout", err)
	}
	// B runs and Q waits: rejected at admission.
	waiting := goExec(db, bulkhead.WithQueueWait(ctx, time.Minute), "SELECT 'waits, then runs'")
	awaitState(t, "an operation waits for the execution permit", func() bool { return g.Stats().Waiting == 1 })
	if _, err := db.ExecContext(ctx, "SELECT 'rejected at admission'"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("operation while B runs and Q waits: got %v, want ErrAdmissionFull", err)
	}
	if got := l.log(); len(got) != seen {
		t.Errorf("the interceptor saw rejected operations: %q", got[seen:])
	}
	txCommit(t, tx)
	must(t, <-waiting)
	testkit.Exec(t, ctx, db, "SELECT 3")
	want := []string{"query SELECT 1", "begin", "exec SELECT 2", "exec SELECT 'waits, then runs'", "exec SELECT 3"}
	if got := l.log(); !slices.Equal(got, want) {
		t.Errorf("the interceptor saw %q, want %q", got, want)
	}
	s := g.Stats()
	if s.RejectedTimeout != 1 || s.RejectedFull != 1 {
		t.Errorf("RejectedTimeout=%d RejectedFull=%d, want 1 and 1", s.RejectedTimeout, s.RejectedFull)
	}
}

// The other order, sqlmw outside the gate (db -> sqlmw -> gate -> pgx), runs
// too, through the gate's Driver() (whose OpenConnector returns the gate,
// keeping the connector's settings), but: the interceptor sees rejected
// operations (as errors), the pool settings of OpenDB must be set by hand,
// db.Close does not reach Gate.Close (sqlmw's connector is no io.Closer),
// and Raw ends at sqlmw's wrapper. The gate outside is the order to use.
func TestSqlmwOutsideTheGateSeesRejectionsAsErrors(t *testing.T) {
	ctx := pgTestCtx(t)
	var l sqlmwLog
	g, err := bulkhead.New(stdlib.GetConnector(*pgConfig(t)), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sqlmw.Driver(g.Driver(), &l).(driver.DriverContext).OpenConnector("") // the gate's driver opens the gate itself
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxIdleConns(2)
	t.Cleanup(func() { db.Close() })
	pgWarm(t, ctx, db, 2)

	tx := pgBegin(t, ctx, db)
	_, err = db.ExecContext(ctx, "SELECT 'rejected'")
	if !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("operation while B is busy: got %v, want ErrQueueTimeout", err)
	}
	want := []string{"begin", "exec SELECT 'rejected' -> queue timeout"}
	if got := l.log(); !slices.Equal(got, want) {
		t.Errorf("the interceptor saw %q, want %q", got, want)
	}
	txCommit(t, tx)
	if s := g.Stats(); s.RejectedTimeout != 1 || s.Admitted != 1 {
		t.Errorf("RejectedTimeout=%d Admitted=%d, want 1 and 1", s.RejectedTimeout, s.Admitted)
	}
}
