package tests

// Network faults between the gated *sql.DB and PostgreSQL: a delaying TCP
// proxy of the test's own (relDelayProxy) for latency, and a net.Conn
// wrapper installed as pgx's DialFunc (relFaultDialer) for a reset
// connection, a blackhole and the ambiguous COMMIT (the connection dropped
// right after COMMIT was written, which no proxy can aim at).
//
// Why not toxiproxy: in v2.12.0 a link whose destination write fails stops
// reading its last toxic's output, and that toxic (latency included) stays
// blocked for ever on an unbuffered send: a goroutine leak that goleak
// reported when a statement cut off closed its connection mid-reply.

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

// relDelayProxy is a TCP proxy between the test and the server that
// delivers every chunk of bytes a latency (plus a uniform jitter) after it
// was read, in order, in each direction, as a slow network would. Either
// side failing closes both; the end of the test closes every connection
// and waits for the proxy's goroutines.
type relDelayProxy struct {
	ln          net.Listener
	up          string
	lat, jitter time.Duration
	wg          sync.WaitGroup
	mu          sync.Mutex
	conns       []net.Conn
	closed      bool
}

// relLatency starts a proxy adding lat ± jitter each way and returns
// relConfig(t) pointed at it.
func relLatency(t *testing.T, lat, jitter time.Duration) *pgx.ConnConfig {
	t.Helper()
	cfg := relConfig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("delay proxy: %v", err)
	}
	p := &relDelayProxy{ln: ln, up: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), lat: lat, jitter: jitter}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	c := cfg.Copy()
	c.Host, c.Port, c.Fallbacks = "127.0.0.1", uint16(ln.Addr().(*net.TCPAddr).Port), nil
	return c
}

func (p *relDelayProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.up)
		if err != nil {
			c.Close()
			continue
		}
		if !p.keep(c, u) {
			return
		}
		p.wg.Go(func() { p.pipe(c, u) })
		p.wg.Go(func() { p.pipe(u, c) })
	}
}

// keep records cs for close, or closes them if the proxy is closed.
func (p *relDelayProxy) keep(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, cs...)
	return true
}

// pipe copies src to dst, each chunk written its delay after it was read.
func (p *relDelayProxy) pipe(src, dst net.Conn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	p.wg.Go(func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				d := p.lat
				if p.jitter > 0 {
					d += rand.N(2*p.jitter) - p.jitter
				}
				q <- chunk{b[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	})
	defer dst.Close()
	for c := range q {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range q { // until the reader sees src closed
			}
			return
		}
	}
}

func (p *relDelayProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// 8. Network faults.

func TestLatencyOnTheNetworkKeepsTheServerWithinB(t *testing.T) {
	const b, callers = 2, 12
	cfg := relLatency(t, 15*time.Millisecond, 5*time.Millisecond)
	r, table, ctx := relOpen(t, bulkhead.Policy{MaxConcurrent: b, MaxQueue: callers - b, QueueWait: time.Minute}, relRigOptions{cfg: cfg, maxConns: callers})
	errs := make(chan error, callers)
	for i := range callers {
		go func() { errs <- r.insertAfter(ctx, table, int64(i), "SELECT pg_sleep(0.01)") }()
	}
	r.wantCommitted(table, "transaction through the slow network", errs, callers)
	if f := r.finish(); f.maxTx != b {
		t.Errorf("S: at most %d transactions seen, want B=%d reached", f.maxTx, b)
	}
}

// relFaultDialer dials the server for pgx (ConnConfig.DialFunc) and wraps
// each connection so that a test can inject, at a moment it chooses:
//
//	reset      the next write aborts the connection (RST to the server,
//	           ECONNRESET to pgx)
//	blackhole  writes vanish; the server never answers, so reads wait for
//	           pgx's deadline; a connection that lost a write stays
//	           blackholed (its protocol state is gone) until closed
//	commit     the next simple-protocol COMMIT is written whole, then the
//	           connection is closed before its reply can be read (with a
//	           RST when rst is set): the ambiguous commit
//
// It counts dials (pgx's cancel requests dial too) and COMMITs written, and
// closes every connection it made at the end of the test, so that pgx's
// background goroutines on blackholed connections end.
type relFaultDialer struct {
	mode    atomic.Int32
	rst     atomic.Bool
	dials   atomic.Int64
	commits atomic.Int64
	dialed[*relFaultConn]
}

const (
	relNoFault int32 = iota
	relReset
	relBlackhole
	relDropAfterCommit
)

// pgx ends a transaction with Exec(ctx, "commit"): without arguments it
// goes as a simple Query message, 'Q', the length (4 + 7), "commit\x00".
var relCommitMsg = []byte("Q\x00\x00\x00\x0bcommit\x00")

// newRelFaultRig returns a rig under p whose server connections go through
// a new relFaultDialer.
func newRelFaultRig(t *testing.T, p bulkhead.Policy) (*relFaultDialer, *relRig) {
	t.Helper()
	d := newRelFaultDialer(t)
	cfg := relConfig(t)
	cfg.DialFunc = d.dial
	return d, newRelRig(t, p, relRigOptions{cfg: cfg})
}

func newRelFaultDialer(t *testing.T) *relFaultDialer {
	d := &relFaultDialer{}
	t.Cleanup(func() { d.each(func(c *relFaultConn) { c.Conn.Close() }) })
	return d
}

func (d *relFaultDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.dials.Add(1)
	return d.dialed.dial(ctx, network, addr, func(c net.Conn) *relFaultConn { return &relFaultConn{Conn: c, d: d} })
}

// heal ends the fault mode and closes the connections a blackhole broke.
func (d *relFaultDialer) heal() {
	d.mode.Store(relNoFault)
	d.each(func(c *relFaultConn) {
		if c.lost.Load() {
			c.Conn.Close()
		}
	})
}

// dialed keeps the connections a test's dialer made, as wrap made them.
type dialed[C net.Conn] struct {
	mu    sync.Mutex
	conns []C
}

// dial dials addr and keeps, and returns, the connection wrap makes of it.
func (d *dialed[C]) dial(ctx context.Context, network, addr string, wrap func(net.Conn) C) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	fc := wrap(c)
	d.mu.Lock()
	d.conns = append(d.conns, fc)
	d.mu.Unlock()
	return fc, nil
}

// each calls f on every connection kept, under the lock.
func (d *dialed[C]) each(f func(C)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		f(c)
	}
}

type relFaultConn struct {
	net.Conn
	d     *relFaultDialer
	lost  atomic.Bool // a write vanished: blackholed for good
	reset atomic.Bool
}

var relErrReset = &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}

func (c *relFaultConn) abort() {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Conn.Close()
}

func (c *relFaultConn) Read(b []byte) (int, error) {
	if c.reset.Load() {
		return 0, relErrReset
	}
	return c.Conn.Read(b)
}

func (c *relFaultConn) Write(b []byte) (int, error) {
	isCommit := bytes.Contains(b, relCommitMsg)
	if isCommit {
		c.d.commits.Add(1)
	}
	switch {
	case c.reset.Load():
		return 0, relErrReset
	case c.lost.Load():
		return len(b), nil
	}
	switch c.d.mode.Load() {
	case relReset:
		c.reset.Store(true)
		c.abort()
		return 0, relErrReset
	case relBlackhole:
		c.lost.Store(true)
		return len(b), nil
	case relDropAfterCommit:
		if isCommit {
			n, err := c.Conn.Write(b)
			if c.d.rst.Load() {
				c.abort()
			} else {
				c.Conn.Close()
			}
			return n, err
		}
	}
	return c.Conn.Write(b)
}

func TestConnectionResetMidTransactionLosesOnlyUncommittedWork(t *testing.T) {
	d, r := newRelFaultRig(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 5 * time.Second})
	table := r.table("")
	ctx := r.ctx()
	must(t, r.insertTx(ctx, table, 1))
	tx := r.holdRow(ctx, table, 2)
	d.mode.Store(relReset)
	if err := relInsert(ctx, tx, table, 3); err == nil {
		t.Error("a statement on a reset connection succeeded")
	} else if errors.Is(err, bulkhead.ErrRejected) {
		t.Errorf("a reset reported as a rejection: %v", err)
	}
	d.heal()
	if err := tx.Commit(); err == nil {
		t.Error("Commit on a reset connection succeeded")
	}
	r.noneRunning("right after Commit returned")
	r.serverUntil("the server drops the reset session", "", 0)
	if err := r.insertTx(ctx, table, 4); err != nil {
		t.Errorf("transaction after the reset: %v", err)
	}
	r.wantIDs(table, 1, 4)
	r.finish()
}

func TestBlackholedNetworkEndsCallsAtTheirDeadlineAndGivesThePermitsBack(t *testing.T) {
	d, r := newRelFaultRig(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 5 * time.Second})
	table := r.table("")
	ctx := r.ctx()
	tx := r.holdRow(ctx, table, 1)
	// From now on nothing the client sends reaches the server, and a new
	// connection's startup never gets an answer.
	d.mode.Store(relBlackhole)

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- relInsert(short, tx, table, 2) }()
	if err := relAwait(t, "statement on a blackholed connection", done); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("statement: err = %v, want the deadline", err)
	}
	go func() { done <- tx.Rollback() }()
	relAwait(t, "Rollback on a blackholed connection", done)
	r.noneRunning("right after Rollback returned")

	// A call that must dial: the call ends at the caller's deadline; the
	// dial goes on (a connection it makes serves the next caller), the
	// only server connection the gate counts, neither idle nor in use.
	dials := r.spy.dials.Load()
	short2, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	if err := relAwait(t, "dial through a blackhole", goExec(r.db, short2, "SELECT 1")); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, bulkhead.ErrRejected) {
		t.Errorf("dial: err = %v, want the deadline", err)
	}
	if r.spy.dials.Load() == dials {
		t.Error("the call did not dial")
	}
	if s := r.g.Stats(); s.Running != 0 || s.OpenConns != 1 || s.IdleConns != 0 || s.DialErrors != 0 || s.ConnectFailed != 0 || s.Canceled != 1 {
		t.Errorf("P: after the call that dialed %+v, want nothing running, 1 server connection (the dial in flight), none idle, no dial error, the call canceled", s)
	}

	// Healing closes the connections the blackhole broke, the one being
	// dialed too: that dial fails, and nothing is left open. (A caller
	// that came first would have waited for it and got its failure.)
	d.heal()
	r.must("the dial through the blackhole fails once healed", func() bool {
		s := r.g.Stats()
		return s.DialErrors == 1 && s.OpenConns == 0
	})
	r.serverUntil("the server drops the blackholed session", relTx, 0)
	if err := r.insertTx(ctx, table, 3); err != nil {
		t.Errorf("transaction after the blackhole: %v", err)
	}
	r.wantIDs(table, 3)
	r.finish()
}

func TestAmbiguousCommitReleasesOnceAndIsNeverRetried(t *testing.T) {
	const rounds = 10
	d, r := newRelFaultRig(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0, QueueWait: 0})
	table := r.table("")
	ctx := r.ctx()
	outcomes := map[string]int{}
	var want []int64
	for i := range rounds {
		id := int64(i)
		tx := r.holdRow(ctx, table, id)
		d.rst.Store(i%2 == 1)
		d.mode.Store(relDropAfterCommit)
		commits, admits := d.commits.Load(), r.admits.Load()
		err := tx.Commit()
		d.heal()
		if err == nil {
			t.Errorf("round %d: Commit succeeded although its reply was never read", i)
		}
		if errors.Is(err, bulkhead.ErrRejected) {
			t.Errorf("round %d: Commit: %v", i, err)
		}
		if s := r.g.Stats(); s.Running != 0 || r.releases.Load() != r.admits.Load() {
			t.Errorf("round %d: P: Running=%d, %d admits, %d releases after Commit returned", i, s.Running, r.admits.Load(), r.releases.Load())
		}
		if n := d.commits.Load() - commits; n != 1 {
			t.Errorf("round %d: COMMIT written %d times, want once (never retried)", i, n)
		}
		if n := r.admits.Load() - admits; n != 0 {
			t.Errorf("round %d: %d admissions during Commit (a retry?)", i, n)
		}
		// The server decides; wait for it to end the session, then accept
		// either outcome.
		r.serverUntil("the server ends the dropped session", relTx, 0)
		mode := "FIN"
		if i%2 == 1 {
			mode = "RST"
		}
		if slices.Contains(r.ids(table), id) {
			outcomes[mode+": committed"]++
			want = append(want, id)
		} else {
			outcomes[mode+": rolled back"]++
		}
	}
	t.Logf("figures: ambiguous commits (%d dials, pgx cancel requests included): %v", d.dials.Load(), outcomes)
	// The gate and pool still work once the connection is gone.
	if err := r.insertTx(ctx, table, 100); err != nil {
		t.Errorf("transaction after the dropped commits: %v", err)
	}
	r.wantIDs(table, append(want, 100)...)
	r.finish()
}

// Slow dials and a slow network: rejections stay immediate, dials are not
// thrown away.

// A rejection sends nothing to the server, also when the pooled
// connection it would have used needs a reset: pgx pings a connection idle
// for more than a second before reusing it (forced here for every reset
// with OptionShouldPing, so that nothing has to wait a second), and with
// 50 ms of network latency that ping cost a rejection 100 ms. The gate
// resets a server connection only once the operation holds its permits.
func TestARejectionPingsNothingAlsoWhenThePooledConnectionNeedsAReset(t *testing.T) {
	var pings atomic.Int64
	inner := stdlib.GetConnector(*relLatency(t, 50*time.Millisecond, 0), stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool {
		pings.Add(1)
		return true
	}))
	g, db := gateOn(t, inner, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Minute})
	ctx := pgTestCtx(t)
	// Three used connections in database/sql's pool: the transaction
	// takes one, the operation waiting for it another, and the third
	// operation gets the last one, which database/sql resets before use.
	closeConns(takeConns(t, ctx, db, 3))
	tx := pgBegin(t, ctx, db)
	waiter := goExec(db, ctx, "SELECT 1")
	awaitState(t, "an operation waits", func() bool { return g.Stats().Waiting == 1 })
	before := pings.Load()
	start := time.Now()
	_, err := db.ExecContext(ctx, "SELECT 1")
	took := time.Since(start)
	if !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("second operation: %v, want admission full", err)
	}
	if n := pings.Load() - before; n != 0 {
		t.Errorf("the rejection asked the driver to reset (ping) %d server connections, want none", n)
	}
	t.Logf("figures: a rejection with 50ms of latency each way: %v, no ping", took)
	txCommit(t, tx)
	must(t, <-waiter)
}

// relSlowDialer makes connection setup slow: each dial waits delay (or its
// context) before dialing. It counts the dials, and those cut off by
// their context.
type relSlowDialer struct {
	delay      time.Duration
	dials, cut atomic.Int64
}

func (d *relSlowDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.dials.Add(1)
	t := time.NewTimer(d.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		d.cut.Add(1)
		return nil, ctx.Err()
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// relShortDeadlines runs workers callers making ops calls each, with
// deadlines of 1 to 200 ms, and tallies how they ended. With end set, a
// caller stops at end and calls again only once the deadline is over.
func relShortDeadlines(t *testing.T, db *sql.DB, workers, ops int, end time.Time) map[string]int {
	t.Helper()
	var tally pgTally
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; i < ops && (end.IsZero() || time.Now().Before(end)); i++ {
				d := time.Duration(1+(w*ops+i)*7919%200) * time.Millisecond
				ctx, cancel := context.WithTimeout(t.Context(), d)
				var v int
				err := db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
				if !end.IsZero() {
					<-ctx.Done()
				}
				cancel()
				k := "ok"
				switch {
				case errors.Is(err, driver.ErrBadConn):
					k = "bad connection"
				case errors.Is(err, bulkhead.ErrRejected):
					k = "rejected: " + bulkhead.ReasonLabel(err)
				case errors.Is(err, context.DeadlineExceeded):
					k = "deadline"
				case err != nil:
					k = "error"
				}
				tally.add(k)
			}
		})
	}
	wg.Wait()
	return tally.n
}

// Connection setup takes 300 ms, longer than every caller's deadline (1 to
// 200 ms). database/sql with no MaxOpenConns dials under the caller's
// context: every dial is cut off and thrown away, so nothing ever runs
// (with MaxOpenConns, its background opener dials for waiting callers).
// Through the gate a dial goes on after its caller gave up and its
// connection is kept: once the connections are up, the calls run.
func TestSlowDialsAreKeptSoShortDeadlinesDoNotTurnTheGateIntoRejectEverything(t *testing.T) {
	const workers = 8
	p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 4, QueueWait: 50 * time.Millisecond}

	for _, maxOpen := range []int{0, p.MaxConcurrent + p.MaxQueue} {
		plainDialer := &relSlowDialer{delay: 300 * time.Millisecond}
		cfg := relConfig(t)
		cfg.DialFunc = plainDialer.dial
		plain := stdlib.OpenDB(*cfg)
		plain.SetMaxOpenConns(maxOpen)
		plain.SetMaxIdleConns(p.MaxConcurrent + p.MaxQueue)
		plainTally := relShortDeadlines(t, plain, workers, 10, time.Time{})
		t.Logf("figures: database/sql alone, MaxOpenConns %d, %d calls: %v; %d dials started, %d cut off, %d connections open after", maxOpen, workers*10, plainTally, plainDialer.dials.Load(), plainDialer.cut.Load(), plain.Stats().OpenConnections)
		plain.Close()
	}

	gateDialer := &relSlowDialer{delay: 300 * time.Millisecond}
	cfg := relConfig(t)
	cfg.DialFunc = gateDialer.dial
	g, db := gateOn(t, stdlib.GetConnector(*cfg), p)
	const ops = 40
	tally := relShortDeadlines(t, db, workers, ops, time.Time{})
	s := g.Stats()
	t.Logf("figures: through the gate, %d calls: %v; %d dials (%d failed, %d cut off), %d connections open", workers*ops, tally, s.Dials, s.DialErrors, gateDialer.cut.Load(), s.OpenConns)
	// Every dial outlasts its caller (300 ms against at most 200 ms): each
	// call that ran did so on a connection dialed for a caller that had
	// given up by then, and no dial failed for its caller's giving up.
	if s.Dials == 0 || s.DialErrors != 0 {
		t.Errorf("%d dials, %d failed: want dials, none failed (a dial goes on after its caller gave up): %+v", s.Dials, s.DialErrors, s)
	}
	if n := gateDialer.cut.Load(); n != 0 {
		t.Errorf("%d dials were cut off by their caller's context", n)
	}
	// Once the connections are up (300 ms), a call runs unless the gate is
	// full, or its deadline ends mid-statement: a good share of the calls
	// made after that succeed (half on an idle machine).
	if tally["ok"] < workers*ops/4 {
		t.Errorf("only %d of %d calls ran: the gate rejected or timed out the rest while the server was idle", tally["ok"], workers*ops)
	}
	awaitState(t, "the dials in flight are done", func() bool { return g.Stats().OpenConns == g.Stats().IdleConns })
}

// relDialCounter is a connector counting Connect calls.
type relDialCounter struct {
	driver.Connector
	dials atomic.Int64
}

func (d *relDialCounter) Connect(ctx context.Context) (driver.Conn, error) {
	d.dials.Add(1)
	return d.Connector.Connect(ctx)
}

// 100 ms of latency each way and callers' deadlines of 1 to 200 ms, for
// the gate over pgx's stdlib and over pgxgate, each beside database/sql
// alone on the same connector with MaxOpenConns B+Q. Over both the gate
// dials no more than database/sql alone, and at most twice the most it had
// open at once plus those found bad (over stdlib pgx closes the connection
// of each statement cut off; the gate starts few: they would be late).
// BULKHEAD_TEST_SLOW_LINK sets the duration (default 10s).
func TestOnASlowLinkTheGateDialsNoMoreThanItCanKeep(t *testing.T) {
	d := 10 * time.Second
	if v := os.Getenv("BULKHEAD_TEST_SLOW_LINK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("BULKHEAD_TEST_SLOW_LINK=%q: want a positive duration such as 60s", v)
		}
	}
	const workers = 12
	p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 4, QueueWait: 100 * time.Millisecond}
	slow := func() *pgx.ConnConfig { return relLatency(t, 100*time.Millisecond, 0) }
	type arm struct {
		db    *sql.DB
		g     *bulkhead.Gate // nil: database/sql alone
		dials *relDialCounter
		tally map[string]int
		most  int // server connections open or being dialed at once, polled
	}
	arms := map[string]*arm{}
	for _, driverName := range []string{"stdlib", "pgxgate"} {
		for _, gated := range []bool{false, true} {
			var c driver.Connector
			if driverName == "stdlib" {
				c = stdlib.GetConnector(*slow())
			} else {
				c = pgxgate.Connector(slow())
			}
			a := &arm{dials: &relDialCounter{Connector: c}}
			name := "plain/" + driverName
			if gated {
				name = "gate/" + driverName
				a.g, a.db = gateOn(t, a.dials, p)
			} else {
				a.db = plainDB(t, a.dials)
				a.db.SetMaxOpenConns(p.MaxConcurrent + p.MaxQueue)
				a.db.SetMaxIdleConns(p.MaxConcurrent + p.MaxQueue)
			}
			arms[name] = a
		}
	}

	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, a := range arms {
		wg.Go(func() { a.tally = relShortDeadlines(t, a.db, workers, 1<<20, end) })
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for time.Now().Before(end) {
				<-tick.C
				n := a.db.Stats().OpenConnections
				if a.g != nil {
					n = a.g.Stats().OpenConns
				}
				a.most = max(a.most, n)
			}
		})
	}
	wg.Wait()
	for _, name := range []string{"plain/stdlib", "gate/stdlib", "plain/pgxgate", "gate/pgxgate"} {
		a := arms[name]
		bad := int64(0)
		if a.g != nil {
			bad = a.g.Stats().BadConns
		}
		t.Logf("figures: %s, %v, %d callers: %v; %d dials, at most %d open, %d found bad", name, d, workers, a.tally, a.dials.dials.Load(), a.most, bad)
	}
	for _, driverName := range []string{"stdlib", "pgxgate"} {
		a, plain := arms["gate/"+driverName], arms["plain/"+driverName]
		awaitState(t, "the gate over "+driverName+" has every permit back", func() bool {
			s := a.g.Stats()
			return s.Running == 0 && s.Waiting == 0
		})
		if n := a.tally["bad connection"]; n != 0 {
			t.Errorf("through the gate over %s, %d calls got an error matching driver.ErrBadConn: want none once the caller's context ended", driverName, n)
		}
		dials, bad := a.dials.dials.Load(), a.g.Stats().BadConns
		if bound := 2*int64(a.most) + bad; dials > bound {
			t.Errorf("the gate over %s dialed %d server connections: want at most %d (twice the %d open at once, plus %d found bad)", driverName, dials, bound, a.most, bad)
		}
		if dials > plain.dials.dials.Load() {
			t.Errorf("the gate over %s dialed %d server connections, database/sql alone %d", driverName, dials, plain.dials.dials.Load())
		}
	}
}
