//go:build go1.25

package bulkhead

// The gate keeps its sessions to what runs at once: an operation without a
// session waits for one just given back rather than dialing once B are
// open, and a session that comes back beyond B free is closed. Sessions
// held between operations (a *sql.Conn) do not count.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/sessions"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// setLingerWait sets sessions.LingerWait for one test and returns what restores it.
func setLingerWait(d time.Duration) func() {
	old := sessions.LingerWait
	sessions.LingerWait = d
	return func() { sessions.LingerWait = old }
}

// spareRig is a gate on the fake driver and its *sql.DB, and, if kept, a
// *sql.Conn that holds session 1 between its operations; all are closed
// at the end of the test.
func spareRig(t *testing.T, p Policy, kept bool) (*fakedb.Connector, *Gate, *sql.DB, *sql.Conn) {
	t.Helper()
	g, db, fc := dlGate(t, p)
	if !kept {
		return fc, g, db, nil
	}
	ctx := context.Background()
	c := testkit.Conn(t, ctx, db)
	t.Cleanup(func() { c.Close() })
	testkit.Exec(t, ctx, c, "UPDATE t")
	return fc, g, db, c
}

// spareSessions fails unless the gate dialed dials sessions and open of
// them are open; want says what the test expected.
func spareSessions(t *testing.T, fc *fakedb.Connector, g *Gate, dials int64, open int, want string) {
	t.Helper()
	if s := g.Stats(); s.Dials != dials || fc.Open() != open {
		t.Fatalf("%+v, %d open: want %s", s, fc.Open(), want)
	}
}

// spareExecs runs n Execs on db at once, all held in the driver until n
// entered, and returns once they all returned.
func spareExecs(t *testing.T, fc *fakedb.Connector, db *sql.DB, n int) {
	t.Helper()
	b := fc.Block(fakedb.OpExec)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := db.Exec("UPDATE t"); err != nil {
				t.Error(err)
			}
		})
	}
	b.Wait(n)
	b.Release()
	wg.Wait()
}

// spareSerial runs n Execs on db one after another, failing the test on
// any error.
func spareSerial(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	for range n {
		if _, err := db.Exec("UPDATE t"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWithBSessionsOpenAnOperationTakesTheSessionGivenBackRatherThanDialing(t *testing.T) {
	defer setLingerWait(time.Hour)() // the give-back comes first, however slow the machine
	fc, g, db, c := spareRig(t, Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Hour}, true)
	b := fc.Block(fakedb.OpExec)
	var wg sync.WaitGroup
	exec := func() {
		if _, err := db.Exec("UPDATE t"); err != nil {
			t.Error(err)
		}
	}
	wg.Go(exec) // on session 2, dialed for it
	b.Wait(1)
	wg.Go(exec)
	// The second Exec holds the last permit and finds no free session.
	admWaitFor(t, func() bool { return g.pool.Waiting() == 1 })
	if s := g.Stats(); s.Dials != 2 || s.OpenConns != 2 {
		t.Fatalf("%+v: want 2 sessions dialed, no dial for the waiter", s)
	}
	c.Close() // session 1 comes back: the waiter runs on it
	b.Wait(2)
	b.Release()
	wg.Wait()
	spareSessions(t, fc, g, 2, 2, "the 2 sessions dialed first, and no other")
}

func TestAnOperationDialsWhenEverySessionIsKeptBetweenOperations(t *testing.T) {
	fc, g, db, _ := spareRig(t, Policy{MaxConcurrent: 1, MaxQueue: 0}, true)
	for i := range 3 {
		if _, err := db.Exec("UPDATE t"); err != nil {
			t.Fatalf("Exec %d beside a kept *sql.Conn: %v", i, err)
		}
	}
	spareSessions(t, fc, g, 2, 2, "one session dialed beside the kept one, and kept")
}

func TestAfterBShrinksTheSessionsBeyondItAreClosedAsTheyComeBack(t *testing.T) {
	fc, g, db, _ := spareRig(t, Policy{MaxConcurrent: 3, MaxQueue: 0}, false)
	spareExecs(t, fc, db, 3)
	if n := fc.Open(); n != 3 {
		t.Fatalf("%d sessions after 3 Execs at once under B=3, want 3", n)
	}
	if err := g.SetPolicy(Policy{MaxConcurrent: 2, MaxQueue: 0}); err != nil {
		t.Fatal(err)
	}
	spareSerial(t, db, 1)
	if s := g.Stats(); fc.Open() != 2 || s.OpenConns != 2 || s.IdleConns != 2 {
		t.Fatalf("after one Exec under B=2: %d sessions open, stats %+v; want 2, the one given back closed", fc.Open(), s)
	}
	spareExecs(t, fc, db, 2)
	spareSerial(t, db, 5)
	spareSessions(t, fc, g, 3, 2, "no dial after the shrink and 2 sessions")
}

// A *sql.Conn kept for good (as for LISTEN) leaves B sessions to the others.
func TestASessionKeptBetweenOperationsCausesNoDialChurn(t *testing.T) {
	fc, g, db, _ := spareRig(t, Policy{MaxConcurrent: 2, MaxQueue: 0}, true)
	for range 10 {
		spareExecs(t, fc, db, 2)
		spareSerial(t, db, 1)
	}
	spareSessions(t, fc, g, 3, 3, "the kept session and B=2 others, dialed once")
}

// database/sql may ask a connection IsValid twice without handing it out
// between: when a caller waiting in its own queue (SetMaxOpenConns reached)
// gives up as the connection is handed to it, it takes it back again. The
// gate keeps its session with it all the same: later operations, one at a
// time, run on the sessions open, dialing and closing nothing.
func TestAConnectionTakenBackTwiceByDatabaseSQLKeepsItsSession(t *testing.T) {
	fc, g, db, _ := spareRig(t, Policy{MaxConcurrent: 1, MaxQueue: 0}, true)
	db.SetMaxOpenConns(2) // above B+Q, as the README allows: c and one more
	ctx := context.Background()
	spareSerial(t, db, 1) // the second session
	for range 20 {
		b := fc.Block(fakedb.OpExec)
		ran := make(chan error, 1)
		go func() {
			_, err := db.Exec("UPDATE t")
			ran <- err
		}()
		b.Wait(1)
		waits := db.Stats().WaitCount
		// A caller waits in database/sql's queue; it gives up as the
		// running operation's connection is given back, maybe handed to it.
		wctx, cancel := context.WithCancel(ctx)
		gaveUp := testkit.GoExec(wctx, db, "UPDATE t")
		admWaitFor(t, func() bool { return db.Stats().WaitCount > waits })
		var once sync.Once
		fc.SetHook(func(_ context.Context, op fakedb.Op, _ string) error {
			if op == fakedb.OpIsValid {
				once.Do(cancel)
			}
			return nil
		})
		b.Release()
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
		<-gaveUp // the context's error, or it ran: either is database/sql's to decide
		fc.SetHook(nil)
		cancel()
	}
	dials, closes := g.Stats().Dials, fc.Count(fakedb.OpConnClose)
	for range 10 {
		testkit.Exec(t, ctx, db, "UPDATE t")
	}
	if d, cl := g.Stats().Dials-dials, fc.Count(fakedb.OpConnClose)-closes; d != 0 || cl != 0 {
		t.Fatalf("10 operations one at a time dialed %d and closed %d server connections, want none", d, cl)
	}
}

// The gate never keeps more server connections than database/sql has
// connections, also when a statement is closed while the session it was
// prepared on is parked on another connection that database/sql hands out
// at that moment.
func TestClosingAStatementWhileItsConnectionIsHandedOutLeavesNoSessionWithoutItsConnection(t *testing.T) {
	g, _, fc := dlGate(t, Policy{MaxConcurrent: 2, MaxQueue: 0})
	ctx := context.Background()
	// Two logical connections, each with the statement prepared on its
	// session, given back to database/sql: their sessions are parked.
	var conns []*conn
	var stmts []driver.Stmt
	for range 2 {
		dc, err := g.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := dc.(*conn)
		st, err := c.PrepareContext(ctx, "UPDATE t")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.(driver.StmtExecContext).ExecContext(ctx, nil); err != nil {
			t.Fatal(err)
		}
		conns, stmts = append(conns, c), append(stmts, st)
	}
	for _, c := range conns {
		if !c.IsValid() {
			t.Fatal("a connection given back with its session: invalid")
		}
	}
	stmts[1].Close()
	b := fc.Block(fakedb.OpStmtClose)
	closed := make(chan struct{})
	go func() {
		stmts[0].Close() // the last of its text: closed on every session
		close(closed)
	}()
	// The close reaches the driver now (held there), or is left for the
	// sessions' next use: then nothing races, and the barrier goes.
	admWaitFor(t, func() bool {
		select {
		case <-closed:
			b.Release()
			return true
		default:
			return b.Entered() == 1
		}
	})
	// database/sql hands the other connection out meanwhile, and runs an
	// operation on it.
	d := conns[1]
	if err := d.ResetSession(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ExecContext(ctx, "UPDATE t", nil); err != nil {
		t.Fatal(err)
	}
	d.IsValid()
	b.Release()
	<-closed
	if open := fc.Open(); open > 2 {
		t.Fatalf("%d server connections open for 2 logical connections: one is left without its connection", open)
	}
	for _, c := range conns {
		c.Close()
	}
	if open := fc.Open(); open != 0 {
		t.Fatalf("%d server connections open once every logical connection is closed, want 0", open)
	}
}

// Under overload and under steady load the gate keeps its server
// connections: after a warm-up second, at most one dial per 10 s, whatever
// B, with operations given back and granted to waiters at once.
func TestUnderLoadTheGateKeepsItsSessions(t *testing.T) {
	for _, c := range []struct {
		name    string
		b       int
		callers int
	}{{"overload, B=16", 16, 64}, {"overload, B=3", 3, 8}, {"steady, B=8", 8, 6}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var w dlWork
				g, db, fc := dlGate(t, Policy{MaxConcurrent: c.b, MaxQueue: 4 * c.b, QueueWait: 50 * time.Millisecond})
				fc.SetHook(w.hook)
				var load dlLoad
				halt := load.run(db, c.callers, func(i int) (string, time.Duration) {
					return fmt.Sprintf("sleep %dms", 1+i%3), 100 * time.Millisecond
				})
				time.Sleep(time.Second)
				dials := g.Stats().Dials
				time.Sleep(10 * time.Second)
				halt()
				if d := g.Stats().Dials - dials; d > 1 {
					t.Fatalf("%d dials in 10 s after the first second (%d ran), want at most 1", d, load.ok.Load())
				}
			})
		})
	}
}
