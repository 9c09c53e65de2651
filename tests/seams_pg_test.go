package tests

// The seams between database/sql's pool and the gate's server
// connections, on real servers: what the fake-driver tests of the root
// package (seams_test.go) show, checked on PostgreSQL through pgx and on
// MariaDB through go-sql-driver/mysql, and pgx's own stdlib tests whose
// outcome depends on those seams, run plain and through the gate side by
// side.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

// ---- helpers (prefixed seam… to stay clear of other test files) ----

// seamCtx bounds a whole test: nothing in it can hang the package.
func seamCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// seamPgx returns the pgx connection behind what (*sql.Conn).Raw hands
// over, plain or through the gate (and pgxgate).
func seamPgx(dc any) (*pgx.Conn, error) {
	u, err := bulkhead.Unwrap(dc)
	if err != nil {
		return nil, err
	}
	sc, ok := u.(*stdlib.Conn)
	if !ok {
		return nil, fmt.Errorf("bulkhead.Unwrap(%T) is %T, want *stdlib.Conn", dc, u)
	}
	return sc.Conn(), nil
}

// seamPID returns the backend pid of c's server connection, through Raw.
func seamPID(t *testing.T, c *sql.Conn) uint32 {
	t.Helper()
	var pid uint32
	if err := c.Raw(func(dc any) error {
		pc, err := seamPgx(dc)
		if err != nil {
			return err
		}
		pid = pc.PgConn().PID()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return pid
}

// seamPgConfig is the test's pgx config with an application_name of its
// own, suffix appended, so that each database a test opens can be told
// apart in pg_stat_activity.
func seamPgConfig(t *testing.T, suffix string) *pgx.ConnConfig {
	t.Helper()
	cfg := pgConfig(t)
	cfg.RuntimeParams["application_name"] = appName(t) + suffix
	return cfg
}

var seamPolicy = bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Minute}

// seamOpen opens a *sql.DB on inner, through a gate under seamPolicy when
// gated (its gate returned) or plain, closed at the end of the test.
func seamOpen(t *testing.T, inner driver.Connector, gated bool) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	if gated {
		return gateOn(t, inner, seamPolicy)
	}
	return nil, plainDB(t, inner)
}

// seamJoin makes a member of the fleet name on inner, its loop's interval
// an hour (the test steps the rounds with Sync), its coordination session
// on the test server with an application_name of its own. Its gate is
// closed at the end of the test.
func seamJoin(t *testing.T, name string, inner driver.Connector, p bulkhead.Policy) *fleet.Member {
	t.Helper()
	return fleetMember(t, name, inner, p, fleet.Coordinator(stdlib.GetConnector(*seamPgConfig(t, "_fc"))))
}

func seamFleetName() string {
	return fmt.Sprintf("s%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
}

// ---- a refused prepared statement sends nothing ----

// database/sql prepares a *sql.Stmt again on each connection it runs it
// on, before the execution reaches the gate. Once database/sql has closed
// the connection the statement was prepared on (no idle connection kept),
// an execution (Exec or Query) that admission refuses is refused at once,
// with B running and Q waiting, and pgx sees neither a dial nor a Prepare
// for it, nor the server a connection; the next execution, admitted,
// dials a server connection and prepares the statement there.
func TestAPreparedStatementRefusedAtAdmissionOnPostgreSQLDialsAndPreparesNothing(t *testing.T) {
	for _, q := range []int{0, 1} {
		t.Run(fmt.Sprintf("B=1,Q=%d", q), func(t *testing.T) {
			ctx := seamCtx(t)
			spy := &relSpyConnector{inner: stdlib.GetConnector(*pgConfig(t))}
			// The queue wait is an hour and no context ends: an execution
			// that waited instead of being refused would hang the test.
			g, db := gateOn(t, spy, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: q, QueueWait: time.Hour})
			db.SetMaxIdleConns(0)
			mon := newMonitor(t)

			st := prepare(t, ctx, db, "SELECT $1::int")
			if n, p := spy.open(), spy.prepares.Load(); n != 0 || p != 1 {
				t.Fatalf("after Prepare with no idle connection kept: %d server connections open, %d Prepare sent; want 0 and 1", n, p)
			}

			// B running (a transaction) and Q waiting: admission is full.
			tx := pgBegin(t, ctx, db)
			testkit.Exec(t, ctx, tx, "SELECT 1")
			waiting := make(chan error, 1)
			if q == 1 {
				go func() {
					_, err := db.ExecContext(ctx, "SELECT 2")
					waiting <- err
				}()
				awaitState(t, "an operation waits for the execution permit", func() bool { return g.Stats().Waiting == 1 })
			}
			awaitState(t, "the gate and the server have the transaction's connection alone", func() bool {
				return g.Stats().OpenConns == 1 && mon.Connections(t) == 1
			})
			dials, prepares, full := spy.dials.Load(), spy.prepares.Load(), g.Stats().RejectedFull

			_, err := st.ExecContext(ctx, 2)
			if !errors.Is(err, bulkhead.ErrAdmissionFull) || errors.Is(err, bulkhead.ErrQueueTimeout) {
				t.Fatalf("the statement's Exec with admission full: %v, want ErrAdmissionFull", err)
			}
			var v int
			err = st.QueryRowContext(ctx, 2).Scan(&v)
			if !errors.Is(err, bulkhead.ErrAdmissionFull) || errors.Is(err, bulkhead.ErrQueueTimeout) {
				t.Fatalf("the statement's Query with admission full: %v, want ErrAdmissionFull", err)
			}
			if d, p := spy.dials.Load()-dials, spy.prepares.Load()-prepares; d != 0 || p != 0 {
				t.Fatalf("the refused Exec and Query dialed %d server connections and sent %d Prepare, want none", d, p)
			}
			if n := mon.Connections(t); n != 1 {
				t.Fatalf("after the refused executions the server shows %d connections of the test, want 1 (the transaction's)", n)
			}
			if s := g.Stats(); s.RejectedFull != full+2 || s.Running != 1 || s.Waiting != q {
				t.Fatalf("after the refused executions: RejectedFull %d (was %d), Running %d, Waiting %d; want two more, 1, %d", s.RejectedFull, full, s.Running, s.Waiting, q)
			}

			txCommit(t, tx)
			if q == 1 {
				if err := <-waiting; err != nil {
					t.Fatalf("the waiting operation: %v", err)
				}
			}
			// Admitted, the same execution dials a server connection and
			// prepares the statement on it: what the refused one was
			// spared. (A dial started for the waiter, which got the
			// transaction's server connection instead, may still be on
			// its way: it is closed when it ends, no connection being
			// left to keep it.)
			awaitState(t, "no server connection left", func() bool { return g.Stats().OpenConns == 0 })
			// The gate stops counting a connection before the driver's
			// Close returns.
			awaitState(t, "no server connection open in the driver", func() bool { return spy.open() == 0 })
			dials, prepares = spy.dials.Load(), spy.prepares.Load()
			if _, err := st.ExecContext(ctx, 3); err != nil {
				t.Fatalf("the admitted execution: %v", err)
			}
			if d, p := spy.dials.Load()-dials, spy.prepares.Load()-prepares; d != 1 || p != 1 {
				t.Fatalf("the admitted execution dialed %d server connections and sent %d Prepare, want 1 and 1", d, p)
			}
			pgExpectIdle(t, g)
		})
	}
}

// ---- pgx's stdlib tests, plain and through the gate ----

// As pgx's TestConnMultiplePrepareAndDeallocate: two Prepares of one text,
// then each statement closed in turn; pg_prepared_statements, read on the
// same server connection, counts at each step what it counts without the
// gate (pgx shares one server statement per text: 1, 1, then 0), on a
// *sql.Conn and on the *sql.DB as pgx's test does.
func TestTwoPreparesOfOneTextLeaveAsManyServerStatementsThroughTheGateAsWithout(t *testing.T) {
	const text = "select 42"
	type querier interface {
		PrepareContext(context.Context, string) (*sql.Stmt, error)
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}
	steps := func(t *testing.T, q querier) []int64 {
		t.Helper()
		ctx := seamCtx(t)
		count := func() int64 {
			t.Helper()
			return queryOne[int64](t, ctx, q, "select count(*) from pg_prepared_statements where statement = $1", text)
		}
		st1, err := q.PrepareContext(ctx, text)
		if err != nil {
			t.Fatal(err)
		}
		st2, err := q.PrepareContext(ctx, text)
		if err != nil {
			t.Fatal(err)
		}
		out := []int64{count()}
		must(t, st1.Close())
		out = append(out, count())
		must(t, st2.Close())
		return append(out, count())
	}
	want := []int64{1, 1, 0}
	for _, on := range []string{"sql.Conn", "sql.DB"} {
		t.Run(on, func(t *testing.T) {
			var counts [2][]int64 // plain, gated
			for i, inner := range []driver.Connector{
				stdlib.GetConnector(*seamPgConfig(t, "_p")),
				stdlib.GetConnector(*seamPgConfig(t, "_g")),
			} {
				_, db := seamOpen(t, inner, i == 1)
				if on == "sql.DB" {
					counts[i] = steps(t, db)
					continue
				}
				c := testkit.Conn(t, seamCtx(t), db)
				counts[i] = steps(t, c)
				must(t, c.Close())
			}
			if !slices.Equal(counts[0], want) {
				t.Fatalf("plain: server statements after two Prepares, after closing one, after closing both: %v, want %v", counts[0], want)
			}
			if !slices.Equal(counts[1], counts[0]) {
				t.Fatalf("through the gate: server statements after two Prepares, after closing one, after closing both: %v, plain %v", counts[1], counts[0])
			}
		})
	}
}

// As pgx's TestOptionBeforeAfterConnect: with no idle connection kept,
// each of two Execs dials a server connection of its own, so pgx runs
// BeforeConnect and AfterConnect once per Exec, as without the gate.
func TestPgxBeforeAndAfterConnectRunOncePerExecWithNoIdleConnectionAsWithoutTheGate(t *testing.T) {
	ctx := seamCtx(t)
	var got [2][2]int64 // plain, gated: BeforeConnect, AfterConnect
	for i := range got {
		var before, after atomic.Int64
		inner := stdlib.GetConnector(*seamPgConfig(t, fmt.Sprintf("_%d", i)),
			stdlib.OptionBeforeConnect(func(context.Context, *pgx.ConnConfig) error { before.Add(1); return nil }),
			stdlib.OptionAfterConnect(func(context.Context, *pgx.Conn) error { after.Add(1); return nil }))
		_, db := seamOpen(t, inner, i == 1)
		db.SetMaxIdleConns(0)
		for range 2 {
			testkit.Exec(t, ctx, db, "select 1")
		}
		got[i] = [2]int64{before.Load(), after.Load()}
	}
	if got[0] != [2]int64{2, 2} {
		t.Fatalf("plain: BeforeConnect and AfterConnect ran %v times for two Execs, want [2 2]", got[0])
	}
	if got[1] != got[0] {
		t.Fatalf("through the gate: BeforeConnect and AfterConnect ran %v times for two Execs, plain %v", got[1], got[0])
	}
}

// As pgx's TestCheckIdleConn: three *sql.Conn, each on a backend of its
// own, given back to database/sql's pool (which keeps two of them, its
// default), their idle backends terminated by the server; the next Ping
// succeeds, on a new backend, and leaves as many open connections and
// server connections as without the gate (one: the dead ones are gone),
// then as many once two *sql.Conn are taken at once. (pgx's own test, run
// by tests/outside, uses the *sql.Conn one after the other and pauses a
// second before the Ping, which pgx's ResetSession needs before it pings
// a connection again: through the gate those *sql.Conn share one backend.)
func TestAPingAfterTheIdleBackendsWereKilledLeavesAsManyConnectionsAsWithoutTheGate(t *testing.T) {
	type counts struct {
		openAfterPing   int // db.Stats().OpenConnections after the Ping
		serverAfterPing int // backends of the test after the Ping
		sessions        int // the gate's server connections after the Ping (plain: openAfterPing)
		openAfterUse    int // db.Stats().OpenConnections after two *sql.Conn at once
	}
	run := func(t *testing.T, gated bool) counts {
		ctx := seamCtx(t)
		g, db := seamOpen(t, stdlib.GetConnector(*pgConfig(t)), gated)
		db.SetMaxIdleConns(2) // database/sql's default, which pgx's test runs with
		conns := takeConns(t, ctx, db, 3)
		if n := db.Stats().OpenConnections; n != 3 {
			t.Fatalf("three *sql.Conn taken: %d open connections, want 3", n)
		}
		var pids []uint32
		for _, c := range conns {
			pids = append(pids, seamPID(t, c))
		}
		if distinct := slices.Compact(slices.Sorted(slices.Values(pids))); len(distinct) != 3 {
			t.Fatalf("three *sql.Conn in use on backends %v, want 3 backends", pids)
		}
		for _, c := range conns {
			must(t, c.Close())
		}
		mon := newMonitor(t)
		var killed int
		if err := mon.db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
			FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, mon.app).Scan(&killed); err != nil {
			t.Fatal(err)
		}
		want := 2 // idle backends: database/sql keeps two connections
		if killed < want {
			t.Fatalf("terminated %d idle backends of %s (used: %v), want at least %d", killed, mon.app, pids, want)
		}
		awaitState(t, "the terminated backends are gone", func() bool { return mon.Connections(t) == 0 })

		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("Ping after the idle backends were terminated: %v", err)
		}
		var out counts
		out.openAfterPing = db.Stats().OpenConnections
		out.serverAfterPing = mon.Connections(t)
		out.sessions = out.openAfterPing
		if g != nil {
			out.sessions = g.Stats().OpenConns
		}
		// Two at once: database/sql hands out both idle connections.
		var two []*sql.Conn
		for range 2 {
			c := takeConn(t, ctx, db)
			if pid := seamPID(t, c); slices.Contains(pids, pid) {
				t.Fatalf("after the Ping, a *sql.Conn is on backend %d, one of the terminated %v", pid, pids)
			}
			two = append(two, c)
		}
		for _, c := range two {
			must(t, c.Close())
		}
		out.openAfterUse = db.Stats().OpenConnections
		if g != nil {
			if s := g.Stats().OpenConns; s != out.openAfterUse {
				t.Fatalf("after two *sql.Conn at once: %d server connections, database/sql counts %d open", s, out.openAfterUse)
			}
		}
		return out
	}
	want := counts{openAfterPing: 1, serverAfterPing: 1, sessions: 1, openAfterUse: 2}
	var plain, gated counts
	t.Run("plain", func(t *testing.T) { plain = run(t, false) })
	t.Run("gated", func(t *testing.T) { gated = run(t, true) })
	if t.Failed() {
		return
	}
	if plain != want {
		t.Fatalf("plain: %+v, want %+v", plain, want)
	}
	if gated != plain {
		t.Fatalf("through the gate: %+v, plain %+v", gated, plain)
	}
}

// ---- a fleet member's *sql.Conn keeps its server connection ----

// A fleet tags each server connection with its member's id (a shared
// advisory lock) within the first operation that needs it. A *sql.Conn
// whose server connection LISTENs (set up through Raw, on the pgx
// connection) then runs a statement cut off by its context, while the
// tag's lock or the statement's is held elsewhere: whichever statement
// the cancellation hits, the same *sql.Conn afterwards either answers on
// the same backend, still listening, or fails; it never answers from
// another backend. With pgxgate, whose cancellation leaves the connection
// usable, it answers on the same backend.
func TestASQLConnOfAFleetMemberNeverMovesToAnotherBackendAfterAStatementCutOffByItsContext(t *testing.T) {
	for _, arm := range []struct {
		name    string
		inner   func(*pgx.ConnConfig) driver.Connector
		usable  bool // the connection survives a cancellation
		comment string
	}{
		{"pgxgate", func(c *pgx.ConnConfig) driver.Connector { return pgxgate.Connector(c) }, true, "pgxgate's cancel request stops the statement and keeps the connection"},
		{"stdlib", func(c *pgx.ConnConfig) driver.Connector { return stdlib.GetConnector(*c) }, false, "pgx closes the connection of a cancelled statement"},
	} {
		t.Run(arm.name, func(t *testing.T) {
			ctx := seamCtx(t)
			mon := newMonitor(t)
			name := seamFleetName()
			m := seamJoin(t, name, arm.inner(pgConfig(t)), bulkhead.Policy{MaxConcurrent: 1, QueueWait: time.Minute})
			fleetSync(t, ctx, m)
			if b := m.Gate().Stats().MaxConcurrent; b != 1 {
				t.Fatalf("the only member of a fleet of T=1 runs on B=%d, want 1", b)
			}
			db := m.Gate().OpenDB()

			// Closed last: Raw may be waiting for the tag's lock until the
			// holder below gives it up.
			conn := testkit.Conn(t, ctx, db)
			defer conn.Close()

			// Another session holds the member's tag lock (Conns, id)
			// exclusively, and the lock the statement will wait for.
			keys := fleet.LockKeys(name)
			stmtKey := int64(os.Getpid())<<32 | time.Now().UnixNano()&0xffffffff
			holder, err := plainDB(t, stdlib.GetConnector(*seamPgConfig(t, "_h"))).Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()
			defer holder.ExecContext(context.Background(), "SELECT pg_advisory_unlock_all()")
			if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4), pg_advisory_lock($3::int8)",
				keys.Conns, m.Stats().ID, stmtKey); err != nil {
				t.Fatal(err)
			}
			waitingOn := func(where string, arg any) func() bool {
				return func() bool {
					var n int
					q := `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
						WHERE l.locktype = 'advisory' AND NOT l.granted AND ` + where
					must(t, mon.db.QueryRowContext(ctx, q, arg).Scan(&n))
					return n > 0
				}
			}

			channel := fmt.Sprintf("seam_%d_%d", os.Getpid(), time.Now().UnixNano())
			var pid uint32
			rawDone := make(chan error, 1)
			go func() {
				rawDone <- conn.Raw(func(dc any) error {
					pc, err := seamPgx(dc)
					if err != nil {
						return err
					}
					if _, err := pc.Exec(ctx, "LISTEN "+channel); err != nil {
						return err
					}
					pid = pc.PgConn().PID()
					return nil
				})
			}()
			// Raw takes no permit: a gate that tags the connection as Raw
			// binds it waits for the tag's lock here; then the lock is
			// given up, and the tag is done.
			var rawErr error
			rawEnded := false
			tagWaits := waitingOn("a.application_name = $1", mon.app)
			awaitState(t, "Raw has run, or waits for the tag's lock", func() bool {
				select {
				case rawErr = <-rawDone:
					rawEnded = true
					return true
				default:
					return tagWaits()
				}
			})
			if !rawEnded {
				t.Logf("the tag waits for its lock under Raw: lock given up")
				testkit.Exec(t, ctx, holder, "SELECT pg_advisory_unlock($1::int4, $2::int4)", keys.Conns, m.Stats().ID)
				rawErr = <-rawDone
			}
			if rawErr != nil {
				t.Fatalf("LISTEN through Raw: %v", rawErr)
			}
			if rawEnded {
				t.Logf("Raw ran without the tag: the tag's lock stays held")
			}

			// A statement on the same *sql.Conn, cut off by its context
			// while it (or the tag before it) waits for a lock.
			stmtCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			execDone := goExec(conn, stmtCtx, "SELECT pg_advisory_xact_lock($1::int8)", stmtKey)
			awaitState(t, "the statement waits for a lock on the listening backend", waitingOn("l.pid = $1", int64(pid)))
			cancel()
			if err := <-execDone; !errors.Is(err, context.Canceled) {
				t.Fatalf("the statement cut off by its context: %v, want context.Canceled", err)
			}
			testkit.Exec(t, ctx, holder, "SELECT pg_advisory_unlock_all()")

			// The same *sql.Conn: on the listening backend, or failing.
			var answered int
			for i := range 2 {
				var got int64
				var listening int
				err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid(),
					(SELECT count(*) FROM pg_listening_channels() c WHERE c = $1::text)`, channel).Scan(&got, &listening)
				if err != nil {
					t.Logf("statement %d after the cut-off one: %v (%s)", i+1, err, arm.comment)
					continue
				}
				answered++
				if got != int64(pid) || listening != 1 {
					t.Fatalf("statement %d after the cut-off one answered from backend %d listening to %d channel(s), want backend %d, listening: the *sql.Conn moved silently",
						i+1, got, listening, pid)
				}
			}
			if arm.usable && answered != 2 {
				t.Fatalf("%d of 2 statements after the cut-off one answered, want 2: %s", answered, arm.comment)
			}
			if !arm.usable && answered != 0 {
				t.Fatalf("%d of 2 statements after the cut-off one answered, want 0: %s", answered, arm.comment)
			}
		})
	}
}

// ---- a member without share answers Ping ----

// Ping takes no permit: a fleet member whose share is 0 (T=1, and the
// other member holds the slot) rejects every operation, but its Ping
// reaches the server and succeeds while the database is up.
func TestAFleetMemberWithNoShareAnswersPing(t *testing.T) {
	ctx := seamCtx(t)
	name := seamFleetName()
	p := bulkhead.Policy{MaxConcurrent: 1, QueueWait: time.Minute}
	first := seamJoin(t, name, stdlib.GetConnector(*seamPgConfig(t, "_1")), p)
	fleetSync(t, ctx, first)
	if s := first.Stats(); s.Share != 1 {
		t.Fatalf("the first member of a fleet of T=1 has share %d, want 1", s.Share)
	}
	cfg := seamPgConfig(t, "_2")
	second := seamJoin(t, name, stdlib.GetConnector(*cfg), p)
	fleetSync(t, ctx, second)
	if s, b := second.Stats(), second.Gate().Stats().MaxConcurrent; s.Share != 0 || b != 0 || s.Instances != 2 {
		t.Fatalf("a second member joining a full fleet of T=1: share %d, B=%d, %d instances; want 0, 0, 2", s.Share, b, s.Instances)
	}
	db := second.Gate().OpenDB()
	if _, err := db.ExecContext(ctx, "SELECT 1"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("an operation on the member without share: %v, want ErrAdmissionFull", err)
	}
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("Ping on the member without share: %v, want nil", err)
	}
	if s := second.Gate().Stats(); s.Dials < 1 || s.OpenConns < 1 || s.Admitted != 0 {
		t.Fatalf("after the Ping: %d dials, %d server connections, %d admitted; want a dial, a connection, nothing admitted", s.Dials, s.OpenConns, s.Admitted)
	}
	var n int
	if err := newMonitor(t).db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`,
		cfg.RuntimeParams["application_name"]).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the server shows %d connections of the member without share after its Ping, want 1", n)
	}
}

// ---- Raw on MariaDB hands a legacy Execer and Queryer ----

// seamMySQL opens a go-sql-driver/mysql connector on the test's MariaDB
// server with multiStatements, and a plain *sql.DB on it for set-up.
func seamMySQL(t *testing.T) (driver.Connector, *sql.DB) {
	t.Helper()
	return openMySQL(t, func(cfg *mysql.Config) { cfg.MultiStatements = true })
}

// As go-sql-driver/mysql's TestExecMultipleResults and
// TestQueryMultipleResults: what (*sql.Conn).Raw hands over is a
// driver.Execer and a driver.Queryer, as the driver's connection is, and
// through them a multi-statement Exec reports each statement's result, a
// multi-statement Query runs each statement, and a query of two result
// sets returns both.
func TestRawOnMariaDBHandsAnExecerAndAQueryerThatRunMultipleStatements(t *testing.T) {
	ctx := seamCtx(t)
	inner, setup := seamMySQL(t)
	table := tempTable(t, setup, "id INT NOT NULL AUTO_INCREMENT, value VARCHAR(255), PRIMARY KEY (id)")
	g, db := gateOn(t, inner, seamPolicy)
	conn := takeConn(t, ctx, db)
	inserts := "INSERT INTO " + table + " (value) VALUES ('a'), ('b'); INSERT INTO " + table + " (value) VALUES ('c'), ('d'), ('e');"
	err := conn.Raw(func(dc any) error {
		//lint:ignore SA1019 the legacy interfaces are what the driver's tests assert
		ex, okE := dc.(driver.Execer)
		//lint:ignore SA1019 as above
		qr, okQ := dc.(driver.Queryer)
		if !okE || !okQ {
			return fmt.Errorf("Raw hands %T: driver.Execer %v, driver.Queryer %v, want both, as the driver's connection", dc, okE, okQ)
		}
		dcInner, err := bulkhead.Unwrap(dc)
		if err != nil {
			return err
		}
		//lint:ignore SA1019 as above
		if _, ok := dcInner.(driver.Execer); !ok {
			return fmt.Errorf("the driver's connection %T is no driver.Execer", dcInner)
		}

		res, err := ex.Exec(inserts, nil)
		if err != nil {
			return fmt.Errorf("a multi-statement Exec: %w", err)
		}
		mres, ok := res.(mysql.Result)
		if !ok {
			return fmt.Errorf("the Exec's result is %T, want the driver's mysql.Result", res)
		}
		if got, want := mres.AllRowsAffected(), []int64{2, 3}; !reflect.DeepEqual(got, want) {
			return fmt.Errorf("AllRowsAffected %v, want %v", got, want)
		}
		// For an INSERT of several rows, LAST_INSERT_ID() is the first one's.
		if got, want := mres.AllLastInsertIds(), []int64{1, 3}; !reflect.DeepEqual(got, want) {
			return fmt.Errorf("AllLastInsertIds %v, want %v", got, want)
		}

		for range 2 {
			rows, err := qr.Query(inserts, nil)
			if err != nil {
				return fmt.Errorf("a multi-statement Query: %w", err)
			}
			if err := rows.Close(); err != nil {
				return err
			}
		}

		rows, err := qr.Query("SELECT count(*) FROM "+table+"; SELECT id, value FROM "+table+" WHERE id > 13 ORDER BY id", nil)
		if err != nil {
			return fmt.Errorf("a query of two result sets: %w", err)
		}
		sets, err := seamResultSets(rows)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if got, want := fmt.Sprint(sets), "[[[15]] [[14 d] [15 e]]]"; got != want {
			return fmt.Errorf("the two result sets: %s, want %s", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := setup.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 15 {
		t.Fatalf("rows inserted by one Exec and two Queries of two INSERTs each: %d, %v; want 15", n, err)
	}
	// The calls on what Raw hands over are the gate's: four operations.
	if s := g.Stats(); s.Admitted != 4 || s.Running != 0 {
		t.Fatalf("the gate admitted %d operations and runs %d, want 4 and 0", s.Admitted, s.Running)
	}
}

// seamResultSets reads every result set of rows, each row as its values
// printed (text as text), at most 3 sets.
func seamResultSets(rows driver.Rows) ([][]string, error) {
	var sets [][]string
	for {
		var set []string
		dest := make([]driver.Value, len(rows.Columns()))
		for {
			err := rows.Next(dest)
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			row := make([]string, len(dest))
			for i, v := range dest {
				if b, ok := v.([]byte); ok {
					v = string(b)
				}
				row[i] = fmt.Sprint(v)
			}
			set = append(set, fmt.Sprint(row))
		}
		sets = append(sets, set)
		nrs, ok := rows.(driver.RowsNextResultSet)
		if !ok {
			return nil, fmt.Errorf("the rows %T have no NextResultSet", rows)
		}
		if !nrs.HasNextResultSet() {
			return sets, nil
		}
		if len(sets) == 3 {
			return nil, fmt.Errorf("more than 3 result sets: %v", sets)
		}
		if err := nrs.NextResultSet(); err != nil {
			return nil, err
		}
	}
}
