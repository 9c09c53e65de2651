package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
)

// A fleet member's refusals on PostgreSQL, as docs/fleet.md promises them:
// "a member with no share rejects every operation at once".

// fleetJoin is fleetGate with the member's inner connector given: its
// loop's interval is an hour unless opts set another, and its coordination
// sessions are the test's own (directCoordination) unless opts name
// another coordinator.
func fleetJoin(t *testing.T, name string, p bulkhead.Policy, inner driver.Connector, opts ...fleet.Option) *fleet.Member {
	t.Helper()
	opts = append([]fleet.Option{fleet.Interval(time.Hour), directCoordination(t)}, opts...)
	m, err := fleet.Join(name, inner, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Gate().OpenDB().Close() }) // closes the gate too
	awaitState(t, "the fleet loop's first round started", func() bool { return m.Stats().Rounds > 0 })
	return m
}

// fleetRefusal checks that err is a rejection for cause, and not for any
// other cause, naming the limits b and q in force, and that it waited for
// nothing unless waited is set; it returns the rejection.
func fleetRefusal(t *testing.T, what string, err, cause error, b, q int, waited bool) *bulkhead.RejectedError {
	t.Helper()
	var re *bulkhead.RejectedError
	if !errors.As(err, &re) || !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, cause) {
		t.Errorf("%s: %v, want a rejection matching %v", what, err, cause)
		return re
	}
	for _, other := range []error{bulkhead.ErrAdmissionFull, bulkhead.ErrQueueTimeout, bulkhead.ErrWouldMissDeadline, bulkhead.ErrLeaseExpired} {
		if other != cause && errors.Is(err, other) {
			t.Errorf("%s: %v matches %v too, want %v alone", what, err, other, cause)
		}
	}
	if errors.Is(err, driver.ErrBadConn) {
		t.Errorf("%s: %v matches driver.ErrBadConn", what, err)
	}
	if re.MaxConcurrent != b || re.MaxQueue != q {
		t.Errorf("%s: %v, want B=%d, Q=%d named", what, err, b, q)
	}
	if (re.Waited > 0) != waited {
		t.Errorf("%s: waited %v (%v), want a wait: %v", what, re.Waited, err, waited)
	}
	return re
}

// fleetOps are the gated operations a refused caller may try, each on db
// with ctx: they return the gate's error.
var fleetOps = []struct {
	name string
	run  func(ctx context.Context, db *sql.DB) error
}{
	{"Exec", func(ctx context.Context, db *sql.DB) error {
		_, err := db.ExecContext(ctx, "SELECT 1")
		return err
	}},
	{"Query", func(ctx context.Context, db *sql.DB) error {
		rows, err := db.QueryContext(ctx, "SELECT 1")
		if err == nil {
			rows.Close()
		}
		return err
	}},
	{"QueryRow", func(ctx context.Context, db *sql.DB) error {
		return db.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
	}},
	{"BeginTx", func(ctx context.Context, db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err == nil {
			tx.Rollback()
		}
		return err
	}},
	{"the first statement on a db.Conn", func(ctx context.Context, db *sql.DB) error {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.ExecContext(ctx, "SELECT 1")
		return err
	}},
}

// With T = 1 and Q = 2 over two members, the member whose share is 0 keeps
// no queue: each operation on it, alone or four at once, is refused at once
// with ErrAdmissionFull (B=0, Q=0, Waited 0), and none reaches its driver.
func TestFleetMemberWithNoShareRejectsEveryOperationAtOnce(t *testing.T) {
	ctx := pgTestCtx(t)
	admin := adminDB(t)
	name := fleetName(t)
	const total, queue = 1, 2
	p := fleetPolicy(total, queue)
	p.QueueWait = 500 * time.Millisecond // what a caller waited before: a failure, not a hang
	spies := []*relSpyConnector{{inner: stdlib.GetConnector(*pgConfig(t))}, {inner: stdlib.GetConnector(*pgConfig(t))}}
	ms := []*fleet.Member{fleetJoin(t, name, p, spies[0]), fleetJoin(t, name, p, spies[1])}
	for range 2 {
		for _, m := range ms {
			if err := m.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			checkFleet(t, ctx, admin, name, total, ms)
		}
	}
	zero := 0
	if ms[0].Gate().Stats().MaxConcurrent != 0 {
		zero = 1
	}
	m, spy := ms[zero], spies[zero]
	if b, _ := shares(ms); fmt.Sprint(sortDesc(b)) != "[1 0]" {
		t.Fatalf("T=1 over two members, settled: shares %v, want [1 0]", b)
	}
	if fs := m.Stats(); fs.Share != 0 || fs.Instances != 2 || fs.Degraded {
		t.Fatalf("the member without share: fleet stats %+v, want share 0 of 2 instances", fs)
	}

	db := m.Gate().OpenDB()
	for _, op := range fleetOps {
		fleetRefusal(t, op.name, op.run(ctx, db), bulkhead.ErrAdmissionFull, 0, 0, false)
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- fleetOps[0].run(ctx, db) }()
	}
	for range 4 {
		fleetRefusal(t, "Exec, four at once", relAwait(t, "Exec, four at once", errs), bulkhead.ErrAdmissionFull, 0, 0, false)
	}

	n := int64(len(fleetOps) + 4)
	s := m.Gate().Stats()
	if s.MaxConcurrent != 0 || s.MaxQueue != 0 || s.Waiting != 0 || s.WaitCount != 0 {
		t.Errorf("the member without share: B=%d, Q=%d, %d waiting, %d waited; want 0, 0, 0, 0", s.MaxConcurrent, s.MaxQueue, s.Waiting, s.WaitCount)
	}
	if s.RejectedFull != n || s.RejectedTimeout != 0 || s.Admitted != 0 || s.Dials != 0 {
		t.Errorf("stats %+v: want %d admission full, no queue timeout, nothing admitted, no dial", s, n)
	}
	if d, st := spy.dials.Load(), spy.stmts.Load(); d != 0 || st != 0 {
		t.Errorf("the refused operations reached the driver: %d dials, %d statements", d, st)
	}
}

// A member whose share falls to 0 (its round failed, fleet.Fallback(0))
// sends the operations waiting in its queue away at once, with
// ErrAdmissionFull, B=0, Q=0, instead of letting them wait their queue wait;
// none of them reaches its driver.
func TestFleetMemberWhoseShareFallsToZeroSendsItsQueueAwayAtOnce(t *testing.T) {
	ctx := pgTestCtx(t)
	admin := adminDB(t)
	p := fleetPolicy(1, 2)
	p.QueueWait = time.Minute // beyond relAwait's bound: a waiter left in the queue is a failure
	spy := &relSpyConnector{inner: stdlib.GetConnector(*pgConfig(t))}
	m := fleetJoin(t, fleetName(t), p, spy, fleet.Fallback(0))
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if s := m.Gate().Stats(); s.MaxConcurrent != 1 || s.MaxQueue != 2 {
		t.Fatalf("alone in a fleet of T=1, Q=2: B=%d, Q=%d; want 1, 2", s.MaxConcurrent, s.MaxQueue)
	}
	db := m.Gate().OpenDB()
	tx := pgBegin(t, ctx, db)
	dials, stmts := spy.dials.Load(), spy.stmts.Load()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- fleetOps[0].run(ctx, db) }()
	}
	awaitState(t, "two operations queued behind the transaction", func() bool { return m.Gate().Stats().Waiting == 2 })

	terminate(t, ctx, admin, m.Stats().Backend)
	if err := m.Sync(ctx); !errors.Is(err, fleet.ErrCoordination) {
		t.Fatalf("a round on a terminated session: %v, want ErrCoordination", err)
	}
	for range 2 {
		fleetRefusal(t, "an Exec queued as the share fell to 0", relAwait(t, "an Exec queued as the share fell to 0", errs), bulkhead.ErrAdmissionFull, 0, 0, true)
	}
	if d, st := spy.dials.Load()-dials, spy.stmts.Load()-stmts; d != 0 || st != 0 {
		t.Errorf("the operations sent away reached the driver: %d dials, %d statements", d, st)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	fleetRefusal(t, "an Exec once the transaction ended", fleetOps[0].run(ctx, db), bulkhead.ErrAdmissionFull, 0, 0, false)
	if s := m.Gate().Stats(); s.Waiting != 0 || s.Running != 0 || s.RejectedFull != 3 || s.RejectedTimeout != 0 || s.Admitted != 1 {
		t.Errorf("stats %+v: want nothing waiting or running, 3 admission full, no queue timeout, 1 admitted", s)
	}
}
