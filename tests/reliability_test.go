package tests

// The fault matrix on real PostgreSQL (RELIABILITY.md lists the scenarios).
// Every scenario builds a relRig: a gated *sql.DB whose inner connector is
// a spy (counting dials and statements that reach pgx), with event hooks
// counting admissions, releases and rejections, and a background poller
// reading pg_stat_activity for the test's application_name. At the end
// (finish) the rig checks the invariants of the issue:
//
//	P  once idle, Running == 0 and Waiting == 0, every admitted operation
//	   released exactly once, Stats counters consistent with the events
//	S  transactions open on the server for the application never above B
//	   at any poll (and the poller did poll)
//	U  db.Stats().InUse back to 0
//
// R (rejection at once, reaching no driver call) is checked by
// relRejectedAtOnce, D (committed rows present, rolled-back rows absent) by
// relRig.ids against a table of its own, and G by TestMain's goleak.
//
// Waiting for asynchronous state (database/sql's rollback goroutine, a
// backend killed by the server) polls that state in a loop bounded by a
// deadline; nothing sleeps for synchronisation.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// relBound is the generous bound on anything that must "return
// eventually": far above any expected duration, it only turns a hang into
// a failure.
const relBound = 20 * time.Second

// The spy: counts what reaches the driver.

// relSpyConnector counts the Connect calls and the statements (BeginTx,
// Exec, Query, Prepare) that reach pgx, the Prepares apart too. Its conns
// embed *stdlib.Conn, so they implement exactly pgx's optional interfaces
// and the gate sees the same driver it would see without the spy.
type relSpyConnector struct {
	inner    driver.Connector
	dials    atomic.Int64 // Connect calls
	opened   atomic.Int64 // connections they returned
	closes   atomic.Int64
	stmts    atomic.Int64
	prepares atomic.Int64
}

func (s *relSpyConnector) Connect(ctx context.Context) (driver.Conn, error) {
	s.dials.Add(1)
	c, err := s.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	s.opened.Add(1)
	return &relSpyConn{Conn: c.(*stdlib.Conn), spy: s}, nil
}

func (s *relSpyConnector) Driver() driver.Driver { return s.inner.Driver() }

// open is the number of connections the spy returned and that are not closed.
func (s *relSpyConnector) open() int64 { return s.opened.Load() - s.closes.Load() }

type relSpyConn struct {
	*stdlib.Conn
	spy *relSpyConnector
}

func (c *relSpyConn) Close() error {
	c.spy.closes.Add(1)
	return c.Conn.Close()
}

func (c *relSpyConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.spy.stmts.Add(1)
	return c.Conn.BeginTx(ctx, opts)
}

func (c *relSpyConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.spy.stmts.Add(1)
	return c.Conn.ExecContext(ctx, q, args)
}

func (c *relSpyConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.spy.stmts.Add(1)
	return c.Conn.QueryContext(ctx, q, args)
}

func (c *relSpyConn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c *relSpyConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.spy.stmts.Add(1)
	c.spy.prepares.Add(1)
	return c.Conn.PrepareContext(ctx, q)
}

// The server poller (invariant S).

// relFigures is what the poller saw.
type relFigures struct {
	maxTx, maxConns int // most transactions / connections of the application at one poll
	polls, fails    int
	lastErr         error
}

// relServerPoll reads pg_stat_activity for one application_name every
// millisecond on its own connection, in autocommit (the view is
// snapshotted per transaction), until stopped.
type relServerPoll struct {
	db   *sql.DB
	app  string
	quit chan struct{}
	done chan struct{}
	once sync.Once
	f    relFigures // written by the goroutine; read after done

	mu    sync.Mutex
	dying []int64 // backends the test terminates: on their way out, not counted
}

// terminating tells the poller that the test is about to terminate the
// backend pid: a terminated backend still lists its transaction while it
// exits, after its client saw the error and the gate released the permit,
// and the server's own termination is not the gate's to bound.
func (sp *relServerPoll) terminating(pid int64) {
	sp.mu.Lock()
	sp.dying = append(sp.dying, pid)
	sp.mu.Unlock()
}

func relStartServerPoll(m *monitor) *relServerPoll {
	sp := &relServerPoll{db: m.db, app: m.app, quit: make(chan struct{}), done: make(chan struct{})}
	go sp.run()
	return sp
}

func (sp *relServerPoll) run() {
	defer close(sp.done)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		sp.sample()
		select {
		case <-sp.quit:
			sp.sample() // the end state too
			return
		case <-tick.C:
		}
	}
}

func (sp *relServerPoll) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var tx, conns int
	sp.mu.Lock()
	dying := append([]int64{}, sp.dying...)
	sp.mu.Unlock()
	// pg_stat_activity is not an atomic snapshot (the server copies the
	// backends' entries one after the other): count only transactions
	// that began before this statement, all open at that one instant, and
	// leave out pgx's ungated session-reset ping (see main_test.go) and
	// backends the test terminated.
	err := sp.db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE xact_start < statement_timestamp()
		     AND NOT (state = 'active' AND query = '-- ping')), count(*)
		  FROM pg_stat_activity WHERE application_name = $1
		   AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND NOT pid = ANY($2)`, sp.app, dying).Scan(&tx, &conns)
	if err != nil {
		sp.f.fails++
		sp.f.lastErr = err
		return
	}
	sp.f.polls++
	sp.f.maxTx = max(sp.f.maxTx, tx)
	sp.f.maxConns = max(sp.f.maxConns, conns)
}

// stop ends the poller (idempotent) and returns what it saw.
func (sp *relServerPoll) stop() relFigures {
	sp.once.Do(func() { close(sp.quit) })
	<-sp.done
	return sp.f
}

// The rig.

type relRigOptions struct {
	cfg       *pgx.ConnConfig // the gated connections; default pgConfig(t)
	serverURL string          // the same server, for monitor and control connections; default postgresURL(t)
	holdLimit time.Duration   // WithHoldWarning; reports go to relRig.holds
	maxConns  int             // assert the server never saw more connections of the application (0: not checked)
}

type relRig struct {
	t    *testing.T
	p    bulkhead.Policy
	g    *bulkhead.Gate
	db   *sql.DB
	spy  *relSpyConnector
	ctl  *sql.DB  // ungated, without the application_name: DDL, checks, locks, kills
	mon  *monitor // ungated, for direct counts of the application's backends
	poll *relServerPoll
	app  string
	opt  relRigOptions

	admits, releases, rejects atomic.Int64
	released                  chan struct{} // a token after each release
	holds                     chan bulkhead.Event
}

// relConfig is pgConfig with the process id in the application_name: the
// same test running in two processes against one server (several go test
// runs at once) must not count, kill or lock the other's sessions.
func relConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	cfg := pgConfig(t)
	cfg.RuntimeParams["application_name"] = relAppName(t)
	return cfg
}

func relAppName(t testing.TB) string {
	return fmt.Sprintf("%s_%d", appName(t), os.Getpid())
}

func newRelRig(t *testing.T, p bulkhead.Policy, o relRigOptions) *relRig {
	t.Helper()
	if o.cfg == nil {
		o.cfg = relConfig(t)
	}
	if o.serverURL == "" {
		o.serverURL = postgresURL(t)
	}
	r := &relRig{
		t: t, p: p, opt: o,
		app:      o.cfg.RuntimeParams["application_name"],
		spy:      &relSpyConnector{inner: stdlib.GetConnector(*o.cfg)},
		released: make(chan struct{}, 1),
		holds:    make(chan bulkhead.Event, 64),
	}
	if r.app == "" || len(r.app) > 63 {
		// The server truncates longer names: the counts would find nothing.
		t.Fatalf("relRig: application_name %q: want 1 to 63 bytes", r.app)
	}
	opts := []bulkhead.Option{bulkhead.WithEvents(bulkhead.Events{
		OnAdmit:  func(bulkhead.Event) { r.admits.Add(1) },
		OnReject: func(bulkhead.Event) { r.rejects.Add(1) },
		OnRelease: func(bulkhead.Event) {
			r.releases.Add(1)
			select {
			case r.released <- struct{}{}:
			default:
			}
		},
	})}
	if o.holdLimit > 0 {
		opts = append(opts, bulkhead.WithHoldWarning(o.holdLimit, func(e bulkhead.Event) {
			select {
			case r.holds <- e:
			default:
			}
		}))
	}
	g, err := bulkhead.New(r.spy, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	r.g = g
	r.ctl = openURL(t, o.serverURL, 8)
	r.mon = &monitor{db: openURL(t, o.serverURL, 1), app: r.app}
	r.poll = relStartServerPoll(&monitor{db: openURL(t, o.serverURL, 1), app: r.app})
	t.Cleanup(func() { r.poll.stop() })
	r.db = g.OpenDB()
	t.Cleanup(func() { r.db.Close() })
	return r
}

// relOpen is newRelRig with a table of the test's own (relRig.table) and
// a context bounding the test's calls (relRig.ctx).
func relOpen(t *testing.T, p bulkhead.Policy, o relRigOptions) (*relRig, string, context.Context) {
	t.Helper()
	r := newRelRig(t, p, o)
	return r, r.table(""), r.ctx()
}

// terminateApp terminates every backend of the application, telling the
// poller first (relServerPoll.terminating), and waits for them to exit.
func (r *relRig) terminateApp(ctx context.Context) error {
	for _, pid := range queryColumn[int64](r.t, ctx, r.ctl, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", r.app) {
		r.poll.terminating(pid)
		if _, err := r.ctl.ExecContext(ctx, "SELECT pg_terminate_backend($1, 5000)", pid); err != nil {
			return err
		}
	}
	return nil
}

// ctx is a context bounded by relBound, cancelled at the end of the test.
func (r *relRig) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), relBound)
	r.t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond, waking at each release and otherwise every few
// milliseconds, until it holds or relBound passes.
func (r *relRig) waitFor(cond func() bool) bool {
	deadline := time.NewTimer(relBound)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-r.released:
		case <-time.After(2 * time.Millisecond):
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

// must waits for cond and fails the test, naming what, if it never holds.
func (r *relRig) must(what string, cond func() bool) {
	r.t.Helper()
	if !r.waitFor(cond) {
		r.t.Fatalf("%s: not reached within %v (gate %+v)", what, relBound, r.g.Stats())
	}
}

// noneRunning checks P at once: no operation holds a permit, what
// having just happened.
func (r *relRig) noneRunning(what string) {
	r.t.Helper()
	if s := r.g.Stats(); s.Running != 0 {
		r.t.Errorf("P: Running=%d %s", s.Running, what)
	}
}

// assertIdle checks P and U once the gate is idle.
func (r *relRig) assertIdle() {
	t := r.t
	t.Helper()
	idle := r.waitFor(func() bool {
		s := r.g.Stats()
		return s.Running == 0 && s.Waiting == 0 && r.db.Stats().InUse == 0 && r.admits.Load() == r.releases.Load() &&
			s.OpenConns == s.IdleConns
	})
	ds := r.db.Stats() // first: database/sql counts a connection closed after the gate does
	s := r.g.Stats()
	if !idle {
		t.Errorf("P/U: not idle within %v: Running=%d Waiting=%d InUse=%d admits=%d releases=%d",
			relBound, s.Running, s.Waiting, ds.InUse, r.admits.Load(), r.releases.Load())
	}
	if s.Admitted != r.admits.Load() {
		t.Errorf("P: Stats.Admitted=%d, but %d OnAdmit events", s.Admitted, r.admits.Load())
	}
	if got := s.RejectedFull + s.RejectedTimeout + s.RejectedDeadline; got != r.rejects.Load() {
		t.Errorf("P: RejectedFull+RejectedTimeout+RejectedDeadline=%d, but %d OnReject events", got, r.rejects.Load())
	}
	// Idle, the gate keeps no more server connections than database/sql
	// keeps (logical) connections.
	if n := ds.OpenConnections; s.OpenConns > n || s.OpenConns < 0 {
		t.Errorf("P: the gate counts %d open connections, database/sql %d", s.OpenConns, n)
	}
	// The gate's count is the driver's: every connection dialed and not
	// closed, all idle once nothing runs. database/sql's own count is of
	// logical connections, which hold none while idle.
	if open := r.spy.opened.Load() - r.spy.closes.Load(); int64(s.OpenConns) != open || s.IdleConns != s.OpenConns {
		t.Errorf("P: the gate counts %d open connections (%d idle), the driver %d", s.OpenConns, s.IdleConns, open)
	}
}

// finish checks P, U and S, logs the figures and returns them.
func (r *relRig) finish() relFigures {
	t := r.t
	t.Helper()
	r.assertIdle()
	f := r.poll.stop()
	if f.polls == 0 {
		t.Errorf("S: the poller never read pg_stat_activity (%d failed polls, last: %v)", f.fails, f.lastErr)
	}
	if f.maxTx > r.p.MaxConcurrent {
		t.Errorf("S: %d transactions open on the server at once for %s, B=%d", f.maxTx, r.app, r.p.MaxConcurrent)
	}
	if r.opt.maxConns > 0 && f.maxConns > r.opt.maxConns {
		t.Errorf("S: %d server connections at once for %s, want at most %d", f.maxConns, r.app, r.opt.maxConns)
	}
	s := r.g.Stats()
	t.Logf("figures: B=%d Q=%d max server transactions %d, max server connections %d, %d polls (%d failed); admitted %d, rejected full %d, timeout %d, canceled %d",
		r.p.MaxConcurrent, r.p.MaxQueue, f.maxTx, f.maxConns, f.polls, f.fails, s.Admitted, s.RejectedFull, s.RejectedTimeout, s.Canceled)
	return f
}

// table creates a table of the test's own, dropped at the end:
// id bigint primary key, v int, plus extra column definitions.
func (r *relRig) table(extra string) string {
	t := r.t
	t.Helper()
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	name := fmt.Sprintf("bh_rel_%x_%d", h.Sum64(), os.Getpid())
	cols := "id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0"
	if extra != "" {
		cols += ", " + extra
	}
	ctx := r.ctx()
	testkit.Exec(t, ctx, r.ctl, "DROP TABLE IF EXISTS "+name)
	testkit.Exec(t, ctx, r.ctl, "CREATE TABLE "+name+" ("+cols+")")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), relBound)
		defer cancel()
		r.ctl.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
	})
	return name
}

// holdRow begins a transaction on r.db that inserts id into table and is
// left open.
func (r *relRig) holdRow(ctx context.Context, table string, id int64) *sql.Tx {
	r.t.Helper()
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		r.t.Fatalf("begin the transaction holding row %d: %v", id, err)
	}
	if err := relInsert(ctx, tx, table, id); err != nil {
		r.t.Fatalf("insert row %d: %v", id, err)
	}
	return tx
}

// insertTx inserts id into table in a transaction of its own on r.db.
func (r *relRig) insertTx(ctx context.Context, table string, id int64) error {
	return relWithTx(ctx, r.db, func(tx *sql.Tx) error { return relInsert(ctx, tx, table, id) })
}

// wantCommitted waits for the n results on errs of transactions that
// inserted their index into table, fails the test on each error, and then
// wants ids 0 to n-1 in table.
func (r *relRig) wantCommitted(table, what string, errs <-chan error, n int) {
	r.t.Helper()
	var want []int64
	for i := range n {
		if err := relAwait(r.t, what, errs); err != nil {
			r.t.Errorf("%s: %v", what, err)
		}
		want = append(want, int64(i))
	}
	r.wantIDs(table, want...)
}

// ids returns the ids in table, ascending, read on the control connection.
func (r *relRig) ids(table string) []int64 {
	t := r.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), relBound)
	defer cancel()
	return queryColumn[int64](t, ctx, r.ctl, "SELECT id FROM "+table+" ORDER BY id")
}

// wantIDs checks D: exactly the ids of committed work are in table.
func (r *relRig) wantIDs(table string, want ...int64) {
	r.t.Helper()
	got := r.ids(table)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		r.t.Errorf("D: rows %v in %s, want %v", got, table, want)
	}
}

// key is an advisory-lock key of the test's own.
func (r *relRig) key(n int64) int64 {
	h := fnv.New64a()
	h.Write([]byte(r.app))
	return int64(h.Sum64()>>2) + n
}

// lockServer holds the session advisory lock k on a control connection
// until the returned function is called. Gated work that takes the shared
// transaction lock on k blocks on the server meanwhile.
func (r *relRig) lockServer(k int64) (unlock func()) {
	t := r.t
	t.Helper()
	c := testkit.Conn(t, r.ctx(), r.ctl)
	if _, err := c.ExecContext(r.ctx(), "SELECT pg_advisory_lock($1)", k); err != nil {
		c.Close()
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), relBound)
			defer cancel()
			if _, err := c.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", k); err != nil {
				t.Errorf("unlock: %v", err)
			}
			c.Close()
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// insertAfter inserts id into table in a transaction of its own on r.db
// that first runs query (such as "SELECT pg_advisory_xact_lock_shared($1)",
// which blocks on the server while lockServer holds the lock).
func (r *relRig) insertAfter(ctx context.Context, table string, id int64, query string, args ...any) error {
	return relWithTx(ctx, r.db, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return err
		}
		return relInsert(ctx, tx, table, id)
	})
}

// count counts the application's backends on the server matching where.
func (r *relRig) count(where string) int {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), relBound)
	defer cancel()
	var n int
	err := r.mon.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
		AND backend_type = 'client backend' AND pid <> pg_backend_pid()`+where, r.app).Scan(&n)
	if err != nil {
		r.t.Fatalf("pg_stat_activity: %v", err)
	}
	return n
}

// serverUntil polls the server (bounded) until the application's backends
// matching where number n.
func (r *relRig) serverUntil(what, where string, n int) {
	r.t.Helper()
	var got int
	if !r.waitFor(func() bool { got = r.count(where); return got == n }) {
		r.t.Fatalf("%s: %d backends on the server, want %d (within %v)", what, got, n, relBound)
	}
}

const (
	relTx     = " AND xact_start IS NOT NULL"
	relActive = " AND state = 'active'"
)

// relRejectedAtOnce runs op with no deadline of its own, on a gate whose
// queue wait is long, and checks R: it returns (within testkit.Bound, far
// shorter than the queue wait, so it did not wait in the queue) an
// admission-full rejection, not a queue timeout and not ErrBadConn, and
// neither dialed nor sent a statement.
func relRejectedAtOnce(r *relRig, what string, op func(context.Context) error) {
	t := r.t
	t.Helper()
	if r.p.QueueWait < time.Hour/2 {
		t.Fatalf("relRejectedAtOnce needs a long queue wait, have %v", r.p.QueueWait)
	}
	dials, stmts := r.spy.dials.Load(), r.spy.stmts.Load()
	done := make(chan error, 1)
	go func() { done <- op(context.Background()) }()
	err := testkit.Recv(t, "R: "+what+" while admission was full", done)
	if !errors.Is(err, bulkhead.ErrAdmissionFull) || !errors.Is(err, bulkhead.ErrRejected) ||
		errors.Is(err, bulkhead.ErrQueueTimeout) || errors.Is(err, driver.ErrBadConn) {
		t.Errorf("R: %s: err = %v, want the admission-full rejection", what, err)
	}
	var re *bulkhead.RejectedError
	if !errors.As(err, &re) || re.MaxConcurrent != r.p.MaxConcurrent || re.MaxQueue != r.p.MaxQueue || re.Waited != 0 {
		t.Errorf("R: %s: err = %#v, want a *RejectedError naming B=%d Q=%d that waited 0", what, re, r.p.MaxConcurrent, r.p.MaxQueue)
	}
	if d, s := r.spy.dials.Load()-dials, r.spy.stmts.Load()-stmts; d != 0 || s != 0 {
		t.Errorf("R: %s reached the driver: %d dials, %d statements", what, d, s)
	}
}

// relAwait waits (bounded) for one value from ch.
func relAwait[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	return testkit.Recv(t, what, ch)
}

// relPgCode is the SQLSTATE of err, or "".
func relPgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// relWithTx is how applications commonly run a transaction: the deferred
// Rollback ends it on an error or a panic (and is a no-op after Commit).
func relWithTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func relInsert(ctx context.Context, tx interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, table string, id int64) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", id)
	return err
}

// 1. Saturation.

func TestSaturationNeverOpensMoreThanBTransactionsOnTheServer(t *testing.T) {
	for _, q := range []int{28, 4} {
		t.Run(fmt.Sprintf("Q=%d", q), func(t *testing.T) {
			const callers, b = 32, 4
			r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: b, MaxQueue: q, QueueWait: time.Hour}, relRigOptions{maxConns: b + q})
			k := r.key(0)
			unlock := r.lockServer(k)
			work := func(id int64) error {
				return r.insertAfter(ctx, table, id, "SELECT pg_advisory_xact_lock_shared($1)", k)
			}
			admitted := min(callers, b+q)
			errs := make(chan error, callers)
			for i := range admitted {
				go func() { errs <- work(int64(i)) }()
			}
			r.must("B running and the rest queued", func() bool {
				s := r.g.Stats()
				return s.Running == b && s.Waiting == admitted-b
			})
			r.serverUntil("B transactions held on the server", relTx, b)
			conns := r.count("")
			if conns != b {
				t.Errorf("R: %d server connections with B=%d running and %d waiting, want B: a waiting operation holds none", conns, b, admitted-b)
			}

			// Admission is full: every other caller is refused at once.
			for i := admitted; i < callers; i++ {
				relRejectedAtOnce(r, fmt.Sprintf("caller %d", i), func(ctx context.Context) error { return work(int64(i)) })
			}
			if got := r.count(""); got != conns {
				t.Errorf("R: %d server connections after the rejections, %d before", got, conns)
			}
			if got := r.count(relTx); got != b {
				t.Errorf("S: %d transactions on the server while saturated, want B=%d", got, b)
			}

			unlock()
			r.wantCommitted(table, "saturated transaction", errs, admitted)
			if f := r.finish(); f.maxTx != b {
				t.Errorf("S: at most %d transactions seen, want exactly B=%d while saturated", f.maxTx, b)
			}
			if s := r.g.Stats(); s.Admitted != int64(admitted) || s.RejectedFull != int64(callers-admitted) {
				t.Errorf("P: admitted %d rejected %d, want %d and %d", s.Admitted, s.RejectedFull, admitted, callers-admitted)
			}
		})
	}
}

// 2. Admission full.

func TestOneMoreCallerIsRejectedAtOnceWhileBRunAndQWait(t *testing.T) {
	const b, q = 2, 2
	r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: b, MaxQueue: q, QueueWait: time.Hour}, relRigOptions{maxConns: b + q})
	k := r.key(0)

	// A statement prepared while the gate is idle, run once admission is full.
	stmt := prepare(t, ctx, r.db, "SELECT $1::int")

	unlock := r.lockServer(k)
	errs := make(chan error, b+q)
	for i := range b + q {
		go func() { errs <- r.insertAfter(ctx, table, int64(i), "SELECT pg_advisory_xact_lock_shared($1)", k) }()
	}
	r.must("B running, Q waiting", func() bool { s := r.g.Stats(); return s.Running == b && s.Waiting == q })
	r.serverUntil("B transactions on the server", relTx, b)
	conns := r.count("")
	// The statement was prepared on a server connection that went idle
	// and serves one of the running transactions: the Q waiting hold none.
	if conns != b {
		t.Errorf("R: %d server connections with B=%d running and Q=%d waiting, want B: a waiting operation holds none", conns, b, q)
	}

	relRejectedAtOnce(r, "BeginTx", func(ctx context.Context) error {
		tx, err := r.db.BeginTx(ctx, nil)
		if err == nil {
			tx.Rollback()
		}
		return err
	})
	relRejectedAtOnce(r, "Exec", func(ctx context.Context) error {
		_, err := r.db.ExecContext(ctx, "INSERT INTO "+table+" (id) VALUES (100)")
		return err
	})
	relRejectedAtOnce(r, "Query", func(ctx context.Context) error {
		rows, err := r.db.QueryContext(ctx, "SELECT 1")
		if err == nil {
			rows.Close()
		}
		return err
	})
	relRejectedAtOnce(r, "QueryRow", func(ctx context.Context) error {
		var v int
		return r.db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
	})
	relRejectedAtOnce(r, "prepared statement", func(ctx context.Context) error {
		_, err := stmt.ExecContext(ctx, 1)
		return err
	})
	// A *sql.Conn holds no server connection until it is used: taking
	// one succeeds, its first operation is rejected.
	relRejectedAtOnce(r, "Conn", func(ctx context.Context) error {
		c, err := r.db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("db.Conn: %w (want success: it takes no permit and no server connection)", err)
		}
		defer c.Close()
		_, err = c.ExecContext(ctx, "SELECT 1")
		return err
	})
	if got := r.count(""); got != conns {
		t.Errorf("R: %d server connections after the rejections, %d before", got, conns)
	}

	unlock()
	r.wantCommitted(table, "admitted transaction", errs, b+q)
	r.finish()
	if s := r.g.Stats(); s.RejectedFull != 6 || s.RejectedTimeout != 0 {
		t.Errorf("P: RejectedFull=%d RejectedTimeout=%d, want 6 and 0", s.RejectedFull, s.RejectedTimeout)
	}
}

// 4. Context cancelled mid-statement.

func TestCancelledStatementReturnsBeforeTheServerFinishesAndTheServerStopsIt(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 5 * time.Second}
	cases := []struct {
		name string
		run  func(ctx, short context.Context, r *relRig, table string) error
	}{
		{"autocommit exec", func(_, short context.Context, r *relRig, _ string) error {
			_, err := r.db.ExecContext(short, "SELECT pg_sleep(60)")
			return err
		}},
		{"autocommit query", func(_, short context.Context, r *relRig, _ string) error {
			rows, err := r.db.QueryContext(short, "SELECT pg_sleep(60)")
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
			}
			return rows.Err()
		}},
		{"statement in a transaction", func(ctx, short context.Context, r *relRig, table string) error {
			tx, err := r.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := relInsert(ctx, tx, table, 1); err != nil {
				return err
			}
			_, err = tx.ExecContext(short, "SELECT pg_sleep(60)")
			if err == nil {
				return errors.New("pg_sleep(60) returned at once")
			}
			if cerr := tx.Commit(); cerr == nil {
				return errors.New("commit after a cancelled statement succeeded")
			}
			return err
		}},
	}
	for _, waitCancel := range []bool{false, true} {
		for _, c := range cases {
			handler := "pgx default"
			if waitCancel {
				handler = "pgx cancel request handler"
			}
			t.Run(handler+" "+c.name, func(t *testing.T) {
				cfg := relConfig(t)
				if waitCancel {
					cfg = pgCancelRequests(cfg, 5*time.Second)
				}
				r, table, ctx := relOpen(t, p, relRigOptions{cfg: cfg})
				done := make(chan error, 1)
				// The statement's context is cancelled once the server
				// runs it: on a busy machine a timer started before
				// BeginTx could fire before the statement is even sent.
				short, cancel := context.WithCancel(ctx)
				defer cancel()
				go func() { done <- c.run(ctx, short, r, table) }()
				r.serverUntil("the server runs the statement", " AND state = 'active' AND query LIKE '%pg_sleep%'", 1)
				cancel()
				// testkit.Bound (30 s) is far shorter than pg_sleep(60): returning
				// within it means the call did not wait for the statement.
				err := relAwait(t, "cancelled statement", done)
				if !errors.Is(err, context.Canceled) {
					t.Errorf("err = %v, want an error matching context.Canceled (with 57014 from the cancel request, or pgx's own)", err)
				}
				// The gate released when pgx returned.
				r.noneRunning("right after the cancelled call returned")
				// pgx's default returns before the server stopped the
				// statement (its cancel request goes out in the background);
				// the cancel request handler returns only after.
				still := r.count(relActive)
				t.Logf("figures: %s: %d statement still running on the server when the call returned", handler, still)
				if waitCancel && still != 0 {
					t.Errorf("S: the cancelled statement still ran on the server after its permit came back")
				}
				r.serverUntil("the server stops the cancelled statement", relActive, 0)
				r.wantIDs(table)
				// The next call works. Under the cancel-request handler
				// a cancel request can reach the server after the
				// statement it was for ended, and cancel the next one
				// (pgx: "CancelRequest is inherently racy"; it waits
				// 100 ms to make it rare, not impossible on a busy
				// machine): one retry for that.
				var v int
				err = r.db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
				if waitCancel && relPgCode(err) == "57014" {
					t.Logf("a late cancel request cancelled the next statement: %v", err)
					err = r.db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
				}
				if err != nil {
					t.Errorf("next call: %v", err)
				}
				r.finish()
			})
		}
	}
}

// 5. Transaction context cancelled mid-transaction.

// The user's Commit or Rollback races database/sql's rollback from its
// awaitDone goroutine: exactly one driver Commit/Rollback ends the
// transaction, and the permits come back exactly once, whichever wins.
func TestCancelledTransactionReleasesExactlyOnceWhileTheUserEndsItConcurrently(t *testing.T) {
	const rounds = 300
	r, table, _ := relOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 5 * time.Second}, relRigOptions{})
	var want []int64
	outcomes := map[string]int{}
	lingering := 0
	for i := range rounds {
		id := int64(i)
		ctx, cancel := context.WithTimeout(context.Background(), relBound)
		tx := r.holdRow(ctx, table, id)
		go cancel()
		commit := i%2 == 1
		var endErr error
		if commit {
			endErr = tx.Commit()
		} else {
			endErr = tx.Rollback()
		}
		r.must(fmt.Sprintf("round %d: permits back", i), func() bool {
			return r.g.Stats().Running == 0 && r.releases.Load() == r.admits.Load()
		})
		if r.count(relTx) > 0 {
			lingering++
		}
		cancel()
		// Let the server end the transaction before looking at the row and
		// before the next round, so that S measures the gate and not pgx's
		// asynchronous close (driver_test.go: TestCancelledTransactionsNeverExceedBOnTheServer).
		r.serverUntil("the server ends the cancelled transaction", relTx, 0)
		var outcome string
		switch {
		case errors.Is(endErr, bulkhead.ErrRejected):
			t.Fatalf("round %d: ending a transaction was rejected: %v", i, endErr)
		case endErr == nil && commit:
			outcome = "committed"
			want = append(want, id)
		case endErr == nil:
			outcome = "rolled back by the user"
		case errors.Is(endErr, sql.ErrTxDone):
			// database/sql's rollback won: the driver never saw COMMIT.
			outcome = "rolled back by database/sql"
		case commit:
			// context.Canceled here is either database/sql's check before
			// the driver (rolled back) or pgx's read of COMMIT's reply
			// interrupted (pgconn's normalizeTimeoutError returns the bare
			// context.Canceled) after the server committed: either outcome.
			if slices.Contains(r.ids(table), id) {
				outcome = "commit reported " + endErr.Error() + ", committed"
				want = append(want, id)
			} else {
				outcome = "commit reported " + endErr.Error() + ", rolled back"
			}
		default:
			outcome = "user rollback: " + endErr.Error()
		}
		outcomes[outcome]++
	}
	if got := r.admits.Load(); got != rounds {
		t.Errorf("P: %d admissions for %d transactions", got, rounds)
	}
	t.Logf("figures: outcomes %v; the server still had the transaction open when the permit came back in %d of %d rounds", outcomes, lingering, rounds)
	r.wantIDs(table, want...)
	r.finish()
}

// A transaction whose context ends while a statement runs: database/sql
// rolls back once the statement returned, in its own goroutine; the
// permits come back then, and the user's Rollback only reports ErrTxDone.
func TestTransactionCancelledDuringAStatementGivesThePermitsBackOnce(t *testing.T) {
	const rounds = 4
	r, table, base := relOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 5 * time.Second}, relRigOptions{})
	for i := range rounds {
		ctx, cancel := context.WithCancel(base)
		tx := r.holdRow(ctx, table, int64(i))
		done := goExec(tx, ctx, "SELECT pg_sleep(60)")
		r.serverUntil("the statement runs", relActive, 1)
		cancel()
		if err := relAwait(t, "statement of the cancelled transaction", done); !errors.Is(err, context.Canceled) {
			t.Errorf("round %d: statement err = %v, want context.Canceled", i, err)
		}
		// Whoever wins, database/sql's rollback (ErrTxDone here) or this
		// one (an error: the cancelled statement closed pgx's connection),
		// one driver Rollback ends the transaction and releases.
		if err := tx.Rollback(); errors.Is(err, bulkhead.ErrRejected) {
			t.Errorf("round %d: Rollback = %v", i, err)
		}
		r.must("permits back", func() bool { return r.g.Stats().Running == 0 })
		r.serverUntil("the server ends the transaction", relTx, 0)
	}
	r.wantIDs(table)
	if got := r.admits.Load(); got != rounds {
		t.Errorf("P: %d admissions for %d transactions", got, rounds)
	}
	r.finish()
}

// 6. Server-side faults.

func TestServerSideFaultsEndTheTransactionAndGiveThePermitsBack(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 5 * time.Second}
	type fault struct {
		name string
		code string // SQLSTATE of the failing statement ("" = any error)
		// run starts with the transaction open and row 1 inserted; it
		// returns the error of the statement the fault hit.
		run func(ctx context.Context, r *relRig, tx *sql.Tx) error
	}
	faults := []fault{
		{"statement_timeout", "57014", func(ctx context.Context, r *relRig, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "SET LOCAL statement_timeout = '100ms'"); err != nil {
				return fmt.Errorf("set: %w", err)
			}
			_, err := tx.ExecContext(ctx, "SELECT pg_sleep(60)")
			return err
		}},
		{"lock_timeout", "55P03", func(ctx context.Context, r *relRig, tx *sql.Tx) error {
			k := r.key(1)
			r.lockServer(k)
			if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '100ms'"); err != nil {
				return fmt.Errorf("set: %w", err)
			}
			_, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", k)
			return err
		}},
		{"idle_in_transaction_session_timeout", "", func(ctx context.Context, r *relRig, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "SET LOCAL idle_in_transaction_session_timeout = '100ms'"); err != nil {
				return fmt.Errorf("set: %w", err)
			}
			r.serverUntil("the server ends the idle session", "", 0)
			_, err := tx.ExecContext(ctx, "SELECT 1")
			return err
		}},
		{"pg_cancel_backend", "57014", func(ctx context.Context, r *relRig, tx *sql.Tx) error {
			done := goExec(tx, ctx, "SELECT pg_sleep(60)")
			r.serverUntil("the statement runs", relActive, 1)
			if _, err := r.ctl.ExecContext(ctx, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity
				WHERE application_name = $1 AND state = 'active'`, r.app); err != nil {
				return fmt.Errorf("cancel: %w", err)
			}
			return relAwait(r.t, "cancelled statement", done)
		}},
		{"pg_terminate_backend", "", func(ctx context.Context, r *relRig, tx *sql.Tx) error {
			if err := r.terminateApp(ctx); err != nil {
				return fmt.Errorf("terminate: %w", err)
			}
			r.serverUntil("the server ends the session", "", 0)
			_, err := tx.ExecContext(ctx, "SELECT 1")
			return err
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			r, table, ctx := relOpen(t, p, relRigOptions{})
			tx := r.holdRow(ctx, table, 1)
			err := f.run(ctx, r, tx)
			if err == nil || (f.code != "" && relPgCode(err) != f.code) {
				t.Errorf("statement hit by %s: err = %v (SQLSTATE %q), want SQLSTATE %q", f.name, err, relPgCode(err), f.code)
			}
			if errors.Is(err, bulkhead.ErrRejected) {
				t.Errorf("a server fault reported as a rejection: %v", err)
			}
			if err := tx.Commit(); err == nil {
				t.Errorf("Commit after %s succeeded", f.name)
			}
			r.noneRunning("right after Commit returned")
			// The gate and the pool still work: a new transaction commits.
			if err := r.insertTx(ctx, table, 2); err != nil {
				t.Errorf("transaction after %s: %v", f.name, err)
			}
			r.wantIDs(table, 2)
			r.finish()
		})
	}
}

// Terminating the B holders while Q operations wait: the waiters get the
// permits in arrival order. Each waiter reports from inside its gated work
// and then holds its permit until told to go on, so the order of the
// reports is the order of the grants.
func TestWaitersProceedInArrivalOrderWhenTheHoldersAreTerminated(t *testing.T) {
	const b, q = 2, 4
	r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: b, MaxQueue: q, QueueWait: time.Minute}, relRigOptions{maxConns: b + q})

	pids := make(chan int, b)
	holderErrs := make(chan error, b)
	for range b {
		go func() {
			sent := false
			err := relWithTx(ctx, r.db, func(tx *sql.Tx) error {
				var pid int
				if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return err
				}
				pids <- pid
				sent = true
				_, err := tx.ExecContext(ctx, "SELECT pg_sleep(60)")
				return err
			})
			if !sent {
				pids <- 0
			}
			holderErrs <- err
		}()
	}
	holders := []int{relAwait(t, "holder", pids), relAwait(t, "holder", pids)}
	if holders[0] == 0 || holders[1] == 0 {
		t.Fatalf("holders failed: %v", relAwait(t, "holder error", holderErrs))
	}
	r.serverUntil("both holders run", relActive, b)

	order := make(chan int)
	proceed := make([]chan struct{}, q)
	waiterErrs := make(chan error, q)
	for i := range q {
		proceed[i] = make(chan struct{})
		go func() {
			waiterErrs <- relWithTx(ctx, r.db, func(tx *sql.Tx) error {
				select {
				case order <- i:
				case <-ctx.Done():
					return ctx.Err()
				}
				select {
				case <-proceed[i]:
				case <-ctx.Done():
					return ctx.Err()
				}
				return relInsert(ctx, tx, table, int64(i))
			})
		}()
		r.must(fmt.Sprintf("waiter %d queued", i), func() bool { return r.g.Stats().Waiting == i+1 })
	}

	terminate := func(pid int) {
		t.Helper()
		r.poll.terminating(int64(pid))
		var ok bool
		if err := r.ctl.QueryRowContext(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("terminate %d: %v %v", pid, ok, err)
		}
	}
	expect := func(want int) {
		t.Helper()
		if got := relAwait(t, "next grant", order); got != want {
			t.Errorf("waiter %d got the permit, want waiter %d (FIFO)", got, want)
		}
	}
	terminate(holders[0])
	expect(0)
	terminate(holders[1])
	expect(1)
	close(proceed[0])
	expect(2)
	close(proceed[1])
	expect(3)
	close(proceed[2])
	close(proceed[3])
	for range b {
		if err := relAwait(t, "holder", holderErrs); relPgCode(err) != "57P01" {
			t.Errorf("terminated holder: err = %v, want SQLSTATE 57P01", err)
		}
	}
	for range q {
		if err := relAwait(t, "waiter", waiterErrs); err != nil {
			t.Errorf("waiter: %v", err)
		}
	}
	r.wantIDs(table, 0, 1, 2, 3)
	if s := r.g.Stats(); s.WaitCount != q || s.RejectedTimeout != 0 {
		t.Errorf("P: WaitCount=%d RejectedTimeout=%d, want %d and 0", s.WaitCount, s.RejectedTimeout, q)
	}
	r.finish()
}

// 9. COMMIT failures.

func TestFailedCommitsGiveThePermitsBackAndLeaveNoRows(t *testing.T) {
	t.Run("serialization failure", func(t *testing.T) {
		p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 0, QueueWait: 0}
		r, table, ctx := relOpen(t, p, relRigOptions{})
		testkit.Exec(t, ctx, r.ctl, "INSERT INTO "+table+" (id, v) VALUES (1, 10), (2, 20)")
		ser := &sql.TxOptions{Isolation: sql.LevelSerializable}
		t1, err1 := r.db.BeginTx(ctx, ser)
		t2, err2 := r.db.BeginTx(ctx, ser)
		must(t, errors.Join(err1, err2))
		var sum int
		for _, tx := range []*sql.Tx{t1, t2} {
			must(t, tx.QueryRowContext(ctx, "SELECT sum(v) FROM "+table).Scan(&sum))
		}
		testkit.Exec(t, ctx, t1, "UPDATE "+table+" SET v = v + 1 WHERE id = 1")
		testkit.Exec(t, ctx, t2, "UPDATE "+table+" SET v = v + 1 WHERE id = 2")
		must(t, relInsert(ctx, t2, table, 3))
		if err := t1.Commit(); err != nil {
			t.Fatalf("first commit: %v", err)
		}
		if err := t2.Commit(); relPgCode(err) != "40001" {
			t.Errorf("second commit: err = %v, want SQLSTATE 40001", err)
		}
		r.noneRunning("right after the failed Commit returned")
		r.wantIDs(table, 1, 2)
		var v1, v2 int
		must(t, r.ctl.QueryRowContext(ctx, "SELECT (SELECT v FROM "+table+" WHERE id = 1), (SELECT v FROM "+table+" WHERE id = 2)").Scan(&v1, &v2))
		if v1 != 11 || v2 != 20 {
			t.Errorf("D: v = %d, %d; want 11 (committed) and 20 (failed commit)", v1, v2)
		}
		r.finish()
	})
	t.Run("deferred unique violation", func(t *testing.T) {
		p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0, QueueWait: 0}
		r := newRelRig(t, p, relRigOptions{})
		table := r.table("u int UNIQUE DEFERRABLE INITIALLY DEFERRED")
		ctx := r.ctx()
		tx := testkit.Begin(t, ctx, r.db)
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (id, u) VALUES (1, 7), (2, 7)"); err != nil {
			t.Fatalf("the duplicate must pass until COMMIT: %v", err)
		}
		if err := tx.Commit(); relPgCode(err) != "23505" {
			t.Errorf("commit: err = %v, want SQLSTATE 23505", err)
		}
		r.noneRunning("right after the failed Commit returned")
		// B=1, Q=0: the permit must be back for this to pass.
		if err := r.insertTx(ctx, table, 3); err != nil {
			t.Errorf("next transaction: %v", err)
		}
		r.wantIDs(table, 3)
		r.finish()
	})
}

// 10. A panic in the user's transaction callback.

func TestPanicInATransactionCallbackPropagatesAndReleases(t *testing.T) {
	r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0, QueueWait: 0}, relRigOptions{})
	type boom struct{}
	catch := func(f func()) (v any) {
		defer func() { v = recover() }()
		f()
		return nil
	}
	for i := range 3 {
		v := catch(func() {
			relWithTx(ctx, r.db, func(tx *sql.Tx) error {
				if err := relInsert(ctx, tx, table, int64(i)); err != nil {
					t.Errorf("insert: %v", err)
				}
				panic(boom{})
			})
		})
		if _, ok := v.(boom); !ok {
			t.Fatalf("recovered %v, want the callback's panic", v)
		}
		// The deferred Rollback ran synchronously before the panic left.
		if s := r.g.Stats(); s.Running != 0 {
			t.Fatalf("P: Running=%d after the panic", s.Running)
		}
	}
	v := catch(func() {
		rows, err := r.db.QueryContext(ctx, "SELECT g FROM generate_series(1, 3) g")
		if err != nil {
			t.Errorf("query: %v", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			panic(boom{})
		}
	})
	if _, ok := v.(boom); !ok {
		t.Fatalf("recovered %v, want the row loop's panic", v)
	}
	// B=1, Q=0: a held permit would make this an admission-full rejection.
	if err := r.insertTx(ctx, table, 10); err != nil {
		t.Errorf("next transaction after the panics: %v", err)
	}
	r.wantIDs(table, 10)
	r.finish()
}

// 11. Leaked Rows.

func TestLeakedRowsMakeTheNextCallerFailBoundedAndAreReportedAsAQuery(t *testing.T) {
	leaks := []struct {
		name string
		leak func(ctx context.Context, db *sql.DB) (closeIt func() error, err error)
	}{
		{"Rows never closed", func(ctx context.Context, db *sql.DB) (func() error, error) {
			rows, err := db.QueryContext(ctx, "SELECT g FROM generate_series(1, 3) g")
			if err != nil {
				return nil, err
			}
			return rows.Close, nil
		}},
		{"QueryRow never scanned", func(ctx context.Context, db *sql.DB) (func() error, error) {
			row := db.QueryRowContext(ctx, "SELECT 1")
			if err := row.Err(); err != nil {
				return nil, err
			}
			return func() error { var v int; return row.Scan(&v) }, nil
		}},
	}
	for _, l := range leaks {
		for _, q := range []int{0, 1} {
			want := bulkhead.ErrAdmissionFull
			if q > 0 {
				want = bulkhead.ErrQueueTimeout
			}
			t.Run(fmt.Sprintf("%s Q=%d", l.name, q), func(t *testing.T) {
				p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: q, QueueWait: 50 * time.Millisecond}
				r := newRelRig(t, p, relRigOptions{holdLimit: 20 * time.Millisecond})
				// No deadline: nothing but Close would ever end the leak.
				closeIt, err := l.leak(context.Background(), r.db)
				if err != nil {
					t.Fatal(err)
				}
				e := relAwait(t, "hold warning", r.holds)
				if e.Kind != bulkhead.KindQuery || e.Held != 20*time.Millisecond {
					t.Errorf("hold warning %+v, want Kind %v and Held 20ms", e, bulkhead.KindQuery)
				}
				done := goExec(r.db, context.Background(), "SELECT 1")
				if err := relAwait(t, "next caller", done); !errors.Is(err, want) || !errors.Is(err, bulkhead.ErrRejected) {
					t.Errorf("next caller: err = %v, want %v", err, want)
				}
				if err := closeIt(); err != nil {
					t.Errorf("closing the leak: %v", err)
				}
				r.noneRunning("after the leaked rows were closed")
				if _, err := r.db.ExecContext(r.ctx(), "SELECT 1"); err != nil {
					t.Errorf("after the leak: %v", err)
				}
				r.finish()
			})
		}
	}
}

// 13. A gated call nested inside a transaction.

func TestNestedCallInsideATransactionFailsBoundedInsteadOfDeadlocking(t *testing.T) {
	for _, q := range []int{0, 1} {
		want := bulkhead.ErrAdmissionFull
		if q > 0 {
			want = bulkhead.ErrQueueTimeout
		}
		t.Run(fmt.Sprintf("Q=%d", q), func(t *testing.T) {
			r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: q, QueueWait: 50 * time.Millisecond}, relRigOptions{})
			nested := []struct {
				name string
				call func() error
			}{
				{"Exec", func() error { _, err := r.db.ExecContext(context.Background(), "SELECT 1"); return err }},
				{"QueryRow", func() error { var v int; return r.db.QueryRowContext(context.Background(), "SELECT 1").Scan(&v) }},
				{"BeginTx", func() error {
					return relWithTx(context.Background(), r.db, func(tx *sql.Tx) error { return relInsert(ctx, tx, table, 99) })
				}},
			}
			err := relWithTx(ctx, r.db, func(tx *sql.Tx) error {
				if err := relInsert(ctx, tx, table, 1); err != nil {
					return err
				}
				for _, n := range nested {
					done := make(chan error, 1)
					go func() { done <- n.call() }()
					if err := relAwait(t, "nested "+n.name, done); !errors.Is(err, want) {
						t.Errorf("nested %s: err = %v, want %v", n.name, err, want)
					}
				}
				return nil
			})
			if err != nil {
				t.Errorf("outer transaction: %v", err)
			}
			r.wantIDs(table, 1)
			r.finish()
		})
	}
}

// 14. Ending a transaction twice; closing the DB with waiters.

func TestEndingATransactionTwiceReturnsErrTxDoneWithoutAnotherRelease(t *testing.T) {
	r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0, QueueWait: 0}, relRigOptions{})
	ends := []struct {
		name        string
		first, then func(*sql.Tx) error
		committed   bool
	}{
		{"Commit then Commit", (*sql.Tx).Commit, (*sql.Tx).Commit, true},
		{"Commit then Rollback", (*sql.Tx).Commit, (*sql.Tx).Rollback, true},
		{"Rollback then Commit", (*sql.Tx).Rollback, (*sql.Tx).Commit, false},
		{"Rollback then Rollback", (*sql.Tx).Rollback, (*sql.Tx).Rollback, false},
	}
	var want []int64
	for i, e := range ends {
		tx := r.holdRow(ctx, table, int64(i))
		if err := e.first(tx); err != nil {
			t.Fatalf("%s: first: %v", e.name, err)
		}
		admitted, released := r.admits.Load(), r.releases.Load()
		for range 3 {
			if err := e.then(tx); !errors.Is(err, sql.ErrTxDone) {
				t.Errorf("%s: again: err = %v, want sql.ErrTxDone", e.name, err)
			}
		}
		s := r.g.Stats()
		if s.Running != 0 || r.admits.Load() != admitted || r.releases.Load() != released || released != admitted {
			t.Errorf("%s: Running=%d admits %d→%d releases %d→%d", e.name, s.Running, admitted, r.admits.Load(), released, r.releases.Load())
		}
		if e.committed {
			want = append(want, int64(i))
		}
	}
	r.wantIDs(table, want...)
	r.finish()
}

func TestClosingTheDBMakesWaitersReturnErrClosedPromptly(t *testing.T) {
	const q = 3
	r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: q, QueueWait: time.Hour}, relRigOptions{})
	holder := r.holdRow(ctx, table, 1)
	var errs []chan error
	for i := range q {
		errs = append(errs, goExec(r.db, context.Background(), "INSERT INTO "+table+" (id) VALUES ($1)", 10+i))
	}
	r.must("waiters queued", func() bool { return r.g.Stats().Waiting == q })
	if err := r.db.Close(); err != nil {
		t.Errorf("db.Close: %v", err)
	}
	// The queue wait is an hour: returning within testkit.Bound is prompt.
	for _, e := range errs {
		if err := relAwait(t, "waiter after Close", e); !errors.Is(err, bulkhead.ErrClosed) || errors.Is(err, bulkhead.ErrRejected) {
			t.Errorf("waiter: err = %v, want bulkhead.ErrClosed (not a rejection)", err)
		}
	}
	// The running transaction keeps its permit and its connection.
	if err := holder.Commit(); err != nil {
		t.Errorf("holder's Commit after Close: %v", err)
	}
	if _, err := r.db.ExecContext(ctx, "SELECT 1"); err == nil {
		t.Error("Exec on a closed DB succeeded")
	}
	r.wantIDs(table, 1)
	r.finish()
	if s := r.g.Stats(); s.Canceled != q || s.OpenConns != 0 {
		t.Errorf("P: Canceled=%d OpenConns=%d, want %d and 0", s.Canceled, s.OpenConns, q)
	}
}

// 15. Flood.

func TestFloodOfTenThousandCallersKeepsFourRunningAndTwelveAdmitted(t *testing.T) {
	const callers, b, q = 10000, 4, 8
	p := bulkhead.Policy{MaxConcurrent: b, MaxQueue: q, QueueWait: 20 * time.Millisecond}
	// The server connections are not bounded by B+Q but by the
	// operations that hold them: at every dial, at most B running and the
	// transactions inside Commit or Rollback (whose logical connections
	// give theirs back as database/sql takes them back). Checked below.
	r := newRelRig(t, p, relRigOptions{})
	ctx := r.ctx()
	var inTx, maxInTx, maxAdmitted, maxOpen atomic.Int64
	var ending endings
	start := make(chan struct{})
	results := make(chan error, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results <- ending.tx(ctx, r.db, func(tx *sql.Tx) error {
				n := inTx.Add(1)
				defer inTx.Add(-1)
				raiseMax(&maxInTx, n)
				s := r.g.Stats()
				raiseMax(&maxAdmitted, int64(s.Running+s.Waiting))
				raiseMax(&maxOpen, int64(s.OpenConns))
				var v int
				return tx.QueryRowContext(ctx, "SELECT 1").Scan(&v)
			})
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	var ok, full, timeout int64
	for err := range results {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, bulkhead.ErrAdmissionFull):
			full++
		case errors.Is(err, bulkhead.ErrQueueTimeout):
			timeout++
		default:
			t.Errorf("caller: %v (neither success nor rejection)", err)
		}
	}
	bound := int64(b) + ending.most.Load()
	t.Logf("figures: %d callers: %d committed, %d admission full, %d queue timeout; at most %d in a transaction, %d admitted, %d connections (%d ending at once)",
		callers, ok, full, timeout, maxInTx.Load(), maxAdmitted.Load(), maxOpen.Load(), ending.most.Load())
	if ok == 0 {
		t.Error("no caller got through")
	}
	if maxInTx.Load() > b || maxAdmitted.Load() > b+q || maxOpen.Load() > bound {
		t.Errorf("bounds broken: %d in a transaction (B=%d), %d admitted (B+Q=%d), %d connections (B + ending at once = %d)", maxInTx.Load(), b, maxAdmitted.Load(), b+q, maxOpen.Load(), bound)
	}
	f := r.finish()
	// The server may still show a connection the gate closed (pgx does
	// not wait for the backend to exit): at most the closes.
	if k := r.spy.closes.Load(); int64(f.maxConns) > bound+k {
		t.Errorf("S: %d server connections at once, want at most B + ending at once + closed = %d", f.maxConns, bound+k)
	}
	s := r.g.Stats()
	if s.Admitted != ok || s.RejectedFull != full || s.RejectedTimeout != timeout {
		t.Errorf("P: Stats admitted %d full %d timeout %d, callers saw %d, %d, %d", s.Admitted, s.RejectedFull, s.RejectedTimeout, ok, full, timeout)
	}
}
