//go:build go1.25

package bulkhead_test

// The seams between database/sql's pool and the gate's server connections.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// smFill fills e's gate of B=1, Q=q (0 or 1) with a transaction and a
// waiting Exec; free commits, and fails unless that Exec succeeds.
func smFill(t *testing.T, e *fkEnv, q int) (free func()) {
	t.Helper()
	ctx := context.Background()
	tx := testkit.Begin(t, ctx, e.db)
	var waiting <-chan error
	if q == 1 {
		waiting = e.exec(ctx, "UPDATE t")
		awaitState(t, "an operation waits", func() bool { return e.g.Stats().Waiting == 1 })
	}
	return func() {
		t.Helper()
		testkit.Commit(t, tx)
		if q == 1 {
			if err := <-waiting; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// smRefused runs st with admission full and returns the dials and
// Prepares it caused and its error.
func smRefused(e *fkEnv, st *sql.Stmt) (dials, prepares int64, err error) {
	d0, p0 := e.fc.Count(fakedb.OpConnect), e.fc.Count(fakedb.OpPrepare)
	_, err = st.ExecContext(context.Background(), 2)
	return e.fc.Count(fakedb.OpConnect) - d0, e.fc.Count(fakedb.OpPrepare) - p0, err
}

// smAdmitted frees admission, fails the test unless st then runs, closes
// st and checks that e's gate holds nothing.
func smAdmitted(t *testing.T, e *fkEnv, st *sql.Stmt, free func()) {
	t.Helper()
	free()
	if _, err := st.ExecContext(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	st.Close()
	e.balanced(t)
}

// smCutOff fails unless an Exec cancelled while the driver is in op
// returns context.Canceled; op then goes on.
func smCutOff(t *testing.T, e *fkEnv, op fakedb.Op, what string) {
	t.Helper()
	b := e.fc.Block(op)
	ctx, cancel := context.WithCancel(context.Background())
	done := e.exec(ctx, "UPDATE t")
	b.Wait(1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("%s: %v, want context.Canceled", what, err)
	}
	b.Release()
}

// A driver without Execer: database/sql prepares each Exec, and an Exec
// refused at admission still sends nothing.
func TestARefusedExecOnADriverWithoutExecerSendsNothing(t *testing.T) {
	ctx := context.Background()
	fc := fakedb.New()
	fc.Conn = fakedb.ConnAll &^ (fakedb.ConnExecerContext | fakedb.ConnExecer)
	e := fkOpen(t, fc, fkB1)
	testkit.Exec(t, ctx, e.db, "UPDATE t SET v = ?", 1)
	tx := testkit.Begin(t, ctx, e.db)
	prepares := fc.Count(fakedb.OpPrepare)
	if _, err := e.db.ExecContext(ctx, "UPDATE t SET v = ?", 2); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("exec: %v, want ErrAdmissionFull", err)
	}
	if n := fc.Count(fakedb.OpPrepare) - prepares; n != 0 {
		t.Fatalf("the refused exec sent %d Prepare, want 0", n)
	}
	tx.Rollback()
	e.balanced(t)
}

// Its error is Prepare's; two statements of one text are the driver's
// two until the last is closed.
func TestAPrepareIsSentAtOnceAndItsStatementsClosedWithTheLast(t *testing.T) {
	ctx := context.Background()
	var prepErr = errors.New("syntax error")
	e := fkOpen(t, nil, fkB1)
	e.fc.FailNext(fakedb.OpPrepare, 1, prepErr)
	if _, err := e.db.PrepareContext(ctx, "SELEC 1"); !errors.Is(err, prepErr) {
		t.Fatalf("prepare: %v, want the driver's error", err)
	}
	st1 := testkit.Prepare(t, ctx, e.db, "SELECT 1")
	st2 := testkit.Prepare(t, ctx, e.db, "SELECT 1")
	if n := e.fc.Count(fakedb.OpPrepare); n < 2 {
		t.Fatalf("%d Prepare reached the driver, want the failed one and the first statement's", n)
	}
	st1.Close()
	if n := e.fc.Count(fakedb.OpStmtClose); n != 0 {
		t.Fatalf("%d statements closed in the driver while one of the text is open, want 0", n)
	}
	var v int
	if err := st2.QueryRowContext(ctx).Scan(&v); err != nil || v != 1 {
		t.Fatalf("the second statement: %d, %v", v, err)
	}
	st2.Close()
	if n := e.fc.Count(fakedb.OpStmtClose); n != 1 {
		t.Fatalf("%d statements closed in the driver once both are, want 1", n)
	}
	e.balanced(t)
}

// The driver's Connect (pgx's BeforeConnect, AfterConnect) runs for each.
func TestWithNoIdleConnectionKeptEachOperationDialsAsWithoutTheGate(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	e.db.SetMaxIdleConns(0)
	for range 3 {
		testkit.Exec(t, context.Background(), e.db, "UPDATE t")
	}
	if n, open := e.fc.Count(fakedb.OpConnect), e.fc.Open(); n != 3 || open != 0 {
		t.Fatalf("%d dials, %d open, want 3 and 0", n, open)
	}
}

// database/sql closes a connection past its lifetime; the gate closes a
// server connection with it.
func TestServerConnectionsFollowDatabaseSQLsConnMaxLifetime(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	e.db.SetConnMaxLifetime(time.Nanosecond)
	for range 3 {
		testkit.Exec(t, context.Background(), e.db, "UPDATE t")
	}
	if n, open, s := e.fc.Count(fakedb.OpConnect), e.fc.Open(), e.db.Stats(); n != 3 || open > s.OpenConnections {
		t.Fatalf("%d dials, %d server connections open, database/sql %+v: want 3 dials and no more server connections than database/sql's", n, open, s)
	}
}

// Through the gate the reset runs once the operation holds its permits,
// on whichever idle server connection it takes: the counts end the same
// once database/sql has handed out (and discarded) the dead one.
func TestStaleConnectionsLeaveDatabaseSQLWithTheCountsItHasWithoutTheGate(t *testing.T) {
	for _, gated := range []bool{false, true} {
		ctx := context.Background()
		fc := fakedb.New()
		db := fkEither(t, fc, gated, bulkhead.Policy{MaxConcurrent: 4})
		db.SetMaxIdleConns(2)
		var conns []*sql.Conn
		for range 3 {
			c := testkit.Conn(t, ctx, db)
			if err := c.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			c.Close()
		}
		// The two kept are dead now: the driver says so on reset.
		fc.FailNext(fakedb.OpResetSession, 2, driver.ErrBadConn)
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("gated %v: ping: %v", gated, err)
		}
		if open := fc.Open(); open != 1 {
			t.Fatalf("gated %v: the driver has %d connections open, want 1", gated, open)
		}
		if s := db.Stats(); s.OpenConnections != 1 || s.Idle != 1 {
			t.Fatalf("gated %v: database/sql %+v after the Ping, want 1 open, idle", gated, s)
		}
		if n := fc.Count(fakedb.OpConnect); n != 4 {
			t.Fatalf("gated %v: %d dials, want 4", gated, n)
		}
		// Two connections handed out: the live one, then a new one (the
		// stale one discarded on the way).
		var two []*sql.Conn
		for range 2 {
			c := testkit.Conn(t, ctx, db)
			two = append(two, c)
		}
		if s := db.Stats(); s.OpenConnections != 2 || s.InUse != 2 {
			t.Fatalf("gated %v: database/sql %+v with two connections handed out, want 2 open", gated, s)
		}
		for _, c := range two {
			c.Close()
		}
	}
}

// The connection is kept, not counted bad, and the others not pinged.
func TestAResetCutOffByTheCallersContextIsNoDeadConnection(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2})
	testkit.Exec(t, context.Background(), e.db, "UPDATE t")
	smCutOff(t, e, fakedb.OpResetSession, "exec")
	pings := e.fc.Count(fakedb.OpPing)
	testkit.Exec(t, context.Background(), e.db, "UPDATE t")
	if s := e.g.Stats(); s.BadConns != 0 || e.fc.Count(fakedb.OpConnect) != 1 || e.fc.Count(fakedb.OpPing) != pings {
		t.Fatalf("%+v, %d dials, %d pings: want no bad connection, one dial, no ping", s, e.fc.Count(fakedb.OpConnect), e.fc.Count(fakedb.OpPing)-pings)
	}
	if s := e.g.Stats(); s.Canceled != 1 || s.Admitted != 2 {
		t.Fatalf("%+v: want the cut-off exec counted as canceled", s)
	}
}

// Raw and Unwrap: a dial that fails is an error, never a nil connection.
func TestUnwrapReturnsTheDialsErrorWhenNoServerConnectionCanBeHad(t *testing.T) {
	dialErr := errors.New("connection refused")
	e := fkOpen(t, nil, fkB1)
	e.fc.FailNext(fakedb.OpConnect, 1, dialErr)
	c := testkit.Conn(t, context.Background(), e.db)
	defer c.Close()
	err := c.Raw(func(dc any) error {
		inner, err := bulkhead.Unwrap(dc)
		if inner != nil {
			t.Errorf("Unwrap gave %v with %v", inner, err)
		}
		return err
	})
	if !errors.Is(err, dialErr) {
		t.Fatalf("Raw: %v, want the dial's error", err)
	}
	if s := e.g.Stats(); s.DialErrors != 1 {
		t.Fatalf("%+v: want the failed dial counted", s)
	}
}

// The value Raw hands over offers the legacy Execer and Queryer too (code
// written for a driver asserts them), gated like the context forms.
func TestRawsConnectionOffersTheLegacyExecerAndQueryer(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	fkRaw(t, e.db, func(dc any) {
		r, err := dc.(driver.Execer).Exec("UPDATE t", nil) //lint:ignore SA1019 the legacy interface is what is tested
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := r.RowsAffected(); n != 1 {
			t.Fatalf("rows affected %d", n)
		}
		rows, err := dc.(driver.Queryer).Query("SELECT 7", nil) //lint:ignore SA1019 the legacy interface is what is tested
		if err != nil {
			t.Fatal(err)
		}
		v := make([]driver.Value, 1)
		if err := rows.Next(v); err != nil || v[0] != int64(7) {
			t.Fatalf("row %v, %v", v, err)
		}
		rows.Close()
	})
	if s := e.g.Stats(); s.Admitted != 2 {
		t.Fatalf("%+v: want both calls gated", s)
	}
	e.balanced(t)
}

// A gate capped at zero rejects every operation, but Ping still reaches
// the database: a readiness probe passes while the database is up.
func TestPingWorksOnAGateCappedAtZero(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second})
	if err := e.g.Cap(context.Background(), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Ping(); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if _, err := e.db.Exec("UPDATE t"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("exec: %v, want ErrAdmissionFull", err)
	}
	if s := e.g.Stats(); s.MaxConcurrent != 0 || s.MaxQueue != 0 {
		t.Fatalf("%+v: want the cap in force", s)
	}
	if err := e.g.Cap(context.Background(), -1, -1); err != nil {
		t.Fatal(err)
	}
	testkit.Exec(t, context.Background(), e.db, "UPDATE t")
}

// Cap returns once the operations beyond the new limit ended.
func TestCapWaitsForTheOperationsBeyondItsLimit(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2})
	b := e.fc.Block(fakedb.OpExec)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { e.db.Exec("UPDATE t") })
	}
	b.Wait(2)
	capped := make(chan error, 1)
	go func() { capped <- e.g.Cap(context.Background(), 1, 0) }()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.g.Cap(ctx, 1, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Cap with a context already ended and 2 running: %v, want context.Canceled", err)
	}
	select {
	case err := <-capped:
		t.Fatalf("Cap returned %v with 2 running and a cap of 1", err)
	default:
	}
	b.Release()
	if err := <-capped; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// Also while database/sql closes connections as its settings change.
func TestServerConnectionsNeverOutnumberDatabaseSQLsConnections(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Second})
	halt := testkit.Repeat(6, func(int) bool {
		e.db.Exec("UPDATE t")
		return true
	})
	for i := range 200 {
		e.db.SetMaxIdleConns(i % 5)
		if i%7 == 0 {
			e.g.SetPolicy(bulkhead.Policy{MaxConcurrent: 1 + i%4, MaxQueue: 4, QueueWait: time.Second})
		}
	}
	halt()
	e.db.SetMaxIdleConns(1)
	if open, s := e.fc.Open(), e.db.Stats(); open > s.OpenConnections || open > 1 {
		t.Fatalf("%d server connections open, database/sql %+v: want at most its 1", open, s)
	}
}

// Under short deadlines and a slow dial, no dial is thrown away at each
// cut-off (database/sql alone cuts its Connect off with its caller).
func TestADialItsCallerGaveUpOnServesTheNextCaller(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	smCutOff(t, e, fakedb.OpConnect, "exec cut off while dialing")
	awaitState(t, "the dial's connection is idle", func() bool { return e.g.Stats().IdleConns == 1 })
	testkit.Exec(t, context.Background(), e.db, "UPDATE t")
	if n := e.fc.Count(fakedb.OpConnect); n != 1 {
		t.Fatalf("%d dials, want 1: the next caller got the first dial's connection", n)
	}
	if s := e.g.Stats(); s.Dials != 1 || s.Canceled != 1 || s.Admitted != 1 {
		t.Fatalf("%+v: want one dial, the cut-off exec canceled", s)
	}
}

// db.Conn takes a logical connection and dials nothing: the server
// connection comes with the *sql.Conn's first use.
func TestASQLConnDialsAtItsFirstUse(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	c := testkit.Conn(t, context.Background(), e.db)
	defer c.Close()
	if n := e.fc.Count(fakedb.OpConnect); n != 0 {
		t.Fatalf("db.Conn dialed %d server connections, want 0", n)
	}
	testkit.Exec(t, context.Background(), c, "UPDATE t")
	if n := e.fc.Count(fakedb.OpConnect); n != 1 {
		t.Fatalf("%d dials after the first statement, want 1", n)
	}
}

// Its error closes that connection and fails the operation with it.
func TestConnInitRunsOnceOnEachServerConnectionWithinThePermitsOfItsFirstOperation(t *testing.T) {
	initErr := errors.New("init failed")
	var mu sync.Mutex
	var ran []int   // Running when it ran
	var fail = true // the first init fails
	var e *fkEnv
	e = fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2}, bulkhead.WithConnInit(func(ctx context.Context, c driver.Conn) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, e.g.Stats().Running)
		if fail {
			fail = false
			return initErr
		}
		return nil
	}))
	if _, err := e.db.Exec("UPDATE t"); !errors.Is(err, initErr) {
		t.Fatalf("exec on a connection whose init fails: %v, want the init's error", err)
	}
	if open := e.fc.Open(); open != 0 {
		t.Fatalf("%d server connections open after a failed init, want 0", open)
	}
	for range 3 {
		testkit.Exec(t, context.Background(), e.db, "UPDATE t")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 2 || ran[0] != 1 || ran[1] != 1 {
		t.Fatalf("init ran with Running %v, want twice (the failed connection, then the next), each within its operation's permits", ran)
	}
	if s := e.g.Stats(); s.ConnectFailed != 1 || s.Admitted != 3 || s.Dials != 2 {
		t.Fatalf("%+v: want the failed init's operation counted as ConnectFailed, 2 dials", s)
	}
}

// README: an operation rejected at admission has sent nothing, no Prepare.
// database/sql prepares a *sql.Stmt on each connection it runs on, before
// the gate: no such Prepare once database/sql closed the statement's
// connections, nor for a text with a statement open, nor for one of the
// 4,096 texts prepared last.
func TestARefusedPreparedStatementSendsNoPrepareAfterThousandsOfOtherTexts(t *testing.T) {
	for _, c := range []struct {
		name           string
		idle           int // database/sql's idle connections: 0 closes the statement's driver statements
		before, others int // texts prepared before the statement's first run, and after
	}{
		{"its connections closed by database/sql", 0, 0, 0},
		{"its statement still open", 2, 4096, 4097},
		{"its statements closed, among the 4,096 last", 0, 4096, 4095},
	} {
		for _, q := range []int{0, 1} {
			ctx := context.Background()
			e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: q, QueueWait: time.Hour})
			e.db.SetMaxIdleConns(c.idle)
			prepareOthers := func(n int, tag string) {
				for i := range n {
					other := testkit.Prepare(t, ctx, e.db, fmt.Sprintf("UPDATE t SET v = %d -- %s", i, tag))
					other.Close()
				}
			}
			prepareOthers(c.before, "before")
			st := testkit.Prepare(t, ctx, e.db, "UPDATE t SET v = ?")
			if _, err := st.ExecContext(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if n := e.fc.Open(); c.idle == 0 && n != 0 {
				t.Fatalf("%s, Q=%d: %d server connections open with no idle connection kept, want 0", c.name, q, n)
			}
			prepareOthers(c.others, "after")
			free := smFill(t, e, q)
			d, p, err := smRefused(e, st)
			var re *bulkhead.RejectedError
			if !errors.As(err, &re) || !errors.Is(err, bulkhead.ErrAdmissionFull) || re.Waited != 0 {
				t.Fatalf("%s, Q=%d: the statement's execution: %v, want an admission-full rejection at once", c.name, q, err)
			}
			if d != 0 || p != 0 {
				t.Fatalf("%s, Q=%d: the refused execution dialed %d server connections and sent %d Prepare, want none", c.name, q, d, p)
			}
			// Admitted, it is prepared on the server connection that runs it.
			smAdmitted(t, e, st, free)
		}
	}
}
