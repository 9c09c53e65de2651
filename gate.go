package bulkhead

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// Gate is a driver.Connector that passes every database operation of the
// *sql.DB opened on it through the bulkhead: B+Q admission permits tried
// without waiting, then B execution permits waited for in FIFO order for at
// most the policy's QueueWait. Only an operation that holds its permits
// gets a server connection: the gate keeps those itself, at most MaxConns
// (B+Q), and hands database/sql logical connections that hold none while
// they wait or sit idle (see Connect). A rejected or waiting operation
// therefore holds no server connection and sends nothing to the server.
//
// A Gate serves one *sql.DB: OpenDB returns the same one every time.
//
// A Gate is safe for concurrent use. The only goroutines it starts are
// dials of server connections (see WithDialTimeout), with
// WithHoldWarning timers, and in a fleet (Policy.Fleet) its coordination
// loop, which Close ends.
type Gate struct {
	inner driver.Connector
	lim   *limiter // the global budget
	pool  *pool    // the server connections
	err   error    // an invalid policy's error (see Connector): Connect returns it
	opt   options

	mu        sync.Mutex                          // serialises SetPolicy, Close and OpenDB
	limiters  map[string]*limiter                 // every workload budget ever made, by name; guarded by mu
	db        *sql.DB                             // opened by OpenDB; guarded by mu
	policy    atomic.Pointer[Policy]              // the policy set (with a fleet, its limits are the fleet's)
	workloads atomic.Pointer[map[string]*limiter] // nil: no workloads
	fleet     *fleet                              // nil: no fleet budget (Policy.Fleet empty)

	stmtMu sync.Mutex
	protos map[string]*stmtProto // queries with an open prepared statement (stmt.go)
}

var (
	_ driver.Connector = (*Gate)(nil)
	_ io.Closer        = (*Gate)(nil)
)

// New returns a Gate that enforces p in front of inner, or an error
// matching ErrInvalidPolicy that names the invalid field or option and
// its value.
func New(inner driver.Connector, p Policy, opts ...Option) (*Gate, error) {
	if inner == nil {
		return nil, errors.New("bulkhead: inner connector is nil")
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	g := &Gate{inner: inner, lim: newLimiter("", p)}
	for _, o := range opts {
		o(&g.opt)
	}
	if g.opt.err != nil {
		return nil, g.opt.err
	}
	g.pool = newPool(inner, &g.opt, 0)
	if p.Fleet != "" {
		g.fleet = newFleet(g, p.Fleet)
		if !g.opt.fleetNoTags {
			g.pool.tag = g.fleet.tag
		}
	}
	g.setPolicy(p)
	if g.fleet != nil {
		g.fleet.start()
	}
	return g, nil
}

// Connector is New for one-line use:
//
//	db := sql.OpenDB(bulkhead.Connector(inner, policy))
//
// An invalid policy or option (or a nil inner) never runs silently: the
// returned Gate's Connect fails every time with New's error, so the first
// database call, or db.PingContext at start-up, reports it and no
// operation runs. Use New to get the error at once.
func Connector(inner driver.Connector, p Policy, opts ...Option) *Gate {
	g, err := New(inner, p, opts...)
	if err != nil {
		g = &Gate{inner: inner, lim: newLimiter("", Policy{}), err: err}
		g.pool = newPool(inner, &g.opt, 0)
		g.policy.Store(&p)
	}
	return g
}

// OpenDB returns the *sql.DB of the gate, opening it on the first call
// with the pool settings the gate relies on: no limit on open connections
// in database/sql (excess work is rejected by the gate at once instead of
// waiting in database/sql's pool, in random order, until its context
// ends), and B+Q idle logical connections kept, so that bursts do not
// allocate new ones. Every later call returns the same *sql.DB, also after
// it was closed: a gate serves one pool.
//
// database/sql's connection settings (SetMaxIdleConns,
// SetConnMaxLifetime, SetConnMaxIdleTime, and DBStats' connection
// counts) apply to the logical connections, which hold no server
// connection while idle. The gate's own options (WithConnMaxLifetime,
// WithConnMaxIdleTime) apply to the server connections; Stats reports
// them.
//
// sql.OpenDB(gate) opens a second *sql.DB on the same gate each time it is
// called: the pools then share the gate's budget and server connections,
// and closing either closes the gate. Use OpenDB.
func (g *Gate) OpenDB() *sql.DB {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.db == nil {
		g.db = sql.OpenDB(g)
		g.db.SetMaxOpenConns(0)
		g.db.SetMaxIdleConns(int(g.maxConns()))
	}
	return g.db
}

// Policy returns the policy in force (a copy: changing it changes
// nothing; see SetPolicy).
func (g *Gate) Policy() Policy {
	p := *g.policy.Load()
	p.Workloads = maps.Clone(p.Workloads)
	return p
}

// SetPolicy changes the limits of a live gate, for a configuration reload,
// without losing or inventing permits. Running work keeps its permits:
// when B shrinks, new work starts only once running work is below the new
// B; when it grows, waiters are woken in FIFO order. When B+Q shrinks below
// the operations admitted, admission refuses until enough have ended.
// Workloads are resized, added and removed the same way (operations of a
// removed workload finish under its old budget). MaxConns follows B+Q:
// idle server connections above it are closed, busy ones when they come
// back. An invalid policy changes nothing and returns New's error.
func (g *Gate) SetPolicy(p Policy) error {
	if g.err != nil {
		return g.err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	if old := g.policy.Load().Fleet; p.Fleet != old {
		return invalid("Fleet is %q, want %q: a gate's fleet is set when it is made", p.Fleet, old)
	}
	g.setPolicy(p)
	return nil
}

func (g *Gate) setPolicy(p Policy) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.setPolicyLocked(p)
}

// setPolicyLocked puts p in force, or, in a fleet, p with this process's
// share of its limits (fleet.apply).
func (g *Gate) setPolicyLocked(p Policy) {
	p.Workloads = maps.Clone(p.Workloads)
	eff := p
	if g.fleet != nil {
		eff = g.fleet.apply(p)
	}
	g.lim.resize(eff)
	var wls map[string]*limiter
	if len(eff.Workloads) > 0 {
		wls = make(map[string]*limiter, len(eff.Workloads))
		for name, w := range eff.Workloads {
			wp := Policy{MaxConcurrent: w.MaxConcurrent, MaxQueue: w.MaxQueue, QueueWait: w.QueueWait, DryRun: p.DryRun}
			// A workload removed earlier and listed again gets its
			// budget back: operations still running or queued under it
			// keep counting against the workload.
			l := g.limiters[name]
			if l != nil {
				l.resize(wp)
			} else {
				l = newLimiter(name, wp)
				if g.lim.isClosed() {
					l.close()
				}
				if g.limiters == nil {
					g.limiters = map[string]*limiter{}
				}
				g.limiters[name] = l
			}
			wls[name] = l
		}
	}
	if wls == nil {
		g.workloads.Store(nil)
	} else {
		g.workloads.Store(&wls)
	}
	g.policy.Store(&p)
	g.pool.setMax(eff.MaxConcurrent + eff.MaxQueue)
}

func (g *Gate) maxConns() int {
	p := g.policy.Load()
	return p.MaxConcurrent + p.MaxQueue
}

// Stats is a snapshot of a gate (or of one workload's budget), shaped like
// sql.DBStats: the limits, then gauges, then cumulative counters.
//
// Every operation ends in exactly one of Admitted, RejectedFull,
// RejectedTimeout, RejectedNoConn, ConnectFailed and Canceled (in
// dry-run, an operation counted in RejectedFull runs, and is counted in
// Admitted too).
type Stats struct {
	MaxConcurrent int           // B: execution permits
	MaxQueue      int           // Q: admission permits beyond B
	QueueWait     time.Duration // longest wait for an execution permit
	MaxConns      int           // most server connections the gate opens (B+Q); 0 for a workload
	DryRun        bool          // rejections are counted and reported, not enforced

	// Gauges.
	Running     int // operations holding an execution permit (in dry-run, also those that would have waited)
	Waiting     int // admitted operations waiting for an execution permit
	OpenConns   int // server connections open or being dialed; 0 for a workload
	IdleConns   int // server connections idle in the gate; 0 for a workload
	WaitingConn int // operations (or Ping, Prepare, Raw) waiting for a server connection, all MaxConns being in use; 0 for a workload

	// Counters.
	Admitted        int64         // operations that got their permits and a server connection, and ran
	RejectedFull    int64         // refused at once: admission full (dry-run: would have been)
	RejectedTimeout int64         // admitted, then rejected: no execution permit within the wait
	RejectedNoConn  int64         // had their permits, then rejected: no server connection within the wait
	ConnectFailed   int64         // had their permits, then the dial of a server connection failed (its error returned)
	Canceled        int64         // context ended (or gate closed) before the operation could run
	WaitCount       int64         // operations that had to wait for an execution permit
	WaitDuration    time.Duration // total time spent waiting for execution permits
	WouldWait       int64         // dry-run: operations that found no execution permit free and ran anyway
	Dials           int64         // server connections dialed; 0 for a workload
	DialsKept       int64         // dials that went on after their operation gave up, their connection kept; 0 for a workload
	BadConns        int64         // server connections closed because the driver found them bad on reset or return; 0 for a workload

	// A fleet budget (Policy.Fleet), zero outside one and for a workload.
	// MaxConcurrent and MaxQueue above are then this process's share.
	Fleet FleetStats
}

// Stats returns a snapshot of the gate's global budget and its server
// connections: every operation counts here, whatever its workload.
func (g *Gate) Stats() Stats {
	var s Stats
	g.lim.stats(&s)
	ps := g.pool.stats()
	s.MaxConns, s.OpenConns, s.IdleConns, s.WaitingConn = ps.max, ps.open, ps.idle, ps.waiting
	s.Dials = g.pool.nDials.Load()
	s.DialsKept = g.pool.nKept.Load()
	s.BadConns = g.pool.nInvalid.Load()
	if g.fleet != nil {
		s.Fleet = g.fleet.stats()
	}
	return s
}

// WorkloadStats returns a snapshot of the named workload's budget: its
// limits, its gauges, and the operations it decided (its own rejections,
// and those of the global budget or the connection budget met by its
// operations). ok is false if the policy has no such workload.
func (g *Gate) WorkloadStats(name string) (s Stats, ok bool) {
	l := g.workload(name)
	if l == nil {
		return Stats{}, false
	}
	l.stats(&s)
	return s, true
}

func (g *Gate) workload(name string) *limiter {
	if wls := g.workloads.Load(); wls != nil && name != "" {
		return (*wls)[name]
	}
	return nil
}

// Connect returns a logical connection for database/sql's pool. It dials
// nothing (except the first time, to learn which optional interfaces the
// driver's connections implement): the logical connection gets a server
// connection only when an operation on it holds its permits, or when a
// Ping, a Prepare or Raw needs one.
func (g *Gate) Connect(ctx context.Context) (driver.Conn, error) {
	if g.err != nil {
		return nil, g.err
	}
	if g.lim.isClosed() {
		return nil, ErrClosed
	}
	pi := g.pool.proto.Load()
	if pi == nil {
		var err error
		if pi, err = g.learn(ctx); err != nil {
			return nil, err
		}
	}
	return newConn(g, pi.mask), nil
}

// learn dials the gate's first server connection, to learn the driver's
// optional interfaces, and keeps it idle. Concurrent first calls wait for
// one dial.
func (g *Gate) learn(ctx context.Context) (*protoInfo, error) {
	select {
	case g.pool.learning <- struct{}{}:
		defer func() { <-g.pool.learning }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if pi := g.pool.proto.Load(); pi != nil {
		return pi, nil
	}
	// A fleet's instance with no share yet (MaxConns 0) still dials once
	// to learn: its operations are then rejected by their budget, as any
	// gate's, not by the connection budget. put closes that session.
	s, err := g.pool.get(ctx, g.connWait(), g.lim.dryRun.Load() || g.pool.max.Load() == 0)
	if err != nil {
		return nil, g.connErr(err, g.connWait())
	}
	// Published only once the session is idle: a concurrent first
	// operation then finds it instead of dialing another one.
	g.pool.put(s)
	g.pool.learn(s)
	return g.pool.proto.Load(), nil
}

// connWait is how long a caller waits for a server connection when all
// MaxConns are in use (WithConnWait).
func (g *Gate) connWait() time.Duration {
	if g.opt.connWait > 0 {
		return g.opt.connWait
	}
	return defaultConnWait
}

// connErr turns the pool's errNoSession into the rejection that says so.
func (g *Gate) connErr(err error, waited time.Duration) error {
	if err != errNoSession {
		return err
	}
	ps := g.pool.stats()
	free, waiting := g.lim.counts()
	e := &RejectedError{Cause: ErrNoConnection, Conns: ps.open, MaxConns: ps.max, Waited: waited, Waiting: waiting}
	e.MaxConcurrent, e.MaxQueue = g.lim.maxAdmitSplit()
	e.Running = e.MaxConcurrent - free
	return e
}

// maxAdmitSplit returns B and Q of the budget.
func (l *limiter) maxAdmitSplit() (b, q int) {
	e := l.fullErr.Load()
	return e.MaxConcurrent, e.MaxQueue
}

// stmtProtoFor returns the gate's prepared statement for query, counting
// one more statement of it, or nil if it has none.
func (g *Gate) stmtProtoFor(query string) *stmtProto {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	pr := g.protos[query]
	if pr != nil {
		pr.refs++
	}
	return pr
}

// addStmtProto records si, just prepared for query, with its NumInput, as
// the gate's prepared statement for it if it has none, and counts one more
// statement of the query.
func (g *Gate) addStmtProto(query string, si driver.Stmt, numInput int) *stmtProto {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	pr := g.protos[query]
	if pr == nil {
		pr = &stmtProto{si: si, mask: stmtMask(si), numInput: numInput}
		if g.protos == nil {
			g.protos = map[string]*stmtProto{}
		}
		g.protos[query] = pr
	}
	pr.refs++
	return pr
}

// dropStmtProto counts one statement of query fewer, forgetting the query
// when none is left.
func (g *Gate) dropStmtProto(query string, pr *stmtProto) {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	if pr.refs--; pr.refs == 0 && g.protos[query] == pr {
		delete(g.protos, query)
	}
}

// Driver returns a driver.Driver that opens connections through the gate,
// for code that registers a driver by name: it implements
// driver.DriverContext, whose OpenConnector returns the gate itself, so
//
//	sql.Register("gated", gate.Driver())
//	db, err := sql.Open("gated", "")
//
// opens a *sql.DB on the gate with the inner connector's settings intact
// (prefer gate.OpenDB: each sql.Open opens another pool on the same gate).
// The data source name must be empty: the connector already holds the
// settings, and a DSN here would be silently ignored.
func (g *Gate) Driver() driver.Driver { return gateDriver{g} }

type gateDriver struct{ g *Gate }

var (
	_ driver.Driver        = gateDriver{}
	_ driver.DriverContext = gateDriver{}
)

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
		return fmt.Errorf("bulkhead: gate driver: the data source name is set (%d bytes, not shown: it may hold a password), want \"\": the gate's connector holds the connection settings", len(name))
	}
	return nil
}

// Close makes operations waiting for an execution permit or a server
// connection return ErrClosed at once, and new ones fail with ErrClosed;
// running operations keep their permits and server connections until they
// end, and their connections are closed then. Idle server connections are
// closed at once. It then closes the inner connector if it is an
// io.Closer. database/sql calls it from db.Close.
//
// In a fleet, Close first ends the coordination loop and gives the
// process's share back: its B becomes 0, and the session that holds its
// slots is closed (freeing them for the other instances) once no operation
// runs: at once if none does, else from a goroutine when the last ends.
func (g *Gate) Close() error {
	if g.fleet != nil {
		g.fleet.stop()
	}
	g.mu.Lock()
	g.lim.close()
	for _, l := range g.limiters { // removed workloads too: operations may still wait in them
		l.close()
	}
	g.mu.Unlock()
	g.pool.close()
	if c, ok := g.inner.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
