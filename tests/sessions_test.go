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

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// A *sql.Conn kept for LISTEN holds a server connection outside any
// operation: it takes no permit, and the gate has no connection budget it
// could exhaust, so B operations still run beside it (each on a server
// connection of its own) and the next is refused for want of admission,
// as without the listener. Under load beside it, the outcomes are
// successes and admission or queue rejections only, and the session keeps
// receiving notifications.
func TestAListeningConnHoldsAServerConnectionButNoPermit(t *testing.T) {
	ctx := pgTestCtx(t)
	channel := fmt.Sprintf("bh_listen_%d", time.Now().UnixNano())

	t.Run("B=2, Q=0: two transactions run beside the listener", func(t *testing.T) {
		g, db := openGated(t, bulkhead.Policy{MaxConcurrent: 2})
		listener := takeConn(t, ctx, db)
		if s := g.Stats(); s.OpenConns != 0 {
			t.Fatalf("a *sql.Conn taken but unused: %d server connections, want 0", s.OpenConns)
		}
		testkit.Exec(t, ctx, listener, "LISTEN "+channel)
		// The LISTEN's permits are back; its server connection stays
		// with the *sql.Conn.
		if s := g.Stats(); s.Running != 0 || s.OpenConns != 1 || s.IdleConns != 0 {
			t.Fatalf("after LISTEN: Running=%d OpenConns=%d IdleConns=%d, want 0, 1, 0", s.Running, s.OpenConns, s.IdleConns)
		}
		tx1, tx2 := pgBegin(t, ctx, db), pgBegin(t, ctx, db)
		if s := g.Stats(); s.Running != 2 || s.OpenConns != 3 {
			t.Errorf("two transactions beside the listener: Running=%d OpenConns=%d, want 2 and 3", s.Running, s.OpenConns)
		}
		_, err := db.BeginTx(ctx, nil)
		var re *bulkhead.RejectedError
		if !errors.Is(err, bulkhead.ErrAdmissionFull) || !errors.As(err, &re) {
			t.Fatalf("a third BeginTx with B=2 running: %v, want ErrAdmissionFull", err)
		}
		if re.Running != 2 || re.Waiting != 0 || re.MaxConcurrent != 2 || re.MaxQueue != 0 {
			t.Errorf("rejection %+v, want Running=2 Waiting=0 of B=2 Q=0", *re)
		}
		if s := g.Stats(); s.RejectedFull != 1 || s.RejectedTimeout != 0 || s.Running != 2 || s.OpenConns != 3 {
			t.Errorf("stats %+v: want one admission rejection, 2 running, 3 server connections (the rejection dialed none)", s)
		}
		tx1.Rollback()
		tx2.Rollback()
	})

	t.Run("B=2, Q=2: load beside the listener", func(t *testing.T) {
		g, db := openGated(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second})
		listener := takeConn(t, ctx, db)
		testkit.Exec(t, ctx, listener, "LISTEN "+channel)
		var wg sync.WaitGroup
		var outcomes pgTally
		for range 6 {
			wg.Go(func() {
				for range 50 {
					err := testkit.Tx(ctx, db, "SELECT pg_sleep(0.001)")
					key := "ok"
					switch {
					case errors.Is(err, bulkhead.ErrRejected):
						key = "rejected: " + bulkhead.ReasonLabel(err)
					case err != nil:
						key = err.Error()
					}
					outcomes.add(key)
				}
			})
		}
		wg.Wait()
		t.Logf("figures: 300 transactions beside a listening *sql.Conn, B=2 Q=2: %v; %+v", &outcomes, g.Stats())
		for k := range outcomes.n {
			if k != "ok" && !strings.HasPrefix(k, "rejected: ") {
				t.Errorf("outcome %q: want only successes and admission or queue rejections", k)
			}
		}
		// The listener kept its session through the load.
		testkit.Exec(t, ctx, db, "NOTIFY "+channel+", 'hello'")
		err := listener.Raw(func(dc any) error {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			u, err := bulkhead.Unwrap(dc)
			if err != nil {
				return err
			}
			n, err := u.(*stdlib.Conn).Conn().WaitForNotification(wctx)
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
// that run one at a time all land on one of them, the idle one given back
// last, whichever logical connection database/sql hands out (the
// running work stays on the fewest, warmest backends instead of
// rotating over all B+Q).
func TestOperationsRunOneAtATimeStayOnTheServerConnectionGivenBackLast(t *testing.T) {
	g, db := openGated(t, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 0})
	ctx := context.Background()
	// Four *sql.Conn at once: four server connections.
	var conns []*sql.Conn
	pids := map[int64]bool{}
	var last int64
	for range 4 {
		c := testkit.Conn(t, ctx, db)
		pid := queryOne[int64](t, ctx, c, "SELECT pg_backend_pid()")
		pids[pid] = true
		last = pid
		conns = append(conns, c)
	}
	if n := g.Stats().OpenConns; n != 4 || len(pids) != 4 {
		t.Fatalf("%d server connections open, %d backends, want 4 and 4", n, len(pids))
	}
	// Given back in the order they were taken: the last one's is the
	// warmest.
	for _, c := range conns {
		c.Close()
	}
	if s := g.Stats(); s.OpenConns != 4 || s.IdleConns != 4 {
		t.Fatalf("after closing the *sql.Conns: OpenConns=%d IdleConns=%d, want 4 and 4 (database/sql keeps B+Q=4 idle)", s.OpenConns, s.IdleConns)
	}
	// database/sql hands out its logical connections in its own order;
	// each operation still runs on the server connection given back last.
	for i := range 20 {
		pid := queryOne[int64](t, ctx, db, "SELECT pg_backend_pid()")
		if pid != last {
			t.Fatalf("operation %d ran on backend %d, want %d, the server connection given back last", i, pid, last)
		}
	}
	if s := g.Stats(); s.Dials != 4 || s.OpenConns != 4 {
		t.Errorf("after the operations: Dials=%d OpenConns=%d, want 4 and 4 (no server connection dialed or closed)", s.Dials, s.OpenConns)
	}
}
