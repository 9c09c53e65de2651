package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/ory/dockertest/v3"
	"go.uber.org/goleak"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// EnvDatabaseURL names the PostgreSQL server the real-server tests use.
const EnvDatabaseURL = "BULKHEAD_TEST_DATABASE_URL"

func TestMain(m *testing.M) {
	if name := os.Getenv(EnvFleetChild); name != "" {
		os.Exit(fleetChild(name))
	}
	code := m.Run()
	stopDocker()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	pgOnce   sync.Once
	pgURL    string
	pgErr    error
	dockerMu sync.Mutex
	dockerRs *dockertest.Resource
	dockerPl *dockertest.Pool
)

// postgresURL returns the URL of the PostgreSQL server for real-server
// tests: $BULKHEAD_TEST_DATABASE_URL, else a server on 127.0.0.1:5432,
// else one started with dockertest when a Docker engine answers. Without
// any, the test fails and says how to provide one. Under -short the test
// is skipped: go test -short runs the fake-driver tests alone.
func postgresURL(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped under -short")
	}
	pgOnce.Do(func() { pgURL, pgErr = findPostgres() })
	if pgErr != nil {
		t.Fatal(pgErr)
	}
	return pgURL
}

func findPostgres() (string, error) {
	if u, ok := os.LookupEnv(EnvDatabaseURL); ok {
		if u == "" {
			return "", fmt.Errorf("%s is set but empty, want a URL such as postgres://postgres@127.0.0.1:5432/test", EnvDatabaseURL)
		}
		return u, nil
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:5432", time.Second); err == nil {
		c.Close()
		return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", nil
	}
	u, err := startDocker()
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL: set %s to a postgres:// URL, run a server on 127.0.0.1:5432 (trust auth, database test), or start a Docker engine (%v)", EnvDatabaseURL, err)
	}
	return u, nil
}

func startDocker() (string, error) {
	dockerMu.Lock()
	defer dockerMu.Unlock()
	pool, err := dockertest.NewPool("")
	if err != nil {
		return "", err
	}
	if err := pool.Client.Ping(); err != nil {
		return "", fmt.Errorf("docker engine does not answer: %w", err)
	}
	rs, err := pool.Run("postgres", "16", []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"})
	if err != nil {
		return "", err
	}
	dockerPl, dockerRs = pool, rs
	u := "postgres://postgres@" + rs.GetHostPort("5432/tcp") + "/test?sslmode=disable"
	pool.MaxWait = time.Minute
	err = pool.Retry(func() error {
		db, err := sql.Open("pgx", u)
		if err != nil {
			return err
		}
		defer db.Close()
		return db.Ping()
	})
	return u, err
}

func stopDocker() {
	dockerMu.Lock()
	defer dockerMu.Unlock()
	if dockerRs != nil {
		_ = dockerPl.Purge(dockerRs)
	}
}

// appName returns an application_name unique to the test and the test
// process, for counting its connections and transactions in
// pg_stat_activity (at most 63 bytes, PostgreSQL's limit).
func appName(t testing.TB) string {
	n := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	if len(n) > 45 {
		n = n[len(n)-45:]
	}
	return fmt.Sprintf("bh%d_%s", os.Getpid(), n)
}

// pgConfig parses the test server's URL with the test's application_name.
func pgConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(postgresURL(t))
	if err != nil {
		t.Fatalf("parse %s: %v", EnvDatabaseURL, err)
	}
	cfg.RuntimeParams["application_name"] = appName(t)
	return cfg
}

// pgCancelRequests makes pgx answer a cancelled context by asking the
// server to cancel the statement and returning only after it did;
// deadline is a fallback for a server that does not answer.
func pgCancelRequests(cfg *pgx.ConnConfig, deadline time.Duration) *pgx.ConnConfig {
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: deadline}
	}
	return cfg
}

// openGated opens a gated *sql.DB on the test server with OpenDB's pool
// settings, closed at the end of the test.
func openGated(t testing.TB, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	return gateOn(t, stdlib.GetConnector(*pgConfig(t)), p, opts...)
}

// pgOpen is openGated with pgTestCtx: a context bounding the test, the
// gate, and its *sql.DB.
func pgOpen(t *testing.T, p bulkhead.Policy, opts ...bulkhead.Option) (context.Context, *bulkhead.Gate, *sql.DB) {
	t.Helper()
	ctx := pgTestCtx(t)
	g, db := openGated(t, p, opts...)
	return ctx, g, db
}

// plainDB opens a *sql.DB on c without a gate, closed at the end of the
// test.
func plainDB(t testing.TB, c driver.Connector) *sql.DB {
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db
}

// gateOn opens a gated *sql.DB on inner with OpenDB's pool settings,
// closed at the end of the test.
func gateOn(t testing.TB, inner driver.Connector, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	return gatetest.Open(t, inner, p, opts...)
}

// takeConn takes a *sql.Conn from db, closed at the end of the test.
func takeConn(t testing.TB, ctx context.Context, db *sql.DB) *sql.Conn {
	t.Helper()
	c := testkit.Conn(t, ctx, db)
	t.Cleanup(func() { c.Close() })
	return c
}

// takeConns takes n *sql.Conn from db at once; the caller closes them.
func takeConns(t testing.TB, ctx context.Context, db *sql.DB, n int) []*sql.Conn {
	t.Helper()
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("take connection %d of %d: %v", i+1, n, err)
		}
		conns[i] = c
	}
	return conns
}

// pingConns pings each of conns: behind a gate, a *sql.Conn gets a server
// connection when first used.
func pingConns(t testing.TB, ctx context.Context, conns []*sql.Conn) {
	t.Helper()
	for i, c := range conns {
		if err := c.PingContext(ctx); err != nil {
			t.Fatalf("ping connection %d of %d: %v", i+1, len(conns), err)
		}
	}
}

func closeConns(conns []*sql.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// monitor is a separate, ungated connection for reading pg_stat_activity.
type monitor struct {
	db  *sql.DB
	app string
}

func newMonitor(t testing.TB) *monitor {
	t.Helper()
	return &monitor{db: openURL(t, postgresURL(t), 1), app: appName(t)}
}

// openURL opens an ungated *sql.DB of at most maxOpen connections (0: no
// limit) on the PostgreSQL server at url, closed at the end of the test.
func openURL(t testing.TB, url string, maxOpen int) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxOpen)
	t.Cleanup(func() { db.Close() })
	return db
}

func (m *monitor) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	// pgx's session-reset ping ("-- ping") runs without a permit and shows
	// as an active transaction while it runs: it is not gated work.
	q := `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
	        AND backend_type = 'client backend' AND pid <> pg_backend_pid()
	        AND NOT (state = 'active' AND query = '-- ping')` + where
	if err := m.db.QueryRowContext(context.Background(), q, m.app).Scan(&n); err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	return n
}

// Transactions counts the transactions open on the server for the test
// at one instant: those that began before this statement did (pgSnapshot
// says why).
func (m *monitor) Transactions(t testing.TB) int {
	return m.count(t, " AND xact_start < statement_timestamp()")
}

// Connections counts the test's server connections.
func (m *monitor) Connections(t testing.TB) int { return m.count(t, "") }

// pollServer calls look again and again in a goroutine of its own until
// look returns false or the returned function is called; that function
// returns once the goroutine has ended.
func pollServer(look func() bool) (stop func()) {
	return testkit.Repeat(1, func(int) bool { return look() })
}

// serverPeak polls q on db, in a goroutine of its own, until the returned
// function is called; q answers a count and a text. That function returns
// the largest count seen, the text at that look, and the number of looks.
// A look that fails ends the polling, failing the test unless ctx ended.
func serverPeak(t testing.TB, ctx context.Context, db *sql.DB, q string, args ...any) (stop func() (peak, looks int, seen string)) {
	var peak, looks int
	var seen string
	end := pollServer(func() bool {
		var n int
		var detail string
		if err := db.QueryRowContext(ctx, q, args...).Scan(&n, &detail); err != nil {
			if ctx.Err() == nil {
				t.Error(err)
			}
			return false
		}
		looks++
		if n > peak {
			peak, seen = n, detail
		}
		return true
	})
	return func() (int, int, string) {
		end()
		return peak, looks, seen
	}
}

// goExec runs e.ExecContext(ctx, query, args...) in a goroutine of its
// own and sends its error on the returned channel (testkit.GoExec).
func goExec(e interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, ctx context.Context, query string, args ...any) chan error {
	return testkit.GoExec(ctx, e, query, args...)
}

// awaitState waits until cond holds, polling state without sleeping
// (testkit.Await).
func awaitState(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Await(t, what, cond)
}

// queryColumn returns the single column of query's rows on q (a *sql.DB,
// *sql.Conn or *sql.Tx), failing the test on an error.
func queryColumn[T any](t testing.TB, ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) []T {
	t.Helper()
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// prepare prepares query on db, failing the test if it cannot; the
// statement is closed at the end of the test.
func prepare(t testing.TB, ctx context.Context, db *sql.DB, query string) *sql.Stmt {
	t.Helper()
	stmt, err := db.PrepareContext(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stmt.Close() })
	return stmt
}

// queryOne returns the single value query answers on q (a *sql.DB,
// *sql.Conn or *sql.Tx), failing the test on an error.
func queryOne[T any](t testing.TB, ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, query string, args ...any) T {
	t.Helper()
	var v T
	if err := q.QueryRowContext(ctx, query, args...).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// must fails the test now if err is not nil.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
