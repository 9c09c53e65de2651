package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
)

// A fleet member's refusals on PostgreSQL, as docs/fleet.md promises them:
// "a member with no share rejects every operation at once"; and as the
// README's errors table does: ErrLeaseExpired, "a fleet member's lease ran
// out before the operation started".

// fleetMember makes one member of the fleet name on inner, its loop's
// interval an hour unless opts set another, whose gate is closed at the
// end of the test (leaving the fleet).
func fleetMember(t *testing.T, name string, inner driver.Connector, p bulkhead.Policy, opts ...fleet.Option) *fleet.Member {
	t.Helper()
	m, err := fleet.Join(name, inner, p, append([]fleet.Option{fleet.Interval(time.Hour)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Gate().OpenDB().Close() }) // closes the gate too
	// The loop's first round starts at once: let it start (Sync waits
	// for a round in progress), so that it does not run between the
	// test's steps.
	awaitState(t, "the fleet loop's first round started", func() bool { return m.Stats().Rounds > 0 })
	return m
}

// fleetJoin is fleetGate with the member's inner connector given.
func fleetJoin(t *testing.T, name string, p bulkhead.Policy, inner driver.Connector, opts ...fleet.Option) *fleet.Member {
	t.Helper()
	m := fleetMember(t, name, inner, p, append([]fleet.Option{directCoordination(t)}, opts...)...)
	// A round of its own waits for the loop's to end: the test's reads of
	// the locks and the shares never fall in the middle of one.
	if err := m.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
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
	ctx, admin, name := fleetStart(t)
	const total, queue = 1, 2
	p := fleetPolicy(total, queue)
	p.QueueWait = 500 * time.Millisecond // what a caller waited before: a failure, not a hang
	spies := []*relSpyConnector{{inner: stdlib.GetConnector(*pgConfig(t))}, {inner: stdlib.GetConnector(*pgConfig(t))}}
	ms := []*fleet.Member{fleetJoin(t, name, p, spies[0]), fleetJoin(t, name, p, spies[1])}
	for range 2 {
		for _, m := range ms {
			fleetSync(t, ctx, m)
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
// sends the operations waiting in its queue away at once, instead of
// letting them wait their queue wait, and refuses the next ones at once:
// with ErrLeaseExpired, B=0, Q=0, for it runs on its fallback share; none
// of them reaches its driver.
func TestFleetMemberWhoseShareFallsToZeroSendsItsQueueAwayAtOnce(t *testing.T) {
	ctx := pgTestCtx(t)
	admin := adminDB(t)
	p := fleetPolicy(1, 2)
	p.QueueWait = time.Minute // beyond relAwait's bound: a waiter left in the queue is a failure
	spy := &relSpyConnector{inner: stdlib.GetConnector(*pgConfig(t))}
	m := fleetJoin(t, fleetName(t), p, spy, fleet.Fallback(0))
	fleetSync(t, ctx, m)
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

	failedRound(t, ctx, admin, m)
	for range 2 {
		fleetRefusal(t, "an Exec queued as the share fell to 0", relAwait(t, "an Exec queued as the share fell to 0", errs), bulkhead.ErrLeaseExpired, 0, 0, true)
	}
	if d, st := spy.dials.Load()-dials, spy.stmts.Load()-stmts; d != 0 || st != 0 {
		t.Errorf("the operations sent away reached the driver: %d dials, %d statements", d, st)
	}
	txCommit(t, tx)
	fleetRefusal(t, "an Exec once the transaction ended", fleetOps[0].run(ctx, db), bulkhead.ErrLeaseExpired, 0, 0, false)
	if s := m.Gate().Stats(); s.Waiting != 0 || s.Running != 0 || s.RejectedLease != 3 || s.RejectedFull != 0 || s.RejectedTimeout != 0 || s.Admitted != 1 {
		t.Errorf("stats %+v: want nothing waiting or running, 3 refused on the fallback share, no queue timeout, 1 admitted", s)
	}
}

// An operation waiting in the queue of a member whose lease runs out with
// fallback 0 is sent away at once with ErrLeaseExpired as B falls to 0,
// with no other call on the gate to notice the lease's end: it does not
// wait out its queue wait.
func TestFleetMemberWhoseLeaseRunsOutSendsItsQueueAwayAtOnce(t *testing.T) {
	ctx := pgTestCtx(t)
	const total, queue = 2, 1
	p := fleetPolicy(total, queue)
	p.QueueWait = time.Minute // beyond relAwait's bound: a waiter left in the queue is a failure
	d := newFleetStallDialer()
	m := fleetJoin(t, fleetName(t), p, stdlib.GetConnector(*pgConfig(t)), fleet.Interval(500*time.Millisecond), fleet.Fallback(0), dialedCoordination(t, d.dial))
	t.Cleanup(d.heal) // before the member leaves: its loop waits for the stalled round
	g, db := m.Gate(), m.Gate().OpenDB()
	awaitState(t, "the member's share of 2", func() bool { return g.Stats().MaxConcurrent == total })
	pgBegin(t, ctx, db)
	pgBegin(t, ctx, db)
	waiter := make(chan error, 1)
	go func() { waiter <- fleetOps[0].run(ctx, db) }()
	awaitState(t, "one operation queued behind two transactions", func() bool { return g.Stats().Waiting == 1 })
	d.stall()
	// From here nothing calls the gate: neither Stats nor an operation.
	fleetRefusal(t, "the operation queued as the lease ran out", relAwait(t, "the operation queued as the lease ran out", waiter), bulkhead.ErrLeaseExpired, 0, 0, true)
}

// fleetStallDialer dials a member's coordination connections (pgx's
// DialFunc) and can stall them: from stall on, a connection's writes
// vanish and its reads wait, past any deadline pgx sets for the round's
// context, until heal fails them. A round so stalled ends only at heal: the
// member's lease runs out meanwhile, and no failed round marks it degraded
// first (a blackhole, relFaultDialer's, fails the round once its context
// ends, 5 s later).
type fleetStallDialer struct {
	stalling atomic.Bool
	healed   chan struct{}
	once     sync.Once
	dialed[*fleetStallConn]
}

func newFleetStallDialer() *fleetStallDialer {
	return &fleetStallDialer{healed: make(chan struct{})}
}

func (d *fleetStallDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.dialed.dial(ctx, network, addr, func(c net.Conn) *fleetStallConn { return &fleetStallConn{Conn: c, d: d} })
}

func (d *fleetStallDialer) stall() { d.stalling.Store(true) }

// heal ends the stall: the stalled connections' reads fail, and they are
// closed (the server ends their sessions); the others work on.
func (d *fleetStallDialer) heal() {
	d.once.Do(func() {
		d.stalling.Store(false)
		close(d.healed)
		d.each(func(c *fleetStallConn) {
			if c.stalled.Load() {
				c.Conn.Close()
			}
		})
	})
}

type fleetStallConn struct {
	net.Conn
	d       *fleetStallDialer
	stalled atomic.Bool // a write vanished: its protocol state is gone
}

var errFleetStallHealed = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("the stalled connection was healed: closed")}

func (c *fleetStallConn) Read(b []byte) (int, error) {
	if c.stalled.Load() {
		<-c.d.healed
		return 0, errFleetStallHealed
	}
	return c.Conn.Read(b)
}

func (c *fleetStallConn) Write(b []byte) (int, error) {
	if c.stalled.Load() || c.d.stalling.Load() {
		c.stalled.Store(true)
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// A member alone in a fleet of T = 2 whose coordination stalls runs on its
// share only until its lease ends: then, with no round failed, the
// operations its fallback share has no room for are refused with
// ErrLeaseExpired (never ErrAdmissionFull), counted in Stats.RejectedLease
// and reported so to OnReject, none reaching its driver; with fallback 0
// that is every operation, at once; with fallback 1, one beyond the one
// running, whether admission is full or its queue wait ends. Once the coordination
// heals and a round succeeds, a refusal under the renewed lease is no
// longer ErrLeaseExpired.
func TestFleetMemberWhoseLeaseRanOutRefusesWithErrLeaseExpiredUntilARoundSucceeds(t *testing.T) {
	for _, fallback := range []int{0, 1} {
		t.Run(fmt.Sprintf("fallback=%d", fallback), func(t *testing.T) {
			ctx := pgTestCtx(t)
			const total, queue = 2, 1
			p := fleetPolicy(total, queue)
			p.QueueWait = 500 * time.Millisecond // what a caller queued on the fallback share waits: a failure, not a hang
			interval := 500 * time.Millisecond   // the lease: 750 ms from the start of the last successful round
			d := newFleetStallDialer()
			var mu sync.Mutex
			reasons := map[error]int{}
			onReject := func(e bulkhead.Event) {
				mu.Lock()
				reasons[e.Reason]++
				mu.Unlock()
			}
			spy := &relSpyConnector{inner: stdlib.GetConnector(*pgConfig(t))}
			m := fleetJoin(t, fleetName(t), p, spy, fleet.Interval(interval), fleet.Fallback(fallback),
				dialedCoordination(t, d.dial), fleet.GateOptions(bulkhead.WithEvents(bulkhead.Events{OnReject: onReject})))
			t.Cleanup(d.heal) // before the member leaves: its loop waits for the stalled round
			g, db := m.Gate(), m.Gate().OpenDB()
			awaitState(t, "the member's share of 2", func() bool { return g.Stats().MaxConcurrent == total })
			if err := fleetOps[0].run(ctx, db); err != nil {
				t.Fatal(err)
			}

			failures := m.Stats().Failures
			d.stall()
			// A round begun after the stall hangs until heal, and no other
			// round runs meanwhile: the lease runs out for good.
			rounds := m.Stats().Rounds
			awaitState(t, "a round stalled and the lease ran out: B at the fallback", func() bool {
				return m.Stats().Rounds > rounds && g.Stats().MaxConcurrent == fallback
			})
			var tx *sql.Tx
			if fallback == 1 {
				tx = pgBegin(t, ctx, db) // it runs on the fallback share
			}
			dials, stmts := spy.dials.Load(), spy.stmts.Load()
			want := int64(0)
			if fallback == 0 {
				for _, op := range fleetOps {
					fleetRefusal(t, op.name, op.run(ctx, db), bulkhead.ErrLeaseExpired, 0, 0, false)
					want++
				}
			} else {
				// One runs on the fallback share, one waits: admission is full.
				wctx, cancel := context.WithCancel(bulkhead.WithQueueWait(ctx, time.Minute))
				waiter := make(chan error, 1)
				go func() { waiter <- fleetOps[0].run(wctx, db) }()
				awaitState(t, "one operation queued on the fallback share", func() bool { return g.Stats().Waiting == 1 })
				fleetRefusal(t, "Exec, admission full", fleetOps[0].run(ctx, db), bulkhead.ErrLeaseExpired, 1, queue, false)
				cancel()
				if err := relAwait(t, "the waiter cancelled", waiter); !errors.Is(err, context.Canceled) || errors.Is(err, bulkhead.ErrRejected) {
					t.Errorf("the waiter whose context ended: %v, want context.Canceled", err)
				}
				// Its queue wait ends before a permit comes.
				fleetRefusal(t, "Exec, queue wait over", fleetOps[0].run(bulkhead.WithQueueWait(ctx, 20*time.Millisecond), db), bulkhead.ErrLeaseExpired, 1, queue, true)
				want = 2
			}
			if dd, ds := spy.dials.Load()-dials, spy.stmts.Load()-stmts; dd != 0 || ds != 0 {
				t.Errorf("the refused operations reached the driver: %d dials, %d statements", dd, ds)
			}
			if tx != nil {
				txCommit(t, tx)
			}
			s, fs := g.Stats(), m.Stats()
			if s.RejectedLease != want || s.RejectedFull != 0 || s.RejectedTimeout != 0 {
				t.Errorf("stats %+v: want %d refusals counted as RejectedLease, none as full or timed out", s, want)
			}
			mu.Lock()
			if reasons[bulkhead.ErrLeaseExpired] != int(want) || len(reasons) != 1 {
				t.Errorf("OnReject reasons %v, want ErrLeaseExpired %d times", reasons, want)
			}
			mu.Unlock()
			if fs.Failures != failures || fs.Degraded {
				t.Fatalf("fleet stats %+v during the stall: want no failed round (%d before), not degraded: the lease alone ran out", fs, failures)
			}

			d.heal()
			awaitState(t, "a round succeeded after the heal", func() bool {
				fs := m.Stats()
				return fs.Failures > failures && !fs.Degraded && g.Stats().MaxConcurrent == total
			})
			fleetRefusesUnderItsLease(t, ctx, m, total)
		})
	}
}

// fleetRefusesUnderItsLease fills the member's B with transactions and
// checks that one more operation, with a queue wait of 0, refused for want
// of permits while the lease holds B at total, is ErrQueueTimeout, not
// ErrLeaseExpired. A lease that ran out again (a round late on a busy
// machine) shows as a transaction refused with ErrLeaseExpired, or a lower
// B named in the refusal: then it tries again after the next successful
// round, up to 10 times.
func fleetRefusesUnderItsLease(t *testing.T, ctx context.Context, m *fleet.Member, total int) {
	t.Helper()
	g, db := m.Gate(), m.Gate().OpenDB()
	for try := 1; ; try++ {
		var txs []*sql.Tx
		var err error
		for len(txs) < total && err == nil {
			var tx *sql.Tx
			if tx, err = db.BeginTx(ctx, nil); err == nil {
				txs = append(txs, tx)
			}
		}
		begun := err == nil
		if begun {
			err = fleetOps[0].run(bulkhead.WithQueueWait(ctx, 0), db)
		}
		for _, tx := range txs {
			if cerr := tx.Commit(); cerr != nil {
				t.Fatal(cerr)
			}
		}
		var re *bulkhead.RejectedError
		switch {
		case !begun && !errors.Is(err, bulkhead.ErrLeaseExpired):
			t.Fatalf("a transaction within B=%d: %v", total, err)
		case !errors.As(err, &re):
			t.Fatalf("an operation beyond B=%d: %v, want a rejection", total, err)
		case begun && re.MaxConcurrent == total:
			if errors.Is(err, bulkhead.ErrLeaseExpired) || !errors.Is(err, bulkhead.ErrQueueTimeout) {
				t.Fatalf("an operation beyond B=%d under the renewed lease: %v, want ErrQueueTimeout (no wait), not ErrLeaseExpired", total, err)
			}
			return
		}
		t.Logf("try %d: the lease ran out again (%v)", try, err)
		if try == 10 {
			t.Fatalf("the lease ran out again in each of %d tries", try)
		}
		rounds := m.Stats().Rounds
		awaitState(t, "the next successful round", func() bool {
			fs := m.Stats()
			return fs.Rounds > rounds+1 && !fs.Degraded && g.Stats().MaxConcurrent == total
		})
	}
}
