package tests

// Integration tests: the gate under GORM and sqlc-generated code, and the
// driver-neutral part of its contract on PostgreSQL (pgx), MariaDB
// (go-sql-driver/mysql) and SQLite (modernc.org/sqlite).

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/stdlib"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
	"github.com/dbbulkhead/bulkhead/tests/internal/sqlcdb"
)

// EnvMySQLDSN names the MariaDB (or MySQL) server of the driver tests, as a
// go-sql-driver/mysql DSN.
const EnvMySQLDSN = "BULKHEAD_TEST_MYSQL_DSN"

const defaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test"

// igTracker records the gate's admissions by kind and the most permits
// held at once.
type igTracker struct {
	mu            sync.Mutex
	admits        map[bulkhead.Kind]int
	held, maxHeld int
}

func (k *igTracker) events() bulkhead.Events {
	return bulkhead.Events{
		OnAdmit: func(e bulkhead.Event) {
			k.mu.Lock()
			defer k.mu.Unlock()
			if k.admits == nil {
				k.admits = map[bulkhead.Kind]int{}
			}
			k.admits[e.Kind]++
			k.held++
			k.maxHeld = max(k.maxHeld, k.held)
		},
		OnRelease: func(bulkhead.Event) { k.mu.Lock(); k.held--; k.mu.Unlock() },
	}
}

// kinds returns the admissions so far as "transaction=1 statement=2 query=0".
func (k *igTracker) kinds() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return fmt.Sprintf("transaction=%d statement=%d query=%d",
		k.admits[bulkhead.KindTx], k.admits[bulkhead.KindExec], k.admits[bulkhead.KindQuery])
}

func (k *igTracker) most() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.maxHeld
}

// igGated opens a gated *sql.DB on inner with the tracker's events,
// closed at the end of the test.
func igGated(t *testing.T, inner driver.Connector, p bulkhead.Policy, k *igTracker) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	return gateOn(t, inner, p, bulkhead.WithEvents(k.events()))
}

var uniqueSeq atomic.Int64

// uniqueName returns a name unique to this process and call, for tables
// and schemas.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), uniqueSeq.Add(1))
}

// tempTable creates a table of columns unique to the test on db, and
// drops it at the end of the test.
func tempTable(t testing.TB, db *sql.DB, columns string) string {
	t.Helper()
	name := uniqueName("bh_t")
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE "+name+" ("+columns+")"); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := db.ExecContext(context.Background(), "DROP TABLE "+name); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

// igPGSchema creates a PostgreSQL schema holding the given DDL, on an
// ungated connection, drops it at the end of the test, and returns a
// gate-ready connector whose sessions use it (search_path) and carry the
// test's application_name.
func igPGSchema(t *testing.T, ddl string) driver.Connector {
	t.Helper()
	setup := openURL(t, postgresURL(t), 0)
	schema := uniqueName("bh_ig")
	if _, err := setup.ExecContext(t.Context(), "CREATE SCHEMA "+schema+"; SET search_path TO "+schema+"; "+ddl); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		if _, err := setup.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	cfg := pgConfig(t)
	cfg.RuntimeParams["search_path"] = schema
	return stdlib.GetConnector(*cfg)
}

// ---- GORM ----

type igOrder struct {
	ID   int64
	Item string
	Qty  int
}

func (igOrder) TableName() string { return "orders" }

const igOrdersDDL = "CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL, qty int NOT NULL)"

// igGORM opens GORM on a gated *sql.DB, the way the README shows.
func igGORM(t *testing.T, p bulkhead.Policy) (*bulkhead.Gate, *gorm.DB, *igTracker) {
	t.Helper()
	k := &igTracker{}
	g, db := igGated(t, igPGSchema(t, igOrdersDDL), p, k)
	gdb, err := gorm.Open(gormpg.New(gormpg.Config{Conn: db}), &gorm.Config{
		Logger: logger.Default.LogMode(logger.Silent),
	})
	if err != nil {
		t.Fatal(err)
	}
	return g, gdb, k
}

func TestGORMTransactionHoldsExactlyOnePermitForItsWholeSpan(t *testing.T) {
	g, gdb, k := igGORM(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second})
	m := newMonitor(t)
	ctx := pgTestCtx(t)
	before := g.Stats()

	var running []int
	err := gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		running = append(running, g.Stats().Running)
		if err := tx.Create(&igOrder{Item: "tea", Qty: 2}).Error; err != nil {
			return err
		}
		running = append(running, g.Stats().Running)
		if err := tx.Create(&igOrder{Item: "cups", Qty: 6}).Error; err != nil {
			return err
		}
		var o igOrder
		if err := tx.Where("item = ?", "tea").First(&o).Error; err != nil {
			return err
		}
		if err := tx.Model(&o).Update("qty", 3).Error; err != nil {
			return err
		}
		running = append(running, g.Stats().Running)
		if n := m.Transactions(t); n != 1 {
			t.Errorf("%d transactions open on the server inside GORM's Transaction, want 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(running) != "[1 1 1]" {
		t.Errorf("Running inside the transaction: %v, want 1 at every step", running)
	}
	after := g.Stats()
	if d := after.Admitted - before.Admitted; d != 1 || after.Running != 0 {
		t.Errorf("the transaction was admitted %d times and left %d running, want once and 0", d, after.Running)
	}
	if got := k.kinds(); got != "transaction=1 statement=0 query=0" {
		t.Errorf("admissions %s, want the transaction alone", got)
	}
	var total int64
	if err := gdb.Model(&igOrder{}).Select("sum(qty)").Scan(&total).Error; err != nil || total != 9 {
		t.Errorf("committed quantity %d (%v), want 9", total, err)
	}
}

func TestGORMReturnsARejectionThatMatchesErrRejected(t *testing.T) {
	// The article's demonstration: B=1, Q=0.
	g, gdb, _ := igGORM(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0})
	ctx := pgTestCtx(t)
	held := gdb.WithContext(ctx).Begin()
	if held.Error != nil {
		t.Fatal(held.Error)
	}
	t.Cleanup(func() { held.Rollback() })
	must(t, held.Create(&igOrder{Item: "held", Qty: 1}).Error)

	err := gdb.WithContext(ctx).Create(&igOrder{Item: "tea", Qty: 1}).Error
	if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Errorf("Create while the permit is held: %v, want ErrRejected and ErrAdmissionFull", err)
	}
	var o igOrder
	if err := gdb.WithContext(ctx).First(&o).Error; !errors.Is(err, bulkhead.ErrRejected) {
		t.Errorf("First while the permit is held: %v, want ErrRejected", err)
	}
	called := false
	err = gdb.WithContext(ctx).Transaction(func(*gorm.DB) error { called = true; return nil })
	if !errors.Is(err, bulkhead.ErrRejected) || called {
		t.Errorf("Transaction while the permit is held: %v, function called %v; want ErrRejected, not called", err, called)
	}

	must(t, held.Commit().Error)
	if err := gdb.WithContext(ctx).Create(&igOrder{Item: "tea", Qty: 1}).Error; err != nil {
		t.Errorf("Create once the permit is back: %v", err)
	}
	if s := g.Stats(); s.Running != 0 || s.RejectedFull != 3 {
		t.Errorf("stats %+v, want nothing running and 3 rejections", s)
	}
}

func TestGORMDefaultTransactionAroundCreateIsOneGatedOperation(t *testing.T) {
	g, gdb, k := igGORM(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second})
	m := newMonitor(t)
	ctx := pgTestCtx(t)

	// Observe the gate from inside GORM's default transaction, right after
	// the INSERT ran and before GORM commits.
	var inside []string
	err := gdb.Callback().Create().After("gorm:create").Before("gorm:commit_or_rollback_transaction").Register("bulkhead_test:observe", func(tx *gorm.DB) {
		inside = append(inside, fmt.Sprintf("running=%d server_txs=%d", g.Stats().Running, m.Transactions(t)))
	})
	if err != nil {
		t.Fatal(err)
	}

	before := g.Stats().Admitted
	must(t, gdb.WithContext(ctx).Create(&igOrder{Item: "tea", Qty: 2}).Error)
	if d := g.Stats().Admitted - before; d != 1 {
		t.Errorf("Create was admitted %d times, want once", d)
	}
	if got := k.kinds(); got != "transaction=1 statement=0 query=0" {
		t.Errorf("admissions %s, want one transaction: GORM's default transaction", got)
	}

	// Without the default transaction, the INSERT ... RETURNING is one
	// autocommit query.
	before = g.Stats().Admitted
	if err := gdb.WithContext(ctx).Session(&gorm.Session{SkipDefaultTransaction: true}).
		Create(&igOrder{Item: "cups", Qty: 6}).Error; err != nil {
		t.Fatal(err)
	}
	if d := g.Stats().Admitted - before; d != 1 {
		t.Errorf("Create without the default transaction was admitted %d times, want once", d)
	}
	if got := k.kinds(); got != "transaction=1 statement=0 query=1" {
		t.Errorf("admissions %s, want one more: the autocommit query", got)
	}
	// Inside the default transaction: its permit and its server
	// transaction. Without it: the query's rows are closed by then.
	want := "[running=1 server_txs=1 running=0 server_txs=0]"
	if fmt.Sprint(inside) != want {
		t.Errorf("inside Create: %v, want %s", inside, want)
	}
	if s := g.Stats(); s.Running != 0 {
		t.Errorf("%d operations still running, want 0", s.Running)
	}
}

// ---- sqlc ----

const igAccountsDDL = "CREATE TABLE accounts (id bigserial PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL DEFAULT 0)"

func TestSqlcQueriesTakeOnePermitEachAndGiveItBack(t *testing.T) {
	k := &igTracker{}
	g, db := igGated(t, igPGSchema(t, igAccountsDDL), bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second}, k)
	q := sqlcdb.New(db)
	ctx := pgTestCtx(t)

	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if s := g.Stats(); s.Running != 0 {
			t.Fatalf("after %s: %d running, want 0: the permit was not given back", what, s.Running)
		}
	}
	alice, err := q.CreateAccount(ctx, sqlcdb.CreateAccountParams{Owner: "alice", Balance: 10})
	step("CreateAccount", err)
	_, err = q.CreateAccount(ctx, sqlcdb.CreateAccountParams{Owner: "bob", Balance: 5})
	step("CreateAccount", err)
	n, err := q.AddToBalance(ctx, sqlcdb.AddToBalanceParams{ID: alice.ID, Amount: 7})
	step("AddToBalance", err)
	got, err := q.GetAccount(ctx, alice.ID)
	step("GetAccount", err)
	list, err := q.ListAccounts(ctx)
	step("ListAccounts", err)
	total, err := q.TotalBalance(ctx)
	step("TotalBalance", err)

	if n != 1 || got.Balance != 17 || len(list) != 2 || total != 22 {
		t.Errorf("rows %d, alice %+v, %d accounts, total %d; want 1, balance 17, 2, 22", n, got, len(list), total)
	}
	if s := g.Stats(); s.Admitted != 6 {
		t.Errorf("%d admitted, want 6: one per generated call", s.Admitted)
	}
	if got := k.kinds(); got != "transaction=0 statement=1 query=5" {
		t.Errorf("admissions %s, want :exec* as a statement and :one/:many as queries", got)
	}
}

func TestSqlcWithTxRunsUnderTheTransactionsOnePermit(t *testing.T) {
	k := &igTracker{}
	g, db := igGated(t, igPGSchema(t, igAccountsDDL), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0}, k)
	q := sqlcdb.New(db)
	ctx := pgTestCtx(t)

	transfer := func(commit bool) {
		t.Helper()
		tx := pgBegin(t, ctx, db)
		qtx := q.WithTx(tx)
		a, err := qtx.CreateAccount(ctx, sqlcdb.CreateAccountParams{Owner: "alice", Balance: 10})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := qtx.AddToBalance(ctx, sqlcdb.AddToBalanceParams{ID: a.ID, Amount: -3}); err != nil {
			t.Fatal(err)
		}
		if _, err := qtx.ListAccounts(ctx); err != nil {
			t.Fatal(err)
		}
		if s := g.Stats(); s.Running != 1 {
			t.Errorf("%d running inside the transaction, want 1", s.Running)
		}
		// B=1, Q=0: outside the transaction, the same Queries are rejected.
		if _, err := q.TotalBalance(ctx); !errors.Is(err, bulkhead.ErrRejected) {
			t.Errorf("TotalBalance outside the open transaction: %v, want ErrRejected", err)
		}
		if commit {
			txCommit(t, tx)
		} else {
			txRollback(t, tx)
		}
	}
	transfer(true)
	transfer(false)

	total, err := q.TotalBalance(ctx)
	if err != nil || total != 7 {
		t.Errorf("total %d (%v), want 7: the committed transfer alone", total, err)
	}
	if s := g.Stats(); s.Running != 0 || s.Admitted != 3 || s.RejectedFull != 2 {
		t.Errorf("stats %+v, want 0 running, 3 admitted (two transactions, one query), 2 rejected", s)
	}
	if got := k.kinds(); got != "transaction=2 statement=0 query=1" {
		t.Errorf("admissions %s, want the two transactions and the last query", got)
	}
}

// ---- The driver-neutral contract on every driver ----

// igDriver is a database and driver the contract runs on.
type igDriver struct {
	name string
	// open returns a gate-ready connector and an ungated *sql.DB on the
	// same database, both closed at the end of the test.
	open func(t *testing.T) (driver.Connector, *sql.DB)
	// ph is the placeholder of the n-th argument.
	ph func(n int) string
}

func igDrivers() []igDriver {
	dollar := func(n int) string { return fmt.Sprintf("$%d", n) }
	question := func(int) string { return "?" }
	return []igDriver{
		{"postgresql-pgx", igOpenPG, dollar},
		{"mariadb", igOpenMySQL(false), question},
		{"mariadb-interpolateParams", igOpenMySQL(true), question},
		{"sqlite-modernc", igOpenSQLite, question},
	}
}

func igOpenPG(t *testing.T) (driver.Connector, *sql.DB) {
	c := stdlib.GetConnector(*pgConfig(t))
	return c, plainDB(t, c)
}

// igOpenMySQL opens the MariaDB server of $BULKHEAD_TEST_MYSQL_DSN, by
// default root@tcp(127.0.0.1:3306)/test, with interpolateParams set as
// given. It skips under -short and fails, saying how to start one, when
// the server does not answer.
func igOpenMySQL(interpolate bool) func(t *testing.T) (driver.Connector, *sql.DB) {
	return func(t *testing.T) (driver.Connector, *sql.DB) {
		return openMySQL(t, func(cfg *mysql.Config) { cfg.InterpolateParams = interpolate })
	}
}

// openMySQL returns a connector on the test's MariaDB server, its DSN's
// config changed by set, and an ungated *sql.DB on it, both closed at the
// end of the test (see igOpenMySQL).
func openMySQL(t *testing.T, set func(*mysql.Config)) (driver.Connector, *sql.DB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs MariaDB; skipped under -short")
	}
	dsn := defaultMySQLDSN
	if v, ok := os.LookupEnv(EnvMySQLDSN); ok {
		dsn = v
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("%s=%q: %v, want a go-sql-driver/mysql DSN such as %s", EnvMySQLDSN, dsn, err, defaultMySQLDSN)
	}
	set(cfg)
	if c, err := net.DialTimeout(cfg.Net, cfg.Addr, 2*time.Second); err != nil {
		t.Fatalf("no MariaDB at %s (%v): start one with `service mariadb start` "+
			"(root without password, database test; .ci/run starts it in CI), or set %s to a DSN", cfg.Addr, err, EnvMySQLDSN)
	} else {
		c.Close()
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, plainDB(t, c)
}

// igOpenSQLite opens a SQLite file in the test's temporary directory
// through sqliteConnector (integrations_example_test.go), the README's
// adapter.
func igOpenSQLite(t *testing.T) (driver.Connector, *sql.DB) {
	c := sqliteConnector{d: &sqlite.Driver{}, dsn: filepath.Join(t.TempDir(), "test.db")}
	return c, plainDB(t, c)
}

// igRows fails the test unless table, read through setup, holds want
// rows.
func igRows(t *testing.T, setup *sql.DB, table string, want int) {
	t.Helper()
	var n int
	if err := setup.QueryRowContext(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	if n != want {
		t.Errorf("%d rows, want %d", n, want)
	}
}

// TestEveryDriverKeepsTheDriverNeutralContract runs the part of the
// contract that holds for any driver on PostgreSQL through pgx, MariaDB
// through go-sql-driver/mysql (with and without interpolateParams) and a
// SQLite file through modernc.org/sqlite.
//
// go-sql-driver/mysql without interpolateParams answers ExecContext and
// QueryContext with arguments by driver.ErrSkip; the gate then runs
// database/sql's fallback (prepare, then Stmt) itself under the permit it
// holds, so one call is admitted once, as on every other driver.
func TestEveryDriverKeepsTheDriverNeutralContract(t *testing.T) {
	for _, d := range igDrivers() {
		t.Run(d.name, func(t *testing.T) {
			inner, setup := d.open(t)
			insert := func(table string) string { return "INSERT INTO " + table + " (v) VALUES (" + d.ph(1) + ")" }
			// open gives a subtest its context, a table (v int) of its own
			// and a gate on the driver under p, tracked by k.
			open := func(t *testing.T, p bulkhead.Policy, k *igTracker) (context.Context, string, *bulkhead.Gate, *sql.DB) {
				t.Helper()
				ctx, table := pgTestCtx(t), tempTable(t, setup, "v int")
				g, db := igGated(t, inner, p, k)
				return ctx, table, g, db
			}

			t.Run("B=1 Q=0 rejects a second operation while a transaction holds the permit", func(t *testing.T) {
				ctx, table, g, db := open(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0}, &igTracker{})
				tx := pgBegin(t, ctx, db)
				testkit.Exec(t, ctx, tx, insert(table), 1)
				_, err := db.ExecContext(ctx, insert(table), 2)
				if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, bulkhead.ErrAdmissionFull) || errors.Is(err, driver.ErrBadConn) {
					t.Errorf("second operation: %v, want ErrRejected and ErrAdmissionFull, not ErrBadConn", err)
				}
				var one int
				if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); !errors.Is(err, bulkhead.ErrRejected) {
					t.Errorf("query while the permit is held: %v, want ErrRejected", err)
				}
				txCommit(t, tx)
				if _, err := db.ExecContext(ctx, insert(table), 2); err != nil {
					t.Errorf("once the permit is back: %v", err)
				}
				if s := g.Stats(); s.Running != 0 || s.OpenConns > 1 {
					t.Errorf("stats %+v, want 0 running, at most 1 connection", s)
				}
				igRows(t, setup, table, 2)
			})

			t.Run("commit keeps, rollback discards, and both give the permit back", func(t *testing.T) {
				k := &igTracker{}
				ctx, table, g, db := open(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 0}, k)
				for _, commit := range []bool{true, false} {
					tx := pgBegin(t, ctx, db)
					for v := range 3 {
						testkit.Exec(t, ctx, tx, insert(table), v)
					}
					if s := g.Stats(); s.Running != 1 {
						t.Errorf("%d running inside the transaction, want 1", s.Running)
					}
					if commit {
						txCommit(t, tx)
					} else {
						txRollback(t, tx)
					}
					if s := g.Stats(); s.Running != 0 {
						t.Errorf("%d running after commit=%v, want 0", s.Running, commit)
					}
				}
				igRows(t, setup, table, 3)
				if got := k.kinds(); got != "transaction=2 statement=0 query=0" {
					t.Errorf("admissions %s, want the two transactions alone", got)
				}
			})

			t.Run("an operation beyond B+Q is rejected at once while one waits", func(t *testing.T) {
				ctx, table, g, db := open(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Minute}, &igTracker{})
				tx := pgBegin(t, ctx, db)
				testkit.Exec(t, ctx, tx, insert(table), 1)
				waited := goExec(db, ctx, insert(table), 2)
				awaitState(t, "the second operation waits", func() bool { return g.Stats().Waiting == 1 })
				if _, err := db.ExecContext(ctx, insert(table), 3); !errors.Is(err, bulkhead.ErrAdmissionFull) {
					t.Errorf("third operation: %v, want ErrAdmissionFull", err)
				}
				// The waiting and the rejected operations hold no server
				// connection: the transaction's is the only one.
				if s := g.Stats(); s.OpenConns != 1 || s.IdleConns != 0 || s.Dials != 1 {
					t.Errorf("stats %+v while one waits and one was rejected, want 1 server connection (the transaction's), none idle, 1 dial", s)
				}
				txCommit(t, tx)
				if err := <-waited; err != nil {
					t.Errorf("the operation that waited: %v", err)
				}
				if s := g.Stats(); s.Running != 0 || s.Waiting != 0 || s.OpenConns > 2 {
					t.Errorf("stats %+v, want 0 running and waiting, at most 2 connections", s)
				}
				igRows(t, setup, table, 2)
			})

			t.Run("an admitted operation is rejected when the queue wait ends", func(t *testing.T) {
				ctx, table, g, db := open(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 10 * time.Millisecond}, &igTracker{})
				tx := pgBegin(t, ctx, db)
				_, err := db.ExecContext(ctx, insert(table), 2)
				var rej *bulkhead.RejectedError
				if !errors.Is(err, bulkhead.ErrQueueTimeout) || !errors.As(err, &rej) || rej.Waited <= 0 {
					t.Errorf("operation behind the transaction: %v, want a queue timeout after a wait", err)
				}
				txCommit(t, tx)
				if s := g.Stats(); s.Running != 0 || s.RejectedTimeout != 1 {
					t.Errorf("stats %+v, want 0 running, 1 queue timeout", s)
				}
				igRows(t, setup, table, 0)
			})

			t.Run("statements with arguments hold one permit at a time", func(t *testing.T) {
				k := &igTracker{}
				ctx, table, g, db := open(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0}, k)
				testkit.Exec(t, ctx, db, insert(table), 5)
				var v int
				if err := db.QueryRowContext(ctx, "SELECT v FROM "+table+" WHERE v = "+d.ph(1), 5).Scan(&v); err != nil || v != 5 {
					t.Fatalf("query: %d, %v", v, err)
				}
				if got, want := k.kinds(), "transaction=0 statement=1 query=1"; got != want {
					t.Errorf("admissions %s, want %s", got, want)
				}
				// A statement prepared by the caller: its executions are gated,
				// its preparation is not.
				stmt := prepare(t, ctx, db, insert(table))
				before := g.Stats().Admitted
				if _, err := stmt.ExecContext(ctx, 6); err != nil {
					t.Fatal(err)
				}
				if d := g.Stats().Admitted - before; d != 1 {
					t.Errorf("prepared statement's Exec admitted %d times, want once", d)
				}
				if n := k.most(); n != 1 {
					t.Errorf("at most %d permits held at once, want 1", n)
				}
				if s := g.Stats(); s.Running != 0 {
					t.Errorf("%d running, want 0", s.Running)
				}
			})
		})
	}
}

// TestSQLiteSecondWriterIsBusyWhileItHoldsItsPermit documents SQLite's
// single writer behind a gate with B=2: the gate lets two transactions
// run, and the second one's write fails at once with SQLITE_BUSY (no busy
// timeout is set) while it holds its permit. With
// _pragma=busy_timeout(ms) the write would instead wait inside the
// driver, still holding the permit. The permit comes back when the
// transaction ends either way.
func TestSQLiteSecondWriterIsBusyWhileItHoldsItsPermit(t *testing.T) {
	inner, setup := igOpenSQLite(t)
	table := tempTable(t, setup, "v int")
	ctx := pgTestCtx(t)
	g, db := igGated(t, inner, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 0}, &igTracker{})
	insert := "INSERT INTO " + table + " (v) VALUES (?)"

	tx1 := pgBegin(t, ctx, db)
	testkit.Exec(t, ctx, tx1, insert, 1)
	tx2 := pgBegin(t, ctx, db)
	_, err := tx2.ExecContext(ctx, insert, 2)
	var se *sqlite.Error
	if !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_BUSY {
		t.Errorf("second writer: %v, want SQLITE_BUSY", err)
	}
	if s := g.Stats(); s.Running != 2 {
		t.Errorf("%d running while both transactions are open, want 2", s.Running)
	}
	txRollback(t, tx2)
	txCommit(t, tx1)
	if s := g.Stats(); s.Running != 0 {
		t.Errorf("%d running after both ended, want 0", s.Running)
	}
	igRows(t, setup, table, 1)
}

func TestGORMWithPreparedStatementsGatesEachExecutionNotThePreparation(t *testing.T) {
	k := &igTracker{}
	g, db := igGated(t, igPGSchema(t, igOrdersDDL), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0}, k)
	gdb, err := gorm.Open(gormpg.New(gormpg.Config{Conn: db}), &gorm.Config{
		Logger:                 logger.Default.LogMode(logger.Silent),
		PrepareStmt:            true,
		SkipDefaultTransaction: true,
		// GORM's statement cache starts a cleanup goroutine that never
		// exits (gorm internal/lru, "done channel is never closed") unless
		// the TTL is its "no eviction" value of 10 years: goleak would see it.
		PrepareStmtTTL: 10 * 365 * 24 * time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := pgTestCtx(t)
	for i := range 3 {
		must(t, gdb.WithContext(ctx).Create(&igOrder{Item: "tea", Qty: i}).Error)
	}
	err = gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for i := range 3 {
			if err := tx.Create(&igOrder{Item: "cups", Qty: i}).Error; err != nil {
				return err
			}
		}
		// B=1, Q=0: the cached statement outside the transaction is rejected.
		if err := gdb.WithContext(ctx).Create(&igOrder{Item: "spoon"}).Error; !errors.Is(err, bulkhead.ErrRejected) {
			t.Errorf("prepared Create outside the open transaction: %v, want ErrRejected", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := k.kinds(); got != "transaction=1 statement=0 query=3" {
		t.Errorf("admissions %s, want one per autocommit Create and one for the transaction", got)
	}
	if s := g.Stats(); s.Running != 0 || k.most() != 1 {
		t.Errorf("%d running, at most %d held; want 0 and 1", s.Running, k.most())
	}
}

// TestErrSkipFallbackIsOneGatedOperation is what go-sql-driver/mysql
// without interpolateParams does to every Exec and Query with arguments,
// on the fake driver: ExecContext answers driver.ErrSkip, and database/sql
// prepares the statement and runs it through Stmt. While the gate gives
// the permit back between the two attempts and admits the second one
// anew, the one call is admitted twice (Admitted, OnAdmit, the metrics),
// and another operation can take the permit in between: the call, already
// admitted once, is then rejected.
func TestErrSkipFallbackIsOneGatedOperation(t *testing.T) {
	fc := fakedb.New()
	k := &igTracker{}
	// B=1, Q=1 and a 1ns queue wait: an operation that finds the permit taken
	// is rejected at once.
	g, db := igGated(t, fc, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond}, k)
	ctx := pgTestCtx(t)

	fc.FailNext(fakedb.OpExec, 1, driver.ErrSkip)
	testkit.Exec(t, ctx, db, "UPDATE t SET v = ?", 1)
	if got := k.kinds(); got != "transaction=0 statement=1 query=0" {
		t.Errorf("one Exec answered by ErrSkip: admissions %s, want one statement", got)
	}

	// Another operation begins while the fallback prepares: it must wait
	// for the Exec's permit, not take it from under it.
	var other *sql.Tx
	var otherErr error
	fc.SetHook(func(_ context.Context, op fakedb.Op, _ string) error {
		if op == fakedb.OpPrepare && other == nil && otherErr == nil {
			other, otherErr = db.BeginTx(ctx, nil)
		}
		return nil
	})
	defer fc.SetHook(nil)
	fc.FailNext(fakedb.OpExec, 1, driver.ErrSkip)
	_, err := db.ExecContext(ctx, "UPDATE t SET v = ?", 2)
	if err != nil {
		t.Errorf("Exec whose fallback met another operation: %v, want success", err)
	}
	if !errors.Is(otherErr, bulkhead.ErrQueueTimeout) {
		t.Errorf("the operation begun during the fallback: %v, want a queue timeout", otherErr)
	}
	if other != nil {
		other.Rollback()
	}
	if s := g.Stats(); s.Running != 0 || s.Admitted != 2 {
		t.Errorf("stats %+v, want 0 running and 2 admitted: one per Exec", s)
	}
}
