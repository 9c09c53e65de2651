package bulkhead

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"maps"
	"sync"
	"sync/atomic"
)

// Gate is a driver.Connector that passes every database operation of the
// *sql.DB opened on it through the bulkhead: B+Q admission permits tried
// without waiting, then B execution permits waited for in FIFO order for at
// most the policy's QueueWait. It also keeps at most B+Q physical
// connections open and refuses to dial while admission is full, so that no
// caller waits inside database/sql's pool.
//
// A Gate is safe for concurrent use. It starts no goroutine (only
// WithHoldWarning uses a timer, time.AfterFunc).
type Gate struct {
	inner driver.Connector
	lim   *limiter // the global budget
	err   error    // an invalid policy's error (see Connector): Connect returns it
	opt   options

	mu        sync.Mutex                          // serialises SetPolicy and Close
	limiters  map[string]*limiter                 // every workload budget ever made, by name; guarded by mu
	policy    atomic.Pointer[Policy]              // the policy in force
	workloads atomic.Pointer[map[string]*limiter] // nil: no workloads
	maxConns  atomic.Int64                        // B+Q
	conns     atomic.Int64                        // physical connections open or being dialed
	refused   atomic.Int64                        // Connect calls refused
}

var (
	_ driver.Connector = (*Gate)(nil)
	_ io.Closer        = (*Gate)(nil)
)

// New returns a Gate that enforces p in front of inner, or an error
// matching ErrInvalidPolicy that names the invalid field and its value.
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
	g.setPolicy(p)
	return g, nil
}

// Connector is New for one-line use:
//
//	db := sql.OpenDB(bulkhead.Connector(inner, policy))
//
// An invalid policy (or a nil inner) never runs silently: the returned
// Gate's Connect fails every time with New's error, so the first database
// call, or db.PingContext at start-up, reports it and no operation runs.
// Use New to get the error at once.
func Connector(inner driver.Connector, p Policy, opts ...Option) *Gate {
	g, err := New(inner, p, opts...)
	if err != nil {
		g = &Gate{inner: inner, lim: newLimiter("", Policy{}), err: err}
		g.policy.Store(&p)
	}
	return g
}

// OpenDB opens a *sql.DB on g with the pool settings the gate relies on:
// no limit on open connections in database/sql (the gate itself keeps at
// most B+Q and refuses to dial more, so excess work is rejected at once
// instead of waiting in database/sql's pool), and B+Q idle connections
// kept, so that bursts do not close and re-dial connections.
//
// To open the *sql.DB yourself, keep SetMaxOpenConns at 0 (or above B+Q)
// and call SetMaxIdleConns(B+Q).
func (g *Gate) OpenDB() *sql.DB {
	db := sql.OpenDB(g)
	db.SetMaxOpenConns(0)
	db.SetMaxIdleConns(int(g.maxConns.Load()))
	return db
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
// removed workload finish under its old budget). The connection cap follows
// B+Q; call db.SetMaxIdleConns(B+Q) too, or database/sql keeps the old
// number of idle connections (after growing, it closes and re-dials the
// extra ones). An invalid policy changes nothing and returns New's error.
func (g *Gate) SetPolicy(p Policy) error {
	if g.err != nil {
		return g.err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	g.setPolicy(p)
	return nil
}

func (g *Gate) setPolicy(p Policy) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p.Workloads = maps.Clone(p.Workloads)
	g.lim.resize(p)
	var wls map[string]*limiter
	if len(p.Workloads) > 0 {
		wls = make(map[string]*limiter, len(p.Workloads))
		for name, w := range p.Workloads {
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
	g.maxConns.Store(int64(p.MaxConcurrent) + int64(p.MaxQueue))
	g.policy.Store(&p)
}

// Stats returns a snapshot of the gate's global budget: every operation
// counts here, whatever its workload.
func (g *Gate) Stats() Stats {
	var s Stats
	g.lim.stats(&s)
	s.MaxConns = int(g.maxConns.Load())
	s.OpenConns = int(g.conns.Load())
	s.ConnectRefused = g.refused.Load()
	return s
}

// WorkloadStats returns a snapshot of the named workload's budget: its
// limits, its gauges, and the operations it decided (its own rejections,
// and those of the global budget met by its operations). ok is false if
// the policy has no such workload.
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

// Connect dials a connection through the inner connector, unless B+Q
// connections are already open or every admission permit is held: then it
// fails at once with the admission-full rejection, without dialing. Such a
// refusal counts in Stats.RejectedFull and Stats.ConnectRefused.
func (g *Gate) Connect(ctx context.Context) (driver.Conn, error) {
	if g.err != nil {
		return nil, g.err
	}
	return g.open(func() (driver.Conn, error) { return g.inner.Connect(ctx) })
}

// Driver returns a driver whose Open dials through the inner connector's
// driver, with the same limits as Connect.
func (g *Gate) Driver() driver.Driver { return gateDriver{g} }

// Close makes operations waiting for an execution permit return ErrClosed
// at once, and new ones fail with ErrClosed; running operations keep their
// permits until they end. It then closes the inner connector if it is an
// io.Closer. database/sql calls it from db.Close.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.lim.close()
	for _, l := range g.limiters { // removed workloads too: operations may still wait in them
		l.close()
	}
	g.mu.Unlock()
	if c, ok := g.inner.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func (g *Gate) open(dial func() (driver.Conn, error)) (driver.Conn, error) {
	if g.lim.isClosed() {
		return nil, ErrClosed
	}
	if !g.reserveConn() {
		g.refused.Add(1)
		g.lim.nFull.Add(1)
		if g.opt.events.OnReject != nil {
			emit(g.opt.events.OnReject, Event{Kind: KindConnect, Reason: ErrAdmissionFull})
		}
		return nil, g.lim.fullErr.Load()
	}
	dialed := false
	defer func() {
		if !dialed {
			g.conns.Add(-1)
		}
	}()
	ci, err := dial()
	if err != nil {
		return nil, err
	}
	dialed = true
	return newConn(g, ci), nil
}

// reserveConn counts a connection about to be dialed, unless B+Q are open
// or admission is full. database/sql dials only when no idle connection is
// left, so B+Q open and none idle means all of them are busy. In dry-run
// it never refuses.
func (g *Gate) reserveConn() bool {
	for {
		n := g.conns.Load()
		if (n >= g.maxConns.Load() || g.lim.admissionFull()) && !g.lim.dryRun.Load() {
			return false
		}
		if g.conns.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// connClosed is called once for each connection of the gate that closes.
func (g *Gate) connClosed() { g.conns.Add(-1) }

type gateDriver struct{ g *Gate }

func (d gateDriver) Open(name string) (driver.Conn, error) {
	if d.g.err != nil {
		return nil, d.g.err
	}
	return d.g.open(func() (driver.Conn, error) { return d.g.inner.Driver().Open(name) })
}
