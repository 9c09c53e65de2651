package bulkhead

import (
	"cmp"
	"context"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/sessions"
)

// conn is a logical connection, kept in database/sql's pool. It holds a
// session (internal/sessions) once an operation on it holds its permits, or
// a Ping, Prepare or Raw needs one, until database/sql takes it back. It
// offers every optional driver interface, answering as database/sql would
// without one. database/sql calls conn, tx, stmt and rows one call at a
// time (also from its own goroutines): their plain fields need no lock.
type conn struct {
	g      *Gate
	s      *sessions.Session // the session held, or nil
	used   bool              // an operation ran on s since database/sql handed c out
	bad    bool              // c is to be discarded: its session was lost, or the driver's rule says so
	idle   bool              // c is idle in database/sql's pool (Pool.Park, Pool.GiveBack)
	parked bool              // c is idle, its session s parked (someone else may have taken it since)
	tx     tx                // the open transaction: a connection has at most one
	rows   rows              // an autocommit query's rows, reused while free
	execP  permit            // the permits of the autocommit Exec running on c
}

// bind gives c a session if it has none: its parked one, else the pool's.
// If the driver panics, the caller's deferred lose closes it. Once lease
// (an operation's, Gate.CapUntil; zero: none) has run out, it sends
// nothing and returns errLapsed.
func (c *conn) bind(ctx context.Context, lease time.Time) error {
	p := c.g.pool
	var s *sessions.Session
	switch {
	case c.parked:
		c.parked = false
		if p.Unpark(c.s) {
			s = c.s
		} else {
			c.s = nil // taken by another connection, or closed
		}
	case c.s != nil:
		return nil
	}
	for {
		if s == nil {
			var err error
			if s, err = p.Get(ctx); err != nil {
				return err
			}
		}
		if !lease.IsZero() && leaseOver(lease) {
			c.s = nil
			p.Put(s, false)
			return errLapsed
		}
		c.s = s
		err := p.Ready(ctx, s)
		if err == nil {
			return nil
		}
		c.s = nil
		if ie, ok := err.(*sessions.InitError); ok {
			p.Discard(s, false)
			return ie.Err
		}
		if err != sessions.ErrBad { // ctx ended while the driver checked s: it checks s again at its next use
			p.Put(s, true)
			return err
		}
		p.Discard(s, true)
		s = nil
	}
}

// lose discards c's session after the driver panicked on it: c reports
// driver.ErrBadConn from now on; an open transaction releases its permits.
func (c *conn) lose() {
	c.bad = true
	if s := c.s; s != nil {
		c.s = nil
		c.g.pool.Discard(s, false)
	}
	c.tx.end()
}

// start takes the permits of an operation of kind k running text ("" for a
// transaction) into p, then a session; on success it must end with
// c.g.release(p), on failure nothing is held.
func (c *conn) start(ctx context.Context, k Kind, text string, p *permit) error {
	if err := c.g.acquire(ctx, k, text, p); err != nil {
		return err
	}
	if c.s == nil || c.parked {
		ok := false
		defer func() {
			if !ok { // the driver panicked while its session was checked
				c.lose()
				c.g.abort(p, errPanicked)
			}
		}()
		err := c.bind(ctx, p.lease)
		ok = true
		if err != nil && err != errLapsed {
			c.g.abort(p, err)
			return ctxErr(ctx, err)
		}
	}
	if err := c.g.admitted(p); err != nil { // refuses it if its lease ran out
		return err
	}
	c.used = true
	return nil
}

var (
	errPanicked = errors.New("bulkhead: the driver panicked")
	errLapsed   = errors.New("bulkhead: lease expired") // an operation's lease ran out before its session was checked
)

// finish is deferred around a driver call: c loses its session if the call
// did not return, then p, if not nil, is released.
func (c *conn) finish(p *permit, returned *bool) {
	if !*returned {
		c.lose()
	}
	if p != nil {
		c.g.release(p)
	}
}

// session binds c's session for Ping, Prepare or Raw, outside an operation.
func (c *conn) session(ctx context.Context) (*sessions.Session, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	returned := false
	defer c.finish(nil, &returned)
	err := c.bind(ctx, time.Time{})
	returned = true
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	c.used = true
	return c.s, nil
}

// Unwrap returns the driver's own connection: see the package's Unwrap.
func (c *conn) Unwrap() (driver.Conn, error) {
	s, err := c.session(context.Background())
	if err != nil {
		return nil, err
	}
	return s.Conn, nil
}

// Unwrap returns the driver's own connection behind dc, the value
// (*sql.Conn).Raw passes, peeling each Unwrap() (driver.Conn, error) or
// Unwrap() driver.Conn. Behind a gate the *sql.Conn keeps a server
// connection until closed, or Unwrap fails. Work on it is not gated.
func Unwrap(dc any) (any, error) {
	for {
		switch u := dc.(type) {
		case interface{ Unwrap() (driver.Conn, error) }:
			inner, err := u.Unwrap()
			if err != nil {
				return nil, err
			}
			dc = inner
		case interface{ Unwrap() driver.Conn }:
			dc = u.Unwrap()
		default:
			return dc, nil
		}
	}
}

// notIdle takes c out of the logical connections given back to database/sql
// and not handed out since (Pool.NotIdle), if it was among them: each
// connection says so of itself, so one taken back twice counts once.
func (c *conn) notIdle() {
	if c.idle {
		c.idle = false
		c.g.pool.NotIdle()
	}
}

// ResetSession is called as database/sql hands c out; the session is reset
// later, once c holds its permits.
func (c *conn) ResetSession(context.Context) error {
	c.notIdle()
	// Its parked session was closed: c is bad unless an idle one is left.
	if c.parked && c.s.Gone() {
		c.parked, c.s = false, nil
		c.bad = c.g.pool.Excess(-1)
	}
	if c.bad {
		return driver.ErrBadConn
	}
	return nil
}

// IsValid is called as database/sql takes c back: c parks its session if
// the Validator and Pool.Park agree; Pool.GiveBack says if c may stay idle.
func (c *conn) IsValid() bool {
	c.notIdle() // taken back, maybe again without being handed out (a caller that gave up)
	if c.bad {
		return false
	}
	if c.parked { // not taken back since c was handed out
		c.parked = false
		if !c.g.pool.Unpark(c.s) {
			c.s = nil
		}
	}
	s := c.s
	if s != nil && s.Validator != nil && !s.Validator.IsValid() {
		c.s = nil
		c.g.pool.Discard(s, true)
		return false
	}
	if s != nil && c.g.pool.Park(s, c.used) { // counts c idle
		c.parked, c.idle, c.used = true, true, false
		return true
	}
	c.s = nil
	c.idle = c.g.pool.GiveBack(s, c.used, true) // counts c idle if it stays
	c.used = false
	return c.idle
}

// Close closes c and its session; an open transaction gives its permits back.
func (c *conn) Close() error {
	if s := c.s; s != nil {
		c.s = nil
		if !c.parked || c.g.pool.Unpark(s) {
			c.g.pool.Discard(s, false)
		}
		c.parked = false
	}
	c.tx.end()
	c.notIdle()
	c.g.pool.LogicalClosed()
	return nil
}

// CheckNamedValue accepts every argument: convert.Args converts it later.
func (c *conn) CheckNamedValue(*driver.NamedValue) error { return nil }

// Ping is not gated; without the driver's Pinger it returns nil.
func (c *conn) Ping(ctx context.Context) error {
	s, err := c.session(ctx)
	if err != nil || s.Pinger == nil {
		return err
	}
	returned := false
	defer c.finish(nil, &returned)
	err = s.Pinger.Ping(ctx)
	returned = true
	return ctxErr(ctx, err)
}

// Begin is the legacy form of BeginTx.
func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx takes both permits, until Commit or Rollback returns, and a session.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	if c.tx.open {
		return nil, ErrTxStillOpen
	}
	if err := c.start(ctx, KindTx, "", &c.tx.p); err != nil {
		return nil, err
	}
	// Open from here: if the driver panics, lose releases the permits.
	c.tx.ctx, c.tx.open = ctx, true
	returned := false
	defer c.finish(nil, &returned)
	ti, err := c.s.Begin(ctx, opts)
	returned = true
	if err != nil {
		c.tx.end() // before database/sql may retry (driver.ErrBadConn)
		return nil, opErr(ctx, err)
	}
	c.tx.inner = ti
	return &c.tx, nil
}

// inTx refuses a statement running text in the open transaction if the
// transaction's context ended; the first one's text names the
// transaction's kind of work (permit.first).
func (c *conn) inTx(ctx context.Context, text string) error {
	if c.tx.ctx.Err() == nil {
		if c.tx.p.first == "" {
			c.tx.p.first = text
		}
		return nil
	}
	return cmp.Or(ctx.Err(), ErrTxStillOpen)
}

// Exec is the legacy form of ExecContext.
func (c *conn) Exec(query string, args []driver.Value) (driver.Result, error) {
	return c.ExecContext(context.Background(), query, valueToNamedValue(args))
}

// ExecContext runs a statement under both permits, or in the open transaction.
func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	p, err := c.startExec(ctx, query)
	if err != nil {
		return nil, err
	}
	returned := false
	defer c.finish(p, &returned)
	r, err := c.s.Exec(ctx, query, args)
	returned = true
	return r, opErr(ctx, err)
}

// startExec returns the permits a statement takes, to release at its end:
// c.execP, or nil in the open transaction.
func (c *conn) startExec(ctx context.Context, text string) (*permit, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	if c.tx.open {
		return nil, c.inTx(ctx, text)
	}
	if err := c.start(ctx, KindExec, text, &c.execP); err != nil {
		return nil, err
	}
	return &c.execP, nil
}

// Query is the legacy form of QueryContext.
func (c *conn) Query(query string, args []driver.Value) (driver.Rows, error) {
	return c.QueryContext(context.Background(), query, valueToNamedValue(args))
}

// QueryContext is ExecContext for a query, whose rows hold the permits.
func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.runQuery(ctx, query, func() (driver.Rows, driver.Stmt, error) { return c.s.Query(ctx, query, args) })
}

// runQuery runs run, which returns the driver's rows and a statement to
// close with them, in c's open transaction, else by runRows.
func (c *conn) runQuery(ctx context.Context, text string, run func() (driver.Rows, driver.Stmt, error)) (driver.Rows, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	if !c.tx.open {
		return c.runRows(ctx, text, run)
	}
	if err := c.inTx(ctx, text); err != nil {
		return nil, err
	}
	returned := false
	defer c.finish(nil, &returned)
	ri, si, err := run()
	returned = true
	if err != nil {
		return nil, opErr(ctx, err)
	}
	if si != nil { // the fallback's statement, closed with its rows
		return &rows{c: c, inner: ri, stmt: si}, nil
	}
	return ri, nil
}

// runRows runs run as an autocommit query whose rows (c's, or new ones while
// c's are open) hold its permits; on an error or a panic they are released.
func (c *conn) runRows(ctx context.Context, text string, run func() (driver.Rows, driver.Stmt, error)) (driver.Rows, error) {
	r := &c.rows
	if r.open {
		r = &rows{c: c}
	}
	if err := c.start(ctx, KindQuery, text, &r.p); err != nil {
		return nil, err
	}
	returned, handed := false, false
	defer func() {
		if !returned {
			c.lose()
		}
		if !handed {
			c.g.release(&r.p)
		}
	}()
	ri, si, err := run()
	returned = true
	if err != nil {
		return nil, opErr(ctx, err)
	}
	r.inner, r.stmt, r.open = ri, si, true
	handed = true
	return r, nil
}

// tx is a conn's open transaction, holding both permits.
type tx struct {
	c     *conn
	inner driver.Tx
	ctx   context.Context // BeginTx's
	p     permit
	open  bool // begun, and its permits not released yet
}

func (t *tx) Commit() error {
	returned := false
	defer t.finish(&returned)
	err := t.inner.Commit()
	returned = true
	return ctxErr(t.ctx, err)
}

// Rollback rolls back. After the transaction's context ended, c is then
// discarded unless the driver can reset and validate it (keepConnOnRollback).
func (t *tx) Rollback() error {
	returned := false
	defer t.finish(&returned)
	if s := t.c.s; s != nil && (s.Resetter == nil || s.Validator == nil) && t.ctx.Err() != nil {
		t.c.bad = true
	}
	err := t.inner.Rollback()
	returned = true
	return ctxErr(t.ctx, err)
}

// finish is conn.finish for Commit and Rollback.
func (t *tx) finish(returned *bool) {
	if !*returned {
		t.c.lose()
	}
	t.end()
}

// end releases the transaction's permits, once.
func (t *tx) end() {
	if t.open {
		t.open = false
		t.c.g.release(&t.p)
	}
}

func valueToNamedValue(args []driver.Value) []driver.NamedValue {
	named := make([]driver.NamedValue, len(args))
	for i, v := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return named
}
