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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/estimate"
	"github.com/dbbulkhead/bulkhead/internal/sessions"
)

// Gate is a driver.Connector that passes every operation of its *sql.DB
// through the bulkhead: B+Q admission permits tried without waiting, then B
// execution permits by priority, then deadline, within QueueWait; only then
// a server connection, so a rejected or waiting operation sends nothing. It
// is safe for concurrent use and starts no goroutines but dials and
// hold-warning timers.
type Gate struct {
	inner  driver.Connector
	err    error // an invalid policy's or option's (see Connector): Connect returns it
	opt    options
	global *budget
	est    *estimate.Estimator
	pool   *sessions.Pool
	stmts  statements

	mu         sync.Mutex // serialises SetPolicy, Cap, Close and OpenDB
	policy     Policy     // as set
	capB, capQ int        // Cap's limits; -1: none
	capUntil   time.Time  // CapUntil's lease; zero: none
	capAfter   int
	budgets    map[string]*budget // every workload budget made, by name
	db         *sql.DB
	workloads  atomic.Pointer[map[string]*budget] // the budgets of the policy's workloads

	nUnknown atomic.Int64        // operations naming a workload the policy lacks
	unknown  map[string]struct{} // the names of them logged, at most maxUnknownLogged; under mu
}

// maxUnknownLogged bounds the unknown workload names a gate logs.
const maxUnknownLogged = 16

// unknownWorkload counts an operation that names a workload the policy
// lacks, and logs the name the first time it is seen.
func (g *Gate) unknownWorkload(name string) {
	g.nUnknown.Add(1)
	g.mu.Lock()
	_, seen := g.unknown[name]
	log := !seen && len(g.unknown) < maxUnknownLogged
	if log {
		if g.unknown == nil {
			g.unknown = map[string]struct{}{}
		}
		g.unknown[name] = struct{}{}
	}
	var known []string
	for k := range g.policy.Workloads {
		known = append(known, k)
	}
	g.mu.Unlock()
	slices.Sort(known)
	if log {
		slog.Default().Warn("bulkhead: an operation names a workload the policy lacks: it passes the global budget alone (Stats.UnknownWorkload counts them)",
			"workload", name, "known", known)
	}
}

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

// WithHoldWarning calls report once, on a timer's goroutine, for each operation
// still holding its permits limit after they were granted (an open transaction,
// unclosed Rows); a nil report logs through slog.Default. Default: off (limit ≤ 0).
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

// WithDialTimeout bounds each dial of a server connection, which goes on for
// the next caller after the one that asked gave up. Default: 30s. d must be
// above 0, else New returns an error matching ErrInvalidPolicy.
func WithDialTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 && o.err == nil {
			o.err = invalid("WithDialTimeout(%v), want above 0s", d)
		}
		o.dialTimeout = d
	}
}

// WithConnInit runs init on each server connection before its first use, in
// the permits of the operation needing it (Ping, Prepare and Raw hold none).
// An error closes it and fails the use; a panic closes it and goes on up.
func WithConnInit(init func(ctx context.Context, c driver.Conn) error) Option {
	return func(o *options) { o.connInit = init }
}

// New returns a Gate that enforces p in front of inner, or an error matching
// ErrInvalidPolicy that names the invalid field or option and its value.
func New(inner driver.Connector, p Policy, opts ...Option) (*Gate, error) {
	if inner == nil {
		return nil, errors.New("bulkhead: the inner connector is nil, want a driver.Connector")
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	g := &Gate{inner: inner, global: newBudget(""), est: estimate.New(), capB: -1, capQ: -1, budgets: map[string]*budget{}}
	g.opt.dialTimeout = 30 * time.Second
	for _, o := range opts {
		o(&g.opt)
	}
	if g.opt.err != nil {
		return nil, g.opt.err
	}
	g.global.onMove = g.opt.events.OnLimit
	g.pool = &sessions.Pool{Connector: inner, DialTimeout: g.opt.dialTimeout, Init: g.opt.connInit, Limit: g.global.limits, Closed: ErrClosed}
	g.mu.Lock()
	g.applyLocked(p)
	g.mu.Unlock()
	return g, nil
}

// Connector is New for one-line use:
//
//	db := sql.OpenDB(bulkhead.Connector(inner, policy))
//
// With an invalid policy or option, the Gate's Connect fails every time with
// New's error, so the first database call reports it.
func Connector(inner driver.Connector, p Policy, opts ...Option) *Gate {
	g, err := New(inner, p, opts...)
	if err != nil {
		g = &Gate{inner: inner, err: err, global: newBudget(""), est: estimate.New(), pool: &sessions.Pool{Connector: inner, Closed: ErrClosed}, policy: p}
	}
	return g
}

// OpenDB returns the gate's *sql.DB, the same one on every call, also once
// closed, keeping B+Q idle connections and no limit on open ones: work beyond
// the budget is rejected, not queued in database/sql's pool, whose settings
// hold for the server connections behind it. sql.OpenDB(gate) opens another.
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
// nothing: a server connection is bound once an operation holds its permits,
// or a Ping, Prepare or Raw needs one.
func (g *Gate) Connect(context.Context) (driver.Conn, error) {
	if g.err != nil {
		return nil, g.err
	}
	if g.global.isClosed() {
		return nil, ErrClosed
	}
	g.pool.LogicalOpened()
	c := &conn{g: g}
	c.tx.c, c.rows.c = c, c
	return c, nil
}

// Driver returns a driver.Driver whose OpenConnector returns the gate, for
// code that registers drivers by name; the data source name must be empty:
//
//	sql.Register("gated", gate.Driver())
//	db, err := sql.Open("gated", "")
func (g *Gate) Driver() driver.Driver { return gateDriver{g} }

type gateDriver struct{ g *Gate }

func (d gateDriver) Open(name string) (driver.Conn, error) {
	if _, err := d.OpenConnector(name); err != nil {
		return nil, err
	}
	return d.g.Connect(context.Background())
}

func (d gateDriver) OpenConnector(name string) (driver.Connector, error) {
	if name != "" {
		return nil, fmt.Errorf("bulkhead: gate driver: data source name of %d bytes (not shown: it may hold a password), want \"\": the gate's connector holds the settings", len(name))
	}
	return d.g, nil
}

// Close makes waiting and later operations fail with ErrClosed and closes
// idle server connections; running ones keep theirs until they end. It then
// closes the inner connector if it is an io.Closer. db.Close calls it.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.global.close()
	for _, l := range g.budgets { // removed workloads too: operations may still wait in them
		l.close()
	}
	g.mu.Unlock()
	g.pool.Close()
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

// SetPolicy changes the limits of a live gate, workloads included, without
// losing or inventing permits: running work keeps them. An invalid policy
// changes nothing and returns New's error.
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

// Cap lowers the limits in force to at most b running and q waiting, workloads
// within them, for a budget shared with other processes (package fleet); b or
// q below 0 lifts that cap, b = 0 rejects all. It returns once running work is
// within b (at once in dry-run), or ctx's error; the cap holds either way.
func (g *Gate) Cap(ctx context.Context, b, q int) error {
	return g.CapUntil(ctx, b, q, time.Time{}, 0)
}

// CapUntil is Cap with a lease: b holds until the instant until (by the
// monotonic and the wall clock), then at most after, until the next Cap or
// CapUntil. A zero until is Cap.
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
	lapsed := false // the lease ran out and its fallback lowers b
	if !g.capUntil.IsZero() && !time.Now().Before(g.capUntil) {
		lapsed = g.capAfter < b
		b = min(b, g.capAfter)
	}
	floor := 0
	if p.Adaptive {
		floor = max(1, p.MinConcurrent)
	}
	// lapsed before the resize: a queue a fallback of 0 sends away was
	// refused for the lease, not for a full admission.
	g.global.mu.Lock()
	g.global.lapsed = lapsed
	g.global.mu.Unlock()
	g.global.resize(b, q, p.QueueWait, p.DryRun, floor)
	g.global.setLease(g.capUntil, g.capAfter, lapsed)
	if len(p.Workloads) == 0 {
		g.workloads.Store(nil)
		return
	}
	wls := make(map[string]*budget, len(p.Workloads))
	for name, w := range p.Workloads {
		l := g.budgets[name] // a workload listed again gets its budget back
		if l == nil {
			l = newBudget(name)
			if g.global.isClosed() {
				l.close()
			}
			g.budgets[name] = l
		}
		l.mu.Lock()
		l.prio, l.lapsed = w.Priority, lapsed
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

// Stats is a snapshot of a gate, or of one workload's budget: the limits in
// force, gauges, then cumulative counters. Every gated operation ends in
// exactly one of Admitted, RejectedFull, RejectedTimeout, RejectedDeadline,
// RejectedLease, ConnectFailed and Canceled (dry-run: RejectedFull and Admitted).
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
	// Hold is the median of the budget's last 8 hold times, all kinds of work
	// together, measured on operations that waited or took the last permit
	// (all under Adaptive); 0 before the first. Deadlines are judged by each
	// kind's own (docs/design.md).
	Hold time.Duration

	// Counters.
	Admitted         int64         // got their permits and a server connection, and ran
	RejectedFull     int64         // refused at once: admission full (dry-run: would have been)
	RejectedTimeout  int64         // admitted, then refused: no execution permit within the wait
	RejectedDeadline int64         // refused at once or after a wait: it could no longer make its context's deadline
	RejectedLease    int64         // refused: a fleet lease ran out (Gate.CapUntil) and its fallback share had no room
	ConnectFailed    int64         // had their permits, then no server connection: the dial failed
	Canceled         int64         // the context ended, or the gate closed, before the operation could run
	WaitCount        int64         // had to wait for an execution permit
	WaitDuration     time.Duration // total time waited for execution permits
	WouldWait        int64         // dry-run: found no execution permit free and ran anyway
	Dials            int64         // server connections dialed, failed dials included; 0 for a workload
	DialErrors       int64         // dials that failed, whoever asked (operations, Ping, Prepare, Raw); 0 for a workload
	BadConns         int64         // server connections the driver found dead and the gate closed; 0 for a workload
	UnknownWorkload  int64         // operations whose context names a workload the policy lacks (WithWorkload): they pass the global budget alone; 0 for a workload

	// LastMove is Policy.Adaptive's last change of MaxConcurrent and the
	// signal it was made on: why B is where it is. Zero without Adaptive.
	LastMove Move
}

// Stats returns a snapshot of the global budget and the server connections.
func (g *Gate) Stats() Stats {
	var s Stats
	g.global.stats(&s)
	s.OpenConns, s.IdleConns, s.Dials, s.DialErrors, s.BadConns = g.pool.Counts()
	s.UnknownWorkload = g.nUnknown.Load()
	return s
}

// WorkloadStats returns a snapshot of the named workload's budget, counting
// outcomes whichever budget decided them; ok is false if the policy lacks it.
func (g *Gate) WorkloadStats(name string) (s Stats, ok bool) {
	l := g.workload(name)
	if l == nil {
		return Stats{}, false
	}
	l.stats(&s)
	return s, true
}
