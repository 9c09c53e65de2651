package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/jackc/pgx/v5/stdlib"
)

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

// On PostgreSQL: once several server connections are open, operations
// that run one at a time all land on the first one opened, whichever
// logical connection database/sql hands out (issue 13: the running work
// stays on the fewest, warmest backends instead of rotating over all B+Q).
func TestOperationsRunOnTheFirstServerConnectionOpenedWhenItIsIdle(t *testing.T) {
	g, db := openGated(t, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 0})
	ctx := context.Background()
	// Four *sql.Conn at once: four server connections, opened in order.
	var conns []*sql.Conn
	var first int64
	for i := range 4 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int64
		if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = pid
		}
		conns = append(conns, c)
	}
	if n := g.Stats().OpenConns; n != 4 {
		t.Fatalf("%d server connections open, want 4", n)
	}
	for _, c := range conns {
		c.Close()
	}
	// database/sql now hands out the logical connections given back last
	// first; each operation still runs on the first server connection.
	for i := range 20 {
		var pid int64
		if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if pid != first {
			t.Fatalf("operation %d ran on backend %d, want %d, the first server connection opened", i, pid, first)
		}
	}
}
