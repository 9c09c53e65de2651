package bulkhead

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync/atomic"
)

// Gate is a driver.Connector that passes every database operation of the
// *sql.DB opened on it through the bulkhead: B+Q admission permits tried
// without waiting, then B execution permits waited for in FIFO order for at
// most the policy's QueueWait. It also keeps at most B+Q physical
// connections open and refuses to dial while admission is full, so that no
// caller waits inside database/sql's pool.
//
// A Gate is safe for concurrent use. It starts no goroutine.
type Gate struct {
	inner    driver.Connector
	policy   Policy
	lim      *limiter
	err      error // an invalid policy's error (see Connector): Connect returns it
	maxConns int64
	opt      options

	conns   atomic.Int64 // physical connections open or being dialed
	refused atomic.Int64 // Connect calls refused
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
	g := &Gate{
		inner:    inner,
		policy:   p,
		lim:      newLimiter(p),
		maxConns: int64(p.MaxConcurrent) + int64(p.MaxQueue),
	}
	for _, o := range opts {
		o(&g.opt)
	}
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
		return &Gate{inner: inner, policy: p, lim: newLimiter(Policy{}), err: err}
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
	db.SetMaxIdleConns(int(g.maxConns))
	return db
}

// Policy returns the gate's policy.
func (g *Gate) Policy() Policy { return g.policy }

// Stats returns a snapshot of the gate.
func (g *Gate) Stats() Stats {
	var s Stats
	g.lim.stats(&s)
	s.MaxConns = int(g.maxConns)
	s.OpenConns = int(g.conns.Load())
	s.ConnectRefused = g.refused.Load()
	return s
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
	g.lim.close()
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
			g.opt.events.OnReject(Event{Kind: KindConnect, Reason: ErrAdmissionFull})
		}
		return nil, g.lim.fullErr
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
// left, so B+Q open and none idle means all of them are busy.
func (g *Gate) reserveConn() bool {
	for {
		n := g.conns.Load()
		if n >= g.maxConns || g.lim.admissionFull() {
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
