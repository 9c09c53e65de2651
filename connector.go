package bulkhead

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// Gate is a driver.Connector that passes every operation of the *sql.DB
// opened on it through the bulkhead: B+Q admission permits tried without
// waiting, then B execution permits handed out in FIFO order for at most
// the policy's QueueWait. Only an operation that holds its permits gets a
// server connection, so a rejected or waiting operation holds none and
// sends nothing to the server (see Connect).
//
// A Gate serves one *sql.DB: OpenDB returns the same one every time. It is
// safe for concurrent use. The only goroutines it starts are dials of
// server connections and, with WithHoldWarning, timers.
type Gate struct {
	inner  driver.Connector
	err    error // an invalid policy's or option's (see Connector): Connect returns it
	opt    options
	global *budget
	pool   *pool
	stmts  statements

	mu        sync.Mutex // serialises SetPolicy, Cap, Close and OpenDB
	policy    Policy     // as set
	capB      int        // Cap's limits; -1: none
	capQ      int
	capUntil  time.Time // CapUntil's lease; zero: none
	capAfter  int
	budgets   map[string]*budget // every workload budget made, by name
	db        *sql.DB
	workloads atomic.Pointer[map[string]*budget] // the budgets of the policy's workloads
}

var (
	_ driver.Connector = (*Gate)(nil)
	_ io.Closer        = (*Gate)(nil)
)

// Option configures a Gate beyond its Policy.
type Option func(*options)

type options struct {
	events      Events
	holdLimit   time.Duration
	onHold      func(Event)
	dialTimeout time.Duration
	connInit    func(context.Context, driver.Conn) error
	err         error
}

// WithEvents sets callbacks on admit, reject and release. Default: none.
// With OnRelease set, each operation also reads the clock when it starts.
func WithEvents(e Events) Option { return func(o *options) { o.events = e } }

// WithHoldWarning reports every operation that holds its permits longer
// than limit (a transaction left open, Rows never closed), like HikariCP's
// leak detection: report is called once, limit after the permits were
// granted, on a timer's goroutine, while the operation still runs. A nil
// report logs a warning through slog.Default. A limit ≤ 0 turns the
// warning off (the default).
func WithHoldWarning(limit time.Duration, report func(Event)) Option {
	return func(o *options) {
		o.holdLimit, o.onHold = limit, report
		if report == nil {
			o.onHold = func(e Event) {
				slog.Default().Warn("bulkhead: operation holds its permits longer than the hold warning",
					"kind", e.Kind.String(), "workload", e.Workload, "held", e.Held, "waited", e.Waited)
			}
		}
	}
}

// WithDialTimeout bounds each dial of a server connection, 30s by
// default. A dial goes on after the caller that asked for it gave up, and
// its connection serves the next caller instead of being thrown away; d
// bounds it on top of the driver's own connect timeout. d must be above
// 0: New reports any other value as an error matching ErrInvalidPolicy.
func WithDialTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 && o.err == nil {
			o.err = invalid("WithDialTimeout(%v), want above 0s", d)
		}
		o.dialTimeout = d
	}
}

// WithConnInit runs init on each server connection before its first use:
// once the operation that needs it holds its permits (before a Ping, a
// Prepare or Raw, which take none, outside them). An error closes that
// connection and fails the use with it; a panic closes it and goes on up.
// For a statement each connection must run once, as package fleet tags
// them; pgx's AfterConnect runs at the dial instead, whoever asked for it.
func WithConnInit(init func(ctx context.Context, c driver.Conn) error) Option {
	return func(o *options) { o.connInit = init }
}

// New returns a Gate that enforces p in front of inner, or an error
// matching ErrInvalidPolicy that names the invalid field or option and
// its value.
func New(inner driver.Connector, p Policy, opts ...Option) (*Gate, error) {
	if inner == nil {
		return nil, errors.New("bulkhead: the inner connector is nil, want a driver.Connector")
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	g := &Gate{inner: inner, global: newBudget(""), capB: -1, capQ: -1}
	g.global.shedOther = g.shedQueued
	g.opt.dialTimeout = 30 * time.Second
	for _, o := range opts {
		o(&g.opt)
	}
	if g.opt.err != nil {
		return nil, g.opt.err
	}
	g.pool = &pool{connector: inner, dialTimeout: g.opt.dialTimeout, init: g.opt.connInit}
	g.mu.Lock()
	g.applyLocked(p)
	g.mu.Unlock()
	return g, nil
}

// Connector is New for one-line use:
//
//	db := sql.OpenDB(bulkhead.Connector(inner, policy))
//
// An invalid policy or option never runs silently: the returned Gate's
// Connect fails every time with New's error, so the first database call,
// or db.PingContext at start-up, reports it. Use New to get the error at
// once.
func Connector(inner driver.Connector, p Policy, opts ...Option) *Gate {
	g, err := New(inner, p, opts...)
	if err != nil {
		g = &Gate{inner: inner, err: err, global: newBudget(""), policy: p}
		g.pool = &pool{connector: inner}
	}
	return g
}

// OpenDB returns the gate's *sql.DB, opening it on the first call with
// B+Q idle connections kept (SetMaxIdleConns) and no limit on open ones:
// work beyond the budget is rejected at once instead of waiting inside
// database/sql's pool. Every later call returns the same *sql.DB, also
// after it was closed. sql.OpenDB(gate) would open another pool on the
// same gate, sharing its budget, and closing either closes the gate.
//
// database/sql's connections are the gate's logical connections, and
// database/sql's settings hold for the server connections behind them:
// the gate never keeps more server connections than database/sql keeps
// connections, and closes an idle one when database/sql closes one
// (SetMaxIdleConns, SetConnMaxLifetime, SetConnMaxIdleTime). A logical
// connection that is idle or waits holds no server connection.
func (g *Gate) OpenDB() *sql.DB {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.db == nil {
		g.db = sql.OpenDB(g)
		g.db.SetMaxIdleConns(g.policy.MaxConcurrent + g.policy.MaxQueue)
	}
	return g.db
}

// Connect returns a logical connection for database/sql's pool. It dials
// nothing: the logical connection takes a server connection only once an
// operation on it holds its permits, or a Ping, a Prepare or Raw needs
// one (see OpenDB).
func (g *Gate) Connect(context.Context) (driver.Conn, error) {
	if g.err != nil {
		return nil, g.err
	}
	if g.global.isClosed() {
		return nil, ErrClosed
	}
	g.pool.logicalOpened()
	c := &conn{g: g}
	c.tx.c, c.rows.c = c, c
	return c, nil
}

// Driver returns a driver.Driver whose OpenConnector returns the gate, for
// code that registers drivers by name:
//
//	sql.Register("gated", gate.Driver())
//	db, err := sql.Open("gated", "")
//
// opens a *sql.DB on the gate with the inner connector's settings intact.
// The data source name must be empty: the connector holds the settings.
func (g *Gate) Driver() driver.Driver { return gateDriver{g} }

type gateDriver struct{ g *Gate }

var _ driver.DriverContext = gateDriver{}

func (d gateDriver) Open(name string) (driver.Conn, error) {
	if err := checkDSN(name); err != nil {
		return nil, err
	}
	return d.g.Connect(context.Background())
}

func (d gateDriver) OpenConnector(name string) (driver.Connector, error) {
	if err := checkDSN(name); err != nil {
		return nil, err
	}
	return d.g, nil
}

func checkDSN(name string) error {
	if name != "" {
		return fmt.Errorf("bulkhead: gate driver: data source name of %d bytes (not shown: it may hold a password), want \"\": the gate's connector holds the settings", len(name))
	}
	return nil
}

// Close makes operations waiting for their permits return ErrClosed at
// once, and later ones fail with it; running operations keep their
// permits and server connections until they end, and these are closed
// then. Idle server connections are closed at once. It then closes the
// inner connector if it is an io.Closer. db.Close calls it.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.global.close()
	for _, l := range g.budgets { // removed workloads too: operations may still wait in them
		l.close()
	}
	g.mu.Unlock()
	g.pool.close()
	if c, ok := g.inner.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Policy returns the policy set (a copy: changing it changes nothing).
func (g *Gate) Policy() Policy {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.policy
	p.Workloads = maps.Clone(p.Workloads)
	return p
}

// SetPolicy changes the limits of a live gate without losing or inventing
// permits. Running work keeps its permits: when B shrinks, new work starts
// once running work is below the new B; when it grows, waiters are served
// in FIFO order. When B+Q shrinks below the operations admitted, admission
// refuses until enough have ended. Workloads are resized, added and
// removed the same way (operations of a removed workload finish under its
// old budget). An invalid policy changes nothing and returns New's error.
func (g *Gate) SetPolicy(p Policy) error {
	if g.err != nil {
		return g.err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	g.mu.Lock()
	g.applyLocked(p)
	g.mu.Unlock()
	return nil
}

// Cap lowers the limits in force below the policy's, for a budget shared
// with other processes (package fleet): at most b operations run at once
// and q wait, and each workload fits within them. b or q below 0 lifts
// that cap; b may be 0, and then every operation is rejected at once.
// Running work keeps its permits: Cap returns once the operations running
// are within the new limit (at once in dry-run, where nothing is
// enforced), or with ctx's error when ctx ends first, the cap in force
// all the same.
func (g *Gate) Cap(ctx context.Context, b, q int) error {
	return g.CapUntil(ctx, b, q, time.Time{}, 0)
}

// CapUntil is Cap with a lease: b holds only until the instant until (by
// the monotonic and the wall clock); from then on, until the next Cap or
// CapUntil, at most after operations start at once. A fleet member whose
// coordination lapsed so stops running on its share (package fleet). A
// zero until is Cap.
func (g *Gate) CapUntil(ctx context.Context, b, q int, until time.Time, after int) error {
	if g.err != nil {
		return g.err
	}
	g.mu.Lock()
	g.capB, g.capQ, g.capUntil, g.capAfter = b, q, until, after
	g.applyLocked(g.policy)
	g.mu.Unlock()
	return g.global.waitDrained(ctx)
}

// applyLocked puts p in force, within Cap's limits. g.mu is held.
func (g *Gate) applyLocked(p Policy) {
	p.Workloads = maps.Clone(p.Workloads)
	g.policy = p
	b, q := p.MaxConcurrent, p.MaxQueue
	if g.capB >= 0 {
		b = min(b, g.capB)
	}
	if g.capQ >= 0 {
		q = min(q, g.capQ)
	}
	if !g.capUntil.IsZero() && !time.Now().Before(g.capUntil) {
		b = min(b, g.capAfter)
	}
	floor := 0
	if p.Adaptive {
		floor = max(1, p.MinConcurrent)
	}
	g.global.resize(b, q, p.QueueWait, p.DryRun, floor)
	g.global.setLease(g.capUntil, g.capAfter)
	if len(p.Workloads) == 0 {
		g.workloads.Store(nil)
		return
	}
	wls := make(map[string]*budget, len(p.Workloads))
	for name, w := range p.Workloads {
		// A workload removed and listed again gets its budget back: what
		// still runs or waits under it counts against it.
		l := g.budgets[name]
		if l == nil {
			l = newBudget(name)
			if g.global.isClosed() {
				l.close()
			}
			if g.budgets == nil {
				g.budgets = map[string]*budget{}
			}
			g.budgets[name] = l
		}
		l.mu.Lock()
		l.prio = w.Priority
		l.mu.Unlock()
		wb := min(w.MaxConcurrent, b)
		l.resize(wb, max(0, min(w.MaxQueue, b+q-wb)), w.QueueWait, p.DryRun, 0)
		wls[name] = l
	}
	g.workloads.Store(&wls)
}

func (g *Gate) workload(name string) *budget {
	if wls := g.workloads.Load(); wls != nil && name != "" {
		return (*wls)[name]
	}
	return nil
}

// Stats is a snapshot of a gate, or of one workload's budget, shaped like
// sql.DBStats: the limits in force, then gauges, then cumulative counters.
// Every gated operation ends in exactly one of Admitted, RejectedFull,
// RejectedTimeout, RejectedDeadline, ConnectFailed and Canceled (in
// dry-run, an operation counted in RejectedFull runs, and is counted in
// Admitted too).
type Stats struct {
	MaxConcurrent int           // B: execution permits (below the policy's under Cap, and moving under Adaptive)
	MaxQueue      int           // Q: admission permits beyond B
	QueueWait     time.Duration // longest wait for an execution permit
	DryRun        bool          // rejections are counted and reported, not made

	// Gauges.
	Running   int // operations holding an execution permit (in dry-run, also those that would have waited)
	Waiting   int // admitted operations waiting for an execution permit
	OpenConns int // server connections open or being dialed; 0 for a workload
	IdleConns int // server connections idle in the gate; 0 for a workload
	// Hold is the moving average of the time operations held their
	// permits, which ErrWouldMissDeadline and Adaptive go by: measured on
	// the operations that could not take their permits at once or took
	// the last free one (all of them under Adaptive); 0 before the first.
	Hold time.Duration

	// Counters.
	Admitted         int64         // got their permits and a server connection, and ran
	RejectedFull     int64         // refused at once: admission full (dry-run: would have been)
	RejectedTimeout  int64         // admitted, then refused: no execution permit within the wait
	RejectedDeadline int64         // refused at once or after a wait: it could no longer make its context's deadline
	ConnectFailed    int64         // had their permits, then no server connection: the dial failed
	Canceled         int64         // the context ended, or the gate closed, before the operation could run
	WaitCount        int64         // had to wait for an execution permit
	WaitDuration     time.Duration // total time waited for execution permits
	WouldWait        int64         // dry-run: found no execution permit free and ran anyway
	Dials            int64         // server connections dialed, failed dials included; 0 for a workload
	DialErrors       int64         // dials that failed, whoever asked (operations, Ping, Prepare, Raw); 0 for a workload
	BadConns         int64         // server connections the driver found dead and the gate closed; 0 for a workload
}

// Stats returns a snapshot of the gate's global budget, which every
// operation passes, and of its server connections.
func (g *Gate) Stats() Stats {
	var s Stats
	g.global.stats(&s)
	s.OpenConns, s.IdleConns = g.pool.counts()
	s.Dials, s.DialErrors, s.BadConns = g.pool.nDials.Load(), g.pool.nDialErrors.Load(), g.pool.nBad.Load()
	return s
}

// WorkloadStats returns a snapshot of the named workload's budget: its
// limits, its gauges, and the outcomes of its operations, whichever budget
// decided them. ok is false if the policy lists no such workload.
func (g *Gate) WorkloadStats(name string) (s Stats, ok bool) {
	l := g.workload(name)
	if l == nil {
		return Stats{}, false
	}
	l.stats(&s)
	return s, true
}
