//go:build go1.25

package bulkhead_test

// One gate, one pool, one budget: the gate's *sql.DB, a second pool on
// the same gate, every rejection attributed to its operation, and
// sessions held outside operations (a *sql.Conn kept for LISTEN), which
// take no permit.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

func TestOpenDBReturnsTheSameDBEveryTimeAndClosingItClosesTheGate(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	g, db := e.g, e.db
	if again := g.OpenDB(); again != db {
		t.Fatal("a second OpenDB opened another pool")
	}
	testkit.Exec(t, context.Background(), db, "UPDATE t")
	db.Close()
	if again := g.OpenDB(); again != db {
		t.Fatal("OpenDB after Close opened another pool on the closed gate")
	}
	if _, err := g.Connect(context.Background()); !errors.Is(err, bulkhead.ErrClosed) {
		t.Fatalf("Connect after db.Close: %v, want ErrClosed", err)
	}
}

// Two pools on one gate (a GORM pool beside the quick start's): server
// connections belong to the gate, idle ones to whichever pool needs one,
// so the first pool's idle connections never refuse the second at zero load.
func TestASecondPoolOnTheSameGateIsNotStarvedByTheFirstsIdleConnections(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Second})
	fc, g, first := e.fc, e.g, e.db
	// Make the first pool hold idle connections: three at once, then idle.
	var wg sync.WaitGroup
	b := fc.Block(fakedb.OpExec)
	for range 3 {
		wg.Go(func() {
			if _, err := first.Exec("UPDATE t"); err != nil {
				t.Error(err)
			}
		})
	}
	b.Wait(2)
	awaitState(t, "the third waits", func() bool { return g.Stats().Waiting == 1 })
	b.Release()
	wg.Wait()

	second := sql.OpenDB(g)
	defer second.Close()
	const callers, each = 3, 50
	var rejected, ok sync.Map
	for c := range callers {
		wg.Go(func() {
			for range each {
				_, err := second.Exec("UPDATE t")
				if err != nil {
					rejected.Store(fmt.Sprint(c, err), true)
				} else {
					ok.Store(c, true)
				}
			}
		})
	}
	wg.Wait()
	rejected.Range(func(k, _ any) bool {
		t.Errorf("the second pool at zero load: %v", k)
		return true
	})
	if s := g.Stats(); s.OpenConns > s.MaxConcurrent+s.MaxQueue || s.Admitted != 3+callers*each {
		t.Errorf("stats %+v: want %d admitted, at most B+Q server connections", s, 3+callers*each)
	}
}

// Under overload every rejection is an operation's: its kind and workload
// reach OnReject, and the workload's stats count it, refusals at the dial
// included.
func TestEveryRejectionIsAttributedToItsOperationsKindAndWorkload(t *testing.T) {
	var mu sync.Mutex
	var got []bulkhead.Event
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0,
		Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1}}}
	e := fkOpen(t, nil, p, bulkhead.WithEvents(bulkhead.Events{OnReject: func(ev bulkhead.Event) {
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	}}))
	ctx := context.Background()
	tx := testkit.Begin(t, ctx, e.db) // the one permit, untagged
	batch := bulkhead.WithWorkload(ctx, "batch")
	const n = 40
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var err error
			switch i % 3 {
			case 0:
				_, err = e.db.ExecContext(batch, "UPDATE t")
			case 1:
				err = e.db.QueryRowContext(batch, "SELECT 1").Scan(new(int))
			default:
				var tx *sql.Tx
				if tx, err = e.db.BeginTx(batch, nil); err == nil {
					tx.Rollback()
				}
			}
			if !errors.Is(err, bulkhead.ErrAdmissionFull) {
				t.Errorf("op %d: %v, want admission full", i, err)
			}
		})
	}
	wg.Wait()
	tx.Rollback()
	kinds := map[bulkhead.Kind]int{}
	mu.Lock()
	for _, ev := range got {
		if ev.Workload != "batch" || ev.Reason != bulkhead.ErrAdmissionFull {
			t.Errorf("rejection event %+v, want workload batch, admission full", ev)
		}
		kinds[ev.Kind]++
	}
	mu.Unlock()
	want := map[bulkhead.Kind]int{bulkhead.KindExec: 14, bulkhead.KindQuery: 13, bulkhead.KindTx: 13}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("rejections by kind %v, want %v", kinds, want)
	}
	if ws, _ := e.g.WorkloadStats("batch"); ws.RejectedFull != n {
		t.Errorf("batch stats %+v: want %d rejections", ws, n)
	}
	if s := e.g.Stats(); s.RejectedFull != n || s.Dials != 1 {
		t.Errorf("global stats %+v: want %d rejections and one server connection ever dialed", s, n)
	}
}

// A logical connection given back keeps its server connection, parked:
// its next operation runs there again, and when database/sql closes
// connections (SetMaxIdleConns), their server connections are closed with
// them, as without the gate.
func TestAConnectionsServerConnectionStaysWithItAndClosesWithIt(t *testing.T) {
	e := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 0})
	fc, g, db := e.fc, e.g, e.db
	ctx := context.Background()
	// Four logical connections, each bound to its own session (1 to 4, in
	// the order they were opened), then all given back, 4 last.
	var conns []*sql.Conn
	for range 4 {
		c := testkit.Conn(t, ctx, db)
		testkit.Exec(t, ctx, c, "UPDATE t")
		conns = append(conns, c)
	}
	if n := fc.Open(); n != 4 {
		t.Fatalf("%d server connections open, want 4", n)
	}
	for _, c := range conns {
		c.Close()
	}
	inTx := func() []int64 {
		var ids []int64
		for _, dc := range fc.Conns() {
			if c := fc.ConnOf(dc); c != nil && c.InTx() {
				ids = append(ids, c.ID())
			}
		}
		return ids
	}
	// database/sql hands out the connection given back last: its
	// transactions run on its session, 4.
	for round := range 3 {
		tx := testkit.Begin(t, ctx, db)
		if ids := inTx(); len(ids) != 1 || ids[0] != 4 {
			t.Fatalf("round %d: the transaction runs on server connections %v, want [4], its connection's", round, ids)
		}
		testkit.Commit(t, tx)
	}
	// database/sql keeps one idle connection, the first given back: the
	// gate keeps its server connection, 1, and closes the others with
	// their connections.
	db.SetMaxIdleConns(1)
	var ids []int64
	for _, dc := range fc.Conns() {
		ids = append(ids, fc.ConnOf(dc).ID())
	}
	if s := g.Stats(); len(ids) != 1 || ids[0] != 1 || s.OpenConns != 1 || s.IdleConns != 1 {
		t.Fatalf("with one idle connection kept: server connections %v open, stats %+v; want [1]", ids, s)
	}
	if s := g.Stats(); s.Dials != 4 {
		t.Fatalf("%+v: want no dial beyond the four", s)
	}
}
