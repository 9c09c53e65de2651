package tests

// The deadline-aware queue on PostgreSQL through pgx: once the gate has
// measured how long operations hold their permits, an operation whose
// deadline is closer than that is refused before it reaches the server,
// while one without a deadline waits its turn and runs.

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

// dlPgQueued runs query on db in a goroutine, once g shows n operations
// waiting for the permit (the one started here among them); its result
// arrives on the channel.
func dlPgQueued(t *testing.T, ctx context.Context, g *bulkhead.Gate, db *sql.DB, query string, n int) <-chan error {
	t.Helper()
	done := goExec(db, ctx, query)
	awaitState(t, "the operation waits for the permit", func() bool { return g.Stats().Waiting == n })
	return done
}

// A 10ms deadline for a statement measured holding its permit for
// pg_sleep(0.05) each time (a hold of at least 50ms) cannot be made: it is
// refused with ErrWouldMissDeadline, dials nothing and runs nothing on the
// server. Without a deadline the same statement waits and runs.
func TestADeadlineShorterThanTheMeasuredHoldIsRefusedBeforeReachingPostgreSQL(t *testing.T) {
	ctx, g, db := pgOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 4, QueueWait: 5 * time.Second})
	m := newMonitor(t)

	// Measure: each pg_sleep(0.05) waits behind a held transaction, so it
	// takes the measured path (an operation that finds the permit free is
	// not measured).
	const marker = "SELECT pg_sleep(0.05), 'bh deadline refused'"
	for i := range 3 {
		holder := pgBegin(t, ctx, db)
		done := dlPgQueued(t, ctx, g, db, marker, 1)
		txCommit(t, holder)
		if err := <-done; err != nil {
			t.Fatalf("measured operation %d: %v", i, err)
		}
	}
	t.Logf("hold measured: %v", g.Stats().Hold)

	// One transaction holds the only permit, running pg_sleep(0.2).
	tx := pgBegin(t, ctx, db)
	slept := goExec(tx, ctx, "SELECT pg_sleep(0.2)")
	before := g.Stats()

	dctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err := db.ExecContext(dctx, marker)
	cancel()
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) || rej.Cause != bulkhead.ErrWouldMissDeadline || !errors.Is(err, bulkhead.ErrRejected) {
		t.Fatalf("operation with a 10ms deadline: %v, want a *RejectedError matching ErrRejected with Cause ErrWouldMissDeadline", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || rej.Waited != 0 || rej.Hold < 50*time.Millisecond || rej.Left > 10*time.Millisecond {
		t.Fatalf("rejection %+v (%v), want no DeadlineExceeded, Waited 0, the statement's hold of 50ms or more, and at most 10ms left", *rej, err)
	}
	s := g.Stats()
	if s.RejectedDeadline != 1 || s.Dials != before.Dials || s.OpenConns != before.OpenConns || s.Admitted != before.Admitted {
		t.Fatalf("stats %+v (before %+v), want 1 deadline rejection and no dial or admission", s, before)
	}
	ran := queryOne[int](t, ctx, m.db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query = $2 AND state = 'active'", m.app, marker)
	if ran != 0 {
		t.Fatalf("%d server sessions ran the refused operation's SQL, want 0", ran)
	}

	const waiter = "SELECT 'bh no deadline'"
	done := dlPgQueued(t, ctx, g, db, waiter, 1)
	if err := <-slept; err != nil {
		t.Fatalf("the holder's pg_sleep(0.2): %v", err)
	}
	txCommit(t, tx)
	if err := <-done; err != nil {
		t.Fatalf("operation without a deadline: %v, want it run once the permit came back", err)
	}
	if s := g.Stats(); s.RejectedDeadline != 1 || s.RejectedTimeout != 0 || s.Canceled != 0 {
		t.Fatalf("stats %+v, want the one deadline rejection and nothing else refused", s)
	}
	pgExpectIdle(t, g)
}

// A statement measured while PostgreSQL was slow (pg_sleep(0.3) each)
// refuses its 100ms deadlines at first; after probeGap (250ms) of such
// refusals, one goes as a probe, its hold is measured though it left a
// permit free, and, fast, restarts the statement's estimate: the gate
// admits the same calls again within a fraction of a second, instead of
// refusing them for as long as old holds weigh.
func TestOnceTheDatabaseIsFastAgainTheGateAdmitsShortDeadlinesAgain(t *testing.T) {
	ctx, g, db := pgOpen(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 4, QueueWait: 5 * time.Second})

	// Measure slow holds: each pg_sleep(0.3) queues behind two held transactions.
	const query = "SELECT pg_sleep($1::float8)"
	for range 8 { // the holds a statement's estimate is the median of
		a, b := pgBegin(t, ctx, db), pgBegin(t, ctx, db)
		done := goExec(db, ctx, query, 0.3)
		awaitState(t, "the slow statement waits for a permit", func() bool { return g.Stats().Waiting == 1 })
		txCommit(t, a)
		txCommit(t, b)
		if err := <-done; err != nil {
			t.Fatalf("slow operation: %v", err)
		}
	}
	stale := g.Stats().Hold

	// The same statement, now fast, with a 100ms deadline, one at a time:
	// each finds both permits free.
	call := func() error {
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := db.ExecContext(dctx, query, 0.0)
		return err
	}
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond) // paces the calls; nothing waits on it for state
	defer tick.Stop()
	refused := 0
	for i := 0; ; i++ {
		if i == 2000 {
			t.Fatalf("%d calls with a 100ms deadline refused after the hold of %v, none let through (stats %+v)", refused, stale, g.Stats())
		}
		err := call()
		if err == nil {
			break
		}
		if !errors.Is(err, bulkhead.ErrWouldMissDeadline) {
			t.Fatalf("call %d: %v, want it run or refused with ErrWouldMissDeadline", i, err)
		}
		refused++
		<-tick.C
	}
	if refused == 0 {
		t.Fatalf("no call refused under a hold of %v, want the first ones refused", stale)
	}
	let := time.Since(start)
	for i := range 20 {
		if err := call(); err != nil {
			t.Fatalf("call %d after the one let through: %v, want every one run", i, err)
		}
	}
	t.Logf("hold %v, then %d calls refused over %v before one was let through", stale, refused, let)
	pgExpectIdle(t, g)
}

// Through pgxgate, a pg_sleep(5) cut off by a 100ms deadline keeps its
// permit until PostgreSQL stopped it, after the cancel request; its hold
// counts only up to the deadline, so that the next callers' deadlines are
// not weighed against the cancellation's time.
func TestAStatementCutOffByItsDeadlineCountsAsAHoldUpToTheDeadline(t *testing.T) {
	ctx := pgTestCtx(t)
	released := make(chan time.Duration, 1)
	g, db := gateOn(t, pgxgate.Connector(pgConfig(t)), bulkhead.Policy{MaxConcurrent: 2, Adaptive: true},
		bulkhead.WithEvents(bulkhead.Events{OnRelease: func(e bulkhead.Event) {
			if e.Kind == bulkhead.KindExec {
				released <- e.Held // one exec runs
			}
		}}))
	if err := db.PingContext(ctx); err != nil { // dialed before: the hold is the statement's
		t.Fatal(err)
	}

	t0 := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	dl, _ := dctx.Deadline()
	if _, err := db.ExecContext(dctx, "SELECT pg_sleep(5)"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pg_sleep(5) with a 100ms deadline: %v, want context.DeadlineExceeded", err)
	}
	var whole time.Duration
	select {
	case whole = <-released: // sent before the exec returned
	default:
		t.Fatal("no release event for the exec")
	}
	// Twice more, with deadlines the estimate leaves room for, so that it is
	// the cut-off holds' (one alone is an outlier): then a deadline between
	// the last one it was cut off at and its whole hold is not refused as late.
	last := dl.Sub(t0)
	for _, d := range []time.Duration{120 * time.Millisecond, 140 * time.Millisecond} {
		c, cancel := context.WithTimeout(ctx, d)
		if _, err := db.ExecContext(c, "SELECT pg_sleep(5)"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("pg_sleep(5) with a %v deadline: %v, want context.DeadlineExceeded", d, err)
		}
		cancel()
		whole, last = <-released, d
	}
	mid := last + (whole-last)/2
	c, cancel2 := context.WithTimeout(ctx, mid)
	defer cancel2()
	_, err := db.ExecContext(c, "SELECT pg_sleep(5)")
	if errors.Is(err, bulkhead.ErrWouldMissDeadline) {
		t.Fatalf("a deadline of %v after holds of %v cut off at 100ms: %v, want it let through (the hold counts up to the deadline, not the %v with the cancellation)", mid, whole, err, whole)
	}
	t.Logf("held %v in all, %v after its deadline of %v; a deadline of %v let through: %v", whole, whole-last, last, mid, err)
	pgExpectIdle(t, g)
}
