package bulkhead_test

// One gate, one pool, one budget (issue 10, points 1 and 2): the gate's
// *sql.DB, a second pool on the same gate, every rejection attributed to
// its operation, and sessions held outside operations (a *sql.Conn kept
// for LISTEN) counted against the connection budget, not admission.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

func TestOpenDBReturnsTheSameDBEveryTimeAndClosingItClosesTheGate(t *testing.T) {
	g, err := bulkhead.New(fakedb.New(), fkB1)
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	if again := g.OpenDB(); again != db {
		t.Fatal("a second OpenDB opened another pool")
	}
	if _, err := db.Exec("UPDATE t"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if again := g.OpenDB(); again != db {
		t.Fatal("OpenDB after Close opened another pool on the closed gate")
	}
	if _, err := g.Connect(context.Background()); !errors.Is(err, bulkhead.ErrClosed) {
		t.Fatalf("Connect after db.Close: %v, want ErrClosed", err)
	}
}

// The README's old GORM snippet opened a second pool next to the quick
// start's: the first pool's idle connections then held every connection
// slot, and the second was refused at zero load. Server connections now
// belong to the gate, idle ones to whichever pool needs one.
func TestASecondPoolOnTheSameGateIsNotStarvedByTheFirstsIdleConnections(t *testing.T) {
	fc := fakedb.New()
	g, err := bulkhead.New(fc, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := g.OpenDB()
	defer first.Close()
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
	if s := g.Stats(); s.OpenConns > s.MaxConns || s.Admitted != 3+callers*each {
		t.Errorf("stats %+v: want %d admitted, at most MaxConns server connections", s, 3+callers*each)
	}
}

// Under overload every rejection is an operation's: its kind and workload
// reach OnReject, and the workload's stats count it. (Refusals at the dial
// used to be reported as kind "connect" with no workload.)
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
	tx, err := e.db.BeginTx(ctx, nil) // the one permit, untagged
	if err != nil {
		t.Fatal(err)
	}
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

// A *sql.Conn kept for LISTEN holds a server connection outside any
// operation: it takes no admission permit, counts against MaxConns, and,
// when it leaves no server connection for an operation that has its
// permits, that operation is rejected with ErrNoConnection (after
// WithConnWait), not "admission full". With room in MaxConns, normal load beside it runs, and the
// session keeps receiving notifications.
func TestAListeningConnCountsAgainstTheConnectionBudgetNotAdmission(t *testing.T) {
	ctx := pgTestCtx(t)
	channel := fmt.Sprintf("bh_listen_%d", time.Now().UnixNano())

	t.Run("B=2, Q=0: one running and one listening use both connections", func(t *testing.T) {
		g, db := openGatedWith(t, bulkhead.Policy{MaxConcurrent: 2}, bulkhead.WithConnWait(20*time.Millisecond))
		listener, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer listener.Close()
		// Taken but unused, it holds nothing: two transactions run.
		tx1, tx2 := pgBegin(t, ctx, db), pgBegin(t, ctx, db)
		tx2.Rollback()
		if _, err := listener.ExecContext(ctx, "LISTEN "+channel); err != nil {
			t.Fatal(err)
		}
		// tx1 runs, the listener holds the second connection: a
		// transaction has an execution permit (1 of B=2 in use) but no
		// server connection.
		_, err = db.BeginTx(ctx, nil)
		var re *bulkhead.RejectedError
		if !errors.Is(err, bulkhead.ErrNoConnection) || errors.Is(err, bulkhead.ErrAdmissionFull) || !errors.As(err, &re) {
			t.Fatalf("BeginTx with the connections held: %v, want ErrNoConnection", err)
		}
		if re.Conns != 2 || re.MaxConns != 2 || !strings.Contains(err.Error(), "2 of MaxConns=2 open and in use") {
			t.Errorf("rejection %q (%+v), want it to say 2 of MaxConns=2 in use", err, *re)
		}
		if s := g.Stats(); s.RejectedNoConn != 1 || s.RejectedFull != 0 || s.Running != 1 {
			t.Errorf("stats %+v: want one rejection for want of a connection, none for admission, 1 running", s)
		}
		tx1.Rollback()
	})

	t.Run("B=2, Q=2: load beside the listener", func(t *testing.T) {
		g, db := openGated(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second})
		listener, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer listener.Close()
		if _, err := listener.ExecContext(ctx, "LISTEN "+channel); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		outcomes := map[string]int{}
		for range 6 {
			wg.Go(func() {
				for range 50 {
					err := relWithTx(ctx, db, func(tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, "SELECT pg_sleep(0.001)")
						return err
					})
					key := "ok"
					switch {
					case errors.Is(err, bulkhead.ErrNoConnection):
						key = "no connection"
					case errors.Is(err, bulkhead.ErrRejected):
						key = "rejected: " + bulkhead.ReasonLabel(err)
					case err != nil:
						key = err.Error()
					}
					mu.Lock()
					outcomes[key]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		t.Logf("figures: 300 transactions beside a listening *sql.Conn, B=2 Q=2: %v; %+v", outcomes, g.Stats())
		for k := range outcomes {
			if k != "ok" && !strings.HasPrefix(k, "rejected: ") || k == "no connection" {
				t.Errorf("outcome %q: want only successes and admission or queue rejections", k)
			}
		}
		// The listener kept its session through the load.
		if _, err := db.ExecContext(ctx, "NOTIFY "+channel+", 'hello'"); err != nil {
			t.Fatal(err)
		}
		err = listener.Raw(func(dc any) error {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			n, err := bulkhead.Unwrap(dc).(*stdlib.Conn).Conn().WaitForNotification(wctx)
			if err == nil && n.Payload != "hello" {
				err = fmt.Errorf("payload %q", n.Payload)
			}
			return err
		})
		if err != nil {
			t.Errorf("the listener after the load: %v, want the notification", err)
		}
	})
}
