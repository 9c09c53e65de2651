//go:build go1.25

package bulkhead_test

// Contract tests of the wrapping through database/sql, on the fake driver.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"go/build"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// fkEnv is a gate on a fake driver and the *sql.DB opened on it.
type fkEnv struct {
	fc *fakedb.Connector
	g  *bulkhead.Gate
	db *sql.DB

	// released receives every OnRelease event, on the goroutine that
	// released (database/sql's own for rollbacks and closes it makes).
	released chan bulkhead.Event
	releases atomic.Int64
}

// fkOpen opens a gate with policy p on fc (fakedb.New() if nil), with
// OpenDB's pool settings; opts come after the OnRelease recorder, so a
// WithEvents among them replaces it. The DB is closed at the end of the test.
func fkOpen(t *testing.T, fc *fakedb.Connector, p bulkhead.Policy, opts ...bulkhead.Option) *fkEnv {
	t.Helper()
	if fc == nil {
		fc = fakedb.New()
	}
	e := &fkEnv{fc: fc, released: make(chan bulkhead.Event, 4096)}
	rec := bulkhead.WithEvents(bulkhead.Events{OnRelease: func(ev bulkhead.Event) {
		e.releases.Add(1)
		e.released <- ev
	}})
	e.g, e.db = gatetest.Open(t, fc, p, append([]bulkhead.Option{rec}, opts...)...)
	return e
}

// running fails the test unless the gate's Running gauge is want.
func (e *fkEnv) running(t *testing.T, want int, when string) {
	t.Helper()
	if got := e.g.Stats().Running; got != want {
		t.Fatalf("%s: Stats().Running = %d, want %d", when, got, want)
	}
}

// exec runs an Exec of query on e's DB on a goroutine (testkit.GoExec).
func (e *fkEnv) exec(ctx context.Context, query string) <-chan error {
	return testkit.GoExec(ctx, e.db, query)
}

// awaitRelease waits for the next release of permits, made on any
// goroutine, and then until nothing runs: OnRelease is called just before
// the permits are given back.
func (e *fkEnv) awaitRelease(t *testing.T) bulkhead.Event {
	t.Helper()
	ev := <-e.released
	awaitState(t, "the released permits are back", func() bool { return e.g.Stats().Running == 0 })
	return ev
}

// balanced fails the test unless every admitted operation released its
// permits exactly once and nothing holds or waits.
func (e *fkEnv) balanced(t *testing.T) {
	t.Helper()
	s := e.g.Stats()
	if s.Running != 0 || s.Waiting != 0 || s.Admitted != e.releases.Load() {
		t.Fatalf("stats %+v with %d releases: want Running 0, Waiting 0, Admitted = releases", s, e.releases.Load())
	}
}

var fkB1 = bulkhead.Policy{MaxConcurrent: 1}

// fkRaw runs f with the driver conn (*sql.Conn).Raw hands out: the wrapper.
func fkRaw(t *testing.T, db *sql.DB, f func(dc any)) {
	t.Helper()
	ctx := context.Background()
	c := testkit.Conn(t, ctx, db)
	defer c.Close()
	if err := c.Raw(func(dc any) error { f(dc); return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestTheWrappersOfferEveryOptionalInterface(t *testing.T) {
	ctx := context.Background()
	fc := fakedb.New()
	fc.Conn, fc.Stmt, fc.Rows = 0, 0, 0 // a driver with none of them
	e := fkOpen(t, fc, fkB1)
	fkRaw(t, e.db, func(dc any) {
		if got := fakedb.ConnIfacesOf(dc); got != fakedb.ConnAll {
			t.Errorf("conn wrapper implements %v, want all: %v", got, fakedb.ConnAll)
		}
		s, err := dc.(driver.ConnPrepareContext).PrepareContext(ctx, "SELECT 1")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if got, want := fakedb.StmtIfacesOf(s), fakedb.StmtExecContext|fakedb.StmtQueryContext|fakedb.StmtNamedValueChecker; got != want {
			t.Errorf("stmt wrapper implements %v, want %v (a ColumnConverter the driver lacks would change database/sql's conversion)", got, want)
		}
		r, err := dc.(driver.QueryerContext).QueryContext(ctx, "SELECT 1", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if got := fakedb.RowsIfacesOf(r); got != fakedb.RowsAll {
			t.Errorf("rows wrapper implements %v, want all: %v", got, fakedb.RowsAll)
		}
	})
}

// fkScript runs the same calls on db and returns what each gave, errors
// with their package prefix taken off: the gate's say "bulkhead:" where
// database/sql's say "sql:".
func fkScript(ctx context.Context, db *sql.DB) []string {
	var out []string
	say := func(what string, err error, v ...any) {
		msg := "ok"
		if err != nil {
			msg = strings.NewReplacer("bulkhead: ", "", "sql: ", "").Replace(err.Error())
		}
		out = append(out, fmt.Sprint(what, ": ", msg, " ", v))
	}
	_, err := db.ExecContext(ctx, "UPDATE t")
	say("exec", err)
	_, err = db.ExecContext(ctx, "UPDATE t SET v = ?", int64(5))
	say("exec with an argument", err)
	_, err = db.ExecContext(ctx, "UPDATE t SET v = ?", []int64{1})
	say("exec with a []int64 argument", err)
	var v int64
	err = db.QueryRowContext(ctx, "SELECT 42").Scan(&v)
	say("query", err, v)
	err = db.QueryRowContext(ctx, "SELECT ?", sql.NullInt64{Int64: 3, Valid: true}).Scan(&v)
	say("query with a Valuer", err, v)
	tx, err := db.BeginTx(ctx, nil)
	say("begin", err)
	if err == nil {
		_, err = tx.ExecContext(ctx, "UPDATE t")
		say("exec in tx", err)
		err = tx.QueryRowContext(ctx, "SELECT 7").Scan(&v)
		say("query in tx", err, v)
		say("commit", tx.Commit())
	}
	for _, opts := range []*sql.TxOptions{{Isolation: sql.LevelSerializable}, {ReadOnly: true}} {
		tx, err := db.BeginTx(ctx, opts)
		say(fmt.Sprintf("begin %+v", *opts), err)
		if err == nil {
			say("rollback", tx.Rollback())
		}
	}
	say("ping", db.PingContext(ctx))
	st, err := db.PrepareContext(ctx, "SELECT ?")
	say("prepare", err)
	if err == nil {
		_, err = st.ExecContext(ctx, int64(1))
		say("stmt exec", err)
		err = st.QueryRowContext(ctx, int64(7)).Scan(&v)
		say("stmt query", err, v)
		say("stmt close", st.Close())
	}
	rows, err := db.QueryContext(ctx, "SELECT 1; SELECT 2")
	say("query two result sets", err)
	if err == nil {
		cts, err := rows.ColumnTypes()
		say("column types", err)
		for _, ct := range cts {
			n, nok := ct.Length()
			null, ook := ct.Nullable()
			p, sc, dok := ct.DecimalSize()
			out = append(out, fmt.Sprint(ct.Name(), ct.DatabaseTypeName(), ct.ScanType(), n, nok, null, ook, p, sc, dok))
		}
		var got []int64
		for {
			for rows.Next() {
				rows.Scan(&v)
				got = append(got, v)
			}
			_, err := rows.Columns() // database/sql closes rows once no result set follows
			say("columns after a set", err)
			if !rows.NextResultSet() {
				break
			}
		}
		say("rows", rows.Err(), got)
		rows.Close()
	}
	c, err := db.Conn(ctx)
	say("conn", err)
	if err == nil {
		_, err = c.ExecContext(ctx, "UPDATE t")
		say("conn exec", err)
		say("conn close", c.Close())
	}
	return out
}

// fkCompare runs fkScript through database/sql alone on plain and through
// a gate on gated, two drivers alike, and fails the test unless every
// call gave the same and the drivers saw the same calls.
func fkCompare(t *testing.T, what string, plain, gated *fakedb.Connector) {
	t.Helper()
	ctx := context.Background()
	pdb := sql.OpenDB(plain)
	want := fkScript(ctx, pdb)
	pdb.Close()
	e := fkOpen(t, gated, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Minute})
	got := fkScript(ctx, e.db)
	e.db.Close()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: through the gate\n\t%s\nwithout it\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
	for op := fakedb.OpConnect; op <= fakedb.OpRowsClose; op++ {
		if op == fakedb.OpConnectorClose {
			continue // db.Close closes the gate, which closes its connector; database/sql alone does not
		}
		if g, p := gated.Count(op), plain.Count(op); g != p {
			t.Errorf("%s: the driver saw %d calls of %v through the gate, %d without it", what, g, op, p)
		}
	}
}

// fakedb's variants lack each optional interface in one at least.

func TestEveryDriverConnBehavesThroughTheGateAsThroughDatabaseSQLAlone(t *testing.T) {
	fkCompareEach(t, "conn", []fakedb.ConnIface{fakedb.ConnAll}, fakedb.ConnVariants(), fakedb.ConnAll,
		func(fc *fakedb.Connector, m fakedb.ConnIface) { fc.Conn = m })
}

// fkCompareEach runs fkCompare for each variant (set on a connector) under
// each conn of conns; it fails unless some variant lacks each of all.
func fkCompareEach[M fakedb.ConnIface | fakedb.StmtIface | fakedb.RowsIface](t *testing.T, what string, conns []fakedb.ConnIface, variants []M, all M, set func(*fakedb.Connector, M)) {
	t.Helper()
	var absent M
	for _, c := range conns {
		for _, m := range variants {
			plain, gated := fakedb.New(), fakedb.New()
			plain.Conn, gated.Conn = c, c
			set(plain, m)
			set(gated, m)
			fkCompare(t, fmt.Sprintf("driver conn %v, %s %v", c, what, m), plain, gated)
			absent |= all &^ m
		}
	}
	if absent != all {
		t.Fatalf("no variant lacks %v", all&^absent)
	}
}

func TestEveryDriverStmtBehavesThroughTheGateAsThroughDatabaseSQLAlone(t *testing.T) {
	// The conn's Execers, Queryers and NamedValueChecker change the statement's part.
	fkCompareEach(t, "stmt", fakedb.ConnVariants(), fakedb.StmtVariants(), fakedb.StmtAll,
		func(fc *fakedb.Connector, m fakedb.StmtIface) { fc.Stmt = m })
}

func TestEveryDriverRowsBehaveThroughTheGateAsThroughDatabaseSQLAlone(t *testing.T) {
	// Rows of a query, and of database/sql's prepared fallback.
	fkCompareEach(t, "rows", []fakedb.ConnIface{fakedb.ConnAll, 0}, fakedb.RowsVariants(), fakedb.RowsAll,
		func(fc *fakedb.Connector, m fakedb.RowsIface) { fc.Rows = m })
}

func TestUnwrapReturnsTheDriversOwnConnFromRaw(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	fkRaw(t, e.db, func(dc any) {
		if e.fc.ConnOf(dc) != nil {
			t.Fatal("Raw handed out the driver's own conn, want the wrapper")
		}
		inner, err := bulkhead.Unwrap(dc)
		if err != nil {
			t.Fatal(err)
		}
		c := e.fc.ConnOf(inner)
		if c == nil {
			t.Fatalf("Unwrap(%T) = %T, not a conn the fake driver returned", dc, inner)
		}
		if conns := e.fc.Conns(); len(conns) != 1 || conns[0] != inner {
			t.Fatalf("Unwrap gave %v, the driver's open conns are %v", inner, conns)
		}
		if again, err := bulkhead.Unwrap(inner); again != inner || err != nil {
			t.Fatalf("Unwrap of the driver's conn = %v, want it unchanged", again)
		}
	})
}

func TestTheArticleDemoOnTheFakeDriverRejectsTheSecondOperationAndCommits42(t *testing.T) {
	ctx := context.Background()
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0})
	tx := testkit.Begin(t, ctx, e.db)
	_, err := e.db.ExecContext(ctx, "UPDATE t")
	if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, bulkhead.ErrAdmissionFull) || errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("second operation: %v, want an admission-full rejection", err)
	}
	var re *bulkhead.RejectedError
	if !errors.As(err, &re) || re.MaxConcurrent != 1 || re.MaxQueue != 0 || re.Waited != 0 {
		t.Fatalf("second operation: %#v, want a *RejectedError naming B=1, Q=0", err)
	}
	var v int
	if err := tx.QueryRowContext(ctx, "SELECT 42").Scan(&v); err != nil || v != 42 {
		t.Fatalf("query in the transaction: %d, %v; want 42", v, err)
	}
	testkit.Commit(t, tx)
	s := e.g.Stats()
	if s.Running != 0 || s.Admitted != 1 || s.RejectedFull != 1 || s.Dials != 1 {
		t.Fatalf("after commit: %+v, want Running 0, Admitted 1, RejectedFull 1, Dials 1", s)
	}
	if n := e.fc.Count(fakedb.OpConnect); n != 1 {
		t.Fatalf("the fake saw %d dials, want 1: the rejected operation never had a connection", n)
	}
	// The one execution permit is free again.
	if _, err := e.db.ExecContext(ctx, "UPDATE t"); err != nil {
		t.Fatalf("after commit: %v", err)
	}
	e.balanced(t)
}

// fkEither opens a *sql.DB on fc, through a gate of policy p if gated,
// else through database/sql alone; it is closed at the end of the test.
func fkEither(t *testing.T, fc *fakedb.Connector, gated bool, p bulkhead.Policy) *sql.DB {
	t.Helper()
	if gated {
		return fkOpen(t, fc, p).db
	}
	db := sql.OpenDB(fc)
	t.Cleanup(func() { db.Close() })
	return db
}

// fkBlocked runs f on a goroutine while the fake holds op inside the
// driver, calls during, then lets op return and waits for f.
func fkBlocked(t *testing.T, fc *fakedb.Connector, op fakedb.Op, f func() error, during func()) {
	t.Helper()
	b := fc.Block(op)
	done := make(chan error, 1)
	go func() { done <- f() }()
	b.Wait(1)
	during()
	b.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// fkOps are operations through database/sql that reach the driver's op:
// a Begin commits, a Commit or Rollback begins first, a statement's Exec
// or Query prepares it first.
var fkOps = []struct {
	op fakedb.Op
	do func(context.Context, *sql.DB) error
}{
	{fakedb.OpExec, func(ctx context.Context, db *sql.DB) error { _, err := db.ExecContext(ctx, "UPDATE t"); return err }},
	{fakedb.OpQuery, fkQueryRow},
	{fakedb.OpBegin, func(ctx context.Context, db *sql.DB) error { return fkTx(ctx, db, (*sql.Tx).Commit) }},
	{fakedb.OpRowsClose, fkQueryRow},
	{fakedb.OpPrepare, func(ctx context.Context, db *sql.DB) error {
		return fkStmt(ctx, db, "UPDATE t", func(*sql.Stmt) error { return nil })
	}},
	{fakedb.OpStmtExec, func(ctx context.Context, db *sql.DB) error {
		return fkStmt(ctx, db, "UPDATE t", func(st *sql.Stmt) error { _, err := st.ExecContext(ctx); return err })
	}},
	{fakedb.OpStmtQuery, func(ctx context.Context, db *sql.DB) error {
		return fkStmt(ctx, db, "SELECT 1", func(st *sql.Stmt) error { return st.QueryRowContext(ctx).Scan(new(int)) })
	}},
	{fakedb.OpCommit, func(ctx context.Context, db *sql.DB) error { return fkTx(ctx, db, (*sql.Tx).Commit) }},
	{fakedb.OpRollback, func(ctx context.Context, db *sql.DB) error { return fkTx(ctx, db, (*sql.Tx).Rollback) }},
}

func fkQueryRow(ctx context.Context, db *sql.DB) error {
	return db.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
}

// fkTx begins a transaction and ends it with end.
func fkTx(ctx context.Context, db *sql.DB, end func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	return end(tx)
}

// fkStmt prepares query, runs f on the statement and closes it.
func fkStmt(ctx context.Context, db *sql.DB, query string, f func(*sql.Stmt) error) error {
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return err
	}
	defer st.Close()
	return f(st)
}

func TestATransactionHoldsItsPermitsUntilTheDriversCommitOrRollbackReturned(t *testing.T) {
	ctx := context.Background()
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2})
	for _, end := range []struct {
		op fakedb.Op
		f  func(*sql.Tx) error
	}{{fakedb.OpCommit, (*sql.Tx).Commit}, {fakedb.OpRollback, (*sql.Tx).Rollback}} {
		tx := testkit.Begin(t, ctx, e.db)
		e.running(t, 1, "transaction begun")
		fkBlocked(t, e.fc, end.op, func() error { return end.f(tx) }, func() {
			e.running(t, 1, "inside the driver's "+end.op.String())
		})
		e.running(t, 0, end.op.String()+" returned")
		if ev := e.awaitRelease(t); ev.Kind != bulkhead.KindTx {
			t.Fatalf("released a %v, want a transaction", ev.Kind)
		}
	}
	e.balanced(t)
}

func TestAnAutocommitExecHoldsItsPermitsWhileTheDriverRunsIt(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2})
	fkBlocked(t, e.fc, fakedb.OpExec, func() error {
		_, err := e.db.Exec("UPDATE t")
		return err
	}, func() { e.running(t, 1, "inside the driver's Exec") })
	e.running(t, 0, "Exec returned")
	e.balanced(t)
}

func TestAQueryHoldsItsPermitsUntilItsRowsAreClosedByWhoeverClosesThem(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2})
	ctx := context.Background()

	t.Run("by Rows.Close", func(t *testing.T) {
		rows := testkit.Query(t, ctx, e.db, "SELECT 1")
		e.running(t, 1, "rows open")
		fkBlocked(t, e.fc, fakedb.OpRowsClose, rows.Close, func() { e.running(t, 1, "inside the driver's Rows.Close") })
		e.running(t, 0, "Rows.Close returned")
	})
	t.Run("by database/sql at the end of Next", func(t *testing.T) {
		rows := testkit.Query(t, ctx, e.db, "SELECT 1")
		if !rows.Next() {
			t.Fatal(rows.Err())
		}
		e.running(t, 1, "rows being read")
		fkBlocked(t, e.fc, fakedb.OpRowsClose, func() error {
			if rows.Next() {
				return errors.New("a second row")
			}
			return rows.Err()
		}, func() { e.running(t, 1, "inside the driver's Rows.Close called by Next") })
		e.running(t, 0, "the last Next returned")
		rows.Close()
	})
	t.Run("by database/sql inside Row.Scan", func(t *testing.T) {
		fkBlocked(t, e.fc, fakedb.OpRowsClose, func() error {
			var v int
			return e.db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
		}, func() { e.running(t, 1, "inside the driver's Rows.Close called by Scan") })
		e.running(t, 0, "Scan returned")
	})
	t.Run("by database/sql when the context ends", func(t *testing.T) {
		qctx, cancel := context.WithCancel(ctx)
		defer cancel()
		rows := testkit.Query(t, qctx, e.db, "SELECT 1")
		for len(e.released) > 0 {
			<-e.released
		}
		b := e.fc.Block(fakedb.OpRowsClose)
		cancel()
		b.Wait(1) // database/sql's goroutine is in the driver's Close
		e.running(t, 1, "inside the driver's Rows.Close called by database/sql after cancel")
		b.Release()
		if ev := e.awaitRelease(t); ev.Kind != bulkhead.KindQuery {
			t.Fatalf("released a %v, want a query", ev.Kind)
		}
		e.running(t, 0, "database/sql closed the rows")
		rows.Close() // closed already: no second release
	})
	e.balanced(t)
	if n := e.fc.Count(fakedb.OpRowsClose); n != 4 {
		t.Fatalf("the driver closed %d rows, want 4", n)
	}
}

func TestPreparedStatementExecutionsOutsideATransactionAreGatedAndPreparingIsNot(t *testing.T) {
	ctx := context.Background()
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2})
	st := testkit.Prepare(t, ctx, e.db, "SELECT 1")
	defer st.Close()
	if s := e.g.Stats(); s.Admitted != 0 {
		t.Fatalf("Prepare took a permit: %+v", s)
	}
	fkBlocked(t, e.fc, fakedb.OpStmtExec, func() error {
		_, err := st.ExecContext(ctx)
		return err
	}, func() { e.running(t, 1, "inside the driver's Stmt.Exec") })
	e.running(t, 0, "Stmt.Exec returned")
	rows, err := st.QueryContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.running(t, 1, "the statement's rows open")
	rows.Close()
	e.running(t, 0, "the statement's rows closed")
	if s := e.g.Stats(); s.Admitted != 2 {
		t.Fatalf("Admitted = %d, want 2", s.Admitted)
	}
	e.balanced(t)
}

func TestStatementsInsideATransactionTakeNoPermit(t *testing.T) {
	ctx := context.Background()
	// B=1, Q=0: any statement that tried to take a permit while the
	// transaction holds the only one would be rejected.
	e := fkOpen(t, nil, fkB1)
	dbStmt := testkit.Prepare(t, ctx, e.db, "SELECT ?")
	defer dbStmt.Close()
	tx := testkit.Begin(t, ctx, e.db)
	before := e.g.Stats()
	if _, err := tx.ExecContext(ctx, "UPDATE t"); err != nil {
		t.Fatalf("exec in tx: %v", err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT 1")
	if err != nil {
		t.Fatalf("query in tx: %v", err)
	}
	rows.Close()
	txStmt := testkit.Prepare(t, ctx, tx, "SELECT ?")
	var v int64
	if _, err := txStmt.ExecContext(ctx, int64(1)); err != nil {
		t.Fatalf("statement prepared on the tx, exec: %v", err)
	}
	if err := txStmt.QueryRowContext(ctx, int64(5)).Scan(&v); err != nil || v != 5 {
		t.Fatalf("statement prepared on the tx, query: %d, %v", v, err)
	}
	moved := tx.StmtContext(ctx, dbStmt)
	if _, err := moved.ExecContext(ctx, int64(1)); err != nil {
		t.Fatalf("Tx.Stmt of a db statement, exec: %v", err)
	}
	if err := moved.QueryRowContext(ctx, int64(6)).Scan(&v); err != nil || v != 6 {
		t.Fatalf("Tx.Stmt of a db statement, query: %d, %v", v, err)
	}
	if after := e.g.Stats(); after != before {
		t.Fatalf("statements inside the transaction changed the stats:\nbefore %+v\nafter  %+v", before, after)
	}
	testkit.Commit(t, tx)
	e.balanced(t)
}

func TestACancelledTransactionIsReleasedOnceByDatabaseSQLsRollback(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2})
	ctx, cancel := context.WithCancel(context.Background())
	tx := testkit.Begin(t, ctx, e.db)
	b := e.fc.Block(fakedb.OpRollback)
	cancel()
	b.Wait(1) // database/sql's goroutine is in the driver's Rollback
	e.running(t, 1, "inside database/sql's rollback")
	if err := tx.Rollback(); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("user Rollback after cancel: %v, want sql.ErrTxDone", err)
	}
	e.running(t, 1, "the user's Rollback returned while database/sql's is in the driver")
	b.Release()
	if ev := e.awaitRelease(t); ev.Kind != bulkhead.KindTx {
		t.Fatalf("released a %v, want a transaction", ev.Kind)
	}
	e.balanced(t)
	if n := e.fc.Count(fakedb.OpRollback); n != 1 {
		t.Fatalf("the driver rolled back %d times, want 1", n)
	}
}

func TestUserRollbackRacingTheCancellationRollbackReleasesExactlyOnce(t *testing.T) {
	const n = 1000
	e := fkOpen(t, nil, fkB1)
	var wg sync.WaitGroup
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("iteration %d: begin: %v (the previous transaction's permit is not back)", i, err)
		}
		wg.Go(cancel)
		if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) && !errors.Is(err, context.Canceled) {
			t.Fatalf("iteration %d: rollback: %v", i, err)
		}
		e.awaitRelease(t) // exactly one release, on whichever goroutine won
		// With B+Q=1 the next BeginTx needs this conn back in the pool.
		awaitState(t, "database/sql returns the conn", func() bool { return e.db.Stats().InUse == 0 })
	}
	wg.Wait()
	e.balanced(t)
	if s := e.g.Stats(); s.Admitted != n || e.releases.Load() != n {
		t.Fatalf("Admitted %d, releases %d, want %d each", s.Admitted, e.releases.Load(), n)
	}
	if got := e.fc.Count(fakedb.OpRollback); got != n {
		t.Fatalf("the driver rolled back %d times, want %d", got, n)
	}
}

func TestErrBadConnRetriesFindThePermitsOfTheFailedAttemptBack(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		op   fakedb.Op
		warm bool // run a statement first, so that the next reuse resets the session
		do   func(context.Context, *sql.DB) error
	}{
		{fakedb.OpBegin, false, fkOps[2].do},
		{fakedb.OpExec, false, fkOps[0].do},
		{fakedb.OpQuery, false, fkOps[1].do},
		// The reset runs once the operation holds its permits; a bad
		// session is closed and another used, under the same permits.
		{fakedb.OpResetSession, true, fkOps[0].do},
	}
	for _, c := range cases {
		t.Run(c.op.String(), func(t *testing.T) {
			e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 3})
			if c.warm {
				if err := c.do(ctx, e.db); err != nil {
					t.Fatal(err)
				}
			}
			var seen testkit.Log[int]
			e.fc.SetHook(func(_ context.Context, op fakedb.Op, _ string) error {
				if op == c.op {
					seen.Add(e.g.Stats().Running)
				}
				return nil
			})
			failures := 2
			if c.warm {
				failures = 1 // one idle conn to reset: one failure, then a new conn
			}
			e.fc.FailNext(c.op, failures, driver.ErrBadConn)
			if err := c.do(ctx, e.db); err != nil {
				t.Fatalf("after %d ErrBadConn: %v, want database/sql's retry to succeed", failures, err)
			}
			// Each attempt holds its own permit when it enters the driver:
			// the failed ones, then the one that succeeded (unless the failure
			// was the reset of an idle conn, retried on a fresh conn that needs none).
			want := slices.Repeat([]int{1}, failures+1)
			if c.warm {
				want = want[:failures]
			}
			if seen := seen.List(); !slices.Equal(seen, want) {
				t.Fatalf("Stats().Running as each attempt entered the driver's %v: %v, want %v", c.op, seen, want)
			}
			e.balanced(t)
			if s := e.g.Stats(); s.OpenConns != e.fc.Open() {
				t.Fatalf("gate counts %d open conns, the driver %d", s.OpenConns, e.fc.Open())
			}
		})
	}
}

func TestErrSkipFromTheDriverFallsBackToAPreparedStatementUnderTheSamePermit(t *testing.T) {
	ctx := context.Background()
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1})
	e.fc.FailNext(fakedb.OpExec, 1, driver.ErrSkip)
	e.fc.FailNext(fakedb.OpQuery, 1, driver.ErrSkip)
	if _, err := e.db.ExecContext(ctx, "UPDATE t"); err != nil {
		t.Fatalf("exec after ErrSkip: %v, want the prepared fallback to succeed", err)
	}
	var v int
	if err := e.db.QueryRowContext(ctx, "SELECT 3").Scan(&v); err != nil || v != 3 {
		t.Fatalf("query after ErrSkip: %d, %v; want 3", v, err)
	}
	if x, q := e.fc.Count(fakedb.OpStmtExec), e.fc.Count(fakedb.OpStmtQuery); x != 1 || q != 1 {
		t.Fatalf("the driver ran %d prepared execs and %d prepared queries, want 1 each", x, q)
	}
	if got := e.g.Stats().Admitted; got != 2 {
		t.Errorf("Admitted %d for one Exec and one Query, want 2: the fallback runs under the permit already held", got)
	}
	e.balanced(t)
}

// pgx answers driver.ErrBadConn when the context ended before anything
// was sent: that answer matches the context's error instead, so that
// database/sql retries nothing.
func TestErrBadConnAfterTheContextEndedKeepsTheServerConnection(t *testing.T) {
	cases := fkOps[:3] // an autocommit statement, a query, a BEGIN
	for _, c := range cases {
		t.Run(c.op.String(), func(t *testing.T) {
			e := fkOpen(t, nil, fkB1)
			if err := c.do(context.Background(), e.db); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			e.fc.SetHook(func(_ context.Context, op fakedb.Op, _ string) error {
				if op == c.op {
					cancel()
					return driver.ErrBadConn
				}
				return nil
			})
			err := c.do(ctx, e.db)
			e.fc.SetHook(nil)
			if !errors.Is(err, context.Canceled) || errors.Is(err, driver.ErrBadConn) {
				t.Fatalf("got %v, want an error matching context.Canceled and not driver.ErrBadConn", err)
			}
			if err := c.do(context.Background(), e.db); err != nil {
				t.Fatal(err)
			}
			if n, cl, ops := e.fc.Count(fakedb.OpConnect), e.fc.Count(fakedb.OpConnClose), e.fc.Count(c.op); n != 1 || cl != 0 || ops != 3 {
				t.Errorf("%d dials, %d closes, %d calls of %v: want 1, 0 and 3 (no retry)", n, cl, ops, c.op)
			}
			e.running(t, 0, "after")
		})
	}
}

func TestNoErrorOfTheGateMatchesErrBadConnSoDatabaseSQLNeverRetriesIt(t *testing.T) {
	ctx := context.Background()
	var errs []error

	// A queue timeout: the driver never sees the statement, and database/sql
	// neither retries it nor dials again.
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Millisecond})
	tx := testkit.Begin(t, ctx, e.db)
	_, err := e.db.ExecContext(ctx, "UPDATE t")
	if !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("got %v, want a queue timeout", err)
	}
	errs = append(errs, err)
	// Admission full: the transaction runs, an operation waits.
	waiter := e.exec(bulkhead.WithQueueWait(ctx, time.Hour), "UPDATE t")
	awaitState(t, "an operation waits", func() bool { return e.g.Stats().Waiting == 1 })
	_, err = e.db.ExecContext(ctx, "UPDATE t")
	if !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("got %v, want admission full", err)
	}
	errs = append(errs, err)
	if n, c := e.fc.Count(fakedb.OpExec), e.fc.Count(fakedb.OpConnect); n != 0 || c != 1 {
		t.Fatalf("the driver saw %d execs and %d dials, want 0 and 1: a rejection was retried", n, c)
	}
	if s := e.g.Stats(); s.RejectedTimeout != 1 || s.RejectedFull != 1 {
		t.Fatalf("%+v: want one rejection of each kind", s)
	}
	tx.Rollback()
	if err := <-waiter; err != nil {
		t.Fatal(err)
	}

	// Admission full at the wrapper: a nested operation on a pinned conn.
	e1 := fkOpen(t, nil, fkB1)
	c := testkit.Conn(t, ctx, e1.db)
	rows := testkit.Query(t, ctx, c, "SELECT 1")
	_, err = c.ExecContext(ctx, "UPDATE t")
	if !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("nested exec: %v, want admission full", err)
	}
	errs = append(errs, err)
	rows.Close()
	c.Close()

	// An invalid policy.
	db := sql.OpenDB(bulkhead.Connector(fakedb.New(), bulkhead.Policy{}))
	defer db.Close()
	errs = append(errs, db.PingContext(ctx))

	// Closed.
	e.db.Close()
	g, _ := bulkhead.New(fakedb.New(), fkB1)
	g.Close()
	_, err = g.Connect(ctx)
	errs = append(errs, err, bulkhead.ErrRejected, bulkhead.ErrAdmissionFull, bulkhead.ErrQueueTimeout, bulkhead.ErrClosed, bulkhead.ErrInvalidPolicy)
	for _, err := range errs {
		if err == nil || errors.Is(err, driver.ErrBadConn) {
			t.Errorf("%v matches driver.ErrBadConn (or is nil)", err)
		}
	}
}

func TestAPanicInTheDriverPropagatesAndGivesThePermitsBack(t *testing.T) {
	ctx := context.Background()
	type panicCase struct {
		op   fakedb.Op
		do   func(context.Context, *sql.DB) error
		skip bool // the driver answers the Exec with ErrSkip first: the panic is in the gate's fallback
	}
	withArg := func(ctx context.Context, db *sql.DB) error {
		_, err := db.ExecContext(ctx, "UPDATE t SET v = ?", 1)
		return err
	}
	cases := []panicCase{{fakedb.OpPrepare, withArg, true}, {fakedb.OpStmtExec, withArg, true}}
	for _, o := range fkOps {
		cases = append(cases, panicCase{o.op, o.do, false})
	}
	for _, c := range cases {
		name := c.op.String()
		if c.skip {
			name += " in the ErrSkip fallback"
		}
		t.Run(name, func(t *testing.T) {
			e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Nanosecond})
			if c.skip {
				e.fc.FailNext(fakedb.OpExec, 1, driver.ErrSkip)
			}
			e.fc.PanicNext(c.op, 1, "boom")
			func() {
				defer func() {
					if r := recover(); r != "boom" {
						t.Fatalf("recovered %v, want the driver's panic", r)
					}
				}()
				c.do(ctx, e.db)
			}()
			e.balanced(t)
			// The server connection the panic lost is closed, and no
			// longer counted against MaxConns.
			if s := e.g.Stats(); s.OpenConns != e.fc.Open() {
				t.Fatalf("after the panic the gate counts %d server connections, the driver has %d open", s.OpenConns, e.fc.Open())
			}
			// The next operation runs: nothing is held or deadlocked.
			if _, err := e.db.ExecContext(ctx, "UPDATE t"); err != nil {
				t.Fatalf("after the panic: %v", err)
			}
			e.balanced(t)
		})
	}
}

// The fallback after driver.ErrSkip converts the caller's arguments for
// the prepared statement as database/sql does: with the statement's
// NamedValueChecker, not only the connection's.
func TestTheErrSkipFallbackChecksArgumentsWithTheStatementsCheckerAsDatabaseSQLDoes(t *testing.T) {
	errStmtRefuses := errors.New("the statement's checker refuses the argument")
	for _, gated := range []bool{false, true} {
		fc := fakedb.New()
		fc.SetHook(func(_ context.Context, op fakedb.Op, query string) error {
			if op == fakedb.OpCheckNamedValue && query != "" { // the statement's, not the connection's
				return errStmtRefuses
			}
			return nil
		})
		fc.FailNext(fakedb.OpExec, 1, driver.ErrSkip)
		_, err := fkEither(t, fc, gated, fkB1).ExecContext(context.Background(), "UPDATE t SET v = ?", 1)
		if !errors.Is(err, errStmtRefuses) {
			t.Errorf("gated=%v: exec answered with ErrSkip: %v, want the statement checker's error", gated, err)
		}
		if n := fc.Count(fakedb.OpStmtExec); n != 0 {
			t.Errorf("gated=%v: the statement ran %d times with arguments its checker refused", gated, n)
		}
	}
}

func TestClosingTheDBMakesAQueuedOperationReturnErrClosed(t *testing.T) {
	ctx := context.Background()
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: bulkhead.MaxQueueWait})
	tx := testkit.Begin(t, ctx, e.db)
	done := e.exec(ctx, "UPDATE t")
	awaitState(t, "the exec waits for a permit", func() bool { return e.g.Stats().Waiting == 1 })
	if err := e.db.Close(); err != nil {
		t.Fatal(err)
	}
	// With an hour of queue wait, only the close can end the wait.
	err := <-done
	if !errors.Is(err, bulkhead.ErrClosed) || errors.Is(err, bulkhead.ErrRejected) {
		t.Fatalf("queued exec after db.Close: %v, want ErrClosed, not a rejection", err)
	}
	if n := e.fc.Count(fakedb.OpConnectorClose); n != 1 {
		t.Fatalf("the driver's connector was closed %d times, want 1", n)
	}
	if s := e.g.Stats(); s.Canceled != 1 || s.Waiting != 0 {
		t.Fatalf("%+v: want the wait counted as Canceled", s)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("the running transaction's commit after close: %v", err)
	}
	e.balanced(t)
}

func TestWaitingAndRejectedOperationsHoldNoServerConnectionAndNeverReachTheDriver(t *testing.T) {
	const extra = 20
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: bulkhead.MaxQueueWait})
	b := e.fc.Block(fakedb.OpExec)
	held := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := e.db.Exec("UPDATE t")
			held <- err
		}()
	}
	b.Wait(1)
	awaitState(t, "two execs wait for a permit", func() bool { return e.g.Stats().Waiting == 2 })
	if dials, open := e.fc.Count(fakedb.OpConnect), e.fc.Open(); dials != 1 || open != 1 {
		t.Fatalf("the driver saw %d dials, %d connections open: want 1 and 1, the running exec's (the waiting two hold none)", dials, open)
	}
	refused := make(chan error, extra)
	var wg sync.WaitGroup
	for range extra {
		wg.Go(func() {
			_, err := e.db.Exec("UPDATE t")
			refused <- err
		})
	}
	wg.Wait()
	close(refused)
	for err := range refused {
		if !errors.Is(err, bulkhead.ErrAdmissionFull) {
			t.Fatalf("extra exec: %v, want admission full", err)
		}
	}
	if got := e.fc.Count(fakedb.OpConnect); got != 1 {
		t.Fatalf("the driver saw %d dials, want 1: the rejections never reached it", got)
	}
	if n := e.fc.Count(fakedb.OpResetSession) + e.fc.Count(fakedb.OpExec); n != 1 {
		t.Fatalf("the driver saw %d resets and execs, want 1 (the running exec): a rejection sends nothing", n)
	}
	if s := e.g.Stats(); s.RejectedFull != extra || s.OpenConns != 1 || s.Waiting != 2 {
		t.Fatalf("%+v: want %d rejections, 1 server connection open, 2 waiting", s, extra)
	}
	b.Release()
	for range 3 {
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	}
	if m := e.fc.MaxOpen(); m > 3 {
		t.Fatalf("the driver had %d conns open at once, want at most 3, one per operation", m)
	}
	e.balanced(t)
}

func TestInvalidOptionsAreErrorsNamingTheOptionAndItsValue(t *testing.T) {
	for _, c := range []struct {
		opt  bulkhead.Option
		want string
	}{
		{bulkhead.WithDialTimeout(0), "WithDialTimeout(0s), want above 0s"},
	} {
		_, err := bulkhead.New(fakedb.New(), fkB1, c.opt)
		if !errors.Is(err, bulkhead.ErrInvalidPolicy) || err.Error() != "bulkhead: "+c.want {
			t.Errorf("New with an invalid option: %v, want an ErrInvalidPolicy %q", err, c.want)
		}
		db := sql.OpenDB(bulkhead.Connector(fakedb.New(), fkB1, c.opt))
		if err := db.Ping(); !errors.Is(err, bulkhead.ErrInvalidPolicy) {
			t.Errorf("Connector with an invalid option: ping %v, want the option's error", err)
		}
		db.Close()
	}
}

func TestAnInvalidPolicyThroughConnectorFailsPingWithoutDialing(t *testing.T) {
	fc := fakedb.New()
	g := bulkhead.Connector(fc, bulkhead.Policy{MaxConcurrent: 0})
	db := sql.OpenDB(g)
	defer db.Close()
	for _, when := range []string{"", " after SetPolicy"} {
		err := db.PingContext(context.Background())
		if !errors.Is(err, bulkhead.ErrInvalidPolicy) || !strings.Contains(err.Error(), "MaxConcurrent") {
			t.Fatalf("ping%s: %v, want the gate's ErrInvalidPolicy naming MaxConcurrent", when, err)
		}
		if _, err := db.Exec("UPDATE t"); !errors.Is(err, bulkhead.ErrInvalidPolicy) {
			t.Fatalf("exec%s: %v, want ErrInvalidPolicy", when, err)
		}
		// SetPolicy on a gate made with an invalid policy returns its error.
		if err := g.SetPolicy(bulkhead.Policy{MaxConcurrent: 1}); !errors.Is(err, bulkhead.ErrInvalidPolicy) {
			t.Fatalf("SetPolicy on an invalid gate: %v, want the gate's ErrInvalidPolicy", err)
		}
	}
	if n := fc.Count(fakedb.OpConnect); n != 0 {
		t.Fatalf("the driver was dialed %d times, want 0", n)
	}
}

func TestEventsReportEachAdmitRejectAndReleaseWithItsKindAndReason(t *testing.T) {
	ctx := context.Background()
	var got testkit.Log[string]
	record := func(what string) func(bulkhead.Event) {
		return func(ev bulkhead.Event) {
			s := what + " " + ev.Kind.String()
			if ev.Reason != nil {
				s += ": " + ev.Reason.Error()
			}
			got.Add(s)
		}
	}
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Millisecond},
		bulkhead.WithEvents(bulkhead.Events{
			OnAdmit:   record("admit"),
			OnReject:  record("reject"),
			OnRelease: record("release"),
		}))
	testkit.Exec(t, ctx, e.db, "UPDATE t")
	if err := e.db.QueryRowContext(ctx, "SELECT 1").Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	tx := testkit.Begin(t, ctx, e.db) // holds the execution permit
	c := testkit.Conn(t, ctx, e.db)
	defer c.Close()
	waiter := e.exec(bulkhead.WithQueueWait(ctx, time.Hour), "UPDATE t")
	awaitState(t, "an operation waits", func() bool { return e.g.Stats().Waiting == 1 })
	if _, err := e.db.ExecContext(ctx, "UPDATE t"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("exec with B running and Q waiting: %v, want admission full", err)
	}
	testkit.Commit(t, tx)
	if err := <-waiter; err != nil {
		t.Fatal(err)
	}
	tx = testkit.Begin(t, ctx, e.db) // holds the execution permit again
	if _, err := c.ExecContext(ctx, "UPDATE t"); !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("exec on the pinned conn: %v, want a queue timeout", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.ExecContext(cctx, "UPDATE t"); !errors.Is(err, context.Canceled) {
		t.Fatalf("exec with a cancelled context: %v", err) // a cancellation: no event
	}
	testkit.Commit(t, tx)
	rows := testkit.Query(t, ctx, c, "SELECT 1")
	if _, err := c.BeginTx(ctx, nil); !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("begin while the rows hold the permit: %v, want a queue timeout", err)
	}
	rows.Close()
	want := []string{
		"admit statement", "release statement",
		"admit query", "release query",
		"admit transaction",
		"reject statement: bulkhead: admission full",
		"release transaction",
		"admit statement", "release statement", // the operation that waited
		"admit transaction",
		"reject statement: bulkhead: queue wait timed out",
		"release transaction",
		"admit query",
		"reject transaction: bulkhead: queue wait timed out",
		"release query",
	}
	if got := got.List(); !slices.Equal(got, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Counted from the events, as a user's gauge would: OnRelease comes
// before the permits are handed on.
func TestAdmissionsMinusReleasesInEventsNeverExceedB(t *testing.T) {
	const b, workers, each = 2, 8, 200
	var mu sync.Mutex
	held, most := 0, 0
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: b, MaxQueue: workers, QueueWait: time.Hour},
		bulkhead.WithEvents(bulkhead.Events{
			OnAdmit: func(bulkhead.Event) {
				mu.Lock()
				held++
				most = max(most, held)
				mu.Unlock()
			},
			OnRelease: func(bulkhead.Event) {
				mu.Lock()
				held--
				mu.Unlock()
			},
		}))
	ctx := context.Background()
	inParallel(t, workers, each, func() error {
		_, err := e.db.ExecContext(ctx, "UPDATE t")
		return err
	})
	mu.Lock()
	defer mu.Unlock()
	if held != 0 || most > b || most == 0 {
		t.Fatalf("from the events: %d held at the end, at most %d at once; want 0 and at most B=%d", held, most, b)
	}
}

func TestHoldWarningReportsAnOperationHeldLongerThanTheLimit(t *testing.T) {
	ctx := context.Background()
	const limit = time.Microsecond
	reports := make(chan bulkhead.Event, 1)
	e := fkOpen(t, nil, fkB1, bulkhead.WithHoldWarning(limit, func(ev bulkhead.Event) { reports <- ev }))
	tx := testkit.Begin(t, ctx, e.db)
	ev := <-reports // the transaction stays open until the report came
	if ev.Kind != bulkhead.KindTx || ev.Held != limit {
		t.Fatalf("report %+v, want a transaction held %v", ev, limit)
	}
	testkit.Commit(t, tx)
	e.balanced(t)
}

func TestHoldWarningWithoutAReportLogsThroughTheDefaultLogger(t *testing.T) {
	logs := captureLog(t)
	e := fkOpen(t, nil, fkB1, bulkhead.WithHoldWarning(time.Microsecond, nil))
	rows := testkit.Query(t, context.Background(), e.db, "SELECT 1")
	var line string
	awaitState(t, "the hold warning is logged", func() bool {
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "hold warning") {
				line = l
				return true
			}
		}
		return false
	})
	rows.Close()
	if !strings.Contains(line, `level=WARN msg="bulkhead:`) || !strings.Contains(line, " kind=query") {
		t.Fatalf("logged %q, want a warning about a query", line)
	}
}

// The root package needs nothing but the standard library: itself and the
// internal packages it imports.
func TestTheRootPackageImportsOnlyTheStandardLibrary(t *testing.T) {
	p, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Imports) == 0 {
		t.Fatal("no imports found: wrong directory?")
	}
	const own = "github.com/dbbulkhead/bulkhead/internal/"
	seen := map[string]bool{}
	var walk func(from string, imports []string)
	walk = func(from string, imports []string) {
		for _, imp := range imports {
			if seen[imp] {
				continue
			}
			seen[imp] = true
			dep, err := build.Import(imp, ".", 0)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case dep.Goroot:
			case strings.HasPrefix(imp, own):
				walk(imp, dep.Imports)
			default:
				t.Errorf("package %s imports %s, outside the standard library", from, imp)
			}
		}
	}
	walk("the root package", p.Imports)
}

func TestADriverPanicThatDatabaseSQLSurvivesLeaksNoConnectionSlot(t *testing.T) {
	// database/sql releases the conn after a panic in an autocommit Exec
	// only: a gate counting its server connection as held would count it
	// forever, and with B+Q=1 every later operation would find none.
	ctx := context.Background()
	for _, c := range fkOps {
		t.Run(c.op.String(), func(t *testing.T) {
			e := fkOpen(t, nil, fkB1)
			e.fc.PanicNext(c.op, 1, "boom")
			func() {
				defer func() { recover() }()
				c.do(ctx, e.db)
			}()
			if _, err := e.db.ExecContext(ctx, "UPDATE t"); err != nil {
				t.Fatalf("after a driver panic in %v: %v; gate %+v, database/sql in use %d", c.op, err, e.g.Stats(), e.db.Stats().InUse)
			}
			e.balanced(t)
			if s := e.g.Stats(); s.OpenConns != e.fc.Open() || s.OpenConns > 1 {
				t.Fatalf("the gate counts %d open conns, the driver has %d, want the same, at most B+Q=1", s.OpenConns, e.fc.Open())
			}
		})
	}
}

// Through database/sql, an Exec, a QueryRow and a transaction allocate as
// much gated as plain.
func TestTheGateAddsNoAllocationPerOperation(t *testing.T) {
	ctx := context.Background()
	ops := []struct {
		name string
		run  func(*sql.DB) error
	}{
		{"exec", func(db *sql.DB) error { _, err := db.ExecContext(ctx, "UPDATE t"); return err }},
		{"queryrow", func(db *sql.DB) error { var v int64; return db.QueryRowContext(ctx, "SELECT 1").Scan(&v) }},
		{"tx", func(db *sql.DB) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "UPDATE t"); err != nil {
				return err
			}
			err = tx.Commit()
			runtime.Gosched() // database/sql's goroutine watching the transaction ends, to be reused
			return err
		}},
	}
	for _, op := range ops {
		plain := sql.OpenDB(fakedb.New())
		g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 4})
		if err != nil {
			t.Fatal(err)
		}
		gated := g.OpenDB()
		// The least of three counts: database/sql starts a goroutine per
		// transaction, which allocates only when none is free to reuse.
		allocs := func(db *sql.DB) float64 {
			if err := op.run(db); err != nil { // warm: the connection dialed
				t.Fatal(err)
			}
			least := math.Inf(1)
			for range 3 {
				least = min(least, testing.AllocsPerRun(200, func() {
					if err := op.run(db); err != nil {
						t.Fatal(err)
					}
				}))
			}
			return least
		}
		if p, g := allocs(plain), allocs(gated); g > p {
			t.Errorf("%s: %v allocations gated, %v plain", op.name, g, p)
		}
		plain.Close()
		gated.Close()
	}
}
