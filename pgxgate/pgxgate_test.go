package pgxgate_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/httpgate"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// postgresURL returns the PostgreSQL server of the real-server tests:
// $BULKHEAD_TEST_DATABASE_URL, else the local one. Under -short the test
// is skipped.
func postgresURL(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped under -short")
	}
	if u := os.Getenv("BULKHEAD_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// pgConfig parses the server's URL with an application_name unique to the
// test and the variant, for counting its statements in pg_stat_activity.
func pgConfig(t *testing.T, variant string) (*pgx.ConnConfig, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	app := fmt.Sprintf("pgxgate%d_%s_%s", os.Getpid(), variant, t.Name())
	if len(app) > 63 {
		app = app[:63]
	}
	cfg.RuntimeParams["application_name"] = app
	return cfg, app
}

// openGate opens a gate with pgxgate.New on cfg; its *sql.DB is closed
// when the test ends.
func openGate(t *testing.T, cfg *pgx.ConnConfig, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	g, err := pgxgate.New(cfg, p, opts...)
	return gatetest.DB(t, g, err)
}

// openDefault opens a gate with bulkhead.New on stdlib.GetConnector(*cfg),
// keeping cfg's context handling; its *sql.DB is closed when the test ends.
func openDefault(t *testing.T, cfg *pgx.ConnConfig, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	return gatetest.Open(t, stdlib.GetConnector(*cfg), p, opts...)
}

// commitAnswered500 fails the test if the error of a Commit whose caller's
// context never ended is a context error, or if httpgate does not answer
// it 500 without Retry-After, as a failure that is not the caller's nor
// worth a retry.
func commitAnswered500(t *testing.T, ctx context.Context, err error) {
	t.Helper()
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || ctx.Err() != nil {
		t.Errorf("Commit: %v matches a context error (caller's context: %v), want none", err, ctx.Err())
	}
	if code, retry := httpgate.Status(err); code != 500 || retry != 0 {
		t.Errorf("httpgate.Status: %d, Retry-After %v; want 500 and none", code, retry)
	}
}

// monitor is an ungated connection that counts an application's active
// statements.
type monitor struct{ db *sql.DB }

func newMonitor(t *testing.T) *monitor {
	t.Helper()
	db, err := sql.Open("pgx", postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return &monitor{db}
}

// table creates the table name with the columns cols, dropped at the end
// of the test.
func (m *monitor) table(t *testing.T, name, cols string) {
	t.Helper()
	if _, err := m.db.Exec("CREATE TABLE " + name + " (" + cols + ")"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.db.Exec("DROP TABLE IF EXISTS " + name) })
}

func (m *monitor) active(t *testing.T, app string) int {
	t.Helper()
	return testkit.Scalar[int](t, context.Background(), m.db, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'
	        AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND query LIKE '%pg_sleep%'`, app)
}

// cancelTries runs n statements that the server would run for a minute,
// each on a *sql.Conn, cancels each once the server runs it, and polls
// pg_stat_activity once, right after the call returned. It returns in how
// many tries the server still ran the statement then while pgx kept the
// connection (it had its answer to the cancel request), in how many pgx
// closed the connection instead (the answer did not come within the
// cancel-request handler's DeadlineDelay: a busy machine, or pgx's
// default handling, which never waits), and how many server connections
// (backend pids) served the n statements.
func cancelTries(t *testing.T, m *monitor, db *sql.DB, app string, n int) (stillActive, closed, backends int) {
	t.Helper()
	pids := map[int]bool{}
	for i := range n {
		c := testkit.Conn(t, t.Context(), db)
		pids[testkit.Scalar[int](t, t.Context(), c, "SELECT pg_backend_pid()")] = true
		ctx, cancel := context.WithCancel(t.Context())
		done := testkit.GoExec(ctx, c, "SELECT pg_sleep(60)")
		testkit.Await(t, "the server runs the statement", func() bool { return m.active(t, app) == 1 })
		cancel()
		err := <-done
		if err == nil {
			t.Fatalf("try %d: the cancelled statement succeeded", i)
		}
		active := m.active(t, app) > 0
		var gone bool
		if err := c.Raw(func(dc any) error {
			c, err := bulkhead.Unwrap(dc)
			if err != nil {
				return err
			}
			gone = c.(*stdlib.Conn).Conn().IsClosed()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		switch {
		case gone:
			closed++
		case active:
			stillActive++
		}
		c.Close()
		// Before the next try, the server must be done with this one.
		testkit.Await(t, "the server stopped the statement", func() bool { return m.active(t, app) == 0 })
	}
	return stillActive, closed, len(pids)
}

// cancelCompare runs cancelTries through db, opened on the gate gated
// (its server connections named app) and, for comparison, through a gate on
// stdlib.GetConnector with pgx's default context handling.
func cancelCompare(t *testing.T, what string, gated *bulkhead.Gate, db *sql.DB, app string) {
	t.Helper()
	const tries = 10
	m := newMonitor(t)
	n, closed, conns := cancelTries(t, m, db, app, tries)

	cfg, appDefault := pgConfig(t, "dflt")
	gd, dbDefault := openDefault(t, cfg, gated.Policy())
	plain, plainClosed, plainConns := cancelTries(t, m, dbDefault, appDefault, tries)

	t.Logf("cancelled calls after which the statement still ran on the server / pgx closed the connection: %s %d and %d of %d (%d server connections used), stdlib.GetConnector default %d and %d of %d (%d server connections used)",
		what, n, closed, tries, conns, plain, plainClosed, tries, plainConns)
	if n != 0 {
		t.Fatalf("through %s, %d of %d cancelled statements still ran on the server after the call returned on a connection pgx kept", what, n, tries)
	}
	if closed == tries {
		t.Fatalf("through %s, pgx closed the connection after every cancelled statement: the cancel-request handler never had its answer", what)
	}
	if plainClosed != tries {
		t.Fatalf("with pgx's default handling, pgx kept the connection after %d of %d cancelled statements: the comparison shows nothing", tries-plainClosed, tries)
	}
	for _, gt := range []*bulkhead.Gate{gated, gd} {
		if s := gt.Stats(); s.Running != 0 || s.Waiting != 0 {
			t.Fatalf("permits not back: %+v", s)
		}
	}
}

var cancelPolicy = bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Second}

func TestWaitForServerMakesACancelledStatementReturnOnlyAfterTheServerStoppedIt(t *testing.T) {
	cfg, app := pgConfig(t, "wait")
	pgxgate.WaitForServer(cfg)
	g, db := openDefault(t, cfg, cancelPolicy)
	cancelCompare(t, "WaitForServer", g, db, app)
}

func TestNewMakesACancelledStatementReturnOnlyAfterTheServerStoppedIt(t *testing.T) {
	cfg, app := pgConfig(t, "new")
	g, db := openGate(t, cfg, cancelPolicy)
	cancelCompare(t, "pgxgate.New", g, db, app)
}

func TestOpenDBMakesACancelledStatementReturnOnlyAfterTheServerStoppedIt(t *testing.T) {
	u := postgresURL(t)
	app := fmt.Sprintf("pgxgate%d_open", os.Getpid())
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	db, g, err := pgxgate.OpenDB(u+sep+"application_name="+app, cancelPolicy)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cancelCompare(t, "pgxgate.OpenDB", g, db, app)
}

// countingHandler counts the cancellations handled by the handler a
// config sets itself.
type countingHandler struct {
	ctxwatch.Handler
	cancels *atomic.Int64
}

func (h countingHandler) HandleCancel(ctx context.Context) {
	h.cancels.Add(1)
	h.Handler.HandleCancel(ctx)
}

func TestNewKeepsTheContextHandlerTheConfigSetsAndLeavesTheConfigUnchanged(t *testing.T) {
	m := newMonitor(t)
	cfg, app := pgConfig(t, "own")
	var built, cancels atomic.Int64
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		built.Add(1)
		return countingHandler{&pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}, &cancels}
	}
	_, db := openGate(t, cfg, bulkhead.Policy{MaxConcurrent: 1})
	cancelTries(t, m, db, app, 1)
	if built.Load() == 0 || cancels.Load() != 1 {
		t.Fatalf("the config's own handler was built %d times and handled %d cancellations, want it in use (1 cancellation)", built.Load(), cancels.Load())
	}

	// New works on a copy: the caller's config is not changed.
	plain, _ := pgConfig(t, "copy")
	before := reflect.ValueOf(plain.BuildContextWatcherHandler).Pointer()
	if _, err := pgxgate.New(plain, bulkhead.Policy{MaxConcurrent: 1}); err != nil {
		t.Fatal(err)
	}
	if after := reflect.ValueOf(plain.BuildContextWatcherHandler).Pointer(); after != before {
		t.Fatal("pgxgate.New changed BuildContextWatcherHandler on the caller's config")
	}
}

func TestWaitForServerInstallsItsHandlerReplacingAnyOther(t *testing.T) {
	cfg, err := pgx.ParseConfig("postgres://u@127.0.0.1:5432/db")
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(*pgconn.PgConn) ctxwatch.Handler { return nil }
	pgxgate.WaitForServer(cfg)
	if h := cfg.BuildContextWatcherHandler(nil); h == nil {
		t.Fatal("after WaitForServer the handler is the one set before, want pgxgate's")
	}
}

func TestNewAndOpenDBReturnTheGatesPolicyError(t *testing.T) {
	cfg, err := pgx.ParseConfig("postgres://u@127.0.0.1:5432/db")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgxgate.New(cfg, bulkhead.Policy{}); !errors.Is(err, bulkhead.ErrInvalidPolicy) {
		t.Fatalf("New with B=0: %v, want ErrInvalidPolicy", err)
	}
	db, g, err := pgxgate.OpenDB("postgres://u@127.0.0.1:5432/db", bulkhead.Policy{MaxConcurrent: 1, MaxQueue: -1})
	if !errors.Is(err, bulkhead.ErrInvalidPolicy) || db != nil || g != nil {
		t.Fatalf("OpenDB with Q=-1: %v, %v, %v; want only ErrInvalidPolicy", db, g, err)
	}
}

func TestOpenDBWithABadDSNReturnsAOneLineErrorNamingTheDSNWithThePasswordHidden(t *testing.T) {
	const secret = "s3cr3t"
	for _, c := range []struct {
		name  string
		dsn   string
		shown string // the DSN as the error shows it
	}{
		{"URL, bad port", "postgres://alice:" + secret + "@127.0.0.1:notaport/test", "postgres://alice:xxxxx@127.0.0.1:notaport/test"},
		{"postgresql URL, bad sslmode", "postgresql://alice:" + secret + "@127.0.0.1:5432/test?sslmode=bogus", "postgresql://alice:xxxxx@127.0.0.1:5432/test?sslmode=bogus"},
		{"URL, password with a colon", "postgres://alice:a:" + secret + "@127.0.0.1:bad/test", "postgres://alice:xxxxx@127.0.0.1:bad/test"},
		{"URL without a password", "postgres://alice@127.0.0.1:bad/test", "postgres://alice@127.0.0.1:bad/test"},
		{"URL, password with an @", "postgres://alice:p@" + secret + "@127.0.0.1:bad/test", "postgres://alice:xxxxx@127.0.0.1:bad/test"},
		{"key=value", "host=127.0.0.1 port=notaport user=alice password=" + secret, "password=xxxxx"},
		{"key=value, quoted", "host=127.0.0.1 port=notaport password='" + secret + " x' user=alice", "password=xxxxx"},
		{"URL, password in the query", "postgres://alice@127.0.0.1:notaport/test?password=" + secret, "password=xxxxx"},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, g, err := pgxgate.OpenDB(c.dsn, bulkhead.Policy{MaxConcurrent: 1})
			if err == nil || db != nil || g != nil {
				t.Fatalf("OpenDB(%q) = %v, %v, %v; want only an error", c.dsn, db, g, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "bulkhead: DSN ") || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("%q: want one line starting with \"bulkhead: DSN \"", msg)
			}
			if strings.Contains(msg, secret) {
				t.Fatalf("%q shows the password", msg)
			}
			if !strings.Contains(msg, c.shown) || !strings.Contains(msg, "want a postgres:// URL or key=value settings") {
				t.Fatalf("%q does not name the DSN as %q and what is expected", msg, c.shown)
			}
			var pce *pgconn.ParseConfigError
			if !errors.As(err, &pce) {
				t.Fatalf("%v does not wrap pgx's parse error", err)
			}
		})
	}
}

func TestOpenDBWorksWithAGoodDSN(t *testing.T) {
	db, g, err := pgxgate.OpenDB(postgresURL(t), bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 3, QueueWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT 42").Scan(&n); err != nil || n != 42 {
		t.Fatalf("SELECT 42: %d, %v", n, err)
	}
	s := g.Stats()
	if s.Admitted != 1 || s.Running != 0 || s.MaxConcurrent != 2 || s.MaxQueue != 3 || s.OpenConns != 1 {
		t.Fatalf("stats %+v: want one admitted operation, the policy's limits, one connection", s)
	}
	if got := db.Stats().MaxOpenConnections; got != 0 {
		t.Fatalf("database/sql MaxOpenConnections = %d, want 0 (the gate bounds connections)", got)
	}
}

// An unset DATABASE_URL is an empty DSN: an error, never libpq's defaults.
func TestOpenDBWithAnEmptyDSNIsAnError(t *testing.T) {
	for _, dsn := range []string{"", "  "} {
		db, g, err := pgxgate.OpenDB(dsn, bulkhead.Policy{MaxConcurrent: 1})
		if err == nil || db != nil || g != nil {
			t.Fatalf("OpenDB(%q) = %v, %v, %v; want only an error", dsn, db, g, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "is empty") || !strings.Contains(msg, "want a postgres:// URL or key=value settings") {
			t.Fatalf("OpenDB(%q): %q, want it to name the empty DSN and what is expected", dsn, msg)
		}
	}
}

// A connection pgx cannot make is one line, whose first words are not the
// refused TLS attempt of sslmode=prefer; it counts as a dial error, and
// the server's error stays reachable.
func TestAFailedConnectionIsOneLineWithTheServersReasonAndIsCounted(t *testing.T) {
	u, err := url.Parse(postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("no_such_role_bulkhead")
	q := u.Query()
	q.Set("sslmode", "prefer") // the server has no TLS: pgx tries it first, then without
	u.RawQuery = q.Encode()
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	g, db := openGate(t, cfg, bulkhead.Policy{MaxConcurrent: 1})
	err = db.PingContext(t.Context())
	if err == nil {
		t.Fatal("ping as a role that does not exist succeeded")
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "\r\n") || !strings.HasPrefix(msg, "bulkhead: pgxgate: cannot connect as user=no_such_role_bulkhead") ||
		strings.Contains(msg, "tls error") || strings.Count(msg, "SQLSTATE 28000") != 1 {
		t.Fatalf("%q: want one line naming the user and the server's reason once, without a TLS attempt", msg)
	}
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	if !errors.As(err, &pe) || pe.Code != "28000" || !errors.As(err, &ce) {
		t.Fatalf("%v: want pgx's ConnectError and the server's 28000 reachable", err)
	}
	if _, err := db.ExecContext(t.Context(), "SELECT 1"); err == nil {
		t.Fatal("exec succeeded")
	}
	if s := g.Stats(); s.DialErrors != 2 || s.ConnectFailed != 1 {
		t.Fatalf("%+v: want both failed dials counted, the operation's as ConnectFailed", s)
	}
}

// Through pgx (sslmode=prefer: two attempts, both refused) a port whose
// listener was closed gives an error httpgate answers as a database that
// is down, 503 with Retry-After; a server that answers and refuses the
// role is reachable, and stays a 500.
func TestARefusedConnectionIsAnUnreachableDatabaseForHttpgate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "postgres://postgres@" + ln.Addr().String() + "/test?sslmode=prefer"
	ln.Close()
	u, err := url.Parse(postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("no_such_role_bulkhead")
	for _, c := range []struct {
		name, dsn string
		code      int
		after     time.Duration
	}{
		{"refused", refused, 503, httpgate.DefaultRetryAfter},
		{"unknown role", u.String(), 500, 0},
	} {
		db, _, err := pgxgate.OpenDB(c.dsn, bulkhead.Policy{MaxConcurrent: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = db.ExecContext(t.Context(), "SELECT 1")
		db.Close()
		if code, after := httpgate.Status(err); code != c.code || after != c.after {
			t.Errorf("%s: httpgate.Status(%v) = %d, %v; want %d, %v", c.name, err, code, after, c.code, c.after)
		}
	}
}
